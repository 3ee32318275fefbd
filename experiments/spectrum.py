"""The spectrum of the game Jacobian while a small GAN trains on a ring of 4
Gaussians (σ = 0.2) (players/gan2d.py). The networks are small (two hidden layers of 8
units, 219 parameters in all, float64) so that gameopt.diagnostics.eigenvalues
forms J column by column and returns every eigenvalue exactly. Eigenvalues with
a positive real part attract, imaginary parts rotate (Mescheder et al. 2017,
"The Numerics of GANs"; Balduzzi et al. 2018). Every ``--log-every`` steps the
run also logs ‖ξ‖ and the split of J along ξ into its potential part
⟨ξ, Sξ⟩/‖ξ‖² and its rotation ‖Aξ‖/‖ξ‖ (S, A: symmetric and antisymmetric parts
of J; gameopt.diagnostics.decompose), all at a fixed evaluation batch.

python -m experiments.spectrum --algorithm adam --lr 0.01 --steps 1000
python -m experiments.spectrum --figures      # regenerate figures/spectrum.png
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch

import gameopt
from experiments.common import (
    Run,
    UsageError,
    algorithm_from_args,
    building_game,
    check_args,
    main_guard,
    one_thread,
    parser,
    run_config,
    save_figure,
)
from gameopt.diagnostics import decompose, eigenvalues
from gameopt_players.gan2d import Discriminator, Generator, gan_losses, mode_metrics, ring_modes, sample_mixture

HIDDEN, DEPTH, BATCH, EVAL_BATCH, STD, N_MODES = 8, 2, 128, 256, 0.2, 4


def build(algorithm: gameopt.Algorithm, seed: int, hidden: int = HIDDEN):
    torch.manual_seed(seed)
    gen = Generator(latent=2, hidden=hidden, depth=DEPTH).double()
    disc = Discriminator(hidden=hidden, depth=DEPTH).double()
    game = gameopt.Game(
        [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
        lambda x, z: gan_losses(gen, disc, x, z),
        algorithm=algorithm,
    )
    return game, gen, disc


def eval_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch every diagnostic is computed on."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x = sample_mixture(ring_modes(N_MODES), EVAL_BATCH, STD, g).double()
    return x, torch.randn(EVAL_BATCH, 2, generator=g, dtype=torch.float64)


def spectrum_steps(steps: int, count: int = 5) -> list[int]:
    """``count`` training points (after 0 .. ``steps`` steps), denser early on."""
    pts = {0, steps}
    for k in range(1, count - 1):
        pts.add(round(steps * (k / (count - 1)) ** 2))
    return sorted(pts)


def train(args_like, run: Run | None = None) -> dict:
    """Train; log diagnostics every ``log_every`` steps and the full spectrum at
    :func:`spectrum_steps`. Returns the rows, the spectra and final samples."""
    with building_game():
        game, gen, disc = build(args_like.algorithm_obj, args_like.seed, args_like.hidden)
    x_eval, z_eval = eval_batch(args_like.seed)
    data = torch.Generator().manual_seed(args_like.seed)
    extra: dict = {"data": data, "spectra": []}
    start = run.resume(game, extra) if run is not None else 0
    at = set(spectrum_steps(args_like.steps, args_like.spectra))
    rows: list[dict] = []

    def diagnose(done: int) -> dict:
        dec = decompose(game, x_eval, z_eval)
        with torch.no_grad():
            g_loss, d_loss = gan_losses(gen, disc, x_eval, z_eval)
        if done in at:
            vals = eigenvalues(game, x_eval, z_eval)
            extra["spectra"].append([done, vals.real.tolist(), vals.imag.tolist()])
        return {
            "g_loss": float(g_loss),
            "d_loss": float(d_loss),
            "xi_norm": dec.xi_norm,
            "potential": dec.potential,
            "rotation": dec.rotation,
        }

    if start == 0 and 0 in at and not any(s[0] == 0 for s in extra["spectra"]):
        diagnose(0)
    steps_iter = run.steps(start) if run is not None else range(start, args_like.steps)
    for step in steps_iter:
        x = sample_mixture(ring_modes(N_MODES), BATCH, STD, data).double()
        z = torch.randn(BATCH, 2, generator=data, dtype=torch.float64)
        game.step(x, z)
        done = step + 1
        if done % args_like.log_every == 0 or done in at or done == args_like.steps:
            row = diagnose(done)
            rows.append({"step": step, **row})
            if run is not None:
                run.log(step, row)
        if run is not None:
            run.maybe_checkpoint(step, game, extra)
    with torch.no_grad():
        samples = gen(torch.randn(2000, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    covered, quality = mode_metrics(samples.float(), ring_modes(N_MODES), STD)
    return {
        "rows": run.rows if run is not None else rows,
        "spectra": extra["spectra"],
        "samples": samples,
        "modes": covered,
        "quality": quality,
    }


def _summary(result: dict) -> dict:
    spectra = []
    for done, re, im in result["spectra"]:
        spectra.append(
            {
                "step": done,
                "max_abs": max(math.hypot(a, b) for a, b in zip(re, im)),
                "min_real": min(re),
                "max_imag": max(abs(b) for b in im),
            }
        )
    return {"modes_covered": result["modes"], "high_quality_percent": result["quality"], "spectra": spectra}


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="adam", lr=0.01, steps=1000, out="runs/spectrum")
    p.add_argument("--log-every", type=int, default=25, help="steps between diagnostics (default 25)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help=f"hidden units per layer (default {HIDDEN})")
    p.add_argument("--spectra", type=int, default=5, help="number of training points with a full spectrum (5)")
    p.add_argument("--figures", action="store_true", help="regenerate figures/spectrum.png")
    args = p.parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    with one_thread():
        check_args(args)
        if args.log_every <= 0 or args.spectra < 2 or args.hidden < 1:
            raise UsageError("--log-every and --hidden must be positive and --spectra at least 2")
        args.algorithm_obj = algorithm_from_args(args)
        config = run_config(
            args, steps=args.steps, log_every=args.log_every, spectra=args.spectra, hidden=args.hidden, depth=DEPTH
        )
        run = Run("spectrum", args, config)
        result = train(args, run=run)
        summary = _summary(result)
        run.finish({**summary, "eigenvalues": result["spectra"]})
        last = summary["spectra"][-1]
        print(
            f"{args.algorithm}: {result['modes']}/{N_MODES} modes, {result['quality']:.1f}% high quality; "
            f"final spectrum: max |λ| {last['max_abs']:.3g}, min Re λ {last['min_real']:.3g}, "
            f"max |Im λ| {last['max_imag']:.3g}"
        )
        return 0


class _Args:
    """The settings :func:`train` reads, for the figure (the command line gives an argparse namespace)."""

    def __init__(self, algorithm: gameopt.Algorithm, steps: int, seed: int = 0, log_every: int = 25, spectra: int = 5):
        self.algorithm_obj, self.steps, self.seed, self.log_every, self.spectra = (
            algorithm,
            steps,
            seed,
            log_every,
            spectra,
        )
        self.hidden = HIDDEN


FIG_STEPS, FIG_LR = 1000, 0.01


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate this experiment's figures; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    t0 = time.perf_counter()
    algo = gameopt.SimGD(FIG_LR, update=gameopt.Adam((0.5, 0.9)))
    result = train(_Args(algo, FIG_STEPS))
    if not quiet:
        for s in _summary(result)["spectra"]:
            print(
                f"spectrum  step {s['step']:>5}: max |λ| {s['max_abs']:.3g}, min Re λ {s['min_real']:.3g}, "
                f"max |Im λ| {s['max_imag']:.3g}"
            )
        print(
            f"spectrum  {result['modes']}/{N_MODES} modes, {result['quality']:.1f}% high quality "
            f"({time.perf_counter() - t0:.1f}s)"
        )

    n_params = len(result["spectra"][0][1])
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.6), gridspec_kw={"width_ratios": [1.2, 1.2, 1, 1, 0.9]})
    cmap = plt.get_cmap("viridis")
    n = len(result["spectra"])
    for k, (done, re, im) in enumerate(result["spectra"]):
        color = cmap(k / max(1, n - 1))
        for ax in axes[:2]:
            ax.scatter(re, im, s=16, color=color, alpha=0.75, label=f"step {done}", edgecolors="none")
    all_re = np.concatenate([np.array(s[1]) for s in result["spectra"]])
    all_im = np.concatenate([np.array(s[2]) for s in result["spectra"]])
    axes[0].set_xscale("symlog", linthresh=0.1)
    axes[0].set_yscale("symlog", linthresh=0.1)
    axes[0].set_title(f"all {n_params} eigenvalues of J (symlog axes)")
    scale = float(np.quantile(np.hypot(all_re, all_im), 0.97))
    axes[1].set_xlim(-scale, scale)
    axes[1].set_ylim(-scale, scale)
    axes[1].set_title(f"zoom: |λ| ≤ {scale:.2g} (97% of them)")
    for ax in axes[:2]:
        ax.axhline(0, color="0.6", lw=0.8)
        ax.axvline(0, color="0.6", lw=0.8)
        ax.set_xlabel("Re λ (potential; > 0 attracts)")
        ax.set_ylabel("Im λ (rotation)")
        ax.legend(fontsize=7, loc="upper left", title="training point", title_fontsize=7)

    rows = result["rows"]
    steps = np.array([r["step"] + 1 for r in rows])
    ax = axes[2]
    ax.semilogy(steps, [r["xi_norm"] for r in rows], label="‖ξ‖", color="tab:blue")
    ax.plot(steps, [r["d_loss"] for r in rows], label="discriminator loss", color="tab:red", lw=1)
    ax.plot(steps, [r["g_loss"] for r in rows], label="generator loss", color="tab:green", lw=1)
    ax.set_xlabel("training step")
    ax.set_ylabel("value (log scale)")
    ax.set_title("‖ξ‖ and the losses (eval batch)")
    ax.legend(fontsize=8)
    ax = axes[3]
    ax.plot(steps, [r["potential"] for r in rows], label="potential ⟨ξ,Sξ⟩/‖ξ‖²", color="tab:purple")
    ax.plot(steps, [r["rotation"] for r in rows], label="rotation ‖Aξ‖/‖ξ‖", color="tab:orange")
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel("J along ξ (symlog)")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_title("potential vs rotation along ξ")
    ax.legend(fontsize=8)
    ax = axes[4]
    samples, modes = result["samples"].numpy(), ring_modes(N_MODES).numpy()
    ax.scatter(samples[:, 0], samples[:, 1], s=2, alpha=0.3, label="generated")
    ax.scatter(modes[:, 0], modes[:, 1], s=40, c="red", marker="x", label="modes")
    ax.set_xlim(-3.5, 3.5)
    ax.set_ylim(-3.5, 3.5)
    ax.set_aspect("equal")
    ax.set_xlabel("x₁")
    ax.set_ylabel("x₂")
    ax.set_title(f"samples after {FIG_STEPS} steps")
    ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"Game Jacobian of a small GAN (2×{HIDDEN} ReLU MLPs, {n_params} parameters, float64) on a ring of "
        f"{N_MODES} Gaussians, SimGD + Adam (η={FIG_LR}, β=(0.5, 0.9)): {result['modes']}/{N_MODES} modes, "
        f"{result['quality']:.0f}% high-quality samples after {FIG_STEPS} steps"
    )
    path = save_figure(fig, "spectrum.png")
    from experiments.common import figures_dir

    numbers = figures_dir() / "spectrum.json"  # for tests/e2e/test_figures_current.py
    record = {"steps": FIG_STEPS, "lr": FIG_LR, **_summary(result), "rows": rows}
    numbers.write_text(json.dumps(record, indent=1) + "\n")
    return [path, str(numbers)]


if __name__ == "__main__":
    sys.exit(main())
