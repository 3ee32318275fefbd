"""
Constrained matrix game: rock-paper-scissors on the simplex
===========================================================

Two mixed strategies :math:`x, y` live on the probability simplex
(:class:`gameopt.constraints.Simplex`); player :math:`x` maximizes
:math:`x^\\top R y`. Under the entropic mirror map (``Simplex(mirror="entropic")``)
simultaneous gradient play is multiplicative weights, which spirals out towards
the boundary; optimism makes it optimistic multiplicative weights (Daskalakis &
Panageas 2019), which converges. With the Euclidean projection (``Simplex()``),
projected extragradient converges to the uniform equilibrium. The duality gap
:math:`\\max_i (Ry)_i - \\min_j (x^\\top R)_j` is zero exactly at an equilibrium.
"""

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt.constraints import Simplex
from gameopt_players.matrix_games import ROCK_PAPER_SCISSORS, MixedStrategy, duality_gap, matrix_game_losses

R = ROCK_PAPER_SCISSORS  # (3, 3), player x's payoff
start_x = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
start_y = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)

runs = {
    "multiplicative weights": (gameopt.SimGD(0.1), "entropic"),
    "optimistic multiplicative weights": (gameopt.Optimistic(0.1), "entropic"),
    "projected gradient": (gameopt.SimGD(0.1), "euclidean"),
    "projected extragradient": (gameopt.Extragradient(0.1), "euclidean"),
}
fig, ax = plt.subplots(figsize=(6.5, 4))
for name, (algorithm, mirror) in runs.items():
    x, y = MixedStrategy(start_x), MixedStrategy(start_y)
    players = [gameopt.Player(s, constraint=Simplex(mirror=mirror)) for s in (x, y)]
    game = gameopt.Game(players, matrix_game_losses(x, y, R), algorithm=algorithm)
    gap = []
    for _ in range(1500):
        gap.append(duality_gap(R, x.p.detach(), y.p.detach()))
        game.step()
    ax.semilogy(gap, label=name)
    print(f"{name:>34}: duality gap after 1500 steps {gap[-1]:.2e}, x = {x.p.detach().numpy().round(3)}")
ax.set_xlabel("step")
ax.set_ylabel("duality gap")
ax.set_title("rock-paper-scissors, step size 0.1")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
