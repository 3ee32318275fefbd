"""How a step's cost grows with the number of players and of parameters, and what
memory each algorithm uses.

* **players**: n = 2, 8, 32, 128, 256 small players sharing the same total number
  of parameters (each player two parameter tensors; a cyclic general-sum quadratic
  game, f_i = ½‖w_i‖² + ⟨a_i, b_{i+1}⟩). Each step is timed interleaved with the
  hand-fused plain ξ (one pruned ``backward`` per player, as in ``step_cost``);
  reported: the ratio and the overhead per step (step − k·ξ for a method with k
  evaluations of ξ per step, µs), with the least
  squares slope of the overhead against n (µs per player). Beside it, the same
  SimGD written the obvious way on unfused tensors (a per-parameter loop), and
  "vector math only" rows: a whole ``Game.step`` with the evaluation of the losses
  and their gradients left out (ξ stays in the buffers), its time in µs.
* **params**: the GAN MLP pair of ``step_cost`` widened to 10^4 … 10^7 parameters:
  ratio to the plain ξ per algorithm and the log-log slope of step time.
* **memory**: for 10^6 and 5·10^6 parameters (an elementwise two-player game, so
  that activations are small), every algorithm and its peer (``torch.optim`` SGD
  and Adam, cooper-optim's ExtraSGD and ExtraAdam), each in a fresh process with
  ``MALLOC_MMAP_THRESHOLD_`` fixed (freed tensors leave the resident set), in units
  of one parameter vector beyond the parameters and their gradients: the memory
  kept between warm steps (resident set after three warm steps; for gameopt also
  the vectors its storage holds, counted by storage) and the peak of a warm step
  (the highest of five, ``VmHWM`` after writing 5 to ``/proc/self/clear_refs``). The plain ξ's row
  is the evaluation alone.

    python3 -m benchmarks.scaling [--quick] [--only players|params|memory]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

import gameopt

from ._common import Result, base_parser, calibrate, compare, print_table, save_csv, setup
from .step_cost import BATCH, LATENT, Pair, gan_losses, hand_fuse, mlp

LR = 1e-3
ALGORITHMS: dict[str, Callable[[], gameopt.Algorithm]] = {
    "SimGD": lambda: gameopt.SimGD(LR),
    "Optimistic": lambda: gameopt.Optimistic(LR),
    "Extragradient": lambda: gameopt.Extragradient(LR),
    "SimGD+Adam": lambda: gameopt.SimGD(LR, update=gameopt.Adam()),
    "Extra-Adam": lambda: gameopt.Extragradient(LR, update=gameopt.Adam()),
}


# ----------------------------------------------------------------------- players
class Small(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(n) * 0.1)
        self.b = nn.Parameter(torch.randn(n) * 0.1)


def cyclic_losses(players: list[Small]) -> Callable[[], list[Tensor]]:
    n = len(players)

    def losses() -> list[Tensor]:
        return [
            0.5 * (p.a.square().sum() + p.b.square().sum()) + p.a @ players[(i + 1) % n].b
            for i, p in enumerate(players)
        ]

    return losses


def players_case(n: int, total: int, algorithm: str | None) -> Callable[[], object]:
    """A step of ``algorithm`` on n players, the plain ξ (``None``), or SimGD the
    obvious way (``"obvious"``)."""
    torch.manual_seed(0)
    mods = [Small(total // (2 * n)) for _ in range(n)]
    losses = cyclic_losses(mods)
    if algorithm is None or algorithm == "obvious":
        fused = [hand_fuse(m) for m in mods] if algorithm is None else []
        per = [list(m.parameters()) for m in mods]

        def xi() -> object:
            for _, grad, _ in fused:
                grad.zero_()
            ls = losses()
            if fused:
                for k, (loss, ps) in enumerate(zip(ls, per)):
                    torch.autograd.backward(loss, inputs=ps, retain_graph=k < n - 1)
                return None
            grads = [torch.autograd.grad(loss, ps, retain_graph=k < n - 1) for k, (loss, ps) in enumerate(zip(ls, per))]
            with torch.no_grad():
                for ps, gs in zip(per, grads):
                    for p, g in zip(ps, gs):
                        p.add_(g, alpha=-LR)
            return None

        return xi
    vector_math_only = algorithm.endswith(" (vector math only)")
    game = gameopt.Game(mods, losses, algorithm=ALGORITHMS[algorithm.removesuffix(" (vector math only)")]())
    if not vector_math_only:
        return game.step
    from gameopt import autodiff

    game.step()  # ξ in the gradient buffers once
    zeros = [torch.zeros(()) for _ in mods]

    def step() -> object:
        """Everything in Game.step but evaluating the losses and differentiating them."""
        real = autodiff.vector_field
        autodiff.vector_field = lambda *a, **k: zeros
        try:
            return game.step()
        finally:
            autodiff.vector_field = real

    return step


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def run_players(args, rounds: int, target: float) -> list[Result]:  # type: ignore[no-untyped-def]
    total = 2**15 if args.quick else 2**17
    counts = [2, 8, 32, 128, 256]
    names = [
        "SimGD",
        "Optimistic",
        "Extragradient",
        "obvious",
        "SimGD (vector math only)",
        "Optimistic (vector math only)",
    ]
    results = []
    for n in counts:
        xi = players_case(n, total, None)
        for name in names:
            fn = players_case(n, total, name)
            batch = calibrate(xi, fn, target_s=target)
            label = "ref: SimGD, per-param loop" if name == "obvious" else f"gameopt {name}"
            r = compare("players", label, "plain xi", xi, fn, rounds=rounds, batch=batch)
            evals = {"Extragradient": 2, "SimGD (vector math only)": 0, "Optimistic (vector math only)": 0}.get(name, 1)
            over = r.cand_us - evals * r.base_us
            r.extra = {"players": n, "params": total, "overhead_us": over}
            print(f"  n={n:4d} {label:28s} ratio {r.ratio:6.3f} overhead {over:8.1f} us", flush=True)
            results.append(r)
    print(f"\noverhead per step (step - its evaluations x plain xi) against players ({total} parameters in all):")
    for label in sorted({r.name for r in results}):
        rs = [r for r in results if r.name == label]
        ns, ov = [r.extra["players"] for r in rs], [r.extra["overhead_us"] for r in rs]
        cells = "  ".join(f"n={n}: {o:7.1f} us" for n, o in zip(ns, ov))
        print(f"  {label:28s} {cells}   slope {slope(ns, ov):6.2f} us/player")
    return results


# ------------------------------------------------------------------------ params
def widened_pair(params: int) -> Pair:
    """The mlp-2d pair with two hidden layers, as wide as needed for ~``params``."""
    per_net = params / 2
    width = max(4, int((-(LATENT + 4) + math.sqrt((LATENT + 4) ** 2 + 4 * per_net)) / 2))
    pair = Pair("mlp-2d")
    torch.manual_seed(0)
    pair.G = mlp([LATENT, width, width, 2], nn.ReLU)
    pair.D = mlp([2, width, width, 1], lambda: nn.LeakyReLU(0.2))
    pair.kind = f"mlp width {width}"
    return pair


def pair_case(pair: Pair, algorithm: str | None) -> Callable[[], object]:
    G, D = pair.fresh()
    if algorithm is None:
        (_, gg, gp), (_, dg, dp) = hand_fuse(G), hand_fuse(D)
        losses = gan_losses(G, D)

        def xi() -> object:
            gg.zero_()
            dg.zero_()
            lg, ld = losses(pair.x, pair.z)
            torch.autograd.backward(lg, inputs=gp, retain_graph=True)
            torch.autograd.backward(ld, inputs=dp)
            return None

        return xi
    game = gameopt.Game([G, D], gan_losses(G, D), algorithm=ALGORITHMS[algorithm]())
    return lambda: game.step(pair.x, pair.z)


def run_params(args, rounds: int, target: float) -> list[Result]:  # type: ignore[no-untyped-def]
    sizes = [10**4, 10**5, 10**6] if args.quick else [10**4, 10**5, 10**6, 10**7]
    results = []
    for size in sizes:
        pair = widened_pair(size)
        actual = sum(p.numel() for p in pair.G.parameters()) + sum(p.numel() for p in pair.D.parameters())
        xi = pair_case(pair, None)
        for name in ALGORITHMS:
            fn = pair_case(pair, name)
            batch = calibrate(xi, fn, target_s=target)
            r = compare("params", f"gameopt {name}", "plain xi", xi, fn, rounds=rounds, batch=batch)
            r.extra = {"params": actual, "model": f"{pair.kind}, batch {BATCH}"}
            print(f"  {actual:>9d} params  {name:14s} ratio {r.ratio:6.3f}  step {r.cand_us:10.1f} us", flush=True)
            results.append(r)
    print("\nlog-log slope of step time against parameters (1 = linear):")
    for name in ALGORITHMS:
        rs = [r for r in results if r.name == f"gameopt {name}"]
        s = slope([math.log(r.extra["params"]) for r in rs], [math.log(r.cand_us) for r in rs])
        sx = slope([math.log(r.extra["params"]) for r in rs], [math.log(r.base_us) for r in rs])
        print(f"  {name:14s} step {s:5.2f}   (plain xi {sx:5.2f})")
    return results


# ------------------------------------------------------------------------ memory
#: every algorithm of the memory table (first-order ones first), and the peers beside
MEMORY_ALGORITHMS: dict[str, Callable[[], gameopt.Algorithm]] = {
    "SimGD": lambda: gameopt.SimGD(LR),
    "AltGD": lambda: gameopt.AltGD(LR),
    "Extragradient": lambda: gameopt.Extragradient(LR),
    "Optimistic": lambda: gameopt.Optimistic(LR),
    "SimGD+Adam": lambda: gameopt.SimGD(LR, update=gameopt.Adam()),
    "Extra-Adam": lambda: gameopt.Extragradient(LR, update=gameopt.Adam()),
    "Optimistic-Adam": lambda: gameopt.Optimistic(LR, update=gameopt.Adam()),
    "Lookahead(SimGD+Adam)": lambda: gameopt.Lookahead(gameopt.SimGD(LR, update=gameopt.Adam())),
    "Lookahead(Extragradient)": lambda: gameopt.Lookahead(gameopt.Extragradient(LR)),
    "HamiltonianGD": lambda: gameopt.HamiltonianGD(LR),
    "Consensus": lambda: gameopt.ConsensusOptimization(LR),
    "SGA": lambda: gameopt.SGA(LR),
    "LA": lambda: gameopt.LA(LR),
    "LOLA": lambda: gameopt.LOLA(LR),
    "SOS": lambda: gameopt.SOS(LR),
    "CGD": lambda: gameopt.CGD(LR),
}
PEERS = {  # gameopt algorithm -> its peer (a torch.optim or cooper-optim optimizer)
    "SimGD": "torch SGD",
    "AltGD": "torch SGD",
    "SimGD+Adam": "torch Adam",
    "Extragradient": "cooper ExtraSGD",
    "Extra-Adam": "cooper ExtraAdam",
}
MMAP_THRESHOLD = 64 * 1024  # bytes: larger blocks are mmap'd, so a freed tensor leaves the process


def _status() -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(k + r":\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


def memory_probe(algorithm: str, size: int) -> dict[str, float]:
    """In this (fresh) process, in parameter vectors (4 bytes x ``size``) beyond the
    parameters and their gradients: the memory kept between warm steps (resident set
    after three warm steps) and the peak of the next five warm steps (``VmHWM``
    after writing 5 to ``/proc/self/clear_refs``); for gameopt also the vectors its storage
    holds (counted by storage, deterministic)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != str(MMAP_THRESHOLD):
        raise RuntimeError("run the probe with MALLOC_MMAP_THRESHOLD_ set (run_memory does)")
    if size > 1000:  # the same case on a tiny game first: imports and lazy setup are not counted
        memory_probe(algorithm, 1000)
    vec_bytes = size * 4
    start = _status()["VmRSS"]  # before any parameter exists
    torch.manual_seed(0)
    half = size // 2
    x, y = nn.Parameter(torch.randn(half) * 0.1), nn.Parameter(torch.randn(half) * 0.1)

    def losses() -> list[Tensor]:
        c = (x * y).sum()
        return [c + 0.5 * x.square().sum(), -c + 0.5 * y.square().sum()]

    def backward() -> None:  # each player's gradient of its own loss, as gameopt computes it
        for p in (x, y):
            p.grad.zero_()
        fx, fy = losses()
        torch.autograd.backward(fx, inputs=[x], retain_graph=True)
        torch.autograd.backward(fy, inputs=[y])

    game = None
    if algorithm in MEMORY_ALGORITHMS:
        players = [gameopt.Player([x], name="x"), gameopt.Player([y], name="y")]
        game = gameopt.Game(players, losses, algorithm=MEMORY_ALGORITHMS[algorithm]())
        step: Callable[[], object] = game.step
    else:
        x.grad, y.grad = torch.zeros_like(x), torch.zeros_like(y)
        step = _peer_step(algorithm, [x, y], backward)
    for _ in range(3):
        step()
    kept = _status()["VmRSS"] - start - 2 * vec_bytes
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set size
    for _ in range(5):  # the highest of five warm steps (Lookahead's k = 5: one synchronization)
        step()
    peak = _status()["VmHWM"] - start - 2 * vec_bytes
    out = {"kept": kept / vec_bytes, "peak": peak / vec_bytes}
    if game is not None:
        out["kept_storage"] = count_kept_vectors(game)
    return out


def _peer_step(name: str, params: list[Tensor], backward: Callable[[], None]) -> Callable[[], object]:
    if name == "plain xi":
        return backward
    if name in ("torch SGD", "torch Adam"):
        opt = torch.optim.SGD(params, lr=LR) if name == "torch SGD" else torch.optim.Adam(params, lr=LR)

        def step() -> None:
            backward()
            opt.step()

        return step
    import cooper

    extra = cooper.optim.ExtraSGD(params, lr=LR) if name == "cooper ExtraSGD" else cooper.optim.ExtraAdam(params, lr=LR)

    def extra_step() -> None:
        backward()
        extra.extrapolation()
        backward()
        extra.step()

    return extra_step


def count_kept_vectors(game: gameopt.Game) -> int:
    """Parameter-sized vectors the game holds between steps beyond parameters and
    gradients: its pool, the evaluation backup, and state vectors from elsewhere."""
    from gameopt.testing import held_storages

    return len(held_storages(game))


def run_memory(args) -> list[dict]:  # type: ignore[no-untyped-def]
    sizes = [10**6] if args.quick else [10**6, 5 * 10**6]
    names = ["plain xi", *MEMORY_ALGORITHMS, *dict.fromkeys(PEERS.values())]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    rows = []
    for size in sizes:
        for name in names:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.scaling", "--memory-probe", name, str(size)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            res = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"params": size, "algorithm": name, "peer": PEERS.get(name, ""), **res})
            stored = f"  (storage: {res['kept_storage']})" if "kept_storage" in res else ""
            line = f"kept {res['kept']:5.2f}{stored}  peak {res['peak']:5.2f}"
            print(f"  {size:>9d} params  {name:26s} {line}", flush=True)
    return rows


def memory_table(rows: list[dict]) -> str:
    """A markdown table: each algorithm with its peer's numbers beside."""
    by = {(r["params"], r["algorithm"]): r for r in rows}
    lines = [
        "| params | algorithm | kept (storage) | peak | peer | peer kept | peer peak |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["algorithm"] not in MEMORY_ALGORITHMS and r["algorithm"] != "plain xi":
            continue
        stored = f" ({r['kept_storage']})" if "kept_storage" in r else ""
        peer = by.get((r["params"], r["peer"]))
        theirs = f"{peer['kept']:.2f} | {peer['peak']:.2f}" if peer else " | "
        ours = f"{r['kept']:.2f}{stored} | {r['peak']:.2f}"
        lines.append(f"| {r['params']:.0e} | {r['algorithm']} | {ours} | {r['peer']} | {theirs} |")
    return "\n".join(lines)


def save_memory_csv(rows: list[dict], path: Path) -> None:
    fields = ["params", "algorithm", "kept", "kept_storage", "peak", "peer"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})


# -------------------------------------------------------------------------- main
def plot(players: list[Result], params: list[Result], memory: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    if players:
        ax = axes[0]
        for label in sorted({r.name for r in players}):
            rs = [r for r in players if r.name == label]
            ax.plot([r.extra["players"] for r in rs], [r.extra["overhead_us"] for r in rs], "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("players (same total parameters)")
        ax.set_ylabel("overhead per step: step − k·ξ (µs)")
        ax.legend(fontsize=8)
    if params:
        ax = axes[1]
        for label in sorted({r.name for r in params}):
            rs = [r for r in params if r.name == label]
            ax.plot([r.extra["params"] for r in rs], [r.ratio for r in rs], "o-", label=label)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("step time / plain ξ")
        ax.legend(fontsize=8)
    if memory:
        ax = axes[2]
        for name in dict.fromkeys(r["algorithm"] for r in memory):
            rs = [r for r in memory if r["algorithm"] == name]
            ax.plot([r["params"] for r in rs], [r["peak"] for r in rs], "o-", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("peak of a warm step beyond params + grads (vectors)")
        ax.legend(fontsize=8)
    fig.suptitle(f"gameopt scaling ({torch.get_num_threads()} threads)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["players", "params", "memory"], default=None)
    parser.add_argument("--memory-csv", default=None, help="file name of the memory table (in --out)")
    parser.add_argument("--memory-probe", nargs=2, metavar=("ALGORITHM", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe:
        torch.set_num_threads(1)
        print(json.dumps(memory_probe(args.memory_probe[0], int(args.memory_probe[1]))))
        return
    setup(args)
    rounds = args.rounds or (6 if args.quick else 15)
    target = 0.01 if args.quick else 0.03
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    players = run_players(args, rounds, target) if args.only in (None, "players") else []
    params = run_params(args, rounds, target) if args.only in (None, "params") else []
    memory = run_memory(args) if args.only in (None, "memory") else []
    if players or params:
        print_table(players + params, "step time / plain ξ (interleaved, median of per-round ratios)")
        save_csv(players + params, out / f"scaling{suffix}.csv")
    if memory:
        print("\nmemory beyond parameters and gradients, in parameter vectors (4 bytes x parameters):")
        print(memory_table(memory))
        save_memory_csv(memory, out / (args.memory_csv or f"memory{suffix}.csv"))
    if players or params:
        plot(players, params, memory, out / f"scaling{suffix}.png")
        print(f"wrote {out / f'scaling{suffix}.png'}")


if __name__ == "__main__":
    main()
