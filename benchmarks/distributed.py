"""Data-parallel games on CPU (gloo): time per step with 1 and 2 ranks, and the
number of collectives per step, for several algorithms.

    python -m benchmarks.distributed [--quick]
    python -m benchmarks.distributed --sharded [--quick]    # players sharded with FSDP2
    python -m benchmarks.distributed --sharded --figure     # and figures/sharded_memory.{png,json}

Each configuration runs in fresh processes (torch.multiprocessing, loopback);
the whole batch is split across the ranks, so 2 ranks do the same work as 1.
On a 2-core machine each rank gets one core (torch.set_num_threads(1) in every
configuration, so 1 rank vs 2 ranks compares 1 core vs 2 cores).

``--sharded``: players sharded with FSDP2 (``fully_shard`` on each layer, then the
root), on 2 and 4 gloo ranks: a gameopt step against the same step in plain torch
on the same sharded modules, timed interleaved in the same processes (see
:func:`plain_grads` for how the plain step gets each player's gradient), and the
memory each rank holds for parameters, gradients and optimizer state on 1, 2 and 4
ranks (each case in fresh processes). With ``--figure`` the memory numbers also go
to ``figures/sharded_memory.png`` and ``.json``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

import gameopt

ALGORITHMS = {
    "SimGD": lambda: gameopt.SimGD(1e-3),
    "Extragradient": lambda: gameopt.Extragradient(1e-3),
    "Optimistic+Adam": lambda: gameopt.Optimistic(1e-4, update=gameopt.Adam()),
    "Consensus": lambda: gameopt.ConsensusOptimization(1e-3, gamma=0.1),
    "SGA": lambda: gameopt.SGA(1e-3),
    "CGD (10 products)": lambda: gameopt.CGD(1e-3, tol=1e-30, maxiter=10),
    "LOLA": lambda: gameopt.LOLA(1e-3, alpha=1e-3),
}


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _worker(rank: int, world: int, port: int, name: str, steps: int, batch: int, out: str) -> None:
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    gen, disc = _mlp([16, 128, 128, 128, 2]), _mlp([2, 128, 128, 128, 1])

    def losses(x, z):
        r, f = disc(x), disc(gen(z))
        d = nn.functional.softplus(-r).mean() + nn.functional.softplus(f).mean()
        return nn.functional.softplus(-f).mean(), d

    group = dist.group.WORLD if world > 1 else None
    game = gameopt.Game([gen, disc], losses, algorithm=ALGORITHMS[name](), process_group=group)
    g = torch.Generator().manual_seed(1)
    x, z = torch.randn(batch, 2, generator=g), torch.randn(batch, 16, generator=g)
    x, z = x[rank::world], z[rank::world]
    calls = {"n": 0}
    real = torch.distributed.all_reduce

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    torch.distributed.all_reduce = counting
    for _ in range(3):
        game.step(x, z)
    calls["n"] = 0
    times = []
    for _ in range(steps):
        if world > 1:
            dist.barrier()
        t = time.perf_counter()
        game.step(x, z)
        times.append(time.perf_counter() - t)
    torch.distributed.all_reduce = real
    if rank == 0:
        Path(out).write_text(json.dumps({"median_s": statistics.median(times), "collectives": calls["n"] / steps}))
    if world > 1:
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(name: str, world: int, steps: int, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        mp.spawn(_worker, args=(world, _port(), name, steps, batch, out), nprocs=world)
        return json.loads(Path(out).read_text())


# ----------------------------------------------------------------- sharded players
LATENT = 16


def _gan_losses(gen: nn.Module, disc: nn.Module) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The non-saturating GAN's losses (one forward of each network) for a game."""

    def losses(x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        r, f = disc(x), disc(gen(z))
        return nn.functional.softplus(-f).mean(), nn.functional.softplus(-r).mean() + nn.functional.softplus(f).mean()

    return losses


#: name → (gameopt algorithm, the plain torch.optim optimizer over a parameter list, extragradient?)
SHARDED: dict[str, tuple[Callable[[], gameopt.Algorithm], Callable[[list[Tensor]], torch.optim.Optimizer], bool]] = {
    "SimGD": (lambda: gameopt.SimGD(1e-3), lambda ps: torch.optim.SGD(ps, lr=1e-3), False),
    "SimGD+Adam": (
        lambda: gameopt.SimGD(1e-4, update=gameopt.Adam()),
        lambda ps: torch.optim.Adam(ps, lr=1e-4),
        False,
    ),
    "Extragradient": (lambda: gameopt.Extragradient(1e-3), lambda ps: torch.optim.SGD(ps, lr=1e-3), True),
}


def sharded_pair(hidden: int, depth: int, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A generator and a discriminator (MLPs of ``depth`` hidden layers of ``hidden``),
    each sharded with ``fully_shard``: every linear layer, then the root."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    gen, disc = _mlp([LATENT, *[hidden] * depth, 2]), _mlp([2, *[hidden] * depth, 1])
    for module in (gen, disc):
        for layer in module:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(module)
    return gen, disc


def plain_grads(gen: nn.Module, disc: nn.Module, x: Tensor, z: Tensor) -> None:
    """Each player's gradient of its own loss, in plain torch on the FSDP-sharded
    modules, from one forward of each network (as gameopt's ξ): the discriminator sees
    the fake batch detached, so its loss reaches the discriminator only; the
    generator's loss is taken back to the fake batch with ``autograd.grad`` (through
    the discriminator, whose weights get nothing) and from there into the generator
    with ``fake.backward``. FSDP's hooks all-gather and reduce-scatter as in any
    ``loss.backward()``. (The textbook alternative, a second forward of the
    discriminator on the fake batch with its parameters frozen, costs one more
    forward.)"""
    softplus = nn.functional.softplus
    fake = gen(z)
    seen = fake.detach().requires_grad_()
    r, f = disc(x), disc(seen)
    g_loss, d_loss = softplus(-f).mean(), softplus(-r).mean() + softplus(f).mean()
    (g_fake,) = torch.autograd.grad(g_loss, seen, retain_graph=True)
    d_loss.backward()
    fake.backward(g_fake)


class PlainStep:
    """The step of :data:`SHARDED`'s algorithm written in plain torch: :func:`plain_grads`
    and a ``torch.optim`` optimizer over the ``DTensor`` parameters; extragradient
    as cooper's ExtraSGD does it (a step from a copy of the point, the gradient
    there, then back to the copy and the step)."""

    def __init__(self, gen: nn.Module, disc: nn.Module, name: str) -> None:
        self.gen, self.disc = gen, disc
        self.params = [*gen.parameters(), *disc.parameters()]
        _, make_opt, self.extra = SHARDED[name]
        self.opt = make_opt(self.params)

    def __call__(self, x: Tensor, z: Tensor) -> None:
        self.opt.zero_grad()
        plain_grads(self.gen, self.disc, x, z)
        if self.extra:
            with torch.no_grad():
                start = [p.detach().clone() for p in self.params]
            self.opt.step()
            self.opt.zero_grad()
            plain_grads(self.gen, self.disc, x, z)
            with torch.no_grad():
                for p, s in zip(self.params, start):
                    p.copy_(s)
        self.opt.step()


def _full(modules: tuple[nn.Module, ...]) -> list[Tensor]:
    return [p.full_tensor().detach() for m in modules for p in m.parameters()]  # type: ignore[operator]


def _sharded_timing_worker(rank: int, world: int, port: int, cfg: dict, out: str) -> None:
    import gc

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(1)
        x, z = torch.randn(cfg["batch"], 2, generator=g), torch.randn(cfg["batch"], LATENT, generator=g)
        x, z = x[rank::world], z[rank::world]
        results = {}
        for name in cfg["algorithms"]:
            gen, disc = sharded_pair(cfg["hidden"], cfg["depth"])
            game = gameopt.Game([gen, disc], _gan_losses(gen, disc), algorithm=SHARDED[name][0]())
            pgen, pdisc = sharded_pair(cfg["hidden"], cfg["depth"])
            plain = PlainStep(pgen, pdisc, name)

            ours, ref = functools.partial(game.step, x, z), functools.partial(plain, x, z)
            for _ in range(3):
                ours()
                ref()
            ours_p, ref_p = _full((gen, disc)), _full((pgen, pdisc))
            diff = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(ours_p, ref_p))
            tb: list[float] = []
            tc: list[float] = []
            gc.collect()
            gc.disable()
            for r in range(cfg["rounds"]):
                order = ((ref, tb), (ours, tc)) if r % 2 == 0 else ((ours, tc), (ref, tb))
                for fn, times in order:
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(cfg["steps"]):
                        fn()
                    times.append((time.perf_counter() - t0) / cfg["steps"])
            gc.enable()
            ratios = [c / b for b, c in zip(tb, tc)]
            numel = sum(p.numel() for p in gen.parameters()), sum(p.numel() for p in disc.parameters())
            results[name] = {
                "gameopt_ms": statistics.median(tc) * 1e3,
                "plain_ms": statistics.median(tb) * 1e3,
                "ratio": statistics.median(ratios),
                "ratio_p25": float(torch.tensor(ratios).quantile(0.25)),
                "ratio_p75": float(torch.tensor(ratios).quantile(0.75)),
                "max_rel_diff": diff,
                "params_per_player": numel,
            }
            del game, plain, ours, ref
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


MMAP_THRESHOLD = 64 * 1024  # bytes: larger blocks are mmap'd, so a freed tensor leaves the process


def _vm(key: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def held_bytes() -> int:
    """Bytes of the distinct tensor storages this process's Python objects hold (a
    ``DTensor``'s through its local tensor), found by walking the garbage collector's
    objects: measured, not computed from the model's sizes."""
    import gc

    from gameopt.sharded import is_sharded

    storages: dict[int, int] = {}
    for obj in gc.get_objects():  # (type(), not isinstance: some module objects warn on __class__)
        if issubclass(type(obj), Tensor) and not is_sharded(obj) and obj.device.type == "cpu":
            try:
                st = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
    return sum(storages.values())


def _memory_case(name: str, side: str, hidden: int, depth: int, x: Tensor, z: Tensor) -> tuple[Callable, tuple]:
    gen, disc = sharded_pair(hidden, depth)
    if side == "gameopt":
        game = gameopt.Game([gen, disc], _gan_losses(gen, disc), algorithm=SHARDED[name][0]())
        return (lambda: game.step(x, z)), (gen, disc, game)
    plain = PlainStep(gen, disc, name)
    return (lambda: plain(x, z)), (gen, disc, plain)


def _sharded_memory_worker(rank: int, world: int, port: int, cfg: dict, out: str) -> None:
    """Per rank, beyond what the process held before the model was built: the tensor
    storages held between warm steps (:func:`held_bytes`), the resident set kept
    (``VmRSS``), and the peak resident set of warm steps (``VmHWM`` after writing 5 to
    ``/proc/self/clear_refs``)."""
    import gc

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(1)
        x, z = torch.randn(cfg["batch"], 2, generator=g), torch.randn(cfg["batch"], LATENT, generator=g)
        x, z = x[rank::world], z[rank::world]
        name, side = cfg["algorithm"], cfg["side"]
        step, keep = _memory_case(name, side, 8, cfg["depth"], x, z)  # imports and lazy setup are not counted
        for _ in range(3):
            step()
        del step, keep
        gc.collect()
        rss0, held0 = _vm("VmRSS"), held_bytes()
        step, keep = _memory_case(name, side, cfg["hidden"], cfg["depth"], x, z)
        for _ in range(3):
            step()
        gc.collect()
        res = {"held": held_bytes() - held0, "kept": _vm("VmRSS") - rss0}
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set size
        for _ in range(3):
            step()
        res["peak"] = _vm("VmHWM") - rss0
        res["param_bytes"] = sum(
            p._local_tensor.numel() * p.element_size()  # type: ignore[attr-defined]
            for m in keep[:2]
            for p in m.parameters()
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))


def _exiting(rank: int, worker: Callable, world: int, port: int, cfg: dict, out: str) -> None:
    """Run ``worker``, then leave without the interpreter's teardown: under load,
    gloo's threads sometimes abort there (SIGABRT) after everything finished."""
    try:
        worker(rank, world, port, cfg, out)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _spawn(worker: Callable, world: int, cfg: dict, out: str) -> None:
    mp.spawn(_exiting, args=(worker, world, _port(), cfg, out), nprocs=world)


def sharded_timing(world: int, cfg: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        _spawn(_sharded_timing_worker, world, cfg, out)
        return json.loads(Path(out).read_text())


def sharded_memory(world: int, cfg: dict) -> dict:
    """The largest of the ranks' numbers (MiB), in fresh processes with
    ``MALLOC_MMAP_THRESHOLD_`` fixed, so that freed tensors leave the resident set."""
    import os

    before = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)  # the spawned ranks' allocator reads it
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _spawn(_sharded_memory_worker, world, cfg, tmp)
            ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    finally:
        if before is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = before
    return {k: max(r[k] for r in ranks) / 2**20 for k in ranks[0]}


def run_sharded(args: argparse.Namespace) -> int:
    if args.quick:
        timing = {"hidden": 64, "depth": 2, "batch": 64, "steps": 2, "rounds": 4, "algorithms": ["SimGD"]}
        worlds, memory = (2,), {"hidden": 64, "depth": 2, "batch": 32}
        mem_worlds, mem_algorithms = (1, 2), ["SimGD+Adam"]
    else:
        timing = {"hidden": 384, "depth": 3, "batch": 256, "steps": 5, "rounds": 12, "algorithms": list(SHARDED)}
        worlds, memory = (2, 4), {"hidden": 1024, "depth": 3, "batch": 64}
        mem_worlds, mem_algorithms = (1, 2, 4), ["SimGD", "SimGD+Adam"]
    rows = []
    h, d = timing["hidden"], timing["depth"]
    print(
        f"GAN MLPs {d}x{h} sharded with fully_shard (layers, then root), batch {timing['batch']} split across "
        f"ranks, gloo on loopback, 1 thread per rank, {timing['rounds']} interleaved rounds of {timing['steps']} steps"
    )
    print(f"{'algorithm':<16}{'ranks':>6}{'gameopt ms':>12}{'plain ms':>10}{'ratio':>8}{'IQR':>16}{'max rel diff':>14}")
    for world in worlds:
        res = sharded_timing(world, timing)
        for name, r in res.items():
            iqr = f"[{r['ratio_p25']:.3f}, {r['ratio_p75']:.3f}]"
            print(
                f"{name:<16}{world:>6}{r['gameopt_ms']:>12.2f}{r['plain_ms']:>10.2f}{r['ratio']:>8.3f}{iqr:>16}"
                f"{r['max_rel_diff']:>14.1e}",
                flush=True,
            )
            rows.append({"algorithm": name, "ranks": world, **{k: v for k, v in r.items() if k != "params_per_player"}})
    print(f"(parameters per player: {res[name]['params_per_player']})")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "distributed_sharded.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    mh, md = memory["hidden"], memory["depth"]
    print(f"\nMemory per rank (MiB, the largest rank's), GAN MLPs {md}x{mh}, beyond the process before the model:")
    print(f"{'algorithm':<12}{'side':<9}{'ranks':>6}{'params':>9}{'held':>9}{'RSS kept':>10}{'RSS peak':>10}")
    mem_rows = []
    for name in mem_algorithms:
        for world in mem_worlds:
            for side in ("gameopt", "plain"):
                m = sharded_memory(world, {**memory, "algorithm": name, "side": side})
                mem_rows.append({"algorithm": name, "side": side, "ranks": world, **m})
                print(
                    f"{name:<12}{side:<9}{world:>6}{m['param_bytes']:>9.2f}{m['held']:>9.2f}{m['kept']:>10.2f}"
                    f"{m['peak']:>10.2f}",
                    flush=True,
                )
    with open(args.out / "distributed_sharded_memory.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(mem_rows[0]))
        writer.writeheader()
        writer.writerows(mem_rows)
    if args.figure:
        memory_figure(mem_rows, {**memory, "timing": rows})
    return 0


def memory_figure(rows: list[dict], config: dict) -> list[str]:
    """``figures/sharded_memory.png`` and ``.json``: memory per rank against the number of ranks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = Path(__file__).resolve().parent.parent / "figures"
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    fig, axes = plt.subplots(1, len(algorithms), figsize=(5.2 * len(algorithms), 4.2), squeeze=False)
    for ax, name in zip(axes[0], algorithms):
        for side, color in (("gameopt", "tab:blue"), ("plain", "tab:orange")):
            rs = [r for r in rows if r["algorithm"] == name and r["side"] == side]
            worlds = [r["ranks"] for r in rs]
            label = "gameopt" if side == "gameopt" else "plain torch (torch.optim)"
            marker, size = ("o", 9) if side == "gameopt" else ("x", 7)  # the held lines coincide: both visible
            ax.plot(worlds, [r["held"] for r in rs], marker + "-", ms=size, color=color, mfc="none" if side == "gameopt"
                    else color, label=f"{label}: held between steps")  # fmt: skip
            ax.plot(worlds, [r["peak"] for r in rs], "s--", color=color, alpha=0.7, label=f"{label}: peak (RSS)")
        first = next(r for r in rows if r["algorithm"] == name and r["side"] == "plain" and r["ranks"] == 1)
        worlds = sorted({r["ranks"] for r in rows})
        ax.plot(worlds, [first["held"] / w for w in worlds], ":", color="gray", label="plain held at 1 rank / ranks")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(worlds, [str(w) for w in worlds])
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        for r in rows:
            if r["algorithm"] == name and r["side"] == "gameopt":
                ax.annotate(f"{r['held']:.1f}", (r["ranks"], r["held"]), textcoords="offset points", xytext=(6, -12),
                            fontsize=7, color="tab:blue")  # fmt: skip
        ax.set_xlabel("ranks (gloo, CPU)")
        ax.set_ylabel("MiB per rank (largest rank)")
        ax.set_title(f"{name}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"Players sharded with fully_shard: memory per rank, parameters + gradients + optimizer state "
        f"(GAN MLPs {config['depth']}x{config['hidden']}, the largest rank's)\nheld: the tensor storages kept "
        "between steps (parameters, gradients, optimizer state); peak: the resident set's high-water mark in a step",
        fontsize=10,
    )
    fig.tight_layout()
    png, js = figures / "sharded_memory.png", figures / "sharded_memory.json"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    payload = {
        "made_by": "python -m benchmarks.distributed --sharded --figure",
        "units": "MiB per rank, the largest rank's",
        "config": config,
        "rows": rows,
        "torch": torch.__version__,
    }
    js.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {png} and {js}")
    return [str(png), str(js)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--sharded", action="store_true", help="players sharded with FSDP2 against plain torch")
    p.add_argument("--figure", action="store_true", help="with --sharded: write figures/sharded_memory.png and .json")
    args = p.parse_args(argv)
    if args.sharded:
        return run_sharded(args)
    steps, batch, rounds = (5, 512, 1) if args.quick else (20, 2048, 3)
    rows = []
    print(f"GAN MLP 3x128, batch {batch} split across ranks, gloo on loopback, 1 thread per rank")
    print(f"{'algorithm':<20}{'1 rank ms':>11}{'2 ranks ms':>12}{'speed-up':>10}{'collectives/step':>18}")
    for name in ALGORITHMS:
        one, two = [], []
        for _ in range(rounds):  # interleaved: 1 rank, 2 ranks, 1 rank, ...
            one.append(measure(name, 1, steps, batch)["median_s"])
            r2 = measure(name, 2, steps, batch)
            two.append(r2["median_s"])
        a, b = statistics.median(one), statistics.median(two)
        rows.append(
            {
                "algorithm": name,
                "1 rank ms": a * 1e3,
                "2 ranks ms": b * 1e3,
                "speed-up": a / b,
                "collectives/step": r2["collectives"],
            }
        )
        print(f"{name:<20}{a * 1e3:>11.2f}{b * 1e3:>12.2f}{a / b:>10.2f}{r2['collectives']:>18.1f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "distributed.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
