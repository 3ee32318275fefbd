"""The README's demo: train a GAN on a ring of 8 Gaussians with several gameopt
algorithms, print a results table and write a figure.

    python -m experiments.demo [--steps 1500] [--out figures]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import gameopt
from players.gan2d import Discriminator, Generator, gan_losses, mode_metrics, ring_modes, sample_mixture

STD = 0.05
ALGORITHMS = {
    "SimGD": lambda: gameopt.SimGD(0.05),
    "AltGD": lambda: gameopt.AltGD(0.05),
    "Extragradient": lambda: gameopt.Extragradient(0.05),
    "Optimistic": lambda: gameopt.Optimistic(0.05),
    "SimGD+Adam": lambda: gameopt.SimGD(2e-3, update=gameopt.Adam((0.5, 0.9))),
    "ExtraAdam": lambda: gameopt.Extragradient(2e-3, update=gameopt.Adam((0.5, 0.9))),
}


def train(name: str, steps: int, seed: int) -> tuple[torch.Tensor, int, float, float]:
    torch.manual_seed(seed)
    gen, disc = Generator(), Discriminator()
    game = gameopt.Game(
        [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
        lambda x, z: gan_losses(gen, disc, x, z),
        algorithm=ALGORITHMS[name](),
    )
    modes = ring_modes()
    data = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        x = sample_mixture(modes, 128, STD, data)
        z = torch.randn(128, 2, generator=data)
        game.step(x, z)
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        samples = gen(torch.randn(2000, 2, generator=data))
    covered, quality = mode_metrics(samples, modes, STD)
    return samples, covered, quality, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("figures"))
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    args = parser.parse_args(argv)
    if args.steps <= 0:
        parser.error("--steps must be positive")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    results = {}
    print(f"{'algorithm':<15}{'modes (of 8)':>14}{'high quality %':>16}{'time s':>9}")
    for name in args.algorithms:
        samples, covered, quality, elapsed = train(name, args.steps, args.seed)
        results[name] = samples
        print(f"{name:<15}{covered:>14}{quality:>16.1f}{elapsed:>9.1f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ring_modes()
    fig, axes = plt.subplots(1, len(results), figsize=(3 * len(results), 3.2), squeeze=False)
    for ax, (name, samples) in zip(axes[0], results.items()):
        ax.scatter(samples[:, 0], samples[:, 1], s=2, alpha=0.4, label="generated")
        ax.scatter(modes[:, 0], modes[:, 1], s=30, c="red", marker="x", label="modes")
        ax.set_title(name)
        ax.set_xlabel("x₁")
        ax.set_ylabel("x₂")
        ax.set_xlim(-3, 3)
        ax.set_ylim(-3, 3)
    axes[0][0].legend(loc="lower left", fontsize=7)
    fig.suptitle(f"8-Gaussian ring GAN after {args.steps} steps")
    fig.tight_layout()
    path = args.out / "demo_ring.png"
    fig.savefig(path, dpi=110)
    print(f"figure written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
