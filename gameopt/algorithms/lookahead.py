"""Lookahead around any algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .api import Algorithm, LookaheadState, Setting, Wrapper

if TYPE_CHECKING:
    from .api import GameView, Oracle, Step


class Lookahead(Wrapper[LookaheadState]):
    """Lookahead-minmax (Chavdarova et al. 2021, "Taming GANs with Lookahead-Minmax").

    The base algorithm moves the fast weights; every ``k`` steps all players'
    slow weights move towards them and the fast weights restart from there (with
    feasible sets: the average of feasible points, projected where a set is not
    convex):

    .. math:: \\tilde w \\leftarrow \\tilde w + α (w - \\tilde w), \\qquad w \\leftarrow \\tilde w

    Learning rates are the base algorithm's (its param groups are shared).

    Args:
        base: the inner algorithm.
        k: fast steps between synchronizations.
        alpha: α in (0, 1].

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Chavdarova et al. 2021, `Taming GANs with Lookahead-Minmax <https://arxiv.org/abs/2006.14567>`_
    """

    k = Setting.integer(low=1)
    alpha = Setting.number(low=0.0, high=1.0, low_open=True)

    def __init__(self, base: Algorithm, k: int = 5, alpha: float = 0.5) -> None:
        super().__init__(base, k=k, alpha=alpha)

    def init_state(self, game: GameView) -> LookaheadState:
        return {"base": self.base.init_state(game), "slow": game.layout.data.clone(), "count": 0}

    def update(self, oracle: Oracle, state: LookaheadState) -> tuple[Step, LookaheadState]:
        delta, base_state = self.base.update(oracle, state["base"])
        count = state["count"] + 1
        slow = state["slow"]
        if count % self.k == 0:
            diff = oracle.moved(delta)  # the fast weights, then (in place) fast − slow
            diff -= slow
            slow = slow.add(diff, alpha=self.alpha)
            # an average of feasible points is feasible in a convex set; project where not
            oracle.project_nonconvex_(slow)
            delta = oracle.delta_to(slow)
        return delta, {"base": base_state, "slow": slow, "count": count}
