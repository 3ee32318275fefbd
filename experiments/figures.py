"""Regenerate every figure in figures/ from scratch (about 15 minutes on 2 CPU cores).

python -m experiments.figures [--only bilinear dirac_gan ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

EXPERIMENTS = [
    "bilinear",
    "dirac_gan",
    "n_player",
    "opponent_shaping",
    "spectrum",
    "matrix_games",
    "constrained_learning",
    "anchored",
    "follow_the_ridge",
    "stackelberg",
    "mixture_gan",
    "digits_gan",
    "demo",
]


#: where the figures' numbers were made: a fresh run reproduces them there
#: (tests/e2e/test_figures_current.py); another torch or vector unit rounds otherwise
MADE_WITH = Path(__file__).resolve().parent.parent / "figures" / "made_with.json"


def platform() -> dict[str, str]:
    """The torch version and the CPU kernels' vector unit that a run's numbers depend on."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=EXPERIMENTS)
    args = p.parse_args(argv)
    total = time.perf_counter()
    for name in args.only:
        start = time.perf_counter()
        module = importlib.import_module(f"experiments.{name}")
        if name == "demo":  # the README's demo: figures/demo_ring.png and its numbers
            module.main(["--out", "figures"])
            paths = ["figures/demo_ring.png", "figures/demo_ring.json"]
        else:
            paths = module.make_figures(quiet=True)
        print(f"{name:<18}{time.perf_counter() - start:7.1f} s   {', '.join(str(p) for p in paths)}", flush=True)
    MADE_WITH.write_text(json.dumps(platform(), indent=2) + "\n")
    print(f"{'all':<18}{time.perf_counter() - total:7.1f} s   {MADE_WITH.name}: {platform()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
