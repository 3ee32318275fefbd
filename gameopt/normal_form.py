"""Distance to equilibrium in n-player normal-form games: NashConv."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["nash_conv"]


def _against_others(payoff: Tensor, strategies: Sequence[Tensor], i: int) -> Tensor:
    """u_i(a, σ_{−i}) for each action a of player i."""
    t = payoff
    for j in reversed(range(len(strategies))):  # the last axes first: earlier indices stay
        if j != i:
            t = torch.tensordot(t, strategies[j].to(t), dims=([j], [0]))
    return t


def nash_conv(payoffs: Sequence[Tensor], strategies: Sequence[Tensor]) -> Tensor:
    """NashConv of a mixed-strategy profile in an n-player normal-form game (the
    measure of OpenSpiel's ``nash_conv``; Lanctot et al. 2017, "A Unified
    Game-Theoretic Approach to Multiagent Reinforcement Learning"):

    .. math:: \\mathrm{NashConv}(σ) = \\sum_i \\big( \\max_a u_i(a, σ_{-i}) - u_i(σ) \\big) \\ge 0,

    zero exactly at a Nash equilibrium. In a two-player zero-sum game it is the
    duality gap.

    Args:
        payoffs: n tensors of shape (A₁, …, Aₙ); player i maximizes ``payoffs[i]``.
        strategies: n probability vectors, player i's of length Aᵢ.

    Returns:
        a 0-d tensor (differentiable where the max is attained once).

    Raises:
        ValueError: shapes that do not fit, or a strategy that is not a probability
            vector (negative entries, or a sum off 1 by more than √ε of its dtype).
    """
    n = len(payoffs)
    if n == 0 or len(strategies) != n:
        raise ValueError(f"nash_conv needs one strategy per player: got {n} payoffs and {len(strategies)} strategies")
    shape = tuple(s.shape[0] if s.dim() == 1 else -1 for s in strategies)
    for i, p in enumerate(payoffs):
        if tuple(p.shape) != shape:
            raise ValueError(f"payoffs[{i}] has shape {tuple(p.shape)}, the strategies' lengths give {shape}")
    for i, s in enumerate(strategies):
        tol = torch.finfo(s.dtype).eps ** 0.5 if s.is_floating_point() else 0.0
        if bool((s < 0).any()) or abs(float(s.sum()) - 1.0) > tol:
            raise ValueError(f"strategies[{i}] is not a probability vector: {s.tolist()}")
    total = payoffs[0].new_zeros(())
    for i in range(n):
        values = _against_others(payoffs[i], strategies, i)
        total = total + (values.max() - values @ strategies[i].to(values))
    return total
