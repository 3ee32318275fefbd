"""
Follow-the-Ridge: converging to a local minimax point
=====================================================

In a zero-sum game :math:`\\min_x \\max_y f(x, y)` the point to reach is usually a
local *minimax* point: :math:`y` best-responds to :math:`x`, not a mere stationary
point. Gradient descent-ascent (GDA) can circle such a point forever.
Follow-the-Ridge (Wang, Zhang & Ba 2020, :class:`gameopt.FollowTheRidge`) adds a
correction that keeps :math:`y` on the ridge :math:`\\nabla_y f = 0` as :math:`x` moves,

.. math:: x \\leftarrow x - \\eta\\nabla_x f,\\qquad
          y \\leftarrow y + \\eta\\nabla_y f + \\eta H_{yy}^{-1}H_{yx}\\nabla_x f,

and its stable fixed points are exactly the local minimax points. The function is the
paper's third toy example (Figure 2),
:math:`f = (0.4x^2 - 0.1(y - 3x + 0.05x^3)^2 - 0.01y^4)e^{-0.01(x^2 + y^2)}`, whose
origin is a local minimax point; both methods start at :math:`(7, 5)` with step 0.05.
The players are plain parameter vectors (``gameopt.Player([x])``), and the losses are
:math:`(f, -f)`.
"""

import math

import matplotlib.pyplot as plt
import numpy as np
import torch

import gameopt


def f(x, y):
    return (0.4 * x * x - 0.1 * (y - 3 * x + 0.05 * x**3) ** 2 - 0.01 * y**4) * torch.exp(-0.01 * (x * x + y * y))


def run(algorithm, steps=1000):
    x = torch.nn.Parameter(torch.tensor([7.0], dtype=torch.float64))
    y = torch.nn.Parameter(torch.tensor([5.0], dtype=torch.float64))

    def losses():
        v = f(x, y).sum()  # read the parameters on every call
        return v, -v

    game = gameopt.Game([gameopt.Player([x], name="x"), gameopt.Player([y], name="y")], losses, algorithm=algorithm)
    path, grad_norm = [], []
    for step in range(steps + 1):
        gx, gy = torch.autograd.grad(f(x, y).sum(), [x, y])
        path.append((x.item(), y.item()))
        grad_norm.append(math.hypot(gx.item(), gy.item()))
        if step < steps:
            game.step()
    return np.array(path), grad_norm


fig, (ax_plane, ax_grad) = plt.subplots(1, 2, figsize=(10, 4.2))
grid = torch.linspace(-8, 8, 161, dtype=torch.float64)
gx, gy = torch.meshgrid(grid, grid, indexing="xy")
ax_plane.contourf(gx.numpy(), gy.numpy(), f(gx, gy).numpy(), levels=30, cmap="RdBu_r", alpha=0.6)
for name, algorithm, style in [
    ("GDA", gameopt.SimGD(0.05), dict(color="C1", ls="--")),
    ("Follow-the-Ridge", gameopt.FollowTheRidge(0.05), dict(color="k", ls="-")),
]:
    path, grad_norm = run(algorithm)
    ax_plane.plot(path[:, 0], path[:, 1], lw=1.5, label=name, **style)
    ax_grad.semilogy(grad_norm, label=name, **style)
    print(f"{name:>16}: ends at ({path[-1, 0]:+.4f}, {path[-1, 1]:+.4f}), ‖∇f‖ = {grad_norm[-1]:.1e}")
ax_plane.plot([7], [5], "o", color="k", ms=5, label="start (7, 5)")
ax_plane.plot([0], [0], "*", color="C2", ms=12, label="local minimax point (0, 0)")
ax_plane.set_xlabel("x (minimizes f)")
ax_plane.set_ylabel("y (maximizes f)")
ax_plane.set_title("trajectories over the contours of f")
ax_plane.legend(fontsize=8, loc="lower left")
ax_grad.set_xlabel("step")
ax_grad.set_ylabel(r"$\|\nabla f(x, y)\|$")
ax_grad.set_title("distance from stationarity")
ax_grad.legend()
fig.tight_layout()
plt.show()
