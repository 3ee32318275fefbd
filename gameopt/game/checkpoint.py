"""A game's checkpoint: what :meth:`Game.state_dict <gameopt.Game.state_dict>`
writes, how a checkpoint is checked against a game, and how it is loaded.

The format: ``{"players": [{"name", "params", "buffers"}, ...], "algorithm": ...,
"skipped_steps": int, "loss_scale": dict | None}``, with each player's fused
parameter buffers and its module's persistent buffers (BatchNorm running
statistics) by name. :func:`check_state_dict` checks everything before
:func:`load_state_dict` writes anything.

A game of FSDP-sharded players saves this form with each flat local vector (a
player's parameters, a joint vector of the algorithm's state) as DTensors, one per
parameter: ``gameopt.game.sharded_checkpoint.saved_form`` turns this module's form into it, and
``gameopt.game.sharded_checkpoint.local_form`` back before it is checked and loaded here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .. import _torch_compat as tc
from ..algorithms.api import State
from ..algorithms.base import Algorithm
from ..checks import check_number
from ..loss_scale import DynamicLossScale
from ..player import Player
from ..state import check_like, clone_state


def state_dict(
    players: Sequence[Player],
    algorithm: Algorithm,
    algorithm_state: State,
    skipped_steps: int,
    loss_scale: DynamicLossScale | None,
    instead: Mapping[int, Tensor] | None = None,
) -> dict[str, Any]:
    """A checkpoint of a game (copies): its players, algorithm (with the state the game
    holds for it), skipped-step count and loss scale. ``instead``: tensors to save in
    place of the players' live ones, by ``id`` of the live tensor (the point and module
    buffers a running step started from)."""
    players_state = _players_state(players)
    if instead:
        players_state = [
            {
                "name": p["name"],
                "params": [instead.get(id(t), t) for t in p["params"]],
                "buffers": {k: instead.get(id(t), t) for k, t in p["buffers"].items()},
            }
            for p in players_state
        ]
    return {
        "players": clone_state(players_state),
        "algorithm": algorithm.state_dict(algorithm_state),
        "skipped_steps": skipped_steps,
        "loss_scale": None if loss_scale is None else loss_scale.state_dict(),
    }


def check_state_dict(
    state_dict: Any,
    players: Sequence[Player],
    algorithm: Algorithm,
    algorithm_state: State,
    loss_scale: DynamicLossScale | None,
) -> None:
    """Raise ``ValueError`` naming what is wrong unless ``state_dict`` fits the game of
    these players, algorithm (and the state the game holds for it) and loss scale.
    Changes nothing."""
    if not isinstance(state_dict, dict):
        raise ValueError(f"a game state_dict must be a dict, got {type(state_dict).__name__}")
    missing = {"players", "algorithm", "skipped_steps", "loss_scale"} - set(state_dict)
    if missing:
        raise ValueError(f"the state_dict lacks {sorted(missing)}")
    # the algorithm first: it tells a checkpoint of another format or run
    algorithm._check_state_dict(state_dict["algorithm"], algorithm_state)
    saved_players = state_dict["players"]
    if not isinstance(saved_players, list) or len(saved_players) != len(players):
        got = f"{len(saved_players)} players" if isinstance(saved_players, list) else type(saved_players).__name__
        raise ValueError(f"players: expected {len(players)} players, got {got}")
    for k, (p, mine, saved) in enumerate(zip(players, _players_state(players), saved_players)):
        if not isinstance(saved, dict):
            raise ValueError(f"players[{k}]: expected a dict, got {type(saved).__name__}")
        if saved.get("name") != p.name:
            raise ValueError(f"checkpoint player {saved.get('name')!r} does not match player {p.name!r}")
        check_like(mine, saved, f"players[{k}]")
    check_number("skipped_steps", state_dict["skipped_steps"], low=0, integer=True)
    if (loss_scale is None) != (state_dict["loss_scale"] is None):
        raise ValueError("loss_scale: the checkpoint and the game differ in using a DynamicLossScale")
    if loss_scale is not None:
        loss_scale.check_state_dict(state_dict["loss_scale"])


def load_state_dict(
    state_dict: dict[str, Any],
    players: Sequence[Player],
    algorithm: Algorithm,
    algorithm_state: State,
    loss_scale: DynamicLossScale | None,
) -> tuple[int, State]:
    """Write a checked ``state_dict`` (:func:`check_state_dict`) into the players, the
    algorithm's param groups and the loss scale; returns the skipped-step count and
    the algorithm state (shaped as ``algorithm_state``, which stays unchanged) for the
    game to keep."""
    loaded = algorithm.load_state_dict(state_dict["algorithm"], algorithm_state)
    with torch.no_grad():
        for mine, saved in zip(_players_state(players), state_dict["players"]):
            tc.foreach_copy_(mine["params"], saved["params"])
            for name, t in mine["buffers"].items():
                t.copy_(saved["buffers"][name])
    if loss_scale is not None:
        loss_scale.load_state_dict(state_dict["loss_scale"])
    return int(state_dict["skipped_steps"]), loaded


def _players_state(players: Sequence[Player]) -> list[dict[str, Any]]:
    """The players' part of a checkpoint, live tensors (not copies)."""
    return [{"name": p.name, "params": [b.data for b in p.buffers], "buffers": _module_buffers(p)} for p in players]


def _module_buffers(player: Player) -> dict[str, Tensor]:
    """The persistent buffers of a player's module (those in its ``state_dict``), by name."""
    if player.module is None:
        return {}
    out = {}
    # torch.compile wrappers (the module's or a submodule's): the modules they hold (names as in eager mode)
    for prefix, sub in tc.eager_named_modules(player.module):
        keep = tc.persistent_buffer_names(sub)
        for name, b in tc.buffer_registry(sub).items():
            if b is not None and name in keep:
                out[f"{prefix}.{name}" if prefix else name] = b
    return out
