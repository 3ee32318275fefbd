"""The README's demo: train a GAN on a ring of 8 Gaussians with several gameopt
algorithms, print a results table and write runs/demo/demo_ring.png with its
numbers in runs/demo/demo_ring.json.

    python -m experiments.demo [--steps 2000] [--seed 0] [--out runs/demo] [--workers 2]

The figure goes to ``--out`` (default ``runs/demo``, a git-ignored folder), so a run
never rewrites the committed ``figures/demo_ring.png``; ``python -m experiments.figures
--only demo`` writes that one (and ``figures/demo_ring.json``, which a test compares
with a short fresh run).

Every ``--eval-every`` steps the generator draws 2,500 samples from a fixed noise.
A sample is *high quality* when it lies within 3σ of a mode centre (σ = 0.05); a mode
is *covered* when it holds at least a quarter of its fair share (2,500 / 8) of the
samples, counting high-quality samples only. The figure shows both against steps,
for each algorithm, and the final samples. The runs are independent and go to
``--workers`` processes of one thread each.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

import gameopt
from gameopt_players.gan2d import Discriminator, Generator, gan_losses, mode_metrics, ring_modes, sample_mixture

STD, BATCH, LATENT, EVAL_SAMPLES = 0.05, 128, 16, 2500
STEPS, SEED, EVAL_EVERY = 2000, 0, 100  # the defaults, those of figures/demo_ring.png
ALGORITHMS = {
    "SimGD (SGD)": lambda: gameopt.SimGD(0.05),
    "Consensus (SGD)": lambda: gameopt.ConsensusOptimization(0.05, gamma=0.1),
    "Adam": lambda: gameopt.SimGD(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "Extra-Adam": lambda: gameopt.Extragradient(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "Optimistic Adam": lambda: gameopt.Optimistic(1e-3, update=gameopt.Adam((0.5, 0.9))),
    "SGA (Adam)": lambda: gameopt.SGA(1e-3, lam=1.0, update=gameopt.Adam((0.5, 0.9))),
}


def train(job: tuple[str, int, int, int]) -> dict[str, Any]:
    """One algorithm for ``steps`` steps, evaluated every ``every`` steps (and at step 0).

    Returns the curve (``step``, ``modes``, ``high_quality`` in %, ``mean_radius`` of the
    samples), the final samples and the training seconds. The evaluations draw their noise
    from a generator of their own, so they do not change the training run.
    """
    name, steps, seed, every = job
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
    noise = torch.randn(EVAL_SAMPLES, LATENT, generator=torch.Generator().manual_seed(10_007 + seed))
    curve: dict[str, list[float]] = {"step": [], "modes": [], "high_quality": [], "mean_radius": []}

    def evaluate(step: int) -> torch.Tensor:
        with torch.no_grad():
            samples = gen(noise)
        covered, quality = mode_metrics(samples, modes, STD)
        curve["step"].append(step)
        curve["modes"].append(covered)
        curve["high_quality"].append(quality)
        curve["mean_radius"].append(float(samples.norm(dim=1).mean()))
        return samples

    evaluate(0)
    elapsed = 0.0
    for step in range(1, steps + 1):
        x = sample_mixture(modes, BATCH, STD, data)
        z = torch.randn(BATCH, LATENT, generator=data)
        start = time.perf_counter()
        game.step(x, z)
        elapsed += time.perf_counter() - start
        if step % every == 0 or step == steps:
            samples = evaluate(step)
    return {"name": name, "curve": curve, "samples": samples.tolist(), "seconds": elapsed}


def plot(results: dict[str, dict[str, Any]], steps: int, seed: int, path: Path) -> None:
    """Curves over steps (top) and the final samples (bottom) in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ring_modes()
    n = len(results)
    fig = plt.figure(figsize=(max(2.3 * n, 9.0), 7.4))
    grid = fig.add_gridspec(2, 2 * n, height_ratios=[1.15, 1.0])
    ax_modes = fig.add_subplot(grid[0, :n])
    ax_quality = fig.add_subplot(grid[0, n:])
    markers = "osD^vP*X"
    # equal counts would hide each other: each algorithm's mode curve is shifted by a
    # small, fixed offset (at most ±0.2), said on the axis
    offsets = [0.08 * (i - (n - 1) / 2) for i in range(n)]
    for i, (name, res) in enumerate(results.items()):
        curve = res["curve"]
        style = {"marker": markers[i % len(markers)], "markevery": max(1, len(curve["step"]) // 10), "ms": 4}
        ax_modes.plot(curve["step"], [m + offsets[i] for m in curve["modes"]], lw=1.3, label=name, **style)
        ax_quality.plot(curve["step"], curve["high_quality"], lw=1.3, label=name, **style)
    ax_modes.set_ylim(-0.4, 8.6)
    ax_modes.set_yticks(range(9))
    ax_modes.set_ylabel("modes covered (of 8)\ncurves offset by ≤ ±0.2 to stay visible")
    ax_quality.set_ylim(0, 100)
    ax_quality.set_ylabel("high-quality samples (%)")
    for ax in (ax_modes, ax_quality):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax_quality.legend(fontsize=8, loc="lower right")
    for i, (name, res) in enumerate(results.items()):
        ax = fig.add_subplot(grid[1, 2 * i : 2 * i + 2])
        samples = torch.tensor(res["samples"])
        covered, quality = res["curve"]["modes"][-1], res["curve"]["high_quality"][-1]
        ax.scatter(samples[:, 0], samples[:, 1], s=2, alpha=0.3, label="generated", rasterized=True)
        ax.scatter(modes[:, 0], modes[:, 1], s=30, c="red", marker="x", label="mode centres")
        ax.set_title(f"{name}\n{covered}/8 modes, {quality:.0f}% HQ", fontsize=8)
        ax.set_xlim(-3, 3)
        ax.set_ylim(-3, 3)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"GAN on a ring of 8 Gaussians: {steps} steps, seed {seed}; final samples below")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="steps between evaluations (default 100)")
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default runs/demo)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    args = parser.parse_args(argv)
    if args.steps <= 0:
        parser.error("--steps must be positive")
    if args.eval_every <= 0:
        parser.error("--eval-every must be positive")
    if args.workers <= 0:
        parser.error("--workers must be positive")
    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    print(f"GAN on a ring of 8 Gaussians (σ={STD}), {args.steps} steps, seed {args.seed}")
    print(f"{'algorithm':<18}{'modes (of 8)':>14}{'high quality %':>16}{'time s':>9}")
    jobs = [(name, args.steps, args.seed, args.eval_every) for name in args.algorithms]
    with multiprocessing.get_context("spawn").Pool(min(args.workers, len(jobs))) as pool:
        for res in pool.imap(train, jobs):
            results[res["name"]] = res
            covered, quality = res["curve"]["modes"][-1], res["curve"]["high_quality"][-1]
            print(f"{res['name']:<18}{covered:>14}{quality:>16.1f}{res['seconds']:>9.1f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "demo_ring.png"
    plot(results, args.steps, args.seed, path)
    record = {
        "steps": args.steps,
        "seed": args.seed,
        "eval_every": args.eval_every,
        "std": STD,
        "batch": BATCH,
        "eval_samples": EVAL_SAMPLES,
        "torch": torch.__version__,
        "algorithms": {name: {"curve": res["curve"], "seconds": res["seconds"]} for name, res in results.items()},
    }
    (args.out / "demo_ring.json").write_text(json.dumps(record, indent=1) + "\n")
    seconds = time.perf_counter() - t0
    print(f"figure written to {path}, numbers to {args.out / 'demo_ring.json'} ({seconds:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
