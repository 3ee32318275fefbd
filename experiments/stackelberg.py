"""Implicit Stackelberg learning against simultaneous gradient play on the polynomial
zero-sum game of Fiez, Chasnov & Ratliff 2020 ("Implicit Learning Dynamics in
Stackelberg Games", the polynomial game of their experiments), in the authors' setup
(their experiments/polynomial-zerosum.ipynb):

    f(x, y) = −((0.15x² + y)² + (0.25y² + x)²) · e^{−0.01(x² + y²)},

x (the leader) minimizes f, y (the follower) minimizes −f. From their seven starting
points, 10 000 steps of simultaneous gradient play (step 0.0025 for both) and of
τ-Stackelberg learning (leader 2.5e-4, follower 2.5e-2). Each end point's nearest
critical point is classified from the Hessian: a differential Nash equilibrium
(f_xx > 0, f_yy < 0) or a differential Stackelberg equilibrium (f_yy < 0 and
f_xx − f_xy²/f_yy > 0).

python -m experiments.stackelberg --algorithm stackelberg --lr 2.5e-4 2.5e-2 --start 1
python -m experiments.stackelberg --algorithm simgd --lr 0.0025 --start 5
python -m experiments.stackelberg --figures      # figures/stackelberg.png and .md
"""

from __future__ import annotations

import math
import sys
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

A1, B1 = 0.15, 0.25
STARTS = [(3.0, 3.0), (-3.0, 1.0), (-10.0, 10.0), (10.0, -10.0), (-10.0, -10.0), (-4.0, -6.0), (-8.0, 12.0)]
STEPS = 10_000
#: the authors' step sizes: name → (label, algorithm)
METHODS = {
    "simgd": ("simultaneous gradient play", lambda: gameopt.SimGD(0.0025)),
    "stackelberg": ("τ-Stackelberg learning", lambda: gameopt.Stackelberg([2.5e-4, 2.5e-2])),
}


def f(x: Tensor, y: Tensor) -> Tensor:
    return -((A1 * x**2 + y) ** 2 + (B1 * y**2 + x) ** 2) * torch.exp(-0.01 * (x**2 + y**2))


def build(start: int, algorithm: gameopt.Algorithm) -> tuple[gameopt.Game, Tensor, Tensor]:
    x0, y0 = STARTS[start]
    x = torch.nn.Parameter(torch.tensor([x0], dtype=torch.float64))
    y = torch.nn.Parameter(torch.tensor([y0], dtype=torch.float64))

    def losses() -> tuple[Tensor, Tensor]:
        v = f(x, y).sum()
        return v, -v

    players = [gameopt.Player([x], name="leader x"), gameopt.Player([y], name="follower y")]
    return gameopt.Game(players, losses, algorithm=algorithm), x, y


def _derivatives(x: float, y: float) -> tuple[Tensor, Tensor]:
    z = torch.tensor([x, y], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(f(z[0], z[1]), z, create_graph=True)
    h = torch.stack([torch.autograd.grad(g[i], z, retain_graph=True)[0] for i in range(2)])
    return g.detach(), h


def critical_point(x: float, y: float) -> tuple[float, float]:
    """Newton's method on ∇f = 0 from (x, y)."""
    z = torch.tensor([x, y], dtype=torch.float64)
    for _ in range(50):
        g, h = _derivatives(float(z[0]), float(z[1]))
        z = z - torch.linalg.pinv(h) @ g  # pinv: a start far from any critical point may meet a singular h
    return float(z[0]), float(z[1])


def classify(x: float, y: float) -> dict[str, Any]:
    """The Hessian tests of a differential Nash and a differential Stackelberg equilibrium."""
    _, h = _derivatives(x, y)
    fxx, fxy, fyy = float(h[0, 0]), float(h[0, 1]), float(h[1, 1])
    return {"nash": fxx > 0 and fyy < 0, "stackelberg": fyy < 0 and fxx - fxy * fxy / fyy > 0}


def trajectory(
    start: int, algorithm: gameopt.Algorithm, steps: int = STEPS, every: int = 20
) -> list[tuple[float, float]]:
    game, x, y = build(start, algorithm)
    points = [(float(x.detach()), float(y.detach()))]
    for t in range(steps):
        game.step()
        if (t + 1) % every == 0 or t + 1 == steps:
            points.append((float(x.detach()), float(y.detach())))
    return points


def grad_norm(x: float, y: float) -> float:
    return float(_derivatives(x, y)[0].norm())


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="stackelberg", lr=2.5e-4, steps=STEPS, out="runs/stackelberg")
    p.add_argument("--start", type=int, default=0, help=f"starting point, 0..{len(STARTS) - 1} (the authors')")
    p.add_argument("--figures", action="store_true", help="regenerate figures/stackelberg.png and .md")
    args = p.parse_args(argv)
    if args.figures:
        print("\n".join(make_figures(args.no_progress)))
        return 0
    check_args(args)
    if not 0 <= args.start < len(STARTS):
        raise UsageError(f"--start must be in 0..{len(STARTS) - 1}, got {args.start}")
    if args.seed != 0:
        raise UsageError("stackelberg is deterministic: it takes no --seed")
    with one_thread():
        with building_game():
            game, x, y = build(args.start, algorithm_from_args(args))
        run = Run("stackelberg", args, run_config(args, start=args.start))
        extra: dict[str, Any] = {}
        for step in run.steps(run.resume(game, extra)):
            game.step()
            xv, yv = float(x.detach()), float(y.detach())
            run.log(step, {"x": xv, "y": yv, "grad_norm": grad_norm(xv, yv)})
            run.maybe_checkpoint(step, game, extra)
    xv, yv = float(x.detach()), float(y.detach())
    run.finish({"x": xv, "y": yv, "grad_norm": grad_norm(xv, yv)})
    print(f"{args.algorithm} from {STARTS[args.start]}: ({xv:.5g}, {yv:.5g}), ‖∇f‖ = {grad_norm(xv, yv):.2e}")
    return 0


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate figures/stackelberg.png and .md; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.common import figures_dir

    fig, ax = plt.subplots(figsize=(7, 6.2))
    grid = torch.linspace(-15, 15, 301, dtype=torch.float64)
    gx, gy = torch.meshgrid(grid, grid, indexing="xy")
    ax.contourf(gx.numpy(), gy.numpy(), f(gx, gy).numpy(), 30, cmap="gray", alpha=0.8)
    lines = [
        "# τ-Stackelberg learning vs simultaneous gradient play (Fiez, Chasnov & Ratliff 2020, polynomial game)",
        "",
        f"{STEPS} steps from each of the authors' starting points. End point, ‖∇f‖ there, and the critical point "
        "it is nearest (Newton from the end point) with its Hessian class: N = differential Nash, "
        "S = differential Stackelberg.",
        "",
        "| start | " + " | ".join(label for label, _ in METHODS.values()) + " |",
        "|---|" + "---|" * len(METHODS),
    ]
    results: list[dict[str, Any]] = []
    critical: dict[tuple[float, float], dict[str, Any]] = {}
    for k, start in enumerate(STARTS):
        cells, row = [], {"start": start}
        for m, (method, (label, make)) in enumerate(METHODS.items()):
            pts = trajectory(k, make(), STEPS)
            xs, ys = zip(*pts)
            style = {"color": "w", "lw": 3.0} if method == "simgd" else {"color": "tab:blue", "lw": 1.8}
            ax.plot(xs, ys, label=label if k == 0 else None, **style)
            ax.plot(xs[-1], ys[-1], "o", color=style["color"], ms=7, mfc="none" if m else style["color"], mew=2)
            cx, cy = critical_point(xs[-1], ys[-1])
            kind = classify(cx, cy)
            critical[(round(cx, 3), round(cy, 3))] = kind
            tags = ("N" if kind["nash"] else "") + ("S" if kind["stackelberg"] else "") or "neither"
            dist = math.hypot(xs[-1] - cx, ys[-1] - cy)
            norm = grad_norm(xs[-1], ys[-1])
            cells.append(
                f"({xs[-1]:.4g}, {ys[-1]:.4g}), ‖∇f‖ {norm:.1e}; {dist:.1e} from ({cx:.4g}, {cy:.4g}) [{tags}]"
            )
            row[method] = {"end": [xs[-1], ys[-1]], "grad_norm": norm, "critical": [cx, cy], **kind}
        ax.plot(*start, "X", color="gold", ms=10, label="start" if k == 0 else None)
        lines.append(f"| {start} | " + " | ".join(cells) + " |")
        results.append(row)
    for (cx, cy), kind in critical.items():
        marker = "h" if kind["nash"] else "D"
        label = "Nash & Stackelberg" if kind["nash"] and kind["stackelberg"] else "Stackelberg, not Nash"
        ax.plot(cx, cy, marker, color="tab:orange" if kind["nash"] else "tab:red", ms=12, label=label, zorder=5)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper right")
    ax.set_xlim(-15, 15)
    ax.set_ylim(-15, 15)
    ax.set_xlabel("x (leader)")
    ax.set_ylabel("y (follower)")
    ax.set_title("Polynomial zero-sum game of Fiez et al. 2020")
    path = save_figure(fig, "stackelberg.png", dpi=80)
    md = figures_dir() / "stackelberg.md"
    md.write_text("\n".join(lines) + "\n")
    (figures_dir() / "stackelberg.json").write_text(json.dumps(results, indent=2))
    if not quiet:
        print("\n".join(lines))
    return [path, str(md)]


if __name__ == "__main__":
    sys.exit(main())
