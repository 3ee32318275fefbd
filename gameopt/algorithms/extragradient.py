"""Extrapolation methods: extragradient and optimistic gradient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from .api import (
    Algorithm,
    DescentState,
    OptimisticState,
    Pieces,
    Setting,
    UpdateRule,
    Vec,
    apply_rule,
    next_count,
    owned,
    stepped,
)

if TYPE_CHECKING:
    from .api import GameView, Oracle, Step


class Extragradient(Algorithm[DescentState]):
    """Extragradient (Korpelevich 1976; Gidel et al. 2019, "A Variational Inequality
    Perspective on Generative Adversarial Networks"): each step evaluates ξ at an
    extrapolated point and steps from the current one.

    One step:

    .. math::
        w' = w_t - η' u(ξ(w_t)), \\qquad w_{t+1} = w_t - η \\, u(ξ(w'))

    Both evaluations advance the update rule's state, so ``update=Adam()`` is
    Extra-Adam as in the paper's code. Two evaluations per step, both with the
    arguments given to :meth:`Game.step` (one batch).

    Args:
        lr: η, one float or one per player.
        extrapolation_lr: η' (default η), one float or one per player.
        update: per-player update rule (default: plain gradient).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Korpelevich 1976, The extragradient method for finding saddle points and other problems, Ekonomika i
          Matematicheskie Metody 12
        - Gidel et al. 2019, `A Variational Inequality Perspective on Generative Adversarial Networks
          <https://arxiv.org/abs/1802.10551>`_
    """

    extrapolation_lr = Setting.per_player(optional=True, low=0.0)

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        extrapolation_lr: float | Sequence[float] | None = None,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
    ) -> None:
        super().__init__(lr, update, extrapolation_lr=extrapolation_lr)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        eta_x = self.extrapolation_lr
        lrs = self.lrs if eta_x is None else ([eta_x] * oracle.num_players if isinstance(eta_x, float) else eta_x)
        # the first direction may be the gradient buffer itself: the move to w' reads it
        # before ξ(w') is written there. The rule's state after it is rebuilt once ξ(w')
        # is in (Adam on large vectors: from a copy of ξ(w), one vector held during that
        # evaluation instead of two moments); the committed state is only read, so a
        # failure anywhere loses nothing
        xi = oracle.xi(pieces=self.reads_pieces)  # ξ read where autograd left it (no copy)
        out: Vec | Pieces
        if isinstance(xi, Pieces) and self.reads_xi_as_is:  # (the plain rule's extrapolation: ξ itself)
            out, memo = xi, state["rule"]
        else:  # (Pieces only to a rule that declares reads_pieces)
            out, memo = self.rule.extrapolate(cast(Vec, self.rule_input(xi)), state["rule"], oracle.empty)
        xi_x = oracle.xi(along=(out, [-lr for lr in lrs]), pieces=self.reads_pieces)  # ξ(w'), w' = w − η' out
        rule_state = self.rule.resume(memo, state["rule"], oracle.empty)  # this step's own
        delta, rule_state = self.scaled_descent(oracle, xi_x, rule_state, scratch=True, own_state=True)
        return delta, {"rule": rule_state}


class Optimistic(Algorithm[OptimisticState]):
    """Optimistic gradient descent (Daskalakis et al. 2018, "Training GANs with
    Optimism"; Popov 1980's past extragradient).

    One step:

    .. math:: w_{t+1} = w_t - 2η \\, u(ξ(w_t)) + η \\, u(ξ(w_{t-1}))

    with ``u(ξ(w_{-1})) := u(ξ(w_0))``, so the first step is plain gradient descent
    (also a parameter's first step after it joined a running game: its step count
    is its own: ``counts``).
    With ``update=Adam()`` this is Optimistic Adam. One evaluation per step; the
    previous direction is kept in the state.

    Args:
        lr: η, one float or one per player.
        update: per-player update rule (default: plain gradient).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Daskalakis et al. 2018, `Training GANs with Optimism <https://arxiv.org/abs/1711.00141>`_
        - Gidel et al. 2019, `A Variational Inequality Perspective on Generative Adversarial Networks
          <https://arxiv.org/abs/1802.10551>`_
    """

    evaluates_once = True
    counts = {"t": "prev"}

    def __init__(
        self, lr: float | Sequence[float] = 1e-3, update: UpdateRule | Sequence[UpdateRule] | None = None
    ) -> None:
        super().__init__(lr, update)

    def init_state(self, game: GameView) -> OptimisticState:
        return {"rule": self.rule.init(game.layout.data), "prev": game.layout.zeros(), "t": 0}

    def update(self, oracle: Oracle, state: OptimisticState) -> tuple[Vec, OptimisticState]:
        xi = oracle.xi()
        out, rule_state = apply_rule(self.rule, xi, state["rule"], oracle.empty, scratch=True)
        out = owned(oracle, out, borrowed=xi)  # the next step's previous direction
        t = state["t"]  # one count, or one per element once parameters joined later
        delta = xi  # read by now: the gradient buffer takes the step
        for g, (d, p, o) in enumerate(zip(delta, state["prev"], out)):
            done = stepped(t, g)  # else u(ξ(w₋₁)) := u(ξ(w₀)): the first step is plain
            p = p if done is True else o if done is False else torch.where(done, p, o)
            torch.add(p, o, alpha=-2.0, out=d)  # −(2 out − prev), exactly
        oracle.scale_(delta, self.lrs)
        return delta, {"rule": rule_state, "prev": out, "t": next_count(t)}
