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


#: Rock-paper-scissors, player 1's payoff (row: player 1's action). Value 0, the
#: unique equilibrium is uniform play by both players.
ROCK_PAPER_SCISSORS = torch.tensor([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]], dtype=torch.float64)


class MixedStrategy(nn.Module):
    """A mixed strategy over ``n`` actions: a probability vector, to be kept on the
    simplex by a constraint (``gameopt.Player(s, constraint=Simplex(...))``).

    Args:
        probs: the initial probabilities (default uniform over ``n`` actions).
    """

    def __init__(self, probs: Tensor) -> None:
        super().__init__()
        self.p = nn.Parameter(probs.detach().clone())

    def forward(self) -> Tensor:
        return self.p


def random_zero_sum(n: int, seed: int) -> Tensor:
    """A seeded n×n payoff matrix with standard normal entries."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n, generator=g, dtype=torch.float64)


def matrix_game_losses(x: MixedStrategy, y: MixedStrategy, payoff: Tensor) -> Losses:
    """Zero-sum losses of the matrix game: player x maximizes xᵀ R y, so its loss is
    −xᵀ R y and y's is xᵀ R y."""

    def losses() -> tuple[Tensor, Tensor]:
        v = x() @ payoff.to(x.p) @ y()
        return -v, v

    return losses


def duality_gap(payoff: Tensor, x: Tensor, y: Tensor) -> float:
    """max_i (R y)_i − min_j (xᵀ R)_j ≥ 0, zero exactly at an equilibrium."""
    r = payoff.to(x)
    return float((r @ y).max() - (x @ r).min())


def random_payoffs(n_players: int, n_actions: int, seed: int) -> list[Tensor]:
    """A seeded general-sum normal-form game: one payoff tensor of shape
    (n_actions,)·n_players per player, standard normal entries."""
    g = torch.Generator().manual_seed(seed)
    shape = (n_actions,) * n_players
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n_players)]


def cyclic_matching_pennies() -> list[Tensor]:
    """Jordan's (1993) three-player cyclic matching pennies, two actions each: player 1
    wins (+1, else −1) by matching player 2, player 2 by matching player 3, player 3 by
    mismatching player 1. No pure equilibrium; the unique Nash equilibrium is uniform play."""
    a = torch.arange(2)
    a1, a2, a3 = torch.meshgrid(a, a, a, indexing="ij")
    sign = lambda win: win.to(torch.float64) * 2 - 1  # noqa: E731
    return [sign(a1 == a2), sign(a2 == a3), sign(a3 != a1)]


def expected_payoffs(payoffs: list[Tensor], strategies: list[Tensor]) -> list[Tensor]:
    """u_i(σ) = E_{a∼σ}[payoffs[i][a]] for each player i (independent mixed strategies)."""
    out = []
    for payoff in payoffs:
        t = payoff.to(strategies[0])
        for j in reversed(range(len(strategies))):  # the last axes first: earlier indices stay
            t = torch.tensordot(t, strategies[j], dims=([j], [0]))
        out.append(t)
    return out


def normal_form_losses(strategies: list[MixedStrategy], payoffs: list[Tensor]) -> Callable[[], list[Tensor]]:
    """General-sum losses of an n-player normal-form game: player i's is −u_i(σ)."""

    def losses() -> list[Tensor]:
        return [-u for u in expected_payoffs(payoffs, [s() for s in strategies])]

    return losses
