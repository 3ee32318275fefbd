"""Two-action matrix games with sigmoid policies.

A :class:`SigmoidPolicy` holds one logit θ and plays action 1 with probability
σ(θ), action 0 with probability 1 − σ(θ). A payoff matrix ``R[a1, a2]`` gives a
player's payoff when player 1 plays ``a1`` and player 2 plays ``a2``; losses are
negative expected payoffs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

Losses = Callable[[], tuple[Tensor, Tensor]]

#: Matching pennies, player 1's payoff: +1 when the actions match, −1 otherwise
#: (player 2's payoff is the negative). The unique (mixed) equilibrium is
#: p = q = 1/2, i.e. θ1 = θ2 = 0.
MATCHING_PENNIES = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64)


class SigmoidPolicy(nn.Module):
    """A mixed strategy over two actions: action 1 with probability σ(θ).

    Args:
        theta: the initial logit θ.
        dtype: the parameter's dtype.
    """

    def __init__(self, theta: float = 0.0, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(float(theta), dtype=dtype))

    def forward(self) -> Tensor:
        """The action distribution (P(action 0), P(action 1))."""
        p = torch.sigmoid(self.theta)
        return torch.stack([1 - p, p])

    def prob(self) -> Tensor:
        """P(action 1) = σ(θ), a 0-d tensor."""
        return torch.sigmoid(self.theta)


def expected_payoff(pi1: Tensor, pi2: Tensor, payoff: Tensor) -> Tensor:
    """E[R[a1, a2]] = π1ᵀ R π2 for action distributions ``pi1`` and ``pi2``."""
    return pi1 @ payoff.to(pi1) @ pi2


def bimatrix_losses(p1: SigmoidPolicy, p2: SigmoidPolicy, payoff1: Tensor, payoff2: Tensor) -> Losses:
    """General-sum losses (−E[R1], −E[R2])."""

    def losses() -> tuple[Tensor, Tensor]:
        pi1, pi2 = p1(), p2()
        return -expected_payoff(pi1, pi2, payoff1), -expected_payoff(pi1, pi2, payoff2)

    return losses


def zero_sum_losses(p1: SigmoidPolicy, p2: SigmoidPolicy, payoff: Tensor = MATCHING_PENNIES) -> Losses:
    """Zero-sum losses (L1, −L1) with L1 = −E[R1] (``payoff``: player 1's payoff,
    matching pennies by default)."""

    def losses() -> tuple[Tensor, Tensor]:
        l1 = -expected_payoff(p1(), p2(), payoff)
        return l1, -l1

    return losses
