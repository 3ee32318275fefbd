"""Bilinear game min_x max_y xᵀAy: distance to the equilibrium (0, 0) per algorithm.

python -m experiments.bilinear --algorithm extragradient --lr 0.1 --steps 500
python -m experiments.bilinear --figures      # regenerate figures/bilinear_*.png
"""

from __future__ import annotations

import json
import sys

import torch

from experiments.common import (
    Run,
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
from gameopt_players.quadratic import QuadraticPlayer, bilinear_losses

DIM = 10


def setup(seed: int, dim: int = DIM):
    """A well-conditioned A (singular values in [1, 2]) and a random start."""
    g = torch.Generator().manual_seed(seed)
    q1, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    q2, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    A = q1 @ torch.diag(torch.linspace(1.0, 2.0, dim, dtype=torch.float64)) @ q2
    x = QuadraticPlayer(torch.randn(dim, generator=g, dtype=torch.float64))
    y = QuadraticPlayer(torch.randn(dim, generator=g, dtype=torch.float64))
    return A, x, y


def build(algorithm, seed: int):
    import gameopt

    A, x, y = setup(seed)
    game = gameopt.Game(
        [gameopt.Player(x, name="x"), gameopt.Player(y, name="y")], bilinear_losses(x, y, A), algorithm=algorithm
    )
    return game, x, y


def distance(x, y) -> float:
    return float(torch.sqrt(x.w.detach() @ x.w.detach() + y.w.detach() @ y.w.detach()))


def trajectory(name: str, lr: float, steps: int, seed: int = 0, hyper: dict | None = None) -> list[float]:
    game, x, y = build(make_algorithm(name, lr, hyper), seed)
    out = [distance(x, y)]
    for _ in range(steps):
        try:
            game.step()
        except FloatingPointError:
            break
        out.append(distance(x, y))
        if out[-1] > 1e6:
            break
    return out


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="extragradient", lr=0.1, steps=500, out="runs/bilinear")
    p.add_argument("--figures", action="store_true", help="regenerate the comparison figures in figures/")
    args = p.parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    check_args(args)
    with building_game():
        game, x, y = build(algorithm_from_args(args), args.seed)
    run = Run("bilinear", args, run_config(args, dim=DIM))
    extra: dict = {}
    start = run.resume(game, extra)
    for step in run.steps(start):
        game.step()
        run.log(step, {"distance": distance(x, y)})
        run.maybe_checkpoint(step, game, extra)
    final = distance(x, y)
    run.finish({"final_distance": final, "params": [x.w.tolist(), y.w.tolist()]})
    print(f"{args.algorithm}: distance to equilibrium after {args.steps} steps: {final:.3e}")
    return 0


COMPARED = {
    "SimGD": ("simgd", {}),
    "AltGD": ("altgd", {}),
    "Extragradient": ("extragradient", {}),
    "Optimistic": ("optimistic", {}),
    "Consensus (γ=1)": ("consensus", {"gamma": 1.0}),
    "SGA": ("sga", {}),
    "CGD": ("cgd", {}),
    "LA (α=η)": ("la", None),
}


FIGURE_LR, FIGURE_STEPS, STEPSIZE_STEPS = 0.2, 300, 200


def stepsize_kind(name: str, lr: float, hyper: dict | None) -> str:
    """How a run of STEPSIZE_STEPS steps ends: its distance over the start's below 1/2,
    above 2 (or it stopped early), or between."""
    d = trajectory(name, lr, STEPSIZE_STEPS, hyper=hyper if hyper is not None else {"alpha": lr})
    ratio = d[-1] / d[0] if len(d) == STEPSIZE_STEPS + 1 else float("inf")
    return "converges" if ratio < 0.5 else ("diverges" if ratio > 2 else "stays bounded")


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate this experiment's figures; returns their paths."""
    with one_thread():
        return _make_figures()


def _make_figures() -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lr, steps = FIGURE_LR, FIGURE_STEPS
    record: dict = {"distance": {"lr": lr, "steps": steps, "curves": {}}}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    styles = ["-", "--", "-.", ":"]
    markers = "ovs^DP*X"
    curves: dict[str, list[float]] = {}
    for k, (label, (name, hyper)) in enumerate(COMPARED.items()):
        d = trajectory(name, lr, steps, hyper=hyper if hyper is not None else {"alpha": lr})
        record["distance"]["curves"][label] = d
        # a curve equal to an earlier one (SGA = consensus, LA = extragradient here) says so and
        # gets markers at other steps, so that neither hides the other
        same = [
            other
            for other, e in curves.items()
            if len(e) == len(d) and all(abs(a - b) <= 1e-9 * abs(b) for a, b in zip(d, e))
        ]
        curves[label] = d
        shown = f"{label} (= {same[0]})" if same else label
        ax.semilogy(
            range(len(d)), d, styles[k % 4], label=shown, lw=1.6, marker=markers[k], ms=4, markevery=(4 * k, 40)
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("distance to equilibrium ‖(x, y)‖")
    ax.set_title(f"Bilinear game min_x max_y xᵀAy (d={DIM}, η={lr})")
    ax.legend(fontsize=8, ncol=2)
    path1 = save_figure(fig, "bilinear_distance.png", dpi=110)

    lrs = np.geomspace(0.01, 2.0, 14)
    record["stepsizes"] = {"steps": STEPSIZE_STEPS, "lrs": lrs.tolist(), "kinds": {}}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    kinds = {"converges": ("tab:green", "s"), "stays bounded": ("tab:orange", "o"), "diverges": ("tab:red", "x")}
    seen = set()
    for row, (label, (name, hyper)) in enumerate(COMPARED.items()):
        record["stepsizes"]["kinds"][label] = []
        for lr_ in lrs:
            kind = stepsize_kind(name, float(lr_), hyper)
            record["stepsizes"]["kinds"][label].append(kind)
            color, marker = kinds[kind]
            ax.scatter([lr_], [row], c=color, marker=marker, label=None if kind in seen else kind)
            seen.add(kind)
    ax.set_yticks(range(len(COMPARED)), list(COMPARED))
    ax.set_xscale("log")
    ax.set_xlabel("step size η")
    ax.set_title("Bilinear game: behaviour after 200 steps by step size")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path2 = save_figure(fig, "bilinear_stepsizes.png", dpi=110)
    from experiments.common import figures_dir

    path3 = figures_dir() / "bilinear.json"  # the numbers of both figures, for tests/e2e/test_figures_current.py
    path3.write_text(json.dumps(record) + "\n")
    return [path1, path2, str(path3)]


if __name__ == "__main__":
    sys.exit(main())
