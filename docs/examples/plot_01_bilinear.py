"""
Bilinear game: SimGD, extragradient and optimism
================================================

The bilinear game :math:`\\min_x \\max_y x^\\top A y` has its only equilibrium at
:math:`(0, 0)` when :math:`A` is invertible. Its vector field
:math:`\\xi = (Ay, -A^\\top x)` is a pure rotation, so simultaneous gradient descent
spirals *out* at every step size, while extragradient (Korpelevich 1976) and
optimistic gradient (Daskalakis et al. 2018) converge at a linear rate for small steps.
At this step size the two converge at almost the same rate, so their curves nearly
coincide (extragradient dashed, optimism dotted with markers).
"""

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt_players.quadratic import QuadraticPlayer, bilinear_losses

torch.manual_seed(0)
dim = 10
q1, _ = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))
q2, _ = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))
A = q1 @ torch.diag(torch.linspace(1.0, 2.0, dim, dtype=torch.float64)) @ q2  # singular values in [1, 2]
x0 = torch.randn(dim, dtype=torch.float64)
y0 = torch.randn(dim, dtype=torch.float64)

algorithms = {
    "SimGD": (gameopt.SimGD(0.1), dict(color="C0", ls="-")),
    "Extragradient": (gameopt.Extragradient(0.1), dict(color="C1", ls="--", lw=2)),
    "Optimistic": (gameopt.Optimistic(0.1), dict(color="C2", ls=":", lw=2, marker="o", markevery=30, ms=4)),
}
fig, ax = plt.subplots(figsize=(6, 4))
for name, (algorithm, style) in algorithms.items():
    x, y = QuadraticPlayer(x0), QuadraticPlayer(y0)  # each holds one parameter vector of shape (10,)
    game = gameopt.Game([x, y], bilinear_losses(x, y, A), algorithm=algorithm)
    distance = []
    for _ in range(300):
        distance.append(torch.cat([x.w, y.w]).norm().item())
        game.step()
    ax.semilogy(distance, label=name, **style)
    print(f"{name:>14}: distance to the equilibrium after 300 steps {distance[-1]:.2e}")
ax.set_xlabel("step")
ax.set_ylabel(r"$\|(x, y)\|$")
ax.set_title(r"$\min_x \max_y x^\top A y$, step size 0.1")
ax.legend()
fig.tight_layout()
plt.show()
