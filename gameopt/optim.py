"""The ``torch.optim`` surface of a game: :class:`GameOptimizer` (``game.optimizer``).

Schedulers, Lightning's manual optimization and step hooks need a
``torch.optim.Optimizer``. The algorithm is not one (it is a small object with an
``update``); the game owns this adapter, which shares the algorithm's param groups
(the very dicts: a scheduler's ``lr`` is the one the next step reads) and runs one
game step per :meth:`GameOptimizer.step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .game.reentry import refused
from .interrupts import deferred_interrupts

if TYPE_CHECKING:
    from .algorithms.base import Algorithm
    from .evaluation import StepLosses
    from .protocols import Steppable


class GameOptimizer(torch.optim.Optimizer):
    """A game as a ``torch.optim.Optimizer``, with one param group per player.

    The param groups are the same dicts as ``game.algorithm.param_groups``
    (``'lr'``, the schedulable hyperparameters such as ``'gamma'`` or Adam's
    ``'betas'``, ``'player'``, and the player's fused parameter buffers as
    ``'params'``).

    * :meth:`step` is one game step. ``closure`` (optional) re-evaluates the model
      and returns the losses, one per player (optionally followed by a dict of
      metrics), as the game's ``losses`` does; the algorithm calls it as many times
      as it evaluates (twice for extragradient), as ``LBFGS`` calls its closure.
      Without it, the game's own losses are used with no arguments. It returns the
      step's losses (:meth:`gameopt.Game.step`'s value).
    * :meth:`state_dict` / :meth:`load_state_dict` are the algorithm's (its param
      groups, and the state the game holds for it: ``game.algorithm_state``; a state
      that does not fit is refused and changes nothing).
      The per-parameter ``state`` of ``torch.optim`` stays empty: an algorithm's
      state is joint vectors over all players, which ``state_dict`` carries.

    The game builds it; the players are fixed (no :meth:`add_param_group`). Assigning
    ``game.algorithm`` builds a new one; this one then refuses to step.

    Args:
        game: the game it steps (its ``step_closure``).
        algorithm: the game's algorithm, whose param groups it shares.
    """

    def __init__(self, game: Steppable, algorithm: Algorithm) -> None:
        self._game: Steppable | None = None
        super().__init__(algorithm.param_groups, algorithm.defaults)
        self.param_groups = algorithm.param_groups  # the same list, so the same dicts
        self.algorithm = algorithm
        self._game = game

    def step(self, closure: Callable[[], Any] | None = None) -> StepLosses:  # type: ignore[override]
        """One game step (see the class docstring).

        Args:
            closure: re-evaluates the losses (no arguments), or None for the game's own.

        Returns:
            The players' losses at the start of the step (:class:`~gameopt.StepLosses`;
            with ``PastExtragradient``, at its extrapolated point: :meth:`gameopt.Game.step`).

        Raises:
            RuntimeError: the game's algorithm was replaced since this optimizer was made.
            gameopt.NonFiniteError: a non-finite step (nothing changed), unless the game skips it.
        """
        game = self._current_game()
        return game.step_closure(game.losses if closure is None else closure)

    def _current_game(self) -> Steppable:
        """The game, whose algorithm is still this optimizer's (else ``RuntimeError``)."""
        game = self._game
        if game is None:
            raise RuntimeError("this GameOptimizer has no game")
        if game.algorithm is not self.algorithm:
            raise RuntimeError(
                "the game's algorithm was replaced after this optimizer was made: step game.optimizer "
                "(and give schedulers game.optimizer again)"
            )
        return game

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's param groups and the state the game holds for it, read
        holding the game's lock (a step on another thread is waited for)."""
        with self._current_game().lock:
            _refuse_sharded(self._current_game(), "state_dict")
            return self.algorithm.state_dict(self._current_game().algorithm_state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (a state that does not fit raises ``ValueError``
        and changes nothing), holding the game's lock: a step on another thread is
        waited for; from inside a running step (its losses) the load is refused
        (``RuntimeError``). A Ctrl-C that arrives while it writes waits for it to end."""
        with self._current_game().lock:
            game = self._current_game()  # still this optimizer's, now that the lock is held
            if game.stepping:
                raise refused("game.optimizer.load_state_dict()")
            _refuse_sharded(game, "load_state_dict")
            game.synchronize()  # a refused step of the run this load replaces: said first
            with deferred_interrupts():  # the param groups and the state together
                game.algorithm_state = self.algorithm.load_state_dict(state_dict, game.algorithm_state)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self._game is not None:
            raise TypeError("a game's players are fixed: build a new gameopt.Game to add parameters")
        super().add_param_group(param_group)

    def __repr__(self) -> str:
        return f"GameOptimizer({self.algorithm!r})"


def _refuse_sharded(game: Any, call: str) -> None:
    """The optimizer's checkpoint holds each rank's flat shards as plain tensors, which
    ``torch.distributed.checkpoint`` would save once, as if every rank held the same:
    a sharded game is checkpointed whole, by ``game.state_dict()``."""
    if game.sharded:
        raise RuntimeError(
            f"game.optimizer.{call}() of a game of sharded players: checkpoint the game instead, "
            "game.state_dict() / game.load_state_dict() (its shards as DTensors, for torch.distributed.checkpoint; "
            "docs/sharded.md)"
        )
