"""Algorithm state structures (nested dicts, lists and tuples of tensors and
numbers): walking, copying for checkpoints, and checking a loaded one against the
live one.

What a state means belongs to its owner (an algorithm, an update rule): the
functions here take what the owner declares, its step counts (``counts``: each count
with the joint vector whose elements it counts), and never name a key themselves.
A step count is one number for all elements, or, once parameters joined a running
game at different steps, one per element: a joint vector like the one it counts.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from .vec import Vec


def tensors_in(obj: Any) -> list[Tensor]:
    """Every tensor in a state structure, in order (an empty container or a tensor
    met on the way costs no call: this runs on every step's state)."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = obj.values()
    elif not isinstance(obj, (list, tuple)):
        return []
    out: list[Tensor] = []
    for v in obj:
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, (dict, list, tuple)) and v:
            out += tensors_in(v)
    return out


def clone_state(obj: Any) -> Any:
    """A deep copy of a state structure, in plain containers (a joint vector becomes a
    list of tensors), so that ``torch.load(weights_only=True)`` reads it back."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_state(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_state(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone_state(v) for v in obj)
    return obj


def moved_like(mine: Any, theirs: Any) -> Any:
    """A copy of ``theirs`` (a loaded state, checked against ``mine``) with each tensor on
    the device of the tensor of ``mine`` it replaces."""
    if isinstance(mine, Tensor) and isinstance(theirs, Tensor):
        return theirs.detach().to(mine.device, copy=True)
    if isinstance(theirs, dict):
        return {k: moved_like(mine.get(k) if isinstance(mine, dict) else None, v) for k, v in theirs.items()}
    if isinstance(theirs, (list, tuple)):
        mines = list(mine) if isinstance(mine, (list, tuple)) else [None] * len(theirs)
        return type(theirs)(moved_like(a, b) for a, b in zip(mines, theirs))
    return clone_state(theirs)


def retyped(mine: Any, theirs: Any) -> Any:
    """``theirs`` (a loaded state, plain containers) with the joint vectors of ``mine``
    (the same structure, checked) made :class:`~gameopt.vec.Vec` again."""
    if isinstance(mine, Vec):
        return Vec(theirs)
    if isinstance(mine, dict):
        return {k: retyped(mine[k], v) for k, v in theirs.items()}
    if isinstance(mine, (list, tuple)):
        return type(theirs)(retyped(a, b) for a, b in zip(mine, theirs))
    return theirs


class Carry(Protocol):
    """What an owner's carry hook gets when the players' layout changed (a parameter
    joined, left or changed shape): :meth:`state` carries a state by parameter, never
    by position (:mod:`gameopt.game.relayout` implements it)."""

    def state(self, old: Any, fresh: Any, counts: Mapping[str, str] = {}, skip: Collection[str] = ()) -> Any:
        """``fresh`` (the owner's new state for the new layout) with each surviving
        parameter's values of every joint vector of ``old`` (the state before, its
        joint vectors taken apart by parameter), and ``old``'s other values. Each step
        count of ``counts`` becomes one per element if a parameter joined since (which
        starts from 0, as under torch.optim); the entries of ``skip`` stay as in ``old``
        (their owner carries them)."""
        ...


def counts_like(live: Any, saved: Any, counts: Mapping[str, str]) -> Any:
    """``live`` with each step count of ``counts`` in the form ``saved`` holds it: one
    number, or one per element (a joint vector like the one it counts). Either form
    loads into either."""
    if not counts or not isinstance(live, dict) or not isinstance(saved, dict):
        return live
    out = dict(live)
    for key, like in counts.items():
        if isinstance(live.get(key), int) and isinstance(saved.get(key), (list, tuple)):
            out[key] = live[like]
        elif key in live and not isinstance(live[key], int) and isinstance(saved.get(key), int):
            out[key] = 0
    return out


def check_counts(state: Any, counts: Collection[str], path: str) -> None:
    """Raise ``ValueError`` naming the entry if a step count of ``state`` is negative."""
    if not isinstance(state, dict):
        return
    for key in counts:
        t = state.get(key)
        if isinstance(t, int) and t < 0:
            raise ValueError(f"{path}.{key}: a step count, must be >= 0, got {t}")
        for k, c in enumerate(t if isinstance(t, (list, tuple)) else ()):  # one count per element
            c = torch.view_as_real(c) if isinstance(c, Tensor) and c.is_complex() else c
            if isinstance(c, Tensor) and bool((c < 0).any()):
                raise ValueError(f"{path}.{key}[{k}]: step counts, must be >= 0, got {float(c.min()):g}")


def check_loaded(live: Any, saved: Any, path: str, counts: Mapping[str, str] = {}, skip: Collection[str] = ()) -> Any:
    """Raise ``ValueError`` naming what is wrong unless ``saved`` (a checkpoint's state)
    fits ``live`` (the state the game holds): :func:`check_like`, each step count in
    either form, none negative; the entries of ``skip`` are left to their owner.
    Returns what ``saved`` loads as: ``live`` with its counts in ``saved``'s form."""
    if not isinstance(live, dict):
        check_like(live, saved, path)
        return live
    _check_keys(live, saved, path)
    like = counts_like(live, saved, counts)
    for k in like:
        if k not in skip:
            check_like(like[k], saved[k], f"{path}.{k}")
    check_counts(saved, counts, path)
    return like


def _check_keys(mine: dict[str, Any], theirs: Any, path: str) -> None:
    if not isinstance(theirs, dict) or set(mine) != set(theirs):
        raise ValueError(
            f"{path}: expected keys {sorted(mine)}, got {sorted(theirs) if isinstance(theirs, dict) else theirs!r}"
        )


def check_like(mine: Any, theirs: Any, path: str) -> None:
    """Raise ValueError unless ``theirs`` has the structure, shapes and dtypes of ``mine``."""
    if isinstance(mine, Tensor):
        if not isinstance(theirs, Tensor) or theirs.shape != mine.shape or theirs.dtype != mine.dtype:
            got = f"{tuple(theirs.shape)} {theirs.dtype}" if isinstance(theirs, Tensor) else type(theirs).__name__
            raise ValueError(f"{path}: expected a {tuple(mine.shape)} {mine.dtype} tensor, got {got}")
        if theirs.device.type == "meta":
            raise ValueError(f"{path}: the tensor is on the meta device (it holds no values to load)")
        if (theirs.is_floating_point() or theirs.is_complex()) and not bool(torch.isfinite(theirs).all()):
            raise ValueError(f"{path}: holds non-finite values")
    elif isinstance(mine, dict):
        _check_keys(mine, theirs, path)
        for k in mine:
            check_like(mine[k], theirs[k], f"{path}.{k}")
    elif isinstance(mine, (list, tuple)):
        if not isinstance(theirs, (list, tuple)) or len(mine) != len(theirs):
            got = f"{len(theirs)}" if isinstance(theirs, (list, tuple)) else f"a {type(theirs).__name__}"
            raise ValueError(f"{path}: expected {len(mine)} entries, got {got}")
        for k, (a, b) in enumerate(zip(mine, theirs)):
            check_like(a, b, f"{path}[{k}]")
    elif isinstance(mine, bool) or isinstance(mine, str):
        if type(theirs) is not type(mine):
            raise ValueError(f"{path}: expected a {type(mine).__name__}, got {theirs!r}")
    elif isinstance(mine, (int, float)):
        kinds = (int,) if isinstance(mine, int) else (int, float)
        if not isinstance(theirs, kinds) or isinstance(theirs, bool) or not math.isfinite(theirs):
            raise ValueError(f"{path}: expected a finite {type(mine).__name__}, got {theirs!r}")
        if isinstance(mine, int) and mine >= 0 and theirs < 0:  # the states' integers are counts
            raise ValueError(f"{path}: a count, must be >= 0, got {theirs!r}")
    elif mine is None:
        if theirs is not None and not isinstance(theirs, (Tensor, list)):
            raise ValueError(f"{path}: unexpected {theirs!r}")
