"""Gradient play: simultaneous and alternating gradient descent."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .api import Algorithm, DescentState, Setting, UpdateRule, Vec, apply_rule

if TYPE_CHECKING:
    from .api import GameView, Oracle, Step


class SimGD(Algorithm[DescentState]):
    """Simultaneous gradient descent: every player steps on its own gradient at once.

    .. math:: w_{t+1} = w_t - η \\, u(ξ(w_t))

    with ``u`` the update rule (identity by default; :class:`~gameopt.Momentum`,
    :class:`~gameopt.Adam`).

    Args:
        lr: η, one float or one per player.
        update: per-player update rule (default: plain gradient).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
    """

    evaluates_once = True

    def __init__(
        self, lr: float | Sequence[float] = 1e-3, update: UpdateRule | Sequence[UpdateRule] | None = None
    ) -> None:
        super().__init__(lr, update)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        xi = oracle.xi(pieces=self.reads_pieces)  # read where autograd left it (the plain rule, Adam, ...)
        delta, rule_state = self.scaled_descent(oracle, xi, state["rule"], scratch=True)
        return delta, {"rule": rule_state}


class AltGD(Algorithm[DescentState]):
    """Alternating gradient descent: players move in turn (list order, or ``order``),
    each with its gradient at the point left by the players before it.

    .. math:: w^{i}_{t+1} = w^{i}_t - η_i \\, u\\big(ξ_i(w^{1}_{t+1}, …, w^{i-1}_{t+1}, w^{i}_t, …, w^{n}_t)\\big)

    (players numbered in the order they move). Costs one evaluation of the losses per
    player. On a :class:`~gameopt.LagrangianGame` (model first, multipliers second),
    the default order is cooper's ``AlternatingPrimalDualOptimizer`` and
    ``order=(1, 0)`` its ``AlternatingDualPrimalOptimizer``.

    Args:
        lr: η, one float or one per player.
        update: per-player update rule (default: plain gradient).
        order: the players' indices in the order they move (a permutation of the
            players; default: the game's list order).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Gidel et al. 2019, `Negative Momentum for Improved Game Dynamics <https://arxiv.org/abs/1807.04740>`_
    """

    order = Setting(lambda algo, name, order: _order(order, getattr(algo, "game", None)))

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
        order: Sequence[int] | None = None,
    ) -> None:
        super().__init__(lr, update, order=order)

    def bind(self, game: GameView) -> None:
        _order(self.order, game)
        super().bind(game)

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Vec, DescentState]:
        delta = oracle.layout.zeros()  # the players who moved so far: their steps
        ones = [1.0] * oracle.num_players
        rule_state, own = state["rule"], False  # own: rule_state is this step's copy
        order = self.order if self.order is not None else range(oracle.num_players)
        for turn, i in enumerate(order):
            xi = oracle.xi(along=(delta, ones) if turn else None, players=[i])
            # the rule is elementwise: player i's rule on player i's part only
            views = functools.partial(oracle.layout.player_views, i=i)
            part = self.rule.part(state["rule"], i, views)
            out, part = apply_rule(self.rule.for_player(i), views(xi), part)
            for d, o in zip(views(delta), out):
                torch.mul(o, -self.lrs[i], out=d)
            rule_state, own = self.rule.with_part(rule_state, i, part, views, own_state=own), True
        return delta, {"rule": rule_state}


def _order(order: Sequence[int] | None, game: GameView | None) -> tuple[int, ...] | None:
    """AltGD's ``order`` as a tuple (or None), checked: player indices (else
    ``TypeError``), a permutation of the game's once bound (else ``ValueError``)."""
    if order is None:
        return None
    if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
        raise TypeError(f"order must be a sequence of player indices, got {order!r}")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
        raise TypeError(f"order must hold player indices (ints), got {list(order)!r}")
    n = None if game is None else len(game.players)
    if n is not None and sorted(order) != list(range(n)):
        raise ValueError(f"order must be a permutation of the players' indices 0..{n - 1}, got {tuple(order)}")
    return tuple(order)
