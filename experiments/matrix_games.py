"""Zero-sum matrix games on the simplex: last-iterate duality gap of multiplicative
weights, optimistic multiplicative weights, projected gradient and projected
extragradient, with the game's value from a linear program beside.

python -m experiments.matrix_games --game rps --method omwu --lr 0.1 --steps 2000
python -m experiments.matrix_games --game random --seed 3 --method peg
python -m experiments.matrix_games --figures      # regenerate figures/matrix_games.png
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import gameopt
from experiments.common import (
    Run,
    UsageError,
    building_game,
    check_args,
    lr_from_args,
    main_guard,
    one_thread,
    parser,
    run_config,
    save_figure,
)
from players.matrix_games import (
    ROCK_PAPER_SCISSORS,
    MixedStrategy,
    duality_gap,
    matrix_game_losses,
    random_zero_sum,
)

#: method name → (algorithm class, simplex geometry, label)
METHODS: dict[str, tuple[type[gameopt.Algorithm], str, str]] = {
    "mwu": (gameopt.SimGD, "entropic", "multiplicative weights"),
    "omwu": (gameopt.Optimistic, "entropic", "optimistic multiplicative weights"),
    "pgd": (gameopt.SimGD, "euclidean", "projected gradient"),
    "peg": (gameopt.Extragradient, "euclidean", "projected extragradient"),
}
RANDOM_SIZE = 5


def payoff_matrix(game: str, seed: int) -> torch.Tensor:
    if game == "rps":
        return ROCK_PAPER_SCISSORS
    return random_zero_sum(RANDOM_SIZE, seed)


def game_value(payoff: torch.Tensor) -> float:
    """max_x min_y xᵀ R y by linear programming (``scipy.optimize.linprog``)."""
    import numpy as np
    from scipy.optimize import linprog

    r = payoff.numpy()
    m, n = r.shape
    # variables (x_1..x_m, v): maximize v s.t. (xᵀR)_j ≥ v, Σx = 1, x ≥ 0
    c = np.zeros(m + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-r.T, np.ones((n, 1))])
    a_eq = np.hstack([np.ones((1, m)), np.zeros((1, 1))])
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(n), A_eq=a_eq, b_eq=[1.0], bounds=[(0, None)] * m + [(None, None)])
    if not res.success:
        raise RuntimeError(f"linprog failed: {res.message}")
    return float(res.x[-1]) + 0.0  # no "-0.0"


def start_point(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded starting point in the interior of both simplices (away from equilibrium)."""
    g = torch.Generator().manual_seed(1000 + seed)
    x, y = (
        torch.rand(n, generator=g, dtype=torch.float64) + 0.05,
        torch.rand(n, generator=g, dtype=torch.float64) + 0.05,
    )
    return x / x.sum(), y / y.sum()


def build(method: str, lr: float | list[float], payoff: torch.Tensor, seed: int):
    cls, mirror, _ = METHODS[method]
    x0, y0 = start_point(payoff.shape[0], seed)
    x, y = MixedStrategy(x0), MixedStrategy(y0)
    game = gameopt.Game(
        [
            gameopt.Player(x, name="x", constraint=gameopt.constraints.Simplex(mirror)),
            gameopt.Player(y, name="y", constraint=gameopt.constraints.Simplex(mirror)),
        ],
        matrix_game_losses(x, y, payoff),
        algorithm=cls(lr),
    )
    return game, x, y


def trajectory(method: str, lr: float, payoff: torch.Tensor, steps: int, seed: int = 0, every: int = 1) -> list[float]:
    """The last iterate's duality gap every ``every`` steps (the start included)."""
    game, x, y = build(method, lr, payoff, seed)
    gaps = [duality_gap(payoff, x.p.detach(), y.p.detach())]
    for t in range(steps):
        game.step()
        if (t + 1) % every == 0:
            gaps.append(duality_gap(payoff, x.p.detach(), y.p.detach()))
    return gaps


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="simgd", lr=0.1, steps=2000, out="runs/matrix_games")
    p.add_argument(
        "--game", choices=["rps", "random"], default="rps", help="rock-paper-scissors or a seeded random game"
    )
    p.add_argument("--method", choices=sorted(METHODS), default="omwu", help="mwu, omwu, pgd or peg")
    p.add_argument("--figures", action="store_true", help="regenerate figures/matrix_games.png")
    args = p.parse_args(argv)
    if args.figures:
        print("\n".join(make_figures(args.no_progress)))
        return 0
    check_args(args)
    if args.hp:
        raise UsageError("matrix_games takes no --hp: the method fixes the algorithm")
    payoff = payoff_matrix(args.game, args.seed)
    with one_thread():
        with building_game():
            game, x, y = build(args.method, lr_from_args(args), payoff, args.seed)
        value = game_value(payoff)
        config = run_config(args, game=args.game, method=args.method)
        run = Run("matrix_games", args, config)
        extra: dict[str, Any] = {}
        start = run.resume(game, extra)
        for step in run.steps(start):
            game.step()
            run.log(step, {"duality_gap": duality_gap(payoff, x.p.detach(), y.p.detach())})
            run.maybe_checkpoint(step, game, extra)
    gap = duality_gap(payoff, x.p.detach(), y.p.detach())
    payoff_now = float(x.p.detach() @ payoff @ y.p.detach())
    run.finish({"duality_gap": gap, "value_lp": value, "payoff": payoff_now, "x": x.p.tolist(), "y": y.p.tolist()})
    print(
        f"{METHODS[args.method][2]} on {args.game}: last-iterate duality gap {gap:.3e} after {args.steps} steps; "
        f"payoff {payoff_now:.6f}, game value (linear program) {value:.6f}"
    )
    return 0


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate figures/matrix_games.png; returns its path and the results file's."""
    with one_thread():
        return _make_figures(quiet)


FIGURE_STEPS, FIGURE_LR, FIGURE_SEEDS = 4000, 0.1, (0, 1, 2)


def _make_figures(quiet: bool) -> list[str]:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.common import figures_dir

    games = {"rock-paper-scissors": [ROCK_PAPER_SCISSORS]}
    games[f"random {RANDOM_SIZE}×{RANDOM_SIZE} (seeds {', '.join(map(str, FIGURE_SEEDS))})"] = [
        random_zero_sum(RANDOM_SIZE, s) for s in FIGURE_SEEDS
    ]
    every = 20
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    results: dict[str, Any] = {"steps": FIGURE_STEPS, "lr": FIGURE_LR, "games": {}}
    for ax, (title, payoffs) in zip(axes, games.items()):
        results["games"][title] = {}
        for method, (_, _, label) in METHODS.items():
            finals = []
            for k, payoff in enumerate(payoffs):
                gaps = trajectory(method, FIGURE_LR, payoff, FIGURE_STEPS, seed=k, every=every)
                finals.append(gaps[-1])
                ax.semilogy(
                    [every * i for i in range(len(gaps))],
                    gaps,
                    label=label if k == 0 else None,
                    color=f"C{list(METHODS).index(method)}",
                    lw=1.2,
                    alpha=0.9,
                )
            results["games"][title][method] = {
                "final_gaps": finals,
                "values_lp": [game_value(p) for p in payoffs],
            }
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("last-iterate duality gap")
        ax.legend(fontsize=8)
    fig.suptitle(f"Zero-sum matrix games on the simplex, η = {FIGURE_LR}")
    path = save_figure(fig, "matrix_games.png", dpi=110, rect=(0, 0, 1, 0.95))
    res = figures_dir() / "matrix_games.json"
    res.write_text(json.dumps(results, indent=2))
    if not quiet:
        for title, per in results["games"].items():
            for method, r in per.items():
                print(f"{title}: {METHODS[method][2]}: final gaps {', '.join(f'{g:.2e}' for g in r['final_gaps'])}")
    return [path, str(res)]


if __name__ == "__main__":
    sys.exit(main())
