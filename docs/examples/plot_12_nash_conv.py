"""
NashConv: how far a profile is from a Nash equilibrium, for any number of players
=================================================================================

:func:`gameopt.nash_conv` sums each player's gain from its best unilateral deviation,

.. math:: \\mathrm{NashConv}(\\sigma) = \\sum_i \\big(\\max_a u_i(a, \\sigma_{-i}) - u_i(\\sigma)\\big) \\ge 0,

zero exactly at a Nash equilibrium (Lanctot et al. 2017). It takes one payoff tensor
of shape :math:`(A_1, \\dots, A_n)` per player (player :math:`i` maximizes its own) and
one probability vector per player; in a two-player zero-sum game it is the duality
gap. Here three players learn mixed strategies on the simplex
(:class:`gameopt.constraints.Simplex`) with three first-order methods, in two games
with three players: random payoffs (3 actions each), where every method finds a pure
equilibrium, and Jordan's cyclic matching pennies (2 actions each), whose only
equilibrium is uniform play and where none of them converges. On the log scale a
line stops where its NashConv becomes exactly 0, and a triangle marks the step.
"""

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt.constraints import Simplex
from gameopt_players.matrix_games import MixedStrategy, cyclic_matching_pennies, normal_form_losses, random_payoffs

games = {
    "random payoffs, 3 actions each": random_payoffs(3, 3, seed=1),  # 3 tensors of shape (3, 3, 3)
    "cyclic matching pennies": cyclic_matching_pennies(),  # 3 tensors of shape (2, 2, 2)
}
methods = {
    "multiplicative weights": (lambda: gameopt.SimGD(0.1), "entropic", dict(color="C0", ls=":")),
    "projected gradient": (lambda: gameopt.SimGD(0.1), "euclidean", dict(color="C1", ls="--")),
    "projected past extragradient": (lambda: gameopt.PastExtragradient(0.1), "euclidean", dict(color="C2")),
}
steps = 400
STARTS = {  # by number of actions: each player's first mixed strategy (sums exactly 1)
    3: [torch.tensor(p, dtype=torch.float64) for p in ([0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5])],
    2: [torch.tensor(p, dtype=torch.float64) for p in ([0.75, 0.25], [0.375, 0.625], [0.25, 0.75])],
}
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, (game_name, payoffs) in zip(axes, games.items()):
    n_actions = payoffs[0].shape[0]
    start = STARTS[n_actions]
    for i, (name, (make, mirror, style)) in enumerate(methods.items()):
        strategies = [MixedStrategy(s) for s in start]
        players = [gameopt.Player(s, constraint=Simplex(mirror=mirror)) for s in strategies]
        game = gameopt.Game(players, normal_form_losses(strategies, payoffs), algorithm=make())
        values = []
        for _ in range(steps + 1):
            with torch.no_grad():
                values.append(float(gameopt.nash_conv(payoffs, [s() for s in strategies])))
            game.step()
        zeros = [k for k, v in enumerate(values) if v == 0.0]
        label = name + (f" (exactly 0 from step {zeros[0]}: ▼)" if zeros else "")
        # exact zeros cannot be drawn on a log scale: the line stops, a marker (one height per
        # method, so that none hides another) shows where it reached 0
        line = ax.plot([v if v > 0 else float("nan") for v in values], label=label, lw=1.2, **style)[0]
        if zeros:
            ax.plot([zeros[0]], [10.0 ** (-15 + 1.5 * i)], marker="v", color=line.get_color(), ms=8, ls="none")
        print(f"{game_name:>30}, {name:>28}: NashConv after {steps} steps {values[-1]:.2e}")
    ax.set_title(game_name)
    ax.set_xlabel("step")
    ax.set_ylabel("NashConv")
    ax.legend(fontsize=8)
axes[0].set_yscale("log")
axes[1].set_ylim(0, 2.5)
fig.suptitle(f"three players, step size 0.1, {steps} steps")
fig.tight_layout()
plt.show()
