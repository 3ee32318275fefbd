"""Follow-the-Ridge on the toy functions of Wang, Zhang & Ba 2020 ("On Solving Minimax
Optimization Locally", Figure 2), in the authors' setup (their quadratic.py): x
minimizes f, y maximizes it, 1000 steps of size 0.05 from the same starting points,
against GDA, OGDA, EG, CO (γ = 0.1) and SGA (step 0.01, λ = 1):

* f1 = −3x² − y² + 4xy, from (5, 7): (0, 0) is a local (and global) minimax point;
* f2 = 3x² + y² + 4xy, from (6, 5): (0, 0) is a stationary point that is not minimax
  (y minimizes there);
* f3 = (0.4x² − 0.1(y − 3x + 0.05x³)² − 0.01y⁴)·e^{−0.01(x² + y²)}, from (7, 5): (0, 0)
  is a local minimax point.

python -m experiments.follow_the_ridge --function f3 --algorithm ftr --steps 1000
python -m experiments.follow_the_ridge --function f1 --algorithm simgd
python -m experiments.follow_the_ridge --figures     # figures/follow_the_ridge.png and .md
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

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


def f1(x: Tensor, y: Tensor) -> Tensor:
    return -3 * x * x - y * y + 4 * x * y


def f2(x: Tensor, y: Tensor) -> Tensor:
    return 3 * x * x + y * y + 4 * x * y


def f3(x: Tensor, y: Tensor) -> Tensor:
    return (0.4 * x * x - 0.1 * (y - 3 * x + 0.05 * x**3) ** 2 - 0.01 * y**4) * torch.exp(-0.01 * (x * x + y * y))


#: name → (f, starting point, half-width of the plot, what (0, 0) is)
FUNCTIONS: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], tuple[float, float], float, str]] = {
    "f1": (f1, (5.0, 7.0), 12.0, "local and global minimax"),
    "f2": (f2, (6.0, 5.0), 12.0, "not minimax (y minimizes)"),
    "f3": (f3, (7.0, 5.0), 8.0, "local minimax"),
}
#: the authors' methods and steps: name → (label, algorithm)
METHODS: dict[str, tuple[str, Callable[[], gameopt.Algorithm]]] = {
    "ftr": ("FtR", lambda: gameopt.FollowTheRidge(0.05)),
    "gda": ("GDA", lambda: gameopt.SimGD(0.05)),
    "ogda": ("OGDA", lambda: gameopt.Optimistic(0.05)),
    "eg": ("EG", lambda: gameopt.Extragradient(0.05)),
    "sga": ("SGA", lambda: gameopt.SGA(0.01, lam=1.0, align=False)),
    "co": ("CO", lambda: gameopt.ConsensusOptimization(0.05, gamma=0.1)),
}
STEPS = 1000


def build(function: str, algorithm: gameopt.Algorithm) -> tuple[gameopt.Game, Tensor, Tensor]:
    f, (x0, y0), _, _ = FUNCTIONS[function]
    x = torch.nn.Parameter(torch.tensor([x0], dtype=torch.float64))
    y = torch.nn.Parameter(torch.tensor([y0], dtype=torch.float64))

    def losses() -> tuple[Tensor, Tensor]:
        v = f(x, y).sum()
        return v, -v

    game = gameopt.Game([gameopt.Player([x], name="x"), gameopt.Player([y], name="y")], losses, algorithm=algorithm)
    return game, x, y


def grad_norm(function: str, x: Tensor, y: Tensor) -> float:
    """‖∇f‖ at (x, y)."""
    a, b = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    gx, gy = torch.autograd.grad(FUNCTIONS[function][0](a, b).sum(), [a, b])
    return math.hypot(float(gx), float(gy))


def trajectory(function: str, algorithm: gameopt.Algorithm, steps: int = STEPS) -> list[tuple[float, float]]:
    game, x, y = build(function, algorithm)
    points = [(float(x.detach()), float(y.detach()))]
    for _ in range(steps):
        game.step()
        points.append((float(x.detach()), float(y.detach())))
    return points


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="ftr", lr=0.05, steps=STEPS, out="runs/follow_the_ridge")
    p.add_argument("--function", choices=sorted(FUNCTIONS), default="f3", help="f1, f2 or f3 (default f3)")
    p.add_argument("--figures", action="store_true", help="regenerate figures/follow_the_ridge.png and .md")
    args = p.parse_args(argv)
    if args.figures:
        print("\n".join(make_figures(args.no_progress)))
        return 0
    check_args(args)
    if args.seed != 0:
        raise UsageError("follow_the_ridge is deterministic: it takes no --seed")
    with one_thread():
        with building_game():
            game, x, y = build(args.function, algorithm_from_args(args))
        run = Run("follow_the_ridge", args, run_config(args, function=args.function))
        extra: dict[str, Any] = {}
        for step in run.steps(run.resume(game, extra)):
            game.step()
            run.log(step, {"x": float(x.detach()), "y": float(y.detach()), "grad_norm": grad_norm(args.function, x, y)})
            run.maybe_checkpoint(step, game, extra)
    summary = {"x": float(x.detach()), "y": float(y.detach()), "grad_norm": grad_norm(args.function, x, y)}
    run.finish(summary)
    point = f"({summary['x']:.4g}, {summary['y']:.4g})"
    print(f"{args.algorithm} on {args.function}: (x, y) = {point}, ‖∇f‖ = {summary['grad_norm']:.2e}")
    return 0


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate figures/follow_the_ridge.png and .md; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from experiments.common import figures_dir

    fig, axes = plt.subplots(1, 3, figsize=(15, 5))
    lines = [
        "# Follow-the-Ridge on the toy functions of Wang, Zhang & Ba 2020 (Figure 2)",
        "",
        f"{STEPS} steps from the authors' starting points; the end point and ‖∇f‖ there "
        "('diverged': left the plotted square).",
        "",
        "| function | (0, 0) is | " + " | ".join(label for label, _ in METHODS.values()) + " |",
        "|---|---|" + "---|" * len(METHODS),
    ]
    results: dict[str, dict[str, Any]] = {}
    for ax, (name, (f, _, width, what)) in zip(axes, FUNCTIONS.items()):
        grid = torch.linspace(-width, width, 241, dtype=torch.float64)
        gx, gy = torch.meshgrid(grid, grid, indexing="xy")
        ax.contourf(gx.numpy(), gy.numpy(), f(gx, gy).numpy(), 30, cmap="gray")
        cells = []
        for k, (method, (label, make)) in enumerate(METHODS.items()):
            pts = np.array(trajectory(name, make(), STEPS))
            inside = np.all(np.abs(pts) <= width, axis=1)
            shown = pts[: np.argmin(inside) + 1] if not inside.all() else pts  # to the edge
            style = {"color": "r", "lw": 2.2, "zorder": 10} if method == "ftr" else {"ls": "--", "lw": 1.6}
            ax.plot(shown[:, 0], shown[:, 1], label=label, color=style.pop("color", f"C{k}"), **style)
            end = pts[-1]
            finite = bool(np.isfinite(end).all()) and inside.all()
            norm = grad_norm(name, torch.tensor(end[:1]), torch.tensor(end[1:])) if finite else float("nan")
            results.setdefault(name, {})[method] = {"end": end.tolist(), "grad_norm": norm, "diverged": not finite}
            cells.append(f"({end[0]:.3g}, {end[1]:.3g}), {norm:.1e}" if finite else "diverged")
        ax.plot(*FUNCTIONS[name][1], "^", color="r", ms=11, zorder=20)
        ax.set_xlim(-width, width)
        ax.set_ylim(-width, width)
        ax.set_title(f"{name}: (0, 0) {what}")
        ax.set_xlabel("x (min)")
        ax.set_ylabel("y (max)")
        ax.legend(loc="lower right", fontsize=8)
        lines.append(f"| {name} | {what} | " + " | ".join(cells) + " |")
    path = save_figure(fig, "follow_the_ridge.png", dpi=80)
    md = figures_dir() / "follow_the_ridge.md"
    md.write_text("\n".join(lines) + "\n")
    (figures_dir() / "follow_the_ridge.json").write_text(__import__("json").dumps(results, indent=2))
    if not quiet:
        print("\n".join(lines))
    return [path, str(md)]


if __name__ == "__main__":
    sys.exit(main())
