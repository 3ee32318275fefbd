"""Checkpoints of games of FSDP2-sharded players on gloo ranks, in float64: saved
with torch.distributed.checkpoint (DCP) by every rank, a fresh game resumes bit for
bit; a checkpoint of one world size loads on another (DCP reshards the per-parameter
DTensors); a state dict that does not fit one rank's shards is refused on every rank,
nothing changed anywhere; torch.save writes one file per rank, which loads on the
rank that wrote it and is refused in a world of another size."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import spawn
from test_sharded import _batches, _full, _losses, _modules, _relative, _shard

import gameopt
from gameopt import _torch_compat as tc
from gameopt.sharded import is_sharded

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not tc.FSDP_PUBLIC or not dist.is_available(), reason="FSDP2 is public from torch 2.6"),
]

BATCH = 8
STEPS, SAVED_AT = 5, 3

#: algorithms with state of each kind: none, moments and a step count (Adam), a kept
#: previous ξ, a wrapper's own vector around its base's state
ALGORITHMS = {
    "SimGD": lambda: gameopt.SimGD([0.1, 0.05]),
    "Extragradient+Adam": lambda: gameopt.Extragradient(0.01, update=gameopt.Adam()),
    "Optimistic": lambda: gameopt.Optimistic(0.05),
    "Lookahead(SimGD+Momentum)": lambda: gameopt.Lookahead(gameopt.SimGD(0.05, update=gameopt.Momentum(0.9)), k=2),
}


def _build(make, seed: int = 0, sharded: bool = True):
    gen, disc = _modules(seed)
    if sharded:
        _shard(gen, disc)
    return gameopt.Game([gen, disc], _losses(gen, disc), algorithm=make()), gen, disc


def _local_batches(rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    n = BATCH // world
    return [(x[rank * n : (rank + 1) * n], z[rank * n : (rank + 1) * n]) for x, z in _batches(STEPS)]


def _same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` equal in structure, numbers and every tensor's bits."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _everything(game: gameopt.Game, gen, disc) -> list[Any]:
    """Each rank's view of a game: the full parameters, this rank's flat buffers and
    algorithm state (padding included), the skipped-step count."""
    return [_full(gen) + _full(disc), list(game.layout.data), game.algorithm_state, game.skipped_steps]


def _full_state(state_dict: dict[str, Any]) -> list[Any]:
    """A sharded game's saved form with every DTensor gathered whole (a collective):
    what any world size holds alike."""

    def whole(x: Any) -> Any:
        if is_sharded(x):
            return x.full_tensor()
        if isinstance(x, dict):
            return {k: whole(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [whole(v) for v in x]
        return x

    return whole({k: state_dict[k] for k in ("players", "algorithm", "skipped_steps")})


def _init(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


# ------------------------------------------------------------------- resume
def _resume_worker(rank: int, world: int, port: int, root: str) -> dict:
    """For each algorithm: 5 steps, against 3 steps, a DCP save, a fresh game (other
    initial values) loading it, and 2 steps."""
    import torch.distributed.checkpoint as dcp

    _init(rank, world, port)
    out: dict = {}
    try:
        batches = _local_batches(rank, world)
        for name, make in ALGORITHMS.items():
            ref, ref_gen, ref_disc = _build(make)
            for x, z in batches:
                ref.step(x, z)
            game, gen, disc = _build(make)
            for x, z in batches[:SAVED_AT]:
                game.step(x, z)
            saved = _everything(game, gen, disc)
            path = os.path.join(root, name)
            sd = game.state_dict()
            out[f"{name}/saved_as"] = [
                [tuple(t.shape), str(t.placements)] if is_sharded(t) else type(t).__name__
                for player in sd["players"]
                for t in player["params"][0]
            ]
            dcp.save({"game": sd}, checkpoint_id=path)
            # a file per rank (torch.save), loaded on the rank that wrote it
            torch.save(sd, f"{path}.rank{rank}.pt")
            again, again_gen, again_disc = _build(make, seed=1)
            again.load_state_dict(torch.load(f"{path}.rank{rank}.pt", weights_only=True))
            out[f"{name}/torch.save"] = _same(_everything(again, again_gen, again_disc), saved)

            fresh, fresh_gen, fresh_disc = _build(make, seed=1)
            out[f"{name}/differed"] = not _same(_full(fresh_gen), saved[0][: len(_full(fresh_gen))])
            sd = {"game": fresh.state_dict()}
            dcp.load(sd, checkpoint_id=path)
            fresh.load_state_dict(sd["game"])
            out[f"{name}/loaded"] = _same(_everything(fresh, fresh_gen, fresh_disc), saved)
            for x, z in batches[SAVED_AT:]:
                fresh.step(x, z)
            resumed, uninterrupted = _everything(fresh, fresh_gen, fresh_disc), _everything(ref, ref_gen, ref_disc)
            out[f"{name}/resumed"] = _same(resumed, uninterrupted)
            out[f"{name}/moved"] = _relative(_full(fresh_gen), saved[0][: len(_full(fresh_gen))])
            out[f"{name}/state_tensors"] = len(gameopt.state.tensors_in(fresh.algorithm_state))
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize("world", [2])
def test_dcp_checkpoint_resumes_bit_for_bit(tmp_path, world) -> None:
    results = spawn(functools.partial(_resume_worker, root=str(tmp_path / "ckpt")), world, tmp_path)
    shapes = [[list(p.shape), "(Shard(dim=0),)"] for m in _modules() for p in m.parameters()]
    for r, res in enumerate(results):
        for name in ALGORITHMS:
            # each rank's shards as DTensors of the parameters' global shapes, never as whole tensors
            assert res[f"{name}/saved_as"] == shapes, (r, name, res[f"{name}/saved_as"])
            assert res[f"{name}/torch.save"], (r, name)
            assert res[f"{name}/differed"], (r, name)  # the fresh game started elsewhere
            assert res[f"{name}/loaded"], (r, name)
            assert res[f"{name}/resumed"], (r, name)
            assert res[f"{name}/moved"] > 1e-4, (r, name)  # the two steps after the load did something
        assert res["Extragradient+Adam/state_tensors"] == 2 and res["Optimistic/state_tensors"] == 1


# ---------------------------------------------------------------- resharding
def _save_worker(rank: int, world: int, port: int, root: str) -> dict:
    """3 steps, saved with DCP and with torch.save (a file per rank); the whole
    values, gathered, in a file of rank 0's."""
    import torch.distributed.checkpoint as dcp

    _init(rank, world, port)
    try:
        batches = _local_batches(rank, world)
        for name, make in ALGORITHMS.items():
            game, gen, disc = _build(make)
            for x, z in batches[:SAVED_AT]:
                game.step(x, z)
            sd = game.state_dict()
            dcp.save({"game": sd}, checkpoint_id=os.path.join(root, name))
            torch.save(sd, os.path.join(root, f"{name}.rank{rank}.pt"))
            whole = _full_state(sd)
            if rank == 0:
                torch.save(whole, os.path.join(root, f"{name}.whole.pt"))
    finally:
        dist.destroy_process_group()
    return {}


def _load_worker(rank: int, world: int, port: int, root: str, saved_world: int) -> dict:
    """Each checkpoint loaded through DCP into a fresh game on ``world`` ranks: the
    whole values as saved; 2 steps on: the unsharded 5-step run's. A per-rank file of
    ``saved_world`` ranks: refused on every rank, nothing changed."""
    import torch.distributed.checkpoint as dcp

    _init(rank, world, port)
    out: dict = {}
    try:
        batches = _local_batches(rank, world)
        for name, make in ALGORITHMS.items():
            fresh, gen, disc = _build(make, seed=1)
            before = _everything(fresh, gen, disc)
            try:  # every rank calls load_state_dict: the ranks agree on its verdict
                file = os.path.join(root, f"{name}.rank{rank % saved_world}.pt")
                fresh.load_state_dict(torch.load(file, weights_only=True))
                out[f"{name}/torch.save"] = "loaded"
            except ValueError as err:
                out[f"{name}/torch.save"] = str(err)
            out[f"{name}/torch.save/unchanged"] = _same(_everything(fresh, gen, disc), before)
            sd = {"game": fresh.state_dict()}
            dcp.load(sd, checkpoint_id=os.path.join(root, name))
            fresh.load_state_dict(sd["game"])
            whole = torch.load(os.path.join(root, f"{name}.whole.pt"), weights_only=True)
            out[f"{name}/whole"] = _same(_full_state(fresh.state_dict()), whole)
            for x, z in batches[SAVED_AT:]:
                fresh.step(x, z)
            ref, ref_gen, ref_disc = _build(make, sharded=False)
            for x, z in _batches(STEPS):
                ref.step(x, z)
            out[f"{name}/parity"] = _relative(_full(gen) + _full(disc), _full(ref_gen) + _full(ref_disc))
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize(("saved_world", "world"), [(2, 4), (4, 2)])
def test_dcp_checkpoint_reshards_to_another_world_size(tmp_path, saved_world, world) -> None:
    root = str(tmp_path / "ckpt")
    (tmp_path / "save").mkdir()
    (tmp_path / "load").mkdir()
    spawn(functools.partial(_save_worker, root=root), saved_world, tmp_path / "save")
    results = spawn(functools.partial(_load_worker, root=root, saved_world=saved_world), world, tmp_path / "load")
    for r, res in enumerate(results):
        for name in ALGORITHMS:
            assert res[f"{name}/whole"], (r, name)  # bit for bit, resharded
            assert res[f"{name}/parity"] < 1e-9, (r, name, res[f"{name}/parity"])
            # a file per rank, of another world size: refused on every rank, nothing changed
            assert res[f"{name}/torch.save/unchanged"], (r, name)
            assert (
                f"saved by a world of {saved_world} ranks, this game is sharded over {world}"
                in (res[f"{name}/torch.save"])
            ), (r, name, res[f"{name}/torch.save"])


# ------------------------------------------------------------ all or nothing
def _last_rank_only(world: int, rank: int, edit):
    """An edit of a state dict made on the last rank only."""

    def apply(sd: dict) -> None:
        if rank == world - 1:
            edit(sd)

    return apply


def _nan_in_shard(dtensors: list) -> None:
    """A NaN in the first non-empty local shard of ``dtensors`` (this rank's)."""
    local = next(t._local_tensor for t in dtensors if t._local_tensor.numel())
    local.view(-1)[0] = float("nan")


def _refusal_worker(rank: int, world: int, port: int) -> dict:
    """State dicts that do not fit, some on the last rank only: refused on every rank
    with ValueError, every rank's game unchanged; then the game's own state dict loads."""
    _init(rank, world, port)
    out: dict = {}
    try:
        make = ALGORITHMS["Extragradient+Adam"]
        game, gen, disc = _build(make)
        for x, z in _local_batches(rank, world)[:2]:
            game.step(x, z)
        other, _, _ = _build(ALGORITHMS["SimGD"])

        def swap(sd: dict) -> None:  # two parameters' DTensors swapped: other global shapes
            params = sd["players"][0]["params"][0]
            params[0], params[2] = params[2], params[0]

        def flat(sd: dict) -> None:  # the flat local form: what state_dict gave before DTensors
            sd["players"][1]["params"][0] = game.players[1].buffers[0].data.clone()

        cases = {
            "nan_param_last_rank": _last_rank_only(
                world, rank, lambda sd: _nan_in_shard(sd["players"][1]["params"][0])
            ),
            "nan_moment_last_rank": _last_rank_only(
                world, rank, lambda sd: _nan_in_shard(sd["algorithm"]["state"]["rule"]["m"][0])
            ),
            "swapped_last_rank": _last_rank_only(world, rank, swap),
            "flat": flat,
            "other_algorithm": lambda sd: sd.update(other.state_dict()),
        }
        for key, edit in cases.items():
            before = _everything(game, gen, disc)
            sd = game.state_dict()
            edit(sd)
            try:
                game.load_state_dict(sd)
                out[f"{key}/verdict"] = "loaded"
            except ValueError as err:
                out[f"{key}/verdict"] = str(err)
            out[f"{key}/unchanged"] = _same(_everything(game, gen, disc), before)
        before = _everything(game, gen, disc)
        game.load_state_dict(game.state_dict())
        out["own/unchanged"] = _same(_everything(game, gen, disc), before)
    finally:
        dist.destroy_process_group()
    return out


def test_a_state_dict_that_does_not_fit_one_rank_is_refused_on_every_rank(tmp_path) -> None:
    world = 2
    results = spawn(_refusal_worker, world, tmp_path)
    expected = {
        "nan_param_last_rank": "players[1].params[0]: holds non-finite values",
        "nan_moment_last_rank": "algorithm.state.rule.m[0]: holds non-finite values",
        "swapped_last_rank": "players[0].params[0][0]: expected a DTensor of a (5, 2) torch.float64 parameter, "
        "got (3, 5)",
        "flat": "players[1].params[0]: expected 4 DTensors, one per sharded parameter",
        "other_algorithm": "checkpoint is for 'SimGD', this game runs 'Extragradient'",
    }
    for r, res in enumerate(results):
        for key, message in expected.items():
            assert res[f"{key}/unchanged"], (r, key)
            verdict = res[f"{key}/verdict"]
            if key.endswith("last_rank") and r != world - 1:
                assert verdict.startswith("another rank refused this state_dict"), (r, key, verdict)
            else:
                assert message in verdict, (r, key, verdict)
        assert res["own/unchanged"]
