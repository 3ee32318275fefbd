"""Hamiltonian gradient descent and consensus optimization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .api import Algorithm, DescentState, Hyper, Setting, UpdateRule

if TYPE_CHECKING:
    from .api import Oracle, Step


class HamiltonianGD(Algorithm[DescentState]):
    """Hamiltonian gradient descent (Balduzzi et al. 2018, "The Mechanics of n-Player
    Differentiable Games"; Loizou et al. 2020): descend the Hamiltonian ℋ = ½‖ξ‖².

    Its gradient is Jᵀξ:

    .. math:: w_{t+1} = w_t - η \\, u(J^⊤ ξ)

    Args:
        lr: η, one float or one per player.
        update: per-player update rule (default: plain gradient).
        zero_sum: the game is two players with losses (f, −f): Jᵀξ = ∇²f ∇f, one
            Hessian-vector product through one ``create_graph`` backward of f.

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Balduzzi et al. 2018, `The Mechanics of n-Player Differentiable Games <https://arxiv.org/abs/1802.05642>`_
    """

    first_order = False
    zero_sum = Setting.flag()

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
        zero_sum: bool = False,
    ) -> None:
        super().__init__(lr, update, zero_sum=zero_sum)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        # the direction Jᵀξ alone may not show a non-finite ξ
        lin = oracle.linearize(zero_sum=self.zero_sum)
        # the one product: the graph is freed as it goes
        delta, rule_state = self.scaled_descent(oracle, lin.vjp(lin.xi, last=True), state["rule"], scratch=True)
        return delta, {"rule": rule_state}


class ConsensusOptimization(Algorithm[DescentState]):
    """Consensus optimization (Mescheder et al. 2017, "The Numerics of GANs"): gradient
    play plus γ times the gradient of the Hamiltonian ½‖ξ‖².

    One step:

    .. math:: w_{t+1} = w_t - η \\, u(ξ + γ J^⊤ ξ)

    Args:
        lr: η, one float or one per player.
        gamma: γ ≥ 0, the weight of the Hamiltonian's gradient.
        update: per-player update rule (default: plain gradient; the paper uses RMSProp-like steps).
        zero_sum: the game is two players with losses (f, −f): Jᵀξ = ∇²f ∇f, one
            Hessian-vector product through one ``create_graph`` backward of f.

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
        TypeError: a setting left without a value, when the algorithm is bound to a game.

    References:
        - Mescheder et al. 2017, `The Numerics of GANs <https://arxiv.org/abs/1705.10461>`_
    """

    first_order = False
    gamma = Hyper(low=0.0)
    zero_sum = Setting.flag()

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        gamma: float = 0.1,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
        zero_sum: bool = False,
    ) -> None:
        super().__init__(lr, update, gamma=gamma, zero_sum=zero_sum)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        # the update is non-finite if ξ is
        lin = oracle.linearize(check=False, zero_sum=self.zero_sum)
        direction = lin.xi.add_(lin.vjp(lin.xi, last=True), alpha=self.gamma)  # lin is used up: in place
        delta, rule_state = self.scaled_descent(oracle, direction, state["rule"], scratch=True)
        return delta, {"rule": rule_state}
