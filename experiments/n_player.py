"""n-player general-sum quadratic games with a known Nash equilibrium.

Player i minimizes L_i(w) = ½ w_iᵀ M_ii w_i + Σ_{j≠i} w_iᵀ M_ij w_j + c_iᵀ w_i, so
ξ = Mw + c, the game Jacobian is M, and with every M_ii positive definite the
unique Nash equilibrium is w* = −M⁻¹c (players/quadratic.py). Three kinds of game
(``--game``):

* ``random``: random couplings M_ij of size ``--coupling`` (general-sum). Weak
  coupling: every eigenvalue of M has a positive real part, w* is an attractor
  of the gradient dynamics. Strong coupling (e.g. 2): some eigenvalues have a
  negative real part; w* is still the Nash equilibrium but it repels SimGD and
  is not a stable fixed point in the sense of Letcher et al. (2019);
* ``rotational``: pairwise zero-sum couplings M_ji = −M_ijᵀ of size
  ``--coupling``: the symmetric part of M is block-diagonal positive definite
  (w* attracts the continuous flow) but large imaginary parts force SimGD's step
  below 2 Re λ / |λ|².

python -m experiments.n_player --algorithm cgd --lr 0.1 --steps 300
python -m experiments.n_player --game rotational --coupling 3 --algorithm extragradient
python -m experiments.n_player --figures      # regenerate figures/n_player.png
"""

from __future__ import annotations

import json
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
    make_algorithm,
    one_thread,
    parser,
    run_config,
    save_figure,
)
from gameopt_players.quadratic import QuadraticGame, QuadraticPlayer, random_quadratic_game

F64 = torch.float64


def rotational_quadratic_game(n_players: int, dim: int, coupling: float, seed: int = 0) -> QuadraticGame:
    """M_ii = RRᵀ/d + I, M_ij = coupling · N(0, 1/d) for i < j and M_ji = −M_ijᵀ,
    c ~ N(0, 1): the couplings are pairwise zero-sum, so Re λ(M) ≥ 1."""
    g = torch.Generator().manual_seed(seed)
    blocks: list[list[torch.Tensor]] = [[torch.zeros(dim, dim, dtype=F64)] * n_players for _ in range(n_players)]
    for i in range(n_players):
        R = torch.randn(dim, dim, generator=g, dtype=F64) / dim**0.5
        blocks[i][i] = R @ R.T + torch.eye(dim, dtype=F64)
        for j in range(i + 1, n_players):
            C = coupling * torch.randn(dim, dim, generator=g, dtype=F64) / dim**0.5
            blocks[i][j], blocks[j][i] = C, -C.T
    return QuadraticGame(blocks, [torch.randn(dim, generator=g, dtype=F64) for _ in range(n_players)])


def make_game(kind: str, n_players: int, dim: int, coupling: float, game_seed: int) -> QuadraticGame:
    if kind == "random":
        return random_quadratic_game(n_players, dim, coupling, seed=game_seed)
    if kind == "rotational":
        return rotational_quadratic_game(n_players, dim, coupling, seed=game_seed)
    raise UsageError(f"--game must be random or rotational, got {kind!r}")


def build(algorithm: gameopt.Algorithm, q: QuadraticGame, seed: int):
    """The game from a start w₀ ~ N(0, I) drawn with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    players = [QuadraticPlayer(torch.randn(len(c), generator=g, dtype=F64)) for c in q.c]
    game = gameopt.Game(
        [gameopt.Player(p, name=f"player{i}") for i, p in enumerate(players)], q.losses(players), algorithm=algorithm
    )
    return game, players


def joint(players) -> torch.Tensor:
    return torch.cat([p.w.detach() for p in players])


def trajectory(name: str, lr: float, steps: int, q: QuadraticGame, hyper: dict, seed: int = 1) -> list[float]:
    """‖w_t − w*‖ for t = 0..steps (shorter if it blows past 1e8)."""
    game, players = build(make_algorithm(name, lr, dict(hyper)), q, seed)
    w_star = torch.cat(q.nash_equilibrium())
    out = [float((joint(players) - w_star).norm())]
    for _ in range(steps):
        try:
            game.step()
        except FloatingPointError:
            break
        out.append(float((joint(players) - w_star).norm()))
        if out[-1] > 1e8:
            break
    return out


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="simgd", lr=0.1, steps=300, out="runs/n_player")
    p.add_argument("--game", default="random", help="random (general-sum) or rotational (default random)")
    p.add_argument("--players", type=int, default=4, help="number of players (default 4)")
    p.add_argument("--dim", type=int, default=3, help="parameters per player (default 3)")
    p.add_argument("--coupling", type=float, default=0.5, help="coupling strength (default 0.5)")
    p.add_argument("--game-seed", type=int, default=0, help="seed of the game's matrices (--seed: the start)")
    p.add_argument("--figures", action="store_true", help="regenerate figures/n_player.png")
    args = p.parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    with one_thread():
        check_args(args)
        if args.players < 2 or args.dim < 1:
            raise UsageError("--players must be at least 2 and --dim at least 1")
        if not args.coupling >= 0:
            raise UsageError(f"--coupling must be non-negative, got {args.coupling}")
        q = make_game(args.game, args.players, args.dim, args.coupling, args.game_seed)
        with building_game():
            game, players = build(algorithm_from_args(args), q, args.seed)
        w_star = torch.cat(q.nash_equilibrium())
        config = run_config(
            args,
            game=args.game,
            players=args.players,
            dim=args.dim,
            coupling=args.coupling,
            game_seed=args.game_seed,
        )
        run = Run("n_player", args, config)
        extra: dict = {}
        start = run.resume(game, extra)
        for step in run.steps(start):
            losses = game.step()
            xi = torch.cat([t.reshape(-1) for t in game.vector_field()])
            run.log(
                step,
                {
                    "distance": float((joint(players) - w_star).norm()),
                    "xi_norm": float(xi.norm()),
                    **{f"loss{i}": float(v) for i, v in enumerate(losses)},
                },
            )
            run.maybe_checkpoint(step, game, extra)
        final = float((joint(players) - w_star).norm())
        run.finish({"final_distance": final, "params": joint(players).tolist(), "nash": w_star.tolist()})
        print(f"{args.algorithm}: distance to the Nash equilibrium after {args.steps} steps: {final:.3e}")
        return 0


# label: (algorithm, hyperparameters); "alpha": None means α = η
COMPARED = {
    "SimGD": ("simgd", {}),
    "AltGD": ("altgd", {}),
    "Extragradient": ("extragradient", {}),
    "Optimistic": ("optimistic", {}),
    "Consensus (γ=0.1)": ("consensus", {"gamma": 0.1}),
    "SGA (λ=0.1)": ("sga", {"lam": 0.1}),
    "CGD": ("cgd", {}),
    "LA (α=η)": ("la", {"alpha": None}),
    "LOLA (α=η)": ("lola", {"alpha": None}),
    "SOS (α=η)": ("sos", {"alpha": None}),
    "SimGD + Adam (η/5)": ("adam", {}),
}
PANELS = [
    # title, game kind, coupling
    ("general-sum, weak coupling (c=0.5)", "random", 0.5),
    ("pairwise zero-sum coupling (c=3)", "rotational", 3.0),
    ("general-sum, strong coupling (c=2):\nNash equilibrium unstable", "random", 2.0),
]
N_PLAYERS, DIM, LR, STEPS = 4, 3, 0.1, 200


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate this experiment's figures; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    styles = ["-", "--", "-.", ":"]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 5.2), sharey=True)
    record: dict = {"players": N_PLAYERS, "dim": DIM, "lr": LR, "steps": STEPS, "panels": {}}
    for ax, (title, kind, coupling) in zip(axes, PANELS):
        curves = record["panels"][f"{kind}, c={coupling}"] = {}
        q = make_game(kind, N_PLAYERS, DIM, coupling, 0)
        ev = torch.linalg.eigvals(q.M)
        for k, (label, (name, hyper)) in enumerate(COMPARED.items()):
            t0 = time.perf_counter()
            lr = LR / 5 if name == "adam" else LR
            hyper = {key: (lr if v is None else v) for key, v in hyper.items()}
            d = np.array(trajectory(name, lr, STEPS, q, hyper))
            curves[label] = (d / d[0]).tolist()  # the relative distance the figure draws
            ax.semilogy(
                range(len(d)), d / d[0], styles[k % 4], lw=1.5, label=label, color=f"C{k}" if k < 10 else "black"
            )
            if not quiet:
                print(
                    f"n_player  {kind:<10} c={coupling:<4} {label:<20} relative distance {d[-1] / d[0]:.2e}"
                    f"  ({time.perf_counter() - t0:.1f}s)",
                    flush=True,
                )
        ax.set_title(
            f"{title}\nRe λ(M) ∈ [{float(ev.real.min()):.2f}, {float(ev.real.max()):.2f}], "
            f"max |λ| = {float(ev.abs().max()):.1f}",
            fontsize=9,
        )
        ax.set_xlabel("iteration")
        ax.set_ylim(1e-12, 1e6)
        ax.grid(alpha=0.3, which="major")
    axes[0].set_ylabel("‖w − w*‖ / ‖w₀ − w*‖  (distance to Nash)")
    axes[-1].legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{N_PLAYERS}-player quadratic games ({DIM} parameters each), η={LR}, same start for every algorithm")
    path = save_figure(fig, "n_player.png", dpi=110)
    from experiments.common import figures_dir

    numbers = figures_dir() / "n_player.json"  # for tests/e2e/test_figures_current.py
    numbers.write_text(json.dumps(record) + "\n")
    return [path, str(numbers)]


if __name__ == "__main__":
    sys.exit(main())
