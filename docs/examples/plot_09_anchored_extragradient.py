"""
Anchored extragradient: an O(1/k²) rate on the squared gradient norm
====================================================================

Anchored extragradient (EAG-C, Yoon & Ryu 2021, :class:`gameopt.AnchoredExtragradient`)
pulls each extragradient step towards the starting point :math:`z_0` with a weight
:math:`\\beta_k = 1/(k+2)` that vanishes:

.. math:: z_{k+1/2} = z_k + \\beta_k(z_0 - z_k) - \\alpha\\xi(z_k),\\qquad
          z_{k+1} = z_k + \\beta_k(z_0 - z_k) - \\alpha\\xi(z_{k+1/2}).

For a monotone :math:`L`-Lipschitz :math:`\\xi` and :math:`\\alpha \\le 1/(8L)` its
squared gradient norm :math:`\\|\\xi(z_k)\\|^2` falls like :math:`1/k^2`, where
extragradient's last iterate only has :math:`1/k`. The game is
:math:`\\min_x \\max_y x^\\top A y` with singular values spread log-uniformly over
:math:`[10^{-2}, 1]` (:math:`L = 1`), where :math:`\\|\\xi(z)\\|^2 = \\|Ay\\|^2 + \\|A^\\top x\\|^2`.
The dashed line is the paper's bound
:math:`\\frac{4(1 + \\alpha L + \\alpha^2L^2)}{\\alpha^2(1 + \\alpha L)}\\frac{\\|z_0 - z^*\\|^2}{(k+1)^2}`.
"""

import math

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt_players.quadratic import QuadraticPlayer, bilinear_losses

dim, steps, alpha = 20, 2000, 1 / 8  # α = 1/(8L) with L = 1, the largest singular value
g = torch.Generator().manual_seed(0)
u, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
v, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
A = u @ torch.diag(torch.logspace(-2, 0, dim, dtype=torch.float64)) @ v.T
x0, y0 = u.sum(1), v.sum(1)  # one unit along each singular pair; the equilibrium is z* = 0

runs = {
    "anchored extragradient (EAG-C)": (gameopt.AnchoredExtragradient(alpha), dict(color="C2", ls="-")),
    "extragradient": (gameopt.Extragradient(alpha), dict(color="C1", ls="--")),
}
fig, ax = plt.subplots(figsize=(6.5, 4))
k = torch.arange(1, steps + 1, dtype=torch.float64)
for name, (algorithm, style) in runs.items():
    x, y = QuadraticPlayer(x0), QuadraticPlayer(y0)
    game = gameopt.Game([x, y], bilinear_losses(x, y, A), algorithm=algorithm)
    squared = []
    for _ in range(steps):
        game.step()
        with torch.no_grad():
            squared.append(float((A @ y.w).square().sum() + (A.T @ x.w).square().sum()))
    ax.loglog(k, squared, label=name, **style)
    slope = math.log(squared[-1] / squared[steps // 10 - 1]) / math.log(10)
    print(f"{name:>31}: ‖ξ‖² = {squared[-1]:.2e} at k = {steps}, log-log slope over the last decade {slope:.2f}")
distance0 = float(x0.square().sum() + y0.square().sum())
bound = 4 * (1 + alpha + alpha**2) / (alpha**2 * (1 + alpha)) * distance0 / (k + 1) ** 2
ax.loglog(k, bound, color="0.4", ls=(0, (4, 3)), lw=1, label="EAG-C bound (Yoon & Ryu 2021)")
ax.set_xlabel("step k")
ax.set_ylabel(r"$\|\xi(z_k)\|^2$")
ax.set_title(r"$\min_x \max_y x^\top A y$, $\alpha = 1/(8L)$")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
