"""Step cost of this checkout against an earlier commit, interleaved in one process.

    python -m benchmarks.before_after --before REV [--methods SimGD,SGA] [--rounds 9] [--quick]

The package as it was at ``REV`` (``git archive``) is imported beside the working
tree's under another name; each method takes steps on the same two GAN pairs as
``benchmarks.step_cost`` (the MLP 4x256 and the deep narrow pair) with each
version, timed by the shared protocol (interleaved rounds, median of the per-round
ratios after / before). Both versions are checked to take the same first steps;
every 16 steps both go back to the starting point (many steps on one batch may
diverge, CGD on the deep narrow pair does).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from benchmarks._common import base_parser, calibrate, compare, setup
from benchmarks.second_order import zero_sum_f
from benchmarks.step_cost import ADAM_LR, LR, Pair, gan_losses

ROOT = Path(__file__).resolve().parent.parent

METHODS: dict[str, Callable[[ModuleType], object]] = {
    "SimGD": lambda g: g.SimGD(LR),
    "SimGD+Adam": lambda g: g.SimGD(ADAM_LR, update=g.Adam()),
    "Extragradient": lambda g: g.Extragradient(LR),
    "Extra-Adam": lambda g: g.Extragradient(ADAM_LR, update=g.Adam()),
    "Optimistic": lambda g: g.Optimistic(LR),
    "Consensus": lambda g: g.ConsensusOptimization(LR, gamma=0.1),
    "HamiltonianGD": lambda g: g.HamiltonianGD(LR),
    "SGA": lambda g: g.SGA(LR),
    "LOLA": lambda g: g.LOLA(LR, alpha=LR),
    "CGD (5 products)": lambda g: g.CGD(LR, tol=1e-30, maxiter=5),
}
#: on the zero-sum losses (−f, f) of ``benchmarks.second_order``, through the zero-sum path
ZERO_SUM_METHODS: dict[str, Callable[[ModuleType], object]] = {
    "HamiltonianGD zero-sum": lambda g: g.HamiltonianGD(LR, zero_sum=True),
    "Consensus zero-sum": lambda g: g.ConsensusOptimization(LR, gamma=0.1, zero_sum=True),
    "SGA zero-sum": lambda g: g.SGA(LR, zero_sum=True),
}
METHODS.update(ZERO_SUM_METHODS)


RESTART_EVERY = 16  # steps, on both sides alike


def load_before(rev: str, into: Path) -> ModuleType:
    """``gameopt`` as it was at ``rev``, imported as ``gameopt_before``."""
    archive = subprocess.run(["git", "archive", rev, "gameopt"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "gameopt").rename(into / "gameopt_before")
    sys.path.insert(0, str(into))
    return importlib.import_module("gameopt_before")


def stepper(package: ModuleType, pair: Pair, method: str) -> Callable[[], object]:
    G, D = pair.fresh()
    players = [package.Player(G, name="G"), package.Player(D, name="D")]
    losses = zero_sum_losses(G, D) if method in ZERO_SUM_METHODS else gan_losses(G, D)
    game = package.Game(players, losses, algorithm=METHODS[method](package))
    x, z = pair.x, pair.z
    params = [*G.parameters(), *D.parameters()]
    start = [p.detach().clone() for p in params]
    calls = [0]

    def step() -> object:
        calls[0] += 1
        if calls[0] % RESTART_EVERY == 0:  # back to the start: long runs on one batch may diverge
            with torch.no_grad():
                torch._foreach_copy_(params, start)
        return game.step(x, z)

    step.params = lambda: [p.detach().clone() for p in [*G.parameters(), *D.parameters()]]  # type: ignore[attr-defined]
    return step


def zero_sum_losses(G: torch.nn.Module, D: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], tuple]:
    def losses(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = zero_sum_f(G, D, x, z)
        return -f, f

    return losses


def same_steps(before: Callable[[], object], after: Callable[[], object]) -> bool:
    for _ in range(2):
        before()
        after()
    return all(torch.equal(a, b) for a, b in zip(before.params(), after.params()))  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="the commit to compare against (any git revision)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from: %(default)s")
    p.add_argument("--pairs", default="mlp-2d,deep-narrow")
    args = p.parse_args(argv)
    setup(args)
    rounds = args.rounds or (3 if args.quick else 9)
    target = 0.05 if args.quick else 0.3
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "gameopt"], cwd=ROOT, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        old = load_before(args.before, Path(tmp))
        import gameopt as new

        after_name = head.strip() + (" + uncommitted changes" if dirty.strip() else "")
        print(f"# step cost after/before, interleaved in one process (before: {args.before}; after: {after_name})")
        print(f"# {rounds} rounds, median [p25, p75] of per-round ratios; load: cores busy with other processes")
        for kind in args.pairs.split(","):
            pair = Pair(kind, seed=args.seed)
            for method in methods:
                before, after = stepper(old, pair, method), stepper(new, pair, method)
                equal = same_steps(before, after)
                batch = calibrate(before, after, target_s=target)
                r = compare(kind, method, "before", before, after, rounds=rounds, batch=batch)
                mark = "" if equal else "  (the iterates differ)"
                print(
                    f"{kind:12s} {method:18s} after/before {r.ratio:.3f} [{r.ratio_p25:.3f},{r.ratio_p75:.3f}] "
                    f"load {r.foreign_load:.2f}{mark}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
