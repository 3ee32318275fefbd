"""Look-ahead and opponent shaping: LA, LOLA, SOS (n players)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .api import Algorithm, DescentState, Hyper, Setting, UpdateRule, Vec

if TYPE_CHECKING:
    from .api import Linearization, Oracle, Step


def _anticipated(lin: Linearization, alpha: float) -> Vec:
    """ξ₀ = (I − α H_o) ξ."""
    return lin.xi.add(lin.offdiag_jvp(lin.xi), alpha=-alpha)


class LA(Algorithm[DescentState]):
    """Look-ahead (Zhang & Lesser 2010; Letcher et al. 2019, "Stable Opponent Shaping"):
    each player anticipates the others' next gradient step.

    Each step is

    .. math:: w_{t+1} = w_t - η \\, u(ξ_0), \\qquad ξ_0 = (I - α H_o) ξ,

    with H_o the off-diagonal blocks of the game Jacobian. Costs 2n reverse
    passes for n players.

    Args:
        lr: η, one float or one per player.
        alpha: α, the anticipated opponents' learning rate.
        update: per-player update rule (default: plain gradient).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
        TypeError: a setting left without a value, when the algorithm is bound to a game.

    References:
        - Letcher et al. 2019, `Stable Opponent Shaping in Differentiable Games <https://arxiv.org/abs/1811.08469>`_
    """

    first_order = False
    alpha = Hyper(low=0.0)

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        alpha: float = 1.0,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
    ) -> None:
        super().__init__(lr, update, alpha=alpha)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        lin = oracle.linearize(check=False, cross=True)  # the update is non-finite if ξ is
        delta, rule_state = self.scaled_descent(oracle, _anticipated(lin, self.alpha), state["rule"], scratch=True)
        return delta, {"rule": rule_state}


class LOLA(Algorithm[DescentState]):
    """Learning with opponent-learning awareness (Foerster et al. 2018): each player
    shapes the others' next gradient step to its own advantage.

    In the n-player form of Letcher et al. 2019:

    .. math::
        w_{t+1} = w_t - η \\, u(ξ_0 - α χ), \\qquad
        χ_i = \\sum_{j≠i} (∂ξ_j/∂w_i)^⊤ ∇_{w_j} f_i.

    ``shaping_only=True`` gives Foerster et al.'s original ξ − αχ. Costs 2n
    reverse passes for n players: each loss differentiated once against all
    parameters (with its graph), then one pass per player for both terms
    (:meth:`~gameopt.protocols.Linearization.shaping`).

    Args:
        lr: η, one float or one per player.
        alpha: α, the anticipated opponents' learning rate.
        shaping_only: drop the look-ahead term (ξ − αχ).
        update: per-player update rule (default: plain gradient).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
        TypeError: a setting left without a value, when the algorithm is bound to a game.

    References:
        - Foerster et al. 2018, `Learning with Opponent-Learning Awareness <https://arxiv.org/abs/1709.04326>`_
    """

    first_order = False
    alpha = Hyper(low=0.0)
    shaping_only = Setting.flag()

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        alpha: float = 1.0,
        shaping_only: bool = False,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
    ) -> None:
        super().__init__(lr, update, alpha=alpha, shaping_only=shaping_only)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        lin = oracle.linearize(check=False, cross=True)  # the update is non-finite if ξ is
        alpha = self.alpha
        # ξ − α(H_o ξ + χ), or ξ − αχ: one reverse pass per player with ``cross``
        shaping = lin.shaping(None if self.shaping_only else lin.xi)
        direction = lin.xi.add(shaping, alpha=-alpha)
        delta, rule_state = self.scaled_descent(oracle, direction, state["rule"], scratch=True)
        return delta, {"rule": rule_state}


class SOS(Algorithm[DescentState]):
    """Stable opponent shaping (Letcher et al. 2019, "Stable Opponent Shaping in
    Differentiable Games"): look-ahead plus LOLA's shaping term, scaled by p ≤ 1 to keep
    the stable fixed points.

    One step:

    .. math:: w_{t+1} = w_t - η \\, u(ξ_0 - p α χ), \\qquad p = \\min(p_1, p_2),

    p₁ = 1 if ⟨−αχ, ξ₀⟩ ≥ 0, else min(1, −a‖ξ₀‖² / ⟨−αχ, ξ₀⟩);
    p₂ = ‖ξ‖² if ‖ξ‖ < b, else 1. p is computed on the device (no host sync).
    Costs 3n reverse passes for n players (ξ₀ and χ are needed apart).

    Args:
        lr: η, one float or one per player.
        alpha: α, the anticipated opponents' learning rate.
        a: in (0, 1), the alignment threshold of p₁.
        b: the gradient-norm threshold of p₂.
        update: per-player update rule (default: plain gradient).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
        TypeError: a setting left without a value, when the algorithm is bound to a game.

    References:
        - Letcher et al. 2019, `Stable Opponent Shaping in Differentiable Games <https://arxiv.org/abs/1811.08469>`_
    """

    first_order = False
    alpha = Hyper(low=0.0)
    a = Setting.number(low=0.0, high=1.0, low_open=True, high_open=True)
    b = Setting.number(low=0.0, low_open=True)

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        alpha: float = 1.0,
        a: float = 0.5,
        b: float = 0.1,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
    ) -> None:
        super().__init__(lr, update, alpha=alpha, a=a, b=b)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        lin = oracle.linearize(check=False, cross=True)  # the update is non-finite if ξ is
        alpha, a, b = self.alpha, self.a, self.b
        xi0 = _anticipated(lin, alpha)
        chi = lin.chi()
        inner = -alpha * chi.dot(xi0)
        one = torch.ones_like(inner)
        p1 = torch.where(inner >= 0, one, torch.clamp(-a * xi0.dot(xi0) / inner, max=1.0))
        xi_sq = lin.xi.dot(lin.xi)
        p2 = torch.where(xi_sq.sqrt() < b, xi_sq, one)
        chi *= torch.minimum(p1, p2)
        direction = xi0.add(chi, alpha=-alpha)
        delta, rule_state = self.scaled_descent(oracle, direction, state["rule"], scratch=True)
        return delta, {"rule": rule_state}
