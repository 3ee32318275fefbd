"""Extragradient's successors with last-iterate guarantees: extrapolation from the
past (one evaluation per step) and anchored extragradient (the optimal O(1/k²) rate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .api import Algorithm, AnchoredExtragradientState, PastExtragradientState, UpdateRule, Vec, apply_rule, owned

if TYPE_CHECKING:
    from .api import GameView, Oracle


class PastExtragradient(Algorithm[PastExtragradientState]):
    """Extrapolation from the past: extragradient that extrapolates with the previous
    step's update, one evaluation per step.

    Popov 1980, "A modification of the Arrow-Hurwicz method for search of saddle
    points"; Gidel et al. 2019, "A Variational Inequality Perspective on Generative
    Adversarial Networks", Algorithm 2, https://arxiv.org/abs/1802.10551:

    .. math::
        w'_t = P(w_t - η \\, u_{t-1}), \\qquad u_t = u(ξ(w'_t)), \\qquad
        w_{t+1} = P(w_t - η \\, u_t), \\qquad u_{-1} = 0,

    with P each player's projection or mirror step (identity without a feasible set)
    and u the update rule (identity by default), whose state advances once per step.
    One evaluation of the losses per step, at w'_t; the parameters hold w_t, the state
    u_{t-1}. So ``game.step()`` returns the losses at w'_t (at w_t only on the first
    step), where the other algorithms return them at w_t.
    Without feasible sets the points w'_t follow optimistic gradient
    (:class:`Optimistic`) from w'_1 on; under projections the two differ.

    Args:
        lr: η, one float or one per player.
        update: per-player update rule (default: plain gradient).
    """

    def __init__(
        self, lr: float | Sequence[float] = 1e-3, update: UpdateRule | Sequence[UpdateRule] | None = None
    ) -> None:
        super().__init__(lr, update)

    def init_state(self, game: GameView) -> PastExtragradientState:
        return {"rule": self.rule.init(game.layout.data), "prev": game.layout.zeros()}

    def update(self, oracle: Oracle, state: PastExtragradientState) -> tuple[Vec, PastExtragradientState]:
        factors = [-lr for lr in self.lrs]
        xi = oracle.xi(along=(state["prev"], factors))  # ξ(w'_t), w'_t = P(w_t − η u_{t−1})
        out, rule_state = apply_rule(self.rule, xi, state["rule"], oracle.empty, scratch=True)
        out = owned(oracle, out, borrowed=xi)  # the state keeps it
        return oracle.layout.scale_(out, factors, out=xi), {"rule": rule_state, "prev": out}


class AnchoredExtragradient(Algorithm[AnchoredExtragradientState]):
    """Extra anchored gradient (EAG-C): extragradient steps pulled toward the starting
    point, with an O(1/k²) rate on the squared norm of ξ.

    Yoon & Ryu 2021, "Accelerated Algorithms for Smooth Convex-Concave Minimax Problems
    with O(1/k²) Rate on Squared Gradient Norm", https://arxiv.org/abs/2102.07922:

    .. math::
        z_{k+1/2} = z_k + β_k (z_0 - z_k) - α ξ(z_k), \\qquad
        z_{k+1} = z_k + β_k (z_0 - z_k) - α ξ(z_{k+1/2}), \\qquad β_k = \\frac{1}{k+2},

    with the anchor z_0 the point at the algorithm's first step (kept in the state,
    with k). For L-Lipschitz monotone ξ and α ≤ 1/(8L), ‖ξ(z_k)‖² = O(‖z_0 − z*‖²/(α²k²)).
    Two evaluations per step. With feasible sets, both moves leave the anchored point
    z_k + β_k(z_0 − z_k) by the set's step (projection or mirror step) of −αξ.

    Args:
        lr: α, one float or one per player.
    """

    def __init__(self, lr: float | Sequence[float] = 1e-3) -> None:
        super().__init__(lr)

    def init_state(self, game: GameView) -> AnchoredExtragradientState:
        return {"anchor": game.layout.zeros(), "k": 0}

    def update(self, oracle: Oracle, state: AnchoredExtragradientState) -> tuple[Vec, AnchoredExtragradientState]:
        k, w = state["k"], oracle.params
        anchor = state["anchor"] if k > 0 else oracle.empty().copy_(w)
        beta, factors = 1.0 / (k + 2), [-lr for lr in self.lrs]
        anchored = oracle.empty().copy_(w).lerp_(anchor, beta)  # z_k + β_k (z_0 − z_k)
        half = oracle.moved(oracle.layout.scale_(oracle.xi(), factors), at=anchored)
        target = oracle.moved(oracle.layout.scale_(oracle.xi(at=half), factors), at=anchored)
        return oracle.delta_to(target), {"anchor": anchor, "k": k + 1}
