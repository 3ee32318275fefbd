"""Data-parallel games on CPU (gloo): time per step with 1 and 2 ranks, and the
number of collectives per step, for several algorithms.

    python -m benchmarks.distributed [--quick]

Each configuration runs in fresh processes (torch.multiprocessing, loopback);
the whole batch is split across the ranks, so 2 ranks do the same work as 1.
On a 2-core machine each rank gets one core (torch.set_num_threads(1) in every
configuration, so 1 rank vs 2 ranks compares 1 core vs 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
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
