"""The README's demo: train a GAN on a ring of 8 Gaussians with several gameopt
algorithms, print a results table and write runs/demo/demo_ring.png.

    python -m experiments.demo [--steps 2000] [--seed 0] [--out runs/demo] [--workers 2]

The figure goes to ``--out`` (default ``runs/demo``, a git-ignored folder), so a run
never rewrites the committed ``figures/demo_ring.png``.

A mode is covered when it holds at least a quarter of its fair share of the
high-quality samples; a sample is high quality within 3σ of a mode centre. The
runs are independent and go to ``--workers`` processes of one thread each.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch

import gameopt
from gameopt_players.gan2d import Discriminator, Generator, gan_losses, mode_metrics, ring_modes, sample_mixture

STD, BATCH, LATENT = 0.05, 128, 16
ALGORITHMS = {
    "SimGD (SGD)": lambda: gameopt.SimGD(0.05),
    "Consensus (SGD)": lambda: gameopt.ConsensusOptimization(0.05, gamma=0.1),
    "Adam": lambda: gameopt.SimGD(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "Extra-Adam": lambda: gameopt.Extragradient(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "Optimistic Adam": lambda: gameopt.Optimistic(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "SGA (Adam)": lambda: gameopt.SGA(1e-3, lam=1.0, update=gameopt.Adam((0.5, 0.9))),
}


def train(job: tuple[str, int, int]) -> tuple[str, list[list[float]], int, float, float]:
    """One algorithm: (name, samples from a fixed noise, modes covered, high-quality %, seconds)."""
    name, steps, seed = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = Generator(latent=LATENT, hidden=128, depth=3, act="tanh")
    disc = Discriminator(hidden=128, depth=3, act="tanh")
    game = gameopt.Game(
        [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
        lambda x, z: gan_losses(gen, disc, x, z),
        algorithm=ALGORITHMS[name](),
        on_nonfinite="skip",
    )
    modes = ring_modes()
    data = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        x = sample_mixture(modes, BATCH, STD, data)
        z = torch.randn(BATCH, LATENT, generator=data)
        game.step(x, z)
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        samples = gen(torch.randn(2500, LATENT, generator=torch.Generator().manual_seed(10_007 + seed)))
    covered, quality = mode_metrics(samples, modes, STD)
    return name, samples.tolist(), covered, quality, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default runs/demo)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    args = parser.parse_args(argv)
    if args.steps <= 0:
        parser.error("--steps must be positive")
    if args.workers <= 0:
        parser.error("--workers must be positive")
    t0 = time.perf_counter()
    results: dict[str, tuple[torch.Tensor, int, float]] = {}
    print(f"GAN on a ring of 8 Gaussians (σ={STD}), {args.steps} steps, seed {args.seed}")
    print(f"{'algorithm':<18}{'modes (of 8)':>14}{'high quality %':>16}{'time s':>9}")
    jobs = [(name, args.steps, args.seed) for name in args.algorithms]
    with multiprocessing.get_context("spawn").Pool(min(args.workers, len(jobs))) as pool:
        for name, samples, covered, quality, elapsed in pool.imap(train, jobs):
            results[name] = (torch.tensor(samples), covered, quality)
            print(f"{name:<18}{covered:>14}{quality:>16.1f}{elapsed:>9.1f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ring_modes()
    cols = min(3, len(results))
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[len(results) :]:
        ax.set_visible(False)
    for ax, (name, (samples, covered, quality)) in zip(axes.flat, results.items()):
        ax.scatter(samples[:, 0], samples[:, 1], s=2, alpha=0.3, label="generated", rasterized=True)
        ax.scatter(modes[:, 0], modes[:, 1], s=40, c="red", marker="x", label="mode centres")
        ax.set_title(f"{name}\n{covered}/8 modes, {quality:.0f}% high quality", fontsize=9)
        ax.set_xlabel("x₁")
        ax.set_ylabel("x₂")
        ax.set_xlim(-3, 3)
        ax.set_ylim(-3, 3)
        ax.set_aspect("equal")
    legend = axes[0][0].legend(loc="lower left", fontsize=7)
    for handle in legend.legend_handles:
        handle.set_sizes([20])
        handle.set_alpha(1)
    fig.suptitle(f"8-Gaussian ring GAN after {args.steps} steps (seed {args.seed})")
    fig.tight_layout()
    path = args.out / "demo_ring.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"figure written to {path} ({time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
