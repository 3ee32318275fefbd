"""The Dirac GAN (Mescheder, Geiger & Nowozin 2018, "Which Training Methods for
GANs do actually Converge?"): the data is a Dirac at 0, the generator a Dirac at
θ, the discriminator D(x) = ψx. With f(t) = −log(1 + exp(−t)) the GAN objective is

    L(θ, ψ) = f(ψθ) + f(0),

which the generator minimizes and the discriminator maximizes (losses
(L, −L)). The unique equilibrium is (θ, ψ) = (0, 0), where the game Jacobian has
the purely imaginary eigenvalues ±i f′(0) = ±i/2: simultaneous gradient descent
spirals out, alternating gradient descent circles, and methods that damp the
rotation (extragradient, optimism, consensus, SGA, CGD, negative momentum) or a
regularizer (R1: (γ/2)ψ² added to the discriminator's loss) converge.

python -m experiments.dirac_gan --algorithm extragradient --lr 0.3 --steps 300
python -m experiments.dirac_gan --algorithm simgd --r1 0.3     # gradient penalty
python -m experiments.dirac_gan --figures      # regenerate figures/dirac_gan.png
"""

from __future__ import annotations

import json
import math
import sys

import torch
from torch.nn import functional as F

import gameopt
from experiments.common import (
    Run,
    UsageError,
    algorithm_from_args,
    building_game,
    check_args,
    main_guard,
    make_algorithm,
    one_thread,
    parser,
    run_config,
    save_figure,
)
from gameopt_players.quadratic import QuadraticPlayer

START = (1.0, 1.0)  # (θ, ψ), as in the paper's figures


def f(t: torch.Tensor) -> torch.Tensor:
    """The paper's f(t) = −log(1 + exp(−t)) (standard GAN), computed stably."""
    return -F.softplus(-t)


def dirac_losses(gen: QuadraticPlayer, disc: QuadraticPlayer, r1: float = 0.0):
    """Losses (L, −L + (γ/2)ψ²) of the generator θ and the discriminator ψ, with
    L = f(ψθ) + f(0). The R1 penalty ‖∇ₓD(x)‖² at the real data is ψ²."""
    f0 = math.log(0.5)  # f(0): the discriminator's term on the real data x = 0

    def losses() -> tuple[torch.Tensor, torch.Tensor]:
        theta, psi = gen.w.sum(), disc.w.sum()
        value = f(psi * theta) + f0
        return value, -value + 0.5 * r1 * psi**2

    return losses


def build(algorithm: gameopt.Algorithm, start: tuple[float, float] = START, r1: float = 0.0):
    gen, disc = QuadraticPlayer([start[0]]), QuadraticPlayer([start[1]])
    game = gameopt.Game(
        [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
        dirac_losses(gen, disc, r1),
        algorithm=algorithm,
    )
    return game, gen, disc


def point(gen: QuadraticPlayer, disc: QuadraticPlayer) -> tuple[float, float]:
    return float(gen.w.detach()[0]), float(disc.w.detach()[0])


def vector_field(theta, psi, r1: float = 0.0):
    """ξ(θ, ψ) = (ψ f′(θψ), −θ f′(θψ) + γψ) on arrays (f′(t) = σ(−t))."""
    import numpy as np

    fp = 1.0 / (1.0 + np.exp(theta * psi))
    return psi * fp, -theta * fp + r1 * psi


def trajectory(
    name: str, lr: float, steps: int, hyper: dict | None = None, r1: float = 0.0, start: tuple[float, float] = START
) -> list[tuple[float, float]]:
    """The iterates (θ_t, ψ_t), t = 0..steps (fewer if the run leaves |w| < 1e3)."""
    game, gen, disc = build(make_algorithm(name, lr, hyper), start, r1)
    out = [point(gen, disc)]
    for _ in range(steps):
        try:
            game.step()
        except FloatingPointError:
            break
        out.append(point(gen, disc))
        if math.hypot(*out[-1]) > 1e3:
            break
    return out


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="extragradient", lr=0.3, steps=300, out="runs/dirac_gan")
    p.add_argument("--r1", type=float, default=0.0, metavar="GAMMA", help="R1 gradient penalty γ (default 0)")
    p.add_argument(
        "--start", type=float, nargs=2, default=list(START), metavar=("THETA", "PSI"), help="starting point (1 1)"
    )
    p.add_argument("--figures", action="store_true", help="regenerate figures/dirac_gan.png")
    args = p.parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    with one_thread():
        check_args(args)
        if args.r1 < 0:
            raise UsageError(f"--r1 must be non-negative, got {args.r1}")
        with building_game():
            game, gen, disc = build(algorithm_from_args(args), tuple(args.start), args.r1)
        config = run_config(args, r1=args.r1, start=args.start)
        run = Run("dirac_gan", args, config)
        extra: dict = {}
        start = run.resume(game, extra)
        for step in run.steps(start):
            losses = game.step()
            theta, psi = point(gen, disc)
            run.log(step, {"distance": math.hypot(theta, psi), "theta": theta, "psi": psi, "loss": float(losses[0])})
            run.maybe_checkpoint(step, game, extra)
        theta, psi = point(gen, disc)
        run.finish({"final_distance": math.hypot(theta, psi), "theta": theta, "psi": psi})
        print(
            f"{args.algorithm}: (θ, ψ) = ({theta:.4g}, {psi:.4g}) after {args.steps} steps, "
            f"distance {math.hypot(theta, psi):.3e}"
        )
        return 0


LR, STEPS = 0.3, 300
# label: (algorithm, hyperparameters, R1 γ)
COMPARED = {
    "SimGD": ("simgd", {}, 0.0),
    "AltGD": ("altgd", {}, 0.0),
    "Extragradient": ("extragradient", {}, 0.0),
    "Optimistic": ("optimistic", {}, 0.0),
    "Consensus (γ=1)": ("consensus", {"gamma": 1.0}, 0.0),
    "SGA (λ=1)": ("sga", {}, 0.0),
    "CGD": ("cgd", {}, 0.0),
    "AltGD + momentum β=−0.5": ("altgd", {"momentum": -0.5}, 0.0),
    "SimGD + Adam (η=0.05)": ("adam", {"betas": (0.5, 0.9)}, 0.0),
    "SimGD + R1 penalty (γ=0.3)": ("simgd", {}, 0.3),
}
LR_OVERRIDE = {"SimGD + Adam (η=0.05)": 0.05}


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate this experiment's figures; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lim = 2.2
    grid = np.linspace(-lim, lim, 25)
    T, P = np.meshgrid(grid, grid)
    fig, axes = plt.subplots(2, 5, figsize=(18, 8.6), sharex=True, sharey=True)
    record: dict = {"steps": STEPS, "start": list(START), "runs": {}}
    for k, (ax, (label, (name, hyper, r1))) in enumerate(zip(axes.ravel(), COMPARED.items())):
        lr = LR_OVERRIDE.get(label, LR)
        traj = np.array(trajectory(name, lr, STEPS, dict(hyper), r1))
        record["runs"][label] = {"lr": lr, "steps_done": len(traj) - 1, "points": traj[::10].tolist()}
        record["runs"][label]["end"] = traj[-1].tolist()
        U, V = vector_field(T, P, r1)
        ax.streamplot(T, P, -U, -V, color="0.75", density=0.8, linewidth=0.7, arrowsize=0.7)
        ax.plot(traj[:, 0], traj[:, 1], "-", color="tab:blue", lw=1.3, label="trajectory")
        ax.plot(*traj[0], "o", color="tab:green", ms=6, label="start")
        ax.plot(*traj[-1], "s", color="tab:blue", ms=5, label=f"after {len(traj) - 1} steps")
        ax.plot(0, 0, "*", color="tab:red", ms=11, label="equilibrium (0, 0)")
        d = math.hypot(*traj[-1])
        ax.set_title(f"{label}\nη={lr}, final ‖w‖={d:.2g}", fontsize=9)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        if k % 5 == 0:
            ax.set_ylabel("discriminator ψ")
        if k >= 5:
            ax.set_xlabel("generator θ")
        ax.legend(fontsize=6, loc="lower left")
        if not quiet:
            print(f"dirac_gan  {label:<28} final distance {d:.3e}", flush=True)
    fig.suptitle(
        f"Dirac GAN, L(θ, ψ) = f(ψθ) + f(0), f(t) = −log(1+e⁻ᵗ): {STEPS} steps from (1, 1); "
        "grey: the flow −ξ (−ξ with the R1 term in the last panel)"
    )
    path = save_figure(fig, "dirac_gan.png")
    from experiments.common import figures_dir

    numbers = figures_dir() / "dirac_gan.json"  # every 10th point, for tests/e2e/test_figures_current.py
    numbers.write_text(json.dumps(record) + "\n")
    return [path, str(numbers)]


if __name__ == "__main__":
    sys.exit(main())
