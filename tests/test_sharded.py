"""Players sharded with FSDP2 (fully_shard) on 2 and 4 gloo ranks, in float64: each
step equals one unsharded process on the whole batch, the fused buffers hold the
local shards, every rank refuses a step together, and what cannot work is refused
when the game is built."""

from __future__ import annotations

import copy
import functools
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from ranks import spawn
from torch import nn

import gameopt
from gameopt import _torch_compat as tc
from gameopt.sharded import WORD_WAIT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not tc.FSDP_PUBLIC or not dist.is_available(), reason="FSDP2 is public from torch 2.6"),
]

BATCH = 8
STEPS = 5

#: first-order algorithms and rules a sharded player takes (lr small enough to stay tame)
ALGORITHMS = {
    "SimGD": lambda: gameopt.SimGD([0.1, 0.05]),
    "AltGD": lambda: gameopt.AltGD(0.1),
    "Extragradient+Adam": lambda: gameopt.Extragradient(0.01, update=gameopt.Adam()),
    "Optimistic": lambda: gameopt.Optimistic(0.05),
    "PastExtragradient+RMSProp": lambda: gameopt.PastExtragradient(0.01, update=gameopt.RMSProp()),
    "AnchoredExtragradient": lambda: gameopt.AnchoredExtragradient(0.05),
    "Lookahead(SimGD+Momentum)": lambda: gameopt.Lookahead(gameopt.SimGD(0.05, update=gameopt.Momentum(0.9)), k=2),
    "Averaging(Extragradient)": lambda: gameopt.Averaging(gameopt.Extragradient(0.05)),
}


def _modules(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A small GAN in float64; odd sizes, so that some shards are padded or empty."""
    torch.manual_seed(seed)
    gen = nn.Sequential(nn.Linear(2, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    disc = nn.Sequential(nn.Linear(3, 7), nn.Tanh(), nn.Linear(7, 1)).double()
    return gen, disc


def _shard(*modules: nn.Module) -> None:
    from torch.distributed.fsdp import fully_shard

    for m in modules:
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(m)


def _losses(gen: nn.Module, disc: nn.Module):
    softplus = nn.functional.softplus

    def losses(x, z):
        fake = gen(z)
        return softplus(-disc(fake)).mean(), softplus(-disc(x)).mean() + softplus(disc(fake)).mean()

    return losses


def _batches(steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(BATCH, 3, generator=g, dtype=torch.float64) + 1, torch.randn(BATCH, 2, generator=g).double())
        for _ in range(steps)
    ]


def _full(module: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in module.parameters()]


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-300)) for x, y in zip(a, b))


#: feasible sets applied elementwise, so shard by shard (the discriminator's weights
#: in a box, as a WGAN clips them): algorithm, sets, and whether a point is inside
SETS = {
    "SimGD+Box": (
        lambda: gameopt.SimGD(0.1),
        {"0.weight": gameopt.constraints.Box(-0.3, 0.3), "2.weight": gameopt.constraints.Box(-0.3, 0.3)},
        lambda w: bool(w[0].abs().max() <= 0.3 and w[2].abs().max() <= 0.3),
    ),
    "Extragradient+NonNegative": (
        lambda: gameopt.Extragradient(0.2),
        {"0.bias": gameopt.constraints.NonNegative()},
        lambda w: bool(w[1].min() >= 0),
    ),
}


def _game(make_algorithm, sharded: bool, sets=None, **kwargs):
    gen, disc = _modules()
    if sharded:
        _shard(gen, disc)
    players = [gen, disc if sets is None else gameopt.Player(disc, constraint=sets)]
    return gameopt.Game(players, _losses(gen, disc), algorithm=make_algorithm(), **kwargs), gen, disc


def _largest_difference(game, ref, modules, ref_modules, rank: int, world: int) -> float:
    """The largest relative difference of the full parameters over the steps: ``game``
    on this rank's part of each batch, ``ref`` (one process) on the whole batch."""
    n = BATCH // world
    errors = []
    for x, z in _batches():
        ref.step(x, z)
        game.step(x[rank * n : (rank + 1) * n], z[rank * n : (rank + 1) * n])
        errors.append(_relative([t for m in modules for t in _full(m)], [t for m in ref_modules for t in _full(m)]))
    return max(errors)


def _parity(rank: int, world: int, out: dict) -> None:
    """Every step of each algorithm: the sharded game's full parameters against one
    process on the whole batch."""
    cases = [(name, make, None) for name, make in ALGORITHMS.items()]
    cases += [(name, make, sets) for name, (make, sets, _) in SETS.items()]
    for name, make, sets in cases:
        ref, ref_gen, ref_disc = _game(make, sharded=False, sets=sets)
        game, gen, disc = _game(make, sharded=True, sets=sets)
        out[f"parity/{name}"] = _largest_difference(game, ref, (gen, disc), (ref_gen, ref_disc), rank, world)
        out[f"moved/{name}"] = _relative(_full(gen), _full(_modules()[0]))
        if sets is not None:  # the sets hold on the whole parameters
            out[f"inside/{name}"] = SETS[name][2](_full(disc))
            out[f"active/{name}"] = not SETS[name][2](_full(_modules()[1]))  # the start was outside


def _layout(rank: int, world: int, out: dict) -> None:
    """The fused buffers hold this rank's shards: parameters and their gradients are views."""
    game, gen, disc = _game(ALGORITHMS["SimGD"], sharded=True)
    x, z = _batches(1)[0]
    game.step(x, z)
    player = game.players[0]
    flat, grad = player.flat_param, player.grad
    shards = [p._local_tensor for p in gen.parameters()]
    grads = [p.grad._local_tensor for p in gen.parameters()]
    out["layout/numel"] = player.numel
    out["layout/local_numel"] = sum(t.numel() for t in shards)
    home, grad_home = flat.untyped_storage().data_ptr(), grad.untyped_storage().data_ptr()
    out["layout/params_are_views"] = all(t.untyped_storage().data_ptr() == home for t in shards)
    out["layout/grads_are_views"] = all(g.untyped_storage().data_ptr() == grad_home for g in grads)
    stepped = _full(gen)
    with torch.no_grad():  # a write into the flat buffer is the module's next forward
        flat.add_(1.0)
    out["layout/write_reaches_module"] = _relative(_full(gen), [t + 1.0 for t in stepped])


def _refusals(rank: int, world: int, out: dict) -> None:
    """What a sharded game cannot do is refused when it is built, with the reason."""
    cases = {
        "second_order": lambda: _game(lambda: gameopt.ConsensusOptimization(0.1, gamma=0.1), sharded=True),
        "process_group": lambda: _game(ALGORITHMS["SimGD"], sharded=True, process_group=dist.group.WORLD),
    }

    def mixed():
        gen, disc = _modules()
        _shard(gen)
        return gameopt.Game([gen, disc], _losses(gen, disc))

    def ball():
        gen, disc = _modules()
        _shard(gen, disc)
        return gameopt.Game([gen, gameopt.Player(disc, constraint=gameopt.constraints.Ball(1.0))], _losses(gen, disc))

    def old_torch():  # a torch without public FSDP2 (before 2.6): a DTensor parameter is refused by name
        tc.FSDP_PUBLIC = False
        try:
            return _game(ALGORITHMS["SimGD"], sharded=True)
        finally:
            tc.FSDP_PUBLIC = True

    cases.update(mixed=mixed, ball=ball, old_torch=old_torch)
    for key, build in cases.items():
        try:
            build()
            out[f"refused/{key}"] = "built"
        except ValueError as err:
            out[f"refused/{key}"] = str(err)
    # a refused game leaves the modules as FSDP had them: the same values, and they train
    gen, disc = _modules()
    _shard(gen, disc)
    start = _full(gen) + _full(disc)
    try:
        gameopt.Game([gen, disc], _losses(gen, disc), algorithm=gameopt.SGA(0.1))
    except ValueError:
        pass
    out["refused/unchanged"] = _relative(_full(gen) + _full(disc), start)
    game = gameopt.Game([gen, disc], _losses(gen, disc), algorithm=gameopt.SimGD(0.1))
    game.step(*_batches(1)[0])
    out["refused/then_trains"] = _relative(_full(gen), start[:4])
    # and what a built sharded game cannot do, when it is asked
    game, _, _ = _game(ALGORITHMS["SimGD"], sharded=True)
    x, z = _batches(1)[0]
    out["sharded"] = game.sharded
    calls = {
        "linearize": lambda: game.linearize(x, z),
        "deepcopy": lambda: copy.deepcopy(game),
        "optimizer_state_dict": lambda: game.optimizer.state_dict(),
    }
    for key, call in calls.items():
        try:
            call()
            out[f"refused/{key}"] = "done"
        except (RuntimeError, TypeError) as err:
            out[f"refused/{key}"] = f"{type(err).__name__}: {err}"


def _nan_in_this_shard(p: torch.Tensor) -> None:
    """A post-accumulate-grad hook (FSDP runs it after the reduce-scatter): NaN into
    one element of this rank's shard of ``p``'s gradient."""
    local = p.grad.to_local()
    if local.numel():
        local.view(-1)[0] = float("nan")


def _together(rank: int, world: int, out: dict) -> None:
    """A non-finite value on one rank only, from a loss (which FSDP's average spreads)
    or in that rank's shard of a gradient alone: every rank refuses the step, and
    nothing changes anywhere; with on_nonfinite="skip" every rank skips it."""
    for source in ("loss", "shard"):
        for algorithm in ("SimGD", "Extragradient"):
            for mode in ("raise", "skip"):
                gen, disc = _modules()
                _shard(gen, disc)
                base = _losses(gen, disc)
                bad = rank == world - 1

                def losses(x, z, bad=bad, base=base):
                    lg, ld = base(x, z)
                    return (lg * float("nan"), ld) if bad and source == "loss" else (lg, ld)

                if bad and source == "shard":
                    next(iter(disc.parameters())).register_post_accumulate_grad_hook(_nan_in_this_shard)
                make = getattr(gameopt, algorithm)
                game = gameopt.Game([gen, disc], losses, algorithm=make(0.05), on_nonfinite=mode)
                before = [t.clone() for t in game.layout.data]
                x, z = _batches(1)[0]
                key = f"together/{source}/{algorithm}/{mode}"
                try:
                    game.step(x, z)
                    out[key] = f"stepped, skipped {game.skipped_steps}"
                except gameopt.NonFiniteError as err:
                    out[key] = "NonFiniteError: " + str(err)
                out[f"{key}/unchanged"] = all(torch.equal(a, b) for a, b in zip(before, game.layout.data))


def _hsdp(rank: int, world: int, out: dict) -> None:
    """Hybrid sharding (HSDP): shards within a pair of ranks, replicas across pairs;
    FSDP averages over all four, and the game agrees over all four."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    for name in ("SimGD", "Extragradient+Adam"):
        ref, ref_gen, ref_disc = _game(ALGORITHMS[name], sharded=False)
        gen, disc = _modules()
        for m in (gen, disc):
            for layer in m:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
        game = gameopt.Game([gen, disc], _losses(gen, disc), algorithm=ALGORITHMS[name]())
        out[f"hsdp/{name}"] = _largest_difference(game, ref, (gen, disc), (ref_gen, ref_disc), rank, world)


def _worker(rank: int, world: int, port: int) -> dict:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out: dict = {}
    try:
        for check in (_parity, _layout, _refusals, _together):
            check(rank, world, out)
        if world == 4:
            _hsdp(rank, world, out)
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_players(tmp_path, world) -> None:
    results = spawn(_worker, world, tmp_path)
    for r, res in enumerate(results):
        for name in [*ALGORITHMS, *SETS]:
            assert res[f"parity/{name}"] < 1e-9, (r, name, res[f"parity/{name}"])
            assert res[f"moved/{name}"] > 1e-3, (r, name)  # the steps did something
        assert all(res[f"inside/{name}"] for name in SETS), res
        assert res["active/SimGD+Box"], "the box did not bind"
        assert res["layout/params_are_views"] and res["layout/grads_are_views"]
        assert res["layout/write_reaches_module"] < 1e-12
        assert "Jacobian products" in res["refused/second_order"] and "sharded" in res["refused/second_order"]
        assert "HSDP" in res["refused/process_group"]
        assert "are not" in res["refused/mixed"] and "fully_shard every player" in res["refused/mixed"]
        assert "Ball" in res["refused/ball"] and "shard" in res["refused/ball"]
        assert "torch 2.6 or newer" in res["refused/old_torch"], res["refused/old_torch"]
        assert res["refused/unchanged"] == 0 and res["refused/then_trains"] > 1e-4, res
        assert res["refused/linearize"].startswith("RuntimeError") and "Jacobian products" in res["refused/linearize"]
        assert res["refused/deepcopy"].startswith("TypeError") and "checkpoint" in res["refused/deepcopy"]
        assert "game.state_dict()" in res["refused/optimizer_state_dict"] and res["sharded"]
        for source in ("loss", "shard"):
            for algorithm in ("SimGD", "Extragradient"):
                key = f"together/{source}/{algorithm}"
                assert res[f"{key}/raise/unchanged"] and res[f"{key}/skip/unchanged"], (r, key)
                assert res[f"{key}/raise"].startswith("NonFiniteError"), (r, key, res[f"{key}/raise"])
                assert res[f"{key}/skip"] == "stepped, skipped 1", (r, key, res[f"{key}/skip"])
        if world == 4:
            assert res["hsdp/SimGD"] < 1e-9 and res["hsdp/Extragradient+Adam"] < 1e-9, res
    # the ranks hold shards: together, every element once
    assert sum(res["layout/numel"] for res in results) >= sum(p.numel() for p in _modules()[0].parameters())
    assert len({res["layout/local_numel"] for res in results}) >= 1


# ------------------------------------------------------------------ failures
TIMEOUT = 3  # the process group's timeout in the failure tests (seconds)


def _failing_worker(mode: str):
    return functools.partial(_fail, mode)


def _fail(mode: str, rank: int, world: int, port: int) -> dict:
    """Rank 1 fails in its losses in the second step (raises, hangs past the timeout,
    or leaves the process); rank 0 reports when its step failed and with what, and
    both whether their shards are as the first step left them."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT)
    )
    gen, disc = _modules()
    _shard(gen, disc)
    base = _losses(gen, disc)
    second = [False]

    def losses(x, z):
        if rank == 1 and second[0]:
            if mode == "raise":
                raise RuntimeError("rank 1's data loader broke")
            if mode == "hang":
                time.sleep(TIMEOUT + 8)
            if mode == "leave":
                os._exit(0)
        return base(x, z)

    game = gameopt.Game([gen, disc], losses, algorithm=gameopt.Extragradient(0.05, update=gameopt.Adam()))
    x, z = _batches(1)[0]
    game.step(x, z)
    after_first = [t.clone() for t in game.layout.data]
    state = [t.clone() for t in gameopt.state.tensors_in(game.algorithm_state)]
    out: dict = {}
    second[0] = True
    t0 = time.monotonic()
    try:
        game.step(x, z)
        out["error"] = "the second step went through"
    except RuntimeError as err:
        out["message"] = str(err)
    out["seconds"] = time.monotonic() - t0
    out["unchanged"] = all(torch.equal(a, b) for a, b in zip(after_first, game.layout.data))
    out["state_unchanged"] = all(
        torch.equal(a, b) for a, b in zip(state, gameopt.state.tensors_in(game.algorithm_state))
    )
    return out


@pytest.mark.parametrize("mode", ["raise", "hang", "leave"])
def test_a_failing_rank_fails_every_rank_naming_it(tmp_path, mode) -> None:
    """A rank that raises, hangs or leaves inside a step: the other rank fails within
    the process group's timeout (and a short wait for word), naming it and its error,
    and no rank commits the step."""
    results = spawn(_failing_worker(mode), 2, tmp_path, timeout=60, may_leave=1)
    zero, one = results
    assert zero["unchanged"] and zero["state_unchanged"], zero
    assert zero["seconds"] < TIMEOUT + WORD_WAIT + 5, zero["seconds"]
    assert "rank 1" in zero["message"] and "Nothing was committed" in zero["message"], zero["message"]
    if mode == "raise":
        assert "rank 1's data loader broke" in zero["message"]
        assert one["message"] == "rank 1's data loader broke" and one["unchanged"] and one["state_unchanged"]
    elif mode == "hang":
        assert "did not answer" in zero["message"]
        # rank 0 (the store's host) may have left by the time rank 1 wakes
        assert "rank 1: a collective of step 1 could not finish: rank 0" in one["message"], one["message"]
        assert one["unchanged"] and one["state_unchanged"]
    else:
        assert "did not answer" in zero["message"] and one == {}
