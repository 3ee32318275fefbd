"""Distance to equilibrium in n-player normal-form games: NashConv."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["nash_conv"]


def _against_others(payoff: Tensor, strategies: Sequence[Tensor], i: int) -> Tensor:
    """u_i(a, σ_{−i}) for each action a of player i."""
    t = payoff
    for j in reversed(range(len(strategies))):  # the last axes first: earlier indices stay
        if j != i:
            t = torch.tensordot(t, strategies[j], dims=([j], [0]))
    return t


def nash_conv(payoffs: Sequence[Tensor], strategies: Sequence[Tensor]) -> Tensor:
    """NashConv of a mixed-strategy profile in an n-player normal-form game: the sum
    over players of what each gains by its best deviation.

    The measure of OpenSpiel's ``nash_conv`` (Lanctot et al. 2017, "A Unified
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
        ValueError: shapes that do not fit, complex tensors, or a strategy that is not a
            probability vector (not 1-D, negative or NaN entries, or a sum off 1 by more
            than √ε of its dtype; exactly 1 for an integer strategy).

    It is computed in the promoted dtype of the payoffs and strategies, or in torch's
    default dtype where both are integers (exact payoffs such as rock-paper-scissors').
    """
    n = len(payoffs)
    if n == 0 or len(strategies) != n:
        raise ValueError(f"nash_conv needs one strategy per player: got {n} payoffs and {len(strategies)} strategies")
    for i, s in enumerate(strategies):
        _check_strategy(i, s)
    shape = tuple(s.shape[0] for s in strategies)
    for i, p in enumerate(payoffs):
        if tuple(p.shape) != shape:
            raise ValueError(f"payoffs[{i}] has shape {tuple(p.shape)}, the strategies' lengths give {shape}")
        if p.is_complex():
            raise ValueError(f"payoffs[{i}] must be real, got {p.dtype}")
    dtype = _common_float([*payoffs, *strategies])
    device = payoffs[0].device
    payoffs = [p.to(device=device, dtype=dtype) for p in payoffs]
    strategies = [s.to(device=device, dtype=dtype) for s in strategies]
    total = payoffs[0].new_zeros(())
    for i in range(n):
        values = _against_others(payoffs[i], strategies, i)
        total = total + (values.max() - values @ strategies[i])
    return total


def _check_strategy(i: int, s: Tensor) -> None:
    """Refuse a strategy that is not a real probability vector: not 1-D, an entry that
    is negative or NaN, or a sum off 1 by more than √ε of its dtype (exactly 1 for
    integers)."""
    if not isinstance(s, Tensor) or s.dim() != 1 or s.is_complex():
        got = f"shape {tuple(s.shape)} and {s.dtype}" if isinstance(s, Tensor) else type(s).__name__
        raise ValueError(f"strategies[{i}] must be a real vector (a 1-D tensor), got {got}")
    tol = torch.finfo(s.dtype).eps ** 0.5 if s.is_floating_point() else 0.0
    s = s.detach()  # a check, outside any graph (a strategy may require grad)
    total = float(s.sum())
    if not bool((s >= 0).all()) or not abs(total - 1.0) <= tol:  # NaN fails both comparisons
        raise ValueError(
            f"strategies[{i}] is not a probability vector (entries >= 0, summing to 1 within {tol:.3g}): {s.tolist()}"
        )


def _common_float(tensors: Sequence[Tensor]) -> torch.dtype:
    """The dtype NashConv is computed in: the tensors' promoted dtype if it is a
    floating-point one, else (integer payoffs and strategies) torch's default."""
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return dtype if dtype.is_floating_point else torch.get_default_dtype()
