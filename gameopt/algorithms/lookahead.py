"""Lookahead around any algorithm."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .base import Algorithm, State, check_number

if TYPE_CHECKING:
    from ..game import Game, Oracle
    from ..layout import Vec


class Lookahead(Algorithm):
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
    """

    def __init__(self, base: Algorithm, k: int = 5, alpha: float = 0.5) -> None:
        if not isinstance(base, Algorithm):
            raise TypeError(f"base must be a gameopt Algorithm, got {type(base).__name__}")
        k = check_number("k", k, low=1, integer=True)
        super().__init__(0.0, k=k, alpha=check_number("alpha", alpha, low=0.0, high=1.0, low_open=True))
        self.base = base

    @property
    def first_order(self) -> bool:  # type: ignore[override]
        return self.base.first_order

    def bind(self, game: Game) -> None:
        self.base.bind(game)
        torch.optim.Optimizer.__init__(self, self.base.param_groups, {"lr": self.base.lrs[0]})
        self.game = game
        self.algo_state = self.init_state(game)

    def refresh_params(self, game: Game) -> None:
        self.base.refresh_params(game)

    def init_state(self, game: Game) -> State:
        return {"base": self.base.init_state(game), "slow": [t.clone() for t in game.layout.data], "count": 0}

    def update(self, oracle: Oracle, state: State) -> tuple[Vec, State]:
        delta, base_state = self.base.update(oracle, state["base"])
        count = state["count"] + 1
        slow = state["slow"]
        if count % self.hyper["k"] == 0:
            fast = oracle.moved(delta)
            slow = list(torch._foreach_add(slow, torch._foreach_sub(fast, slow), alpha=self.hyper["alpha"]))
            # an average of feasible points is feasible in a convex set; project where not
            oracle.project_nonconvex_(slow)
            delta = oracle.delta_to(slow)
        return delta, {"base": base_state, "slow": slow, "count": count}

    def __repr__(self) -> str:
        return f"Lookahead({self.base!r}, k={self.hyper['k']}, alpha={self.hyper['alpha']})"
