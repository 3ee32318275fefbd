"""The iterated prisoner's dilemma with memory-1 policies and exact discounted
losses (Foerster et al. 2018, "Learning with Opponent-Learning Awareness";
Letcher et al. 2019, "Stable Opponent Shaping in Differentiable Games").

Each agent holds 5 logits: its cooperation logit in the first round, then after
each joint outcome of the previous round, seen from its own side (own action
first): CC, CD, DC, DD. Joint outcomes are indexed from agent 1's side, so agent
2's logits for CD and DC are swapped when building the Markov chain.

Payoffs are losses (years in prison): CC → (1, 1), CD → (3, 0), DC → (0, 3),
DD → (2, 2). The loss of agent i is the normalized discounted sum

    V_i = (1 − γ) p0ᵀ (I − γP)⁻¹ r_i,

the average loss per round under discounting: 1 for mutual cooperation, 2 for
mutual defection.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

#: The joint outcomes (agent 1's action first), in the order of the Markov chain.
STATES = ("CC", "CD", "DC", "DD")

#: Loss per round of each agent (columns) in each joint outcome (rows).
IPD_LOSSES = torch.tensor([[1.0, 1.0], [3.0, 0.0], [0.0, 3.0], [2.0, 2.0]], dtype=torch.float64)

#: Agent 2's logits in agent 1's order: (start, CC, DC, CD, DD) of its own view.
_SWAP = [0, 1, 3, 2, 4]


class IPDPolicy(nn.Module):
    """A memory-1 policy: 5 logits θ (start, CC, CD, DC, DD from the agent's own
    side); the agent cooperates with probability σ(θ).

    Args:
        theta: initial logits, shape (5,) (default zeros: cooperate with prob. 1/2).
        dtype: the parameter's dtype.
    """

    def __init__(self, theta: Tensor | None = None, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        value = torch.zeros(5, dtype=dtype) if theta is None else theta.detach().clone().to(dtype).reshape(5)
        self.theta = nn.Parameter(value)

    def forward(self) -> Tensor:
        """Cooperation probabilities σ(θ), shape (5,)."""
        return torch.sigmoid(self.theta)


def markov_chain(coop1: Tensor, coop2: Tensor) -> tuple[Tensor, Tensor]:
    """The initial distribution p0 (4,) and transition matrix P (4, 4) over joint
    outcomes (CC, CD, DC, DD), from both agents' cooperation probabilities (each
    (5,), in the agent's own state order)."""
    x1, x2 = coop1, coop2[_SWAP]

    def joint(a: Tensor, b: Tensor) -> Tensor:
        return torch.stack([a * b, a * (1 - b), (1 - a) * b, (1 - a) * (1 - b)], -1)

    return joint(x1[0], x2[0]), joint(x1[1:], x2[1:])


def discounted_losses(
    coop1: Tensor, coop2: Tensor, gamma: float = 0.96, normalized: bool = True
) -> tuple[Tensor, Tensor]:
    """Both agents' exact discounted losses (1 − γ) p0ᵀ (I − γP)⁻¹ r_i.

    ``normalized=False`` drops the factor (1 − γ), as in the papers' code; gradients
    are then 1/(1 − γ) times larger (25 for γ = 0.96).
    """
    p0, P = markov_chain(coop1, coop2)
    eye = torch.eye(4, dtype=P.dtype, device=P.device)
    # p0ᵀ (I − γP)⁻¹: the discounted visits of each joint outcome
    visits = torch.linalg.solve(eye - gamma * P.T, p0)
    if normalized:
        visits = (1 - gamma) * visits
    v = visits @ IPD_LOSSES.to(visits)
    return v[0], v[1]


def ipd_losses(
    p1: IPDPolicy, p2: IPDPolicy, gamma: float = 0.96, normalized: bool = True
) -> Callable[[], tuple[Tensor, Tensor]]:
    """The losses callable of the IPD between ``p1`` and ``p2`` (discount γ; see
    :func:`discounted_losses`)."""

    def losses() -> tuple[Tensor, Tensor]:
        return discounted_losses(p1(), p2(), gamma, normalized)

    return losses
