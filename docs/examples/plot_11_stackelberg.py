"""
Stackelberg learning: a leader that anticipates its follower
============================================================

In a Stackelberg game a leader :math:`x` commits first and a follower :math:`y`
best-responds, :math:`y^*(x) = \\arg\\min_y f_2(x, y)`. Implicit Stackelberg learning
(Fiez, Chasnov & Ratliff 2020, :class:`gameopt.Stackelberg`) lets the leader descend its
*total* derivative, with the follower's response differentiated by the implicit
function theorem:

.. math:: x \\leftarrow x - \\eta_x\\big(\\nabla_x f_1
          - \\nabla^2_{xy}f_2\\,(\\nabla^2_{yy}f_2)^{-1}\\nabla_y f_1\\big),
          \\qquad y \\leftarrow y - \\eta_y\\nabla_y f_2.

The game here is general-sum, with closed-form answers:
:math:`f_1 = \\tfrac12(x - 1)^2 + y` (the leader wants :math:`x` near 1 and :math:`y` small)
and :math:`f_2 = \\tfrac12(y - x)^2` (the follower copies the leader, :math:`y^*(x) = x`).
Simultaneous gradient play converges to the Nash equilibrium :math:`(1, 1)`, where the
leader's loss is 1. A leader that accounts for :math:`y^*(x) = x` minimizes
:math:`\\tfrac12(x - 1)^2 + x` instead, and Stackelberg learning reaches the Stackelberg
equilibrium :math:`(0, 0)`, where its loss is 1/2. The follower learns ten times faster
than the leader (the timescale separation of the paper).
"""

import matplotlib.pyplot as plt
import numpy as np
import torch

import gameopt

lr = [0.05, 0.5]  # [leader, follower]
fig, (ax_plane, ax_loss) = plt.subplots(1, 2, figsize=(10, 4.2))
for name, algorithm, style in [
    ("simultaneous gradient play", gameopt.SimGD(lr), dict(color="C1", ls="--")),
    ("Stackelberg learning (leader x)", gameopt.Stackelberg(lr, leader=0), dict(color="k", ls="-")),
]:
    x = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    y = torch.nn.Parameter(torch.tensor([-1.0], dtype=torch.float64))

    def losses():
        return (0.5 * (x - 1) ** 2 + y).sum(), (0.5 * (y - x) ** 2).sum()  # leader's f1, follower's f2

    players = [gameopt.Player([x], name="leader"), gameopt.Player([y], name="follower")]
    game = gameopt.Game(players, losses, algorithm=algorithm)
    path, leader_loss = [], []
    for step in range(301):
        path.append((x.item(), y.item()))
        leader_loss.append(losses()[0].item())
        if step < 300:
            game.step()
    path = np.array(path)
    ax_plane.plot(path[:, 0], path[:, 1], lw=1.5, marker="o", markevery=20, ms=3, label=name, **style)
    ax_loss.plot(leader_loss, label=name, **style)
    print(f"{name:>31}: ends at ({path[-1, 0]:.4f}, {path[-1, 1]:.4f}), leader's loss {leader_loss[-1]:.4f}")
line = np.linspace(-1.2, 2.2, 2)
ax_plane.plot(line, line, color="0.6", lw=1, ls=":", label="follower's best response y = x")
ax_plane.plot([1], [1], "s", color="C1", ms=8, label="Nash equilibrium (1, 1)")
ax_plane.plot([0], [0], "*", color="C2", ms=12, label="Stackelberg equilibrium (0, 0)")
ax_plane.plot([2], [-1], "o", color="k", ms=5, label="start (2, −1)")
ax_plane.set_xlabel("x (leader)")
ax_plane.set_ylabel("y (follower)")
ax_plane.set_title("trajectories")
ax_plane.legend(fontsize=7, loc="upper left")
ax_loss.axhline(1.0, color="C1", lw=0.8, ls=":")
ax_loss.axhline(0.5, color="C2", lw=0.8, ls=":")
ax_loss.set_xlabel("step")
ax_loss.set_ylabel(r"leader's loss $f_1$")
ax_loss.set_title("leader's loss: 1 at Nash, 1/2 at Stackelberg")
ax_loss.legend()
fig.tight_layout()
plt.show()
