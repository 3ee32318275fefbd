"""
Writing your own algorithm: consensus optimization
==================================================

The contract of :doc:`/custom-algorithm`, executed: everything an algorithm needs
comes from :mod:`gameopt.algorithms.api`. A subclass of ``Algorithm``, typed by its
state (here ``DescentState``: the update rule's state), implements
``update(oracle, state) -> (delta, new_state)``.
Here consensus optimization (Mescheder et al. 2017, `"The Numerics of GANs"
<https://arxiv.org/abs/1705.10461>`_),

.. math::
    w_{t+1} = w_t - \\eta \\, (\\xi + \\gamma J^\\top \\xi),

asks the oracle for a linearization, forms the direction with one Jacobian-transpose
product, and hands it to the update rule through ``self.descend``. We check it
against the built-in :class:`gameopt.ConsensusOptimization` iterate for iterate on
the bilinear game, and plot it beside simultaneous gradient descent.
"""

import matplotlib.pyplot as plt
import torch

import gameopt
from gameopt.algorithms.api import Algorithm, DescentState, Hyper, Oracle, Vec
from gameopt_players.quadratic import QuadraticPlayer, bilinear_losses


class MyConsensus(Algorithm[DescentState]):
    first_order = False  # it uses Jacobian products
    gamma = Hyper(low=0.0)  # lives in the param groups beside lr: schedulable, checkpointed

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Vec, DescentState]:
        lin = oracle.linearize(check=False)  # ξ with its graph
        direction = lin.xi.add_(lin.vjp(lin.xi, last=True), alpha=self.gamma)  # ξ + γ Jᵀξ; frees the graph
        delta, rule_state = self.descend(oracle, direction, state["rule"], scratch=True)
        return delta, {"rule": rule_state}  # all mutable state goes in the returned state


torch.manual_seed(0)
A = torch.randn(4, 4, dtype=torch.float64)  # the payoff of min_x max_y xᵀAy
x0, y0 = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)


def run(algorithm, steps=100):
    x, y = QuadraticPlayer(x0), QuadraticPlayer(y0)  # one parameter vector of shape (4,) each
    game = gameopt.Game([x, y], bilinear_losses(x, y, A), algorithm=algorithm)
    points = [torch.cat([x.w, y.w]).detach().clone()]
    for _ in range(steps):
        game.step()
        points.append(torch.cat([x.w, y.w]).detach().clone())
    return torch.stack(points)  # (steps + 1, 8)


mine = run(MyConsensus(0.05, gamma=0.5))
builtin = run(gameopt.ConsensusOptimization(0.05, gamma=0.5))
simgd = run(gameopt.SimGD(0.05))
print("largest difference to the built-in ConsensusOptimization:", float((mine - builtin).abs().max()))
assert torch.allclose(mine, builtin, rtol=0, atol=1e-12)

fig, ax = plt.subplots(figsize=(6, 4))
ax.semilogy(mine.norm(dim=1), label="MyConsensus (γ = 0.5)")
ax.semilogy(builtin.norm(dim=1), "k:", label="gameopt.ConsensusOptimization")
ax.semilogy(simgd.norm(dim=1), label="SimGD")
ax.set_xlabel("step")
ax.set_ylabel("distance to the equilibrium")
ax.set_title("a custom algorithm on the bilinear game, η = 0.05")
ax.legend()
fig.tight_layout()
plt.show()
