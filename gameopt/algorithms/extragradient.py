"""Extrapolation methods: extragradient and optimistic gradient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..updates import UpdateRule
from .base import Algorithm, State

if TYPE_CHECKING:
    from ..game import Game, Oracle
    from ..layout import Vec


class Extragradient(Algorithm):
    """Extragradient (Korpelevich 1976; Gidel et al. 2019, "A Variational
    Inequality Perspective on Generative Adversarial Networks"):

    .. math::
        w' = w_t - η' u(ξ(w_t)), \\qquad w_{t+1} = w_t - η \\, u(ξ(w'))

    Both evaluations advance the update rule's state, so ``update=Adam()`` is
    Extra-Adam as in the paper's code. Two evaluations per step, both with the
    arguments given to :meth:`Game.step` (one batch).

    Args:
        lr: η, one float or one per player.
        extrapolation_lr: η' (default η), one float or one per player.
        update: per-player update rule (default: plain gradient).
    """

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        extrapolation_lr: float | Sequence[float] | None = None,
        update: UpdateRule | None = None,
    ) -> None:
        super().__init__(lr, update, extrapolation_lr=extrapolation_lr)

    def update(self, oracle: Oracle, state: State) -> tuple[Vec, State]:
        eta_x = self.hyper["extrapolation_lr"]
        lrs = self.lrs if eta_x is None else ([eta_x] * oracle.num_players if isinstance(eta_x, float) else eta_x)
        out, rule_state = self.rule.apply(oracle.xi(), state["rule"])
        extrapolated = list(torch._foreach_add(oracle.params, oracle.scaled(out, [-lr for lr in lrs])))
        delta, rule_state = self.descend(oracle, oracle.xi(at=extrapolated), rule_state)
        return delta, {"rule": rule_state}


class Optimistic(Algorithm):
    """Optimistic gradient descent (Daskalakis et al. 2018, "Training GANs with
    Optimism"; Popov 1980's past extragradient):

    .. math:: w_{t+1} = w_t - 2η \\, u(ξ(w_t)) + η \\, u(ξ(w_{t-1}))

    with ``u(ξ(w_{-1})) := u(ξ(w_0))``, so the first step is plain gradient descent.
    With ``update=Adam()`` this is Optimistic Adam. One evaluation per step; the
    previous direction is kept in the state.

    Args:
        lr: η, one float or one per player.
        update: per-player update rule (default: plain gradient).
    """

    def __init__(self, lr: float | Sequence[float] = 1e-3, update: UpdateRule | None = None) -> None:
        super().__init__(lr, update)

    def init_state(self, game: Game) -> State:
        return {"rule": self.rule.init(game.layout.data), "prev": game.layout.zeros(), "t": 0}

    def update(self, oracle: Oracle, state: State) -> tuple[Vec, State]:
        out, rule_state = self.rule.apply(oracle.xi(), state["rule"])
        prev = state["prev"] if state["t"] > 0 else out
        direction = list(torch._foreach_sub(torch._foreach_mul(out, 2.0), prev))
        delta = oracle.scale_(direction, [-lr for lr in self.lrs])
        return delta, {"rule": rule_state, "prev": [t.clone() for t in out], "t": state["t"] + 1}
