"""Zero-sum matrix games on the simplex: last-iterate duality gap of multiplicative
weights, optimistic multiplicative weights, projected gradient, projected
extragradient and projected past extragradient, with the game's value from a linear
program beside, and NashConv (gameopt.nash_conv; the duality gap again in a
two-player zero-sum game). ``--game random3``: a three-player general-sum game with
random payoffs (3 actions each), where NashConv is the measure.

python -m experiments.matrix_games --game rps --method omwu --lr 0.1 --steps 2000
python -m experiments.matrix_games --game random --seed 3 --method peg
python -m experiments.matrix_games --game random3 --seed 1 --method popov
python -m experiments.matrix_games --figures      # regenerate figures/matrix_games.png and _3p.png
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
from gameopt_players.matrix_games import (
    ROCK_PAPER_SCISSORS,
    MixedStrategy,
    cyclic_matching_pennies,
    duality_gap,
    matrix_game_losses,
    normal_form_losses,
    random_payoffs,
    random_zero_sum,
)

#: method name → (algorithm class, simplex geometry, label)
METHODS: dict[str, tuple[type[gameopt.Algorithm], str, str]] = {
    "mwu": (gameopt.SimGD, "entropic", "multiplicative weights"),
    "omwu": (gameopt.Optimistic, "entropic", "optimistic multiplicative weights"),
    "pgd": (gameopt.SimGD, "euclidean", "projected gradient"),
    "peg": (gameopt.Extragradient, "euclidean", "projected extragradient"),
    "popov": (gameopt.PastExtragradient, "euclidean", "projected past extragradient"),
}
RANDOM_SIZE = 5
THREE_PLAYERS, THREE_ACTIONS = 3, 3


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


def nash_conv_of(payoffs: list[torch.Tensor], strategies: list[MixedStrategy]) -> float:
    return float(gameopt.nash_conv(payoffs, [s.p.detach() for s in strategies]))


def zero_sum_payoffs(payoff: torch.Tensor) -> list[torch.Tensor]:
    """The two players' payoffs: x maximizes xᵀRy, y maximizes −xᵀRy."""
    return [payoff, -payoff]


def build_n(method: str, lr: float | list[float], payoffs: list[torch.Tensor], seed: int):
    """An n-player normal-form game, every player on its simplex, from a seeded interior point."""
    cls, mirror, _ = METHODS[method]
    g = torch.Generator().manual_seed(2000 + seed)
    strategies = []
    for n in payoffs[0].shape:
        p = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
        strategies.append(MixedStrategy(p / p.sum()))
    players = [
        gameopt.Player(s, name=f"player {i}", constraint=gameopt.constraints.Simplex(mirror))
        for i, s in enumerate(strategies)
    ]
    return gameopt.Game(players, normal_form_losses(strategies, payoffs), algorithm=cls(lr)), strategies


def trajectory_n(method: str, lr: float, payoffs: list[torch.Tensor], steps: int, seed: int = 0, every: int = 1):
    """NashConv of the last iterate every ``every`` steps (the start included)."""
    game, strategies = build_n(method, lr, payoffs, seed)
    out = [nash_conv_of(payoffs, strategies)]
    for t in range(steps):
        game.step()
        if (t + 1) % every == 0:
            out.append(nash_conv_of(payoffs, strategies))
    return out, [s.p.detach().tolist() for s in strategies]


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="simgd", lr=0.1, steps=2000, out="runs/matrix_games")
    p.add_argument(
        "--game",
        choices=["rps", "random", "random3"],
        default="rps",
        help="rock-paper-scissors, a seeded random zero-sum game, or a seeded random three-player game",
    )
    p.add_argument("--method", choices=sorted(METHODS), default="omwu", help="mwu, omwu, pgd, peg or popov")
    p.add_argument("--figures", action="store_true", help="regenerate figures/matrix_games.png")
    args = p.parse_args(argv)
    if args.figures:
        print("\n".join(make_figures(args.no_progress)))
        return 0
    check_args(args)
    if args.hp:
        raise UsageError("matrix_games takes no --hp: the method fixes the algorithm")
    if args.game == "random3":
        return main_n(args)
    payoff = payoff_matrix(args.game, args.seed)
    payoffs = zero_sum_payoffs(payoff)
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
            gap = duality_gap(payoff, x.p.detach(), y.p.detach())
            run.log(step, {"duality_gap": gap, "nash_conv": nash_conv_of(payoffs, [x, y])})
            run.maybe_checkpoint(step, game, extra)
    gap = duality_gap(payoff, x.p.detach(), y.p.detach())
    payoff_now = float(x.p.detach() @ payoff @ y.p.detach())
    nc = nash_conv_of(payoffs, [x, y])
    run.finish(
        {
            "duality_gap": gap,
            "nash_conv": nc,
            "value_lp": value,
            "payoff": payoff_now,
            "x": x.p.tolist(),
            "y": y.p.tolist(),
        }
    )
    print(
        f"{METHODS[args.method][2]} on {args.game}: last-iterate duality gap {gap:.3e} after {args.steps} steps; "
        f"payoff {payoff_now:.6f}, game value (linear program) {value:.6f}; NashConv {nc:.3e}"
    )
    return 0


def main_n(args) -> int:
    """--game random3: NashConv of the last iterate of a three-player random game."""
    payoffs = random_payoffs(THREE_PLAYERS, THREE_ACTIONS, args.seed)
    with one_thread():
        with building_game():
            game, strategies = build_n(args.method, lr_from_args(args), payoffs, args.seed)
        run = Run("matrix_games", args, run_config(args, game=args.game, method=args.method))
        extra: dict[str, Any] = {}
        for step in run.steps(run.resume(game, extra)):
            game.step()
            run.log(step, {"nash_conv": nash_conv_of(payoffs, strategies)})
            run.maybe_checkpoint(step, game, extra)
    nc = nash_conv_of(payoffs, strategies)
    run.finish({"nash_conv": nc, "strategies": [s.p.tolist() for s in strategies]})
    print(f"{METHODS[args.method][2]} on a random three-player game: last-iterate NashConv {nc:.3e}")
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
                    ls=LINESTYLES[list(METHODS).index(method) % len(LINESTYLES)],
                    lw=1.3,
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
    return [path, str(res), *_three_player_figure(quiet)]


LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]


def _three_player_figure(quiet: bool) -> list[str]:
    """figures/matrix_games_3p.png and .md: NashConv of each method's last iterate on
    random three-player games and on Jordan's cyclic matching pennies."""
    import json

    import matplotlib.pyplot as plt

    from experiments.common import figures_dir

    every = 20
    games = {
        f"random, {THREE_ACTIONS} actions each (seeds {', '.join(map(str, FIGURE_SEEDS))})": [
            (random_payoffs(THREE_PLAYERS, THREE_ACTIONS, s), s) for s in FIGURE_SEEDS
        ],
        "cyclic matching pennies (Jordan 1993)": [(cyclic_matching_pennies(), s) for s in FIGURE_SEEDS],
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    lines = [
        "# Three-player normal-form games: NashConv of the last iterate",
        "",
        f"η = {FIGURE_LR}, {FIGURE_STEPS} steps, seeds {', '.join(map(str, FIGURE_SEEDS))} (the payoffs of the "
        "random games, and the starting points). Last-iterate NashConv at the end (the smallest along the run "
        "in brackets).",
    ]
    results: dict[str, Any] = {"steps": FIGURE_STEPS, "lr": FIGURE_LR, "games": {}}
    for ax, (title, runs) in zip(axes, games.items()):
        lines += ["", f"## {title}", "", "| method | " + " | ".join(f"seed {s}" for _, s in runs) + " |"]
        lines.append("|---|" + "---|" * len(runs))
        results["games"][title] = {}
        for m, (method, (_, _, label)) in enumerate(METHODS.items()):
            cells, finals = [], []
            for payoffs, seed in runs:
                values, strategies = trajectory_n(method, FIGURE_LR, payoffs, FIGURE_STEPS, seed=seed, every=every)
                steps = [every * i for i in range(len(values))]
                # a NashConv of exactly 0 has no place on a log axis: the line stops there and a
                # triangle marks the step, one height per method (several methods reach 0 together)
                shown = [v if v > 0 else float("nan") for v in values]
                style = {"ls": LINESTYLES[m % len(LINESTYLES)], "lw": 1.3, "color": f"C{m}"}
                ax.semilogy(steps, shown, **style, label=label if seed == runs[0][1] else None)
                zero = next((t for t, v in zip(steps, values) if v == 0), None)
                if zero is not None:
                    ax.plot([zero], [10.0 ** (-16 + 1.5 * m)], "v", color=f"C{m}", ms=6)
                cells.append(f"{values[-1]:.2e} ({min(values):.1e})")
                finals.append({"nash_conv": values[-1], "min_nash_conv": min(values), "strategies": strategies})
            results["games"][title][method] = finals
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        ax.set_xlabel("step")
        ax.set_ylabel("NashConv (last iterate); ▼: exactly 0 from there on")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    path = save_figure(fig, "matrix_games_3p.png", dpi=70)
    md = figures_dir() / "matrix_games_3p.md"
    md.write_text("\n".join(lines) + "\n")
    (figures_dir() / "matrix_games_3p.json").write_text(json.dumps(results, indent=2))
    if not quiet:
        print("\n".join(lines))
    return [path, str(md)]


if __name__ == "__main__":
    sys.exit(main())
