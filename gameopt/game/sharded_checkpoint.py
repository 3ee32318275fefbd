"""The saved form of a sharded game's checkpoint (players sharded with FSDP2: see
:mod:`gameopt.sharded`).

Each flat local vector (a player's parameters, a joint vector of the algorithm's
state) is saved as one DTensor per parameter: the parameter's global shape, sharded
like it, over a copy of this rank's shard. What ``torch.distributed.checkpoint``
saves is then every rank's shard, and what it loads is resharded to the loading
world's shards, whatever its size. Only here does a checkpoint change form:
:func:`saved_form` after the game's checkpoint is taken (:mod:`.checkpoint`), and
:func:`local_form` before it is checked and loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .. import _torch_compat as tc
from ..buffer import FlatBuffer
from ..layout import JointLayout
from ..player import Player
from ..sharded import ShardedBuffer, is_sharded
from ..vec import Vec


def saved_form(
    state_dict: dict[str, Any], players: Sequence[Player], layout: JointLayout, algorithm_state: Any
) -> dict[str, Any]:
    """A sharded game's checkpoint (``state_dict``: copies, in the local form of
    :func:`gameopt.game.checkpoint.state_dict`) in the form it is saved in: each
    player's flat parameter buffer as a list of DTensors, one per parameter; each joint
    vector of the algorithm's state (where ``algorithm_state``, the live state it was
    copied from, holds a :class:`~gameopt.vec.Vec`) as one such list per joint group,
    the group's parameters in storage order; tuples as lists (``torch.distributed.
    checkpoint`` pickles a tuple whole, with one rank's tensors). Each DTensor's
    shard is a copy of its own (see :func:`_saved_buffer`)."""
    out = dict(state_dict)
    out["players"] = [
        {**saved, "params": [_saved_buffer(b, flat) for b, flat in zip(p.buffers, saved["params"])]}
        for p, saved in zip(players, state_dict["players"])
    ]
    algorithm = dict(state_dict["algorithm"])
    algorithm["state"] = _saved_state(algorithm["state"], algorithm_state, layout)
    out["algorithm"] = algorithm
    return out


def local_form(state_dict: Any, players: Sequence[Player], layout: JointLayout, algorithm_state: Any) -> Any:
    """A saved checkpoint (:func:`saved_form`; loaded by ``torch.distributed.checkpoint``
    into a game's :meth:`~gameopt.Game.state_dict`, or by ``torch.load`` from this rank's
    file) back in the local form that :mod:`gameopt.game.checkpoint` checks and loads:
    new flat tensors, each parameter's local shard copied into its segment, the padding
    as the live tensor's (the game's parameters, ``algorithm_state``). Raise
    ``ValueError`` naming the entry where a DTensor is not a shard of its parameter on
    this rank (another shape, dtype, placement or mesh); the rest of the structure is
    left to :func:`gameopt.game.checkpoint.check_state_dict`. Changes nothing."""
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("players"), list):
        return state_dict  # not a checkpoint: check_state_dict says what is wrong
    out = dict(state_dict)
    saved_players = state_dict["players"]
    if len(saved_players) == len(players):
        out["players"] = [
            _local_player(p, saved, f"players[{i}]") for i, (p, saved) in enumerate(zip(players, saved_players))
        ]
    algorithm = state_dict.get("algorithm")
    if isinstance(algorithm, dict) and "state" in algorithm:
        state = _local_state(algorithm["state"], algorithm_state, layout, "algorithm.state")
        out["algorithm"] = {**algorithm, "state": state}
    return out


def _saved_buffer(buf: FlatBuffer, flat: Tensor) -> list[Tensor]:
    """``flat`` (laid out like ``buf``) as one DTensor per parameter, each shard in
    storage of its own: ``torch.save`` fails on a DTensor over a view at an offset
    ("invalid python storage", torch 2.13), and a file holds no padding."""
    if not isinstance(buf, ShardedBuffer):  # a sharded game's players are all sharded
        raise TypeError(f"a sharded game holds a buffer that is not sharded: {buf!r}")
    return buf.as_dtensors(flat)


def _saved_vec(vec: Sequence[Tensor], layout: JointLayout) -> list[list[Tensor]]:
    """A joint vector (flat local groups) as one list of DTensors per group."""
    return [
        [t for e in layout.group_entries(g) for t in _saved_buffer(e.buffer, group[e.start : e.stop])]
        for g, group in enumerate(vec)
    ]


def _saved_state(state: Any, live: Any, layout: JointLayout) -> Any:
    if isinstance(live, Vec):
        return _saved_vec(state, layout)
    if isinstance(state, dict):
        return {k: _saved_state(v, live[k], layout) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_saved_state(v, w, layout) for v, w in zip(state, live)]
    return state


def _local_player(player: Player, saved: Any, path: str) -> Any:
    if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
        return saved
    params = saved["params"]
    if len(params) != len(player.buffers):
        raise ValueError(f"{path}.params: expected {len(player.buffers)} parameter groups, got {len(params)}")
    flats = []
    for j, (b, s) in enumerate(zip(player.buffers, params)):
        flat = b.data.detach().clone()
        _copy_shards(b, s, flat, f"{path}.params[{j}]")
        flats.append(flat)
    return {**saved, "params": flats}


def _copy_shards(buf: FlatBuffer, saved: Any, out: Tensor, path: str, first: int = 0) -> None:
    """Copy the local shards of the DTensors of ``saved`` into their parameters'
    segments of ``out`` (laid out like ``buf``), each checked to be this rank's shard
    of its parameter (named ``path[first + k]``)."""
    assert isinstance(buf, ShardedBuffer)
    n = len(buf.params)
    if not isinstance(saved, (list, tuple)) or len(saved) != n:
        got = f"{len(saved)} entries" if isinstance(saved, (list, tuple)) else _describe(saved)
        raise ValueError(
            f"{path}: expected {n} DTensors, one per sharded parameter (a sharded game's checkpoint), got {got}"
        )
    for k, (p, view, t) in enumerate(zip(buf.params, buf.views(out), saved)):
        where = f"{path}[{first + k}]"
        if not is_sharded(t):
            raise ValueError(
                f"{where}: expected a DTensor (this rank's shard of a {tuple(p.shape)} parameter), got "
                f"{_describe(t)}: a sharded game loads the checkpoint of a sharded game (game.state_dict())"
            )
        if t.shape != p.shape or t.dtype != out.dtype:
            raise ValueError(
                f"{where}: expected a DTensor of a {tuple(p.shape)} {out.dtype} parameter, got "
                f"{tuple(t.shape)} {t.dtype}"
            )
        mesh, mine = t.device_mesh, p.device_mesh  # type: ignore[attr-defined]  # p: a DTensor
        placed, mine_placed = tuple(t.placements), tuple(p.placements)  # type: ignore[attr-defined]
        if mesh.size() != mine.size():
            raise ValueError(
                f"{where}: saved by a world of {mesh.size()} ranks, this game is sharded over {mine.size()}: a "
                "checkpoint saved per rank (torch.save) loads into the same world size only; to load it into "
                "another, save with torch.distributed.checkpoint, which reshards"
            )
        if mesh != mine or placed != mine_placed:
            raise ValueError(f"{where}: sharded as {placed} over {mesh}, the parameter as {mine_placed} over {mine}")
        local = tc.local_shard(t)
        if local.shape != view.shape:
            raise ValueError(
                f"{where}: a local shard of shape {tuple(local.shape)}, this rank's is {tuple(view.shape)}"
            )
        with torch.no_grad():
            view.copy_(local)


def _local_vec(saved: Any, live: Sequence[Tensor] | None, layout: JointLayout, path: str) -> Vec:
    """A joint vector from its saved form: a copy of ``live`` (or zeros where the live
    state holds none: a step count saved per element) with the saved local shards."""
    groups = len(layout.data)
    if not isinstance(saved, (list, tuple)) or len(saved) != groups:
        got = f"{len(saved)} entries" if isinstance(saved, (list, tuple)) else _describe(saved)
        raise ValueError(f"{path}: expected a joint vector saved as {groups} lists of DTensors, got {got}")
    out = []
    for g in range(groups):
        entries, items = layout.group_entries(g), saved[g]
        sizes = [len(e.buffer.params) for e in entries]
        if not isinstance(items, (list, tuple)) or len(items) != sum(sizes):
            got = f"{len(items)} entries" if isinstance(items, (list, tuple)) else _describe(items)
            raise ValueError(f"{path}[{g}]: expected {sum(sizes)} DTensors, one per parameter, got {got}")
        if live is not None:
            like = live[g]
        else:  # its dtype is the saved one's
            first = next((t for t in items if isinstance(t, Tensor)), None)
            like = torch.zeros_like(layout.data[g], dtype=None if first is None else first.dtype)
        flat = like.detach().clone()
        start = 0
        for e, size in zip(entries, sizes):
            _copy_shards(e.buffer, items[start : start + size], flat[e.start : e.stop], f"{path}[{g}]", start)
            start += size
        out.append(flat)
    return Vec(out)


def _local_state(saved: Any, live: Any, layout: JointLayout, path: str) -> Any:
    if isinstance(live, Vec):
        return _local_vec(saved, live, layout, path)
    if isinstance(saved, dict):
        mine = live if isinstance(live, dict) else {}
        return {k: _local_state(v, mine.get(k), layout, f"{path}.{k}") for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        if _saved_as_vec(saved, layout):  # a step count saved per element, kept as one number here
            return _local_vec(saved, None, layout, path)
        lives = list(live) if isinstance(live, (list, tuple)) and len(live) == len(saved) else [None] * len(saved)
        items = [_local_state(v, w, layout, f"{path}[{k}]") for k, (v, w) in enumerate(zip(saved, lives))]
        return tuple(items) if isinstance(live, tuple) else items
    if is_sharded(saved):
        raise ValueError(f"{path}: a DTensor where the game holds {_describe(live)}")
    return saved


def _saved_as_vec(saved: Sequence[Any], layout: JointLayout) -> bool:
    """Whether ``saved`` is a joint vector's saved form (one list of DTensors per group)."""
    return len(saved) == len(layout.data) and all(
        isinstance(items, (list, tuple)) and any(is_sharded(t) for t in items) for items in saved
    )


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {tuple(value.shape)} {value.dtype} tensor"
    return type(value).__name__
