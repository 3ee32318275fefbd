"""Keeping a game's joint layout in step with its players, and carrying the
algorithm state across a new layout.

The vocabulary: :meth:`Watch.intact` is the cheap check that nothing moved
(every step); :meth:`Player.why_stale <gameopt.Player.why_stale>` says what moved;
:func:`refresh` re-fuses the players that changed and says whether the layout must
be rebuilt. Across a rebuild, :func:`take_apart` keys every joint vector of the
algorithm state by parameter identity and the state's owners (the algorithm, its
update rule) carry it into the new layout's fresh state with a
:class:`ParameterCarry`, so that state follows each parameter, never a position.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..buffer import links_intact
from ..layout import JointLayout
from ..player import Player, RegistryWatch, registries_intact
from ..vec import Vec

log = logging.getLogger(__name__)

_BUFFERS = operator.attrgetter("buffers")


class Watch:
    """What a game's layout was built on: each player's buffers, each parameter's
    storage pointer and shape, and every player's registries
    (:meth:`Player.registry_watch`: every registration of a parameter or submodule,
    so also every place a fused parameter is registered), all checked in one set
    of C-level passes."""

    def __init__(self, players: Sequence[Player]) -> None:
        self.players = list(players)
        self.buffers = [p.buffers for p in players]
        self.params = [q for p in players for b in p.buffers for q in b.params]
        self.ptrs = [q.data_ptr() for q in self.params]
        self.shapes = [q.shape for q in self.params]
        self.registries = RegistryWatch.joined([p.registry_watch() for p in players])

    def intact(self) -> bool:
        """Nothing moved: the same buffers, registrations, storage, shapes and flags
        (what ``links_intact`` and every player's ``registry_intact`` check)."""
        return (
            all(map(operator.is_, map(_BUFFERS, self.players), self.buffers))
            and links_intact(self.params, self.ptrs, self.shapes)
            and registries_intact(self.registries)
        )


def refresh(players: Sequence[Player], layout: JointLayout, watch: Watch) -> bool:
    """Refresh every player (one whose module was converted or changed re-fuses) and
    say whether ``layout`` is stale now: a player re-fused, a buffer left the joint
    storage, or a player's buffers were replaced."""
    changed = [p.refresh() for p in players]
    moved = any(
        e.buffer not in players[e.player].buffers
        or e.buffer.data.data_ptr() != layout.entry_view(layout.data, e).data_ptr()
        for e in layout.entries
    )
    re_fused = not all(map(operator.is_, map(_BUFFERS, players), watch.buffers))
    return any(changed) or moved or re_fused


class _PerParam(dict):
    """A joint vector taken apart by parameter identity: id(param) -> (param, values).
    The parameter object is held so that its id cannot be reused meanwhile."""


def take_apart(state: Any, layout: JointLayout) -> Any:
    """``state`` with every joint vector of ``layout`` taken apart by parameter
    identity (copies), ready for :func:`carry` into a new layout."""
    return _map_vectors(state, layout, lambda v: _unflatten(layout, v))


class ParameterCarry:
    """Carries a state into ``layout`` by parameter (:class:`gameopt.state.Carry`):
    what an owner's carry hook (:meth:`gameopt.UpdateRule.carry`) is given."""

    def __init__(self, layout: JointLayout) -> None:
        self.layout = layout

    def state(self, old: Any, fresh: Any, counts: Mapping[str, str] = {}, skip: Collection[str] = ()) -> Any:
        """``fresh`` with each surviving parameter's part of every joint vector taken
        from ``old`` (taken apart by :func:`take_apart`), the step counts of ``counts``
        one per element once a parameter joined, ``old``'s other values, and the
        entries of ``skip`` as ``old`` holds them (another owner carries them)."""
        if isinstance(old, _PerParam):
            return _fill(self.layout, old, fresh)
        if isinstance(old, dict):
            return {k: v if k in skip else self._entry(old, fresh, k, counts.get(k)) for k, v in old.items()}
        if isinstance(old, (list, tuple)):
            return type(old)(self.state(v, f) for v, f in zip(old, fresh))
        return old

    def _entry(self, old: dict[str, Any], fresh: dict[str, Any], key: str, counted: str | None) -> Any:
        """One entry of a dict state: a step count of the vector ``counted``, or any value."""
        if counted is not None and isinstance(old.get(counted), _PerParam):
            return _counts(old[key], old[counted], fresh[counted], self.layout)
        return self.state(old[key], fresh[key])


def untyped_vectors(obj: Any, layout: JointLayout, path: str = "state") -> list[str]:
    """Where a state holds a joint vector as a plain list (not a :class:`Vec`): a
    re-fuse could not carry it by parameter. Shapes are a guess: debug mode only."""
    if isinstance(obj, Vec):
        return []
    if isinstance(obj, dict):
        return [w for k, v in obj.items() for w in untyped_vectors(v, layout, f"{path}[{k!r}]")]
    if isinstance(obj, (list, tuple)):
        if (
            isinstance(obj, list)
            and len(obj) == len(layout.data)
            and all(isinstance(t, Tensor) and t.shape == d.shape for t, d in zip(obj, layout.data))
        ):
            return [path]
        return [w for k, v in enumerate(obj) for w in untyped_vectors(v, layout, f"{path}[{k}]")]
    return []


def _is_vec(obj: Any, layout: JointLayout) -> bool:
    """A joint vector of ``layout`` in a state: typed, never guessed from shapes."""
    if not isinstance(obj, Vec):
        return False
    if [t.shape for t in obj] != [d.shape for d in layout.data]:
        raise RuntimeError("the algorithm state holds a gameopt.Vec that is not a joint vector of the game")
    return True


def _map_vectors(obj: Any, layout: JointLayout, fn: Callable[[Vec], Any]) -> Any:
    """Apply ``fn`` to every joint vector (of ``layout``) inside a state structure."""
    if isinstance(obj, _PerParam):  # taken apart already (a dict: not to be walked into)
        return obj
    if _is_vec(obj, layout):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_vectors(v, layout, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_vectors(v, layout, fn) for v in obj)
    return obj


def _unflatten(layout: JointLayout, vec: Vec) -> _PerParam:
    out = _PerParam()
    for e in layout.entries:
        for p, view in zip(e.buffer.params, e.buffer.views(layout.entry_view(vec, e))):
            out[id(p)] = (p, view.clone())
    return out


def _counts(t: int | _PerParam, like: _PerParam, fresh: Vec, layout: JointLayout) -> int | Vec:
    """A state's step count after a re-layout: a parameter that joined since (or whose
    shape changed) starts from 0, as under torch.optim, so that its first step and its
    bias correction are a fresh start's. One number while all parameters share it;
    else one per element, a joint vector like ``like`` (the state's vector beside it,
    taken apart), in a new joint vector like ``fresh``."""
    if isinstance(t, int):
        carried = all(
            id(p) in like and like[id(p)][0] is p and like[id(p)][1].shape == p.shape
            for e in layout.entries
            for p in e.buffer.params
        )
        if t == 0 or carried:
            return t
        t = _PerParam({k: (p, torch.full_like(values, t)) for k, (p, values) in like.items()})
    return _fill(layout, t, Vec(torch.zeros_like(x) for x in fresh))


def _fill(layout: JointLayout, per_param: _PerParam, vec: Vec) -> Vec:
    """Write each parameter's own values (by identity, never by position) into ``vec``;
    a parameter that joined since, or whose shape changed, keeps ``vec``'s fresh state."""
    fresh = []
    with torch.no_grad():
        for e in layout.entries:
            for p, view in zip(e.buffer.params, e.buffer.views(layout.entry_view(vec, e))):
                old = per_param.get(id(p))
                if old is not None and old[0] is p and old[1].shape == view.shape:
                    view.copy_(old[1])
                else:
                    fresh.append(tuple(view.shape))
    if fresh:
        log.info("fresh algorithm state for %d parameter(s) of shapes %s", len(fresh), fresh)
    return vec
