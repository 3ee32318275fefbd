"""
Dirac GAN phase plane
=====================

The Dirac GAN (Mescheder, Geiger & Nowozin 2018, `"Which Training Methods for GANs
do actually Converge?" <https://arxiv.org/abs/1801.04406>`_): the data is a Dirac at
0, the generator a Dirac at :math:`\\theta`, the discriminator
:math:`D(x) = \\psi x`. With :math:`f(t) = -\\log(1 + e^{-t})` the generator
minimizes and the discriminator maximizes :math:`L(\\theta, \\psi) = f(\\psi\\theta) + f(0)`.
The Jacobian at the equilibrium :math:`(0, 0)` has purely imaginary eigenvalues
:math:`\\pm i/2`: simultaneous gradient descent spirals out, alternating gradient
descent circles, and extragradient and consensus optimization converge.
"""

import matplotlib.pyplot as plt
import numpy as np
from torch.nn import functional as F

import gameopt
from gameopt_players.quadratic import QuadraticPlayer


def dirac_losses(gen, disc):
    def losses():
        theta, psi = gen.w.sum(), disc.w.sum()
        value = -F.softplus(-psi * theta) + np.log(0.5)  # f(ψθ) + f(0)
        return value, -value

    return losses


algorithms = {
    "SimGD": gameopt.SimGD(0.3),
    "AltGD": gameopt.AltGD(0.3),
    "Extragradient": gameopt.Extragradient(0.3),
    "Consensus (γ=1)": gameopt.ConsensusOptimization(0.3, gamma=1.0),
}

# the vector field (ξ_θ, ξ_ψ) = (ψ f'(θψ), −θ f'(θψ)), f'(t) = σ(−t), drawn as arrows
grid = np.linspace(-2, 2, 15)
T, P = np.meshgrid(grid, grid)
fp = 1 / (1 + np.exp(T * P))
fig, ax = plt.subplots(figsize=(6, 5.5))
ax.quiver(T, P, -P * fp, T * fp, color="0.75")

for name, algorithm in algorithms.items():
    gen, disc = QuadraticPlayer([1.0]), QuadraticPlayer([1.0])  # θ and ψ, each of shape (1,)
    game = gameopt.Game([gen, disc], dirac_losses(gen, disc), algorithm=algorithm)
    path = [(gen.w.item(), disc.w.item())]
    for _ in range(200):
        game.step()
        path.append((gen.w.item(), disc.w.item()))
    path = np.array(path)
    ax.plot(path[:, 0], path[:, 1], label=name)
    print(f"{name:>16}: distance to (0, 0) after 200 steps {np.hypot(*path[-1]):.3f}")
ax.plot([0], [0], "k*", markersize=12, label="equilibrium")
ax.set_xlim(-2, 2)
ax.set_ylim(-2, 2)
ax.set_xlabel(r"generator $\theta$")
ax.set_ylabel(r"discriminator $\psi$")
ax.set_title("Dirac GAN, step size 0.3, start (1, 1)")
ax.legend(loc="lower left")
fig.tight_layout()
plt.show()
