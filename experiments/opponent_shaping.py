"""Opponent shaping on three small games (Foerster et al. 2018, "Learning with
Opponent-Learning Awareness"; Letcher et al. 2019, "Stable Opponent Shaping in
Differentiable Games"), with SimGD, LA, LOLA, SOS, SGA and CGD (``--game``):

* ``pennies``: matching pennies with sigmoid policies; the unique equilibrium is
  mixed, p = q = ½. Metric: the distance ‖(p − ½, q − ½)‖.
* ``tandem``: L1 = (x+y)² − 2x, L2 = (x+y)² − 2y; the Nash equilibria are the
  line x + y = 1. LOLA's shaping term drags it off the line. Metric: x + y.
* ``ipd``: the iterated prisoner's dilemma between memory-1 policies (5 logits
  each) with the exact discounted losses, γ = 0.96 (players/ipd.py). As in the
  papers' code the players descend the unnormalized discounted sum, so the
  papers' hyperparameters apply as they are (η = α = 1, SOS a = 0.5, b = 0.1);
  metrics are reported per round, normalized by (1 − γ): 1 is mutual
  cooperation, 2 mutual defection.

Default hyperparameters per game (η, and α for LA/LOLA/SOS): pennies η = α = 1;
tandem η = 0.2, α = 0.1; ipd η = α = 1. ``--hp`` overrides them.

python -m experiments.opponent_shaping --game ipd --algorithm lola --seed 3
python -m experiments.opponent_shaping --game tandem --algorithm sos --steps 100
python -m experiments.opponent_shaping --figures    # figures/opponent_shaping_*.png and _results.md
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass

import torch

import gameopt
from experiments.common import (
    Run,
    UsageError,
    building_game,
    check_args,
    figures_dir,
    hyperparameters,
    lr_from_args,
    main_guard,
    make_algorithm,
    one_thread,
    run_config,
    save_figure,
)
from experiments.common import parser as common_parser
from gameopt_players.ipd import IPDPolicy, discounted_losses, ipd_losses, markov_chain
from gameopt_players.matrix_games import SigmoidPolicy, zero_sum_losses
from gameopt_players.quadratic import QuadraticPlayer, tandem_losses

F64 = torch.float64
GAMMA = 0.96


@dataclass(frozen=True)
class GameSpec:
    lr: float
    alpha: float
    steps: int
    title: str


GAMES = {
    "pennies": GameSpec(lr=1.0, alpha=1.0, steps=150, title="matching pennies"),
    "tandem": GameSpec(lr=0.2, alpha=0.1, steps=100, title="tandem game"),
    "ipd": GameSpec(lr=1.0, alpha=1.0, steps=100, title=f"iterated prisoner's dilemma (γ={GAMMA})"),
}


def default_hyper(game: str, algorithm: str) -> dict:
    """α = the game's default for the look-ahead/shaping algorithms."""
    key = algorithm.lower().replace("_", "")
    return {"alpha": GAMES[game].alpha} if key in ("la", "lola", "sos") else {}


def build(game_name: str, algorithm: gameopt.Algorithm, seed: int):
    """The game from a random start (θ ~ N(0, 1) per parameter, drawn with ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    if game_name == "pennies":
        p1, p2 = (SigmoidPolicy(float(torch.randn(1, generator=g, dtype=F64))) for _ in range(2))
        losses = zero_sum_losses(p1, p2)
    elif game_name == "tandem":
        p1, p2 = (QuadraticPlayer(torch.randn(1, generator=g, dtype=F64)) for _ in range(2))
        losses = tandem_losses(p1, p2)
    elif game_name == "ipd":
        p1, p2 = (IPDPolicy(torch.randn(5, generator=g, dtype=F64)) for _ in range(2))
        losses = ipd_losses(p1, p2, GAMMA, normalized=False)
    else:
        raise UsageError(f"--game must be one of {', '.join(GAMES)}, got {game_name!r}")
    game = gameopt.Game(
        [gameopt.Player(p1, name="player1"), gameopt.Player(p2, name="player2")], losses, algorithm=algorithm
    )
    return game, p1, p2


def metrics(game_name: str, p1, p2) -> dict[str, float]:
    """What is logged after each step."""
    with torch.no_grad():
        if game_name == "pennies":
            p, q = float(p1.prob()), float(p2.prob())
            return {"distance": math.hypot(p - 0.5, q - 0.5), "p1": p, "p2": q}
        if game_name == "tandem":
            x, y = float(p1.w[0]), float(p2.w[0])
            return {"x_plus_y": x + y, "x": x, "y": y}
        c1, c2 = p1(), p2()
        l1, l2 = discounted_losses(c1, c2, GAMMA)  # per round (normalized)
        p0, P = markov_chain(c1, c2)
        visits = (1 - GAMMA) * torch.linalg.solve(torch.eye(4, dtype=F64) - GAMMA * P.T, p0)  # CC, CD, DC, DD
        out = {
            "loss": float(l1 + l2) / 2,
            "loss1": float(l1),
            "loss2": float(l2),
            "coop1": float(visits[0] + visits[1]),  # discounted share of rounds in which each cooperates
            "coop2": float(visits[0] + visits[2]),
        }
        states = ("s0", "CC", "CD", "DC", "DD")
        for who, c in (("1", c1), ("2", c2)):
            out.update({f"pC{who}_{s}": float(v) for s, v in zip(states, c)})
        return out


def final_params(p1, p2) -> list:
    return [p.detach().reshape(-1).tolist() for p in (*p1.parameters(), *p2.parameters())]


def parser():
    p = common_parser(__doc__, algorithm="sos", lr=1.0, steps=100, out="runs/opponent_shaping")
    p.add_argument("--game", default="ipd", help=f"one of {', '.join(GAMES)} (default ipd)")
    p.add_argument("--figures", action="store_true", help="regenerate figures/opponent_shaping_*.png and results")
    # η and the number of steps default to the game's values
    p.set_defaults(lr=None, steps=None)
    return p


@main_guard
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    with one_thread():
        if args.game not in GAMES:
            raise UsageError(f"--game must be one of {', '.join(GAMES)}, got {args.game!r}")
        spec = GAMES[args.game]
        args.lr = args.lr if args.lr is not None else [spec.lr]
        args.steps = args.steps if args.steps is not None else spec.steps
        check_args(args)
        hyper = {**default_hyper(args.game, args.algorithm), **hyperparameters(args)}
        algorithm = make_algorithm(args.algorithm, lr_from_args(args), dict(hyper))
        with building_game():
            game, p1, p2 = build(args.game, algorithm, args.seed)
        config = {**run_config(args, game=args.game), "hp": hyper}
        if args.game == "ipd":
            config["gamma"] = GAMMA
        run = Run("opponent_shaping", args, config)
        extra: dict = {}
        start = run.resume(game, extra)
        for step in run.steps(start):
            game.step()
            run.log(step, metrics(args.game, p1, p2))
            run.maybe_checkpoint(step, game, extra)
        final = metrics(args.game, p1, p2)
        run.finish({"final": final, "params": final_params(p1, p2)})
        shown = {"pennies": "distance", "tandem": "x_plus_y", "ipd": "loss"}[args.game]
        print(f"{args.game}, {args.algorithm}: {shown} = {final[shown]:.4g} after {args.steps} steps")
        return 0


# ------------------------------------------------------------------ figures
COMPARED = {"SimGD": "simgd", "LA": "la", "LOLA": "lola", "SOS": "sos", "SGA": "sga", "CGD": "cgd"}
SEEDS = range(5)
COLORS = ["C0", "C1", "C2", "C3", "C4", "C9"]  # no brown: LOLA's green over SOS's red looks brown


def trajectory(game_name: str, algorithm: str, seed: int, steps: int | None = None) -> dict[str, list[float]]:
    """Every metric after 0..steps steps (NaN-padded past a refused step)."""
    spec = GAMES[game_name]
    steps = steps or spec.steps
    algo = make_algorithm(algorithm, spec.lr, default_hyper(game_name, algorithm))
    game, p1, p2 = build(game_name, algo, seed)
    rows = [metrics(game_name, p1, p2)]
    for _ in range(steps):
        try:
            game.step()
        except FloatingPointError:
            break
        rows.append(metrics(game_name, p1, p2))
    out = {k: [r[k] for r in rows] + [math.nan] * (steps + 1 - len(rows)) for k in rows[0]}
    return out


def _band(ax, runs, label: str, color, style: str = "-", log: bool = False, clip=(-math.inf, math.inf)) -> None:
    import numpy as np

    arr = np.array(runs)
    if log:  # mean ± std of log10, drawn back in linear units
        arr = np.log10(np.maximum(arr, 1e-16))
    mean, std = np.nanmean(arr, 0), np.nanstd(arr, 0)
    lo, hi = mean - std, mean + std
    if log:
        mean, lo, hi = 10**mean, 10**lo, 10**hi
    lo, hi = np.clip(lo, *clip), np.clip(hi, *clip)
    x = np.arange(arr.shape[1])
    ax.plot(x, mean, style, color=color, lw=1.6, label=label)
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0)


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate this experiment's figures; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    styles = ["-", "--", "-.", ":", "-", "--"]
    results: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for game_name in GAMES:
        results[game_name] = {}
        for label, name in COMPARED.items():
            t0 = time.perf_counter()
            runs = [trajectory(game_name, name, seed) for seed in SEEDS]
            results[game_name][label] = {k: [r[k] for r in runs] for k in runs[0]}
            if not quiet:
                print(f"opponent_shaping  {game_name:<8} {label:<6} ({time.perf_counter() - t0:.1f}s)", flush=True)
    paths = []

    # ---- IPD: loss per round, cooperation over training, final P(C | state)
    ipd = results["ipd"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    for k, (label, r) in enumerate(ipd.items()):
        _band(axes[0], r["loss"], label, COLORS[k], styles[k], clip=(1.0, 2.0))
        coop = [[(a + b) / 2 for a, b in zip(c1, c2)] for c1, c2 in zip(r["coop1"], r["coop2"])]
        _band(axes[1], coop, label, COLORS[k], styles[k], clip=(0.0, 1.0))
    axes[0].axhline(1.0, color="0.5", lw=0.8, ls=":")
    axes[0].axhline(2.0, color="0.5", lw=0.8, ls=":")
    axes[0].set_ylabel("average loss per round (1: cooperate, 2: defect)")
    axes[0].set_title("IPD: loss per round (mean of both agents)")
    axes[1].set_ylabel("discounted share of cooperative moves")
    axes[1].set_title("IPD: cooperation over training")
    for ax in axes[:2]:
        ax.set_xlabel("iteration")
        ax.legend(fontsize=8)
    states = ["start", "CC", "CD", "DC", "DD"]
    width = 0.8 / len(ipd)
    for k, (label, r) in enumerate(ipd.items()):
        finals = np.array(
            [
                [r[f"pC{w}_{s}"][seed][-1] for s in ("s0", "CC", "CD", "DC", "DD")]
                for w in ("1", "2")
                for seed in range(len(SEEDS))
            ]
        )
        xs = np.arange(5) + (k - (len(ipd) - 1) / 2) * width
        mean, std = finals.mean(0), finals.std(0)
        yerr = [mean - np.maximum(mean - std, 0), np.minimum(mean + std, 1) - mean]  # ± std, clipped to [0, 1]
        axes[2].bar(xs, mean, width, yerr=yerr, color=COLORS[k], label=label, capsize=2)
    axes[2].set_xticks(range(5), states)
    axes[2].set_xlabel("state (previous joint move, own move first)")
    axes[2].set_ylabel("P(cooperate | state)")
    axes[2].set_ylim(0, 1.05)
    axes[2].set_title(f"IPD: final policies after {GAMES['ipd'].steps} steps (both agents, all seeds)")
    axes[2].legend(fontsize=7, ncol=3, loc="upper right")
    fig.suptitle(
        f"Iterated prisoner's dilemma, γ={GAMMA}, exact discounted losses; η=α=1 (papers' units); "
        f"mean ± std over {len(SEEDS)} seeds, θ₀ ~ N(0, 1)"
    )
    paths.append(save_figure(fig, "opponent_shaping_ipd.png"))

    # ---- tandem and pennies
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    spec = GAMES["tandem"]
    for k, (label, r) in enumerate(results["tandem"].items()):
        _band(axes[0], r["x_plus_y"], label, COLORS[k], styles[k])
    axes[0].axhline(1.0, color="k", lw=0.8, ls=":", label="Nash line x + y = 1")
    a = spec.alpha
    axes[0].axhline((1 - 2 * a) / (1 - 4 * a), color="C2", lw=0.8, ls=":", label="LOLA fixed point (1−2α)/(1−4α)")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("x + y")
    axes[0].set_title(f"Tandem game (η={spec.lr}, α={a}): x + y over training")
    axes[0].text(0.98, 0.6, "all but LOLA reach the Nash line", transform=axes[0].transAxes, ha="right", fontsize=8)
    axes[0].legend(fontsize=8)
    spec = GAMES["pennies"]
    for k, (label, r) in enumerate(results["pennies"].items()):
        _band(axes[1], r["distance"], label, COLORS[k], styles[k], log=True)
    axes[1].set_yscale("log")
    axes[1].text(
        0.98,
        0.5,
        "near (½, ½), LA, SGA (λ=1) and CGD take almost\nthe same steps: their curves overlap",
        transform=axes[1].transAxes,
        ha="right",
        va="top",
        fontsize=7.5,
    )
    axes[1].set_xlabel("iteration")
    axes[1].set_ylabel("‖(p − ½, q − ½)‖")
    axes[1].set_title(f"Matching pennies (η={spec.lr}, α={spec.alpha}): distance to the mixed equilibrium")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Opponent shaping on the tandem game and matching pennies: mean ± std over {len(SEEDS)} seeds")
    paths.append(save_figure(fig, "opponent_shaping_tandem_pennies.png"))

    paths += write_results(results)
    return paths


def _final(runs: list[list[float]]) -> tuple[float, float]:
    import numpy as np

    values = np.array([r[-1] for r in runs])
    return float(np.mean(values)), float(np.std(values))


def write_results(results) -> list[str]:
    table: dict[str, dict] = {}
    for label in COMPARED:
        ipd, tandem, pennies = results["ipd"][label], results["tandem"][label], results["pennies"][label]
        coop = [[(a + b) / 2 for a, b in zip(c1, c2)] for c1, c2 in zip(ipd["coop1"], ipd["coop2"])]
        table[label] = {
            "ipd_loss_per_round": _final(ipd["loss"]),
            "ipd_cooperation": _final(coop),
            "tandem_x_plus_y": _final(tandem["x_plus_y"]),
            "pennies_distance": _final(pennies["distance"]),
        }
    meta = {
        "seeds": len(SEEDS),
        "games": {k: {"lr": v.lr, "alpha": v.alpha, "steps": v.steps} for k, v in GAMES.items()},
        "gamma": GAMMA,
    }
    json_path = figures_dir() / "opponent_shaping_results.json"
    json_path.write_text(json.dumps({"settings": meta, "final_mean_std": table}, indent=2))
    lines = [
        f"# Opponent shaping: final values (mean ± std over {len(SEEDS)} seeds, θ₀ ~ N(0, 1))",
        "",
        "Regenerate with `python -m experiments.opponent_shaping --figures`.",
        "",
        f"* IPD: γ = {GAMMA}, exact discounted losses, η = α = 1 on the unnormalized sum (the papers' units), "
        f"{GAMES['ipd'].steps} steps; loss per round normalized by (1 − γ): 1 = mutual cooperation, "
        "2 = mutual defection.",
        f"* Tandem: η = {GAMES['tandem'].lr}, α = {GAMES['tandem'].alpha}, {GAMES['tandem'].steps} steps; "
        "Nash line x + y = 1.",
        f"* Matching pennies: η = α = {GAMES['pennies'].lr}, {GAMES['pennies'].steps} steps; distance "
        "‖(p − ½, q − ½)‖ to the mixed equilibrium.",
        "",
        "| algorithm | IPD loss per round | IPD cooperation share | tandem x + y | pennies distance |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, row in table.items():
        cells = [f"{m:.3f} ± {s:.3f}" for m, s in list(row.values())[:3]]
        m, s = row["pennies_distance"]
        cells.append(f"{m:.2e} ± {s:.1e}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    md_path = figures_dir() / "opponent_shaping_results.md"
    md_path.write_text("\n".join(lines) + "\n")
    return [str(json_path), str(md_path)]


if __name__ == "__main__":
    sys.exit(main())
