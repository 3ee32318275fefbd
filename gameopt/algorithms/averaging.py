"""Iterate averaging around any algorithm: uniform and exponential moving averages."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .api import Algorithm, AveragingState, Setting, Vec, Wrapper, check_number

if TYPE_CHECKING:
    from .api import GameView, Oracle, Step


class Averaging(Wrapper[AveragingState]):
    """The running average w̄ of the iterates of any algorithm (Yazıcı et al. 2019, "The
    Unusual Effectiveness of Averaging in GAN Training", section 3).

    The base algorithm moves the iterates wₜ exactly as without the wrapper; the
    state also holds w̄ₜ, equal to wₜ for t ≤ s (``start``) and after that

    .. math:: \\bar w_t = \\bar w_{t-1} + a_t (w_t - \\bar w_{t-1}), \\qquad
              a_t = \\tfrac{1}{t - s} \\text{ (uniform)}, \\quad a_t = 1 - β \\text{ (ema)}

    ``"uniform"``: w̄ₜ = (w_{s+1} + … + wₜ)/(t − s), the starting point w_s not
    included (for s = 0, Yazıcı et al.'s MA (1/t) Σᵢ₌₁ᵗ wᵢ: w₀ is left out).
    ``"ema"``: starts from w̄_s = w_s (w̄₀ = w₀, Yazıcı et al.'s EMA), no bias
    correction. The iterates are averaged, not extragradient's extrapolation
    points, whose average has the O(1/t) ergodic rate for monotone games
    (Nemirovski 2004; Gidel et al. 2019, Thm. 2); on a bilinear game the iterates'
    average converges at O(1/t) too. An average of feasible points is feasible in
    a convex set; it is projected where a set is not convex.

    Use :meth:`average` (w̄ per player) or ``with algo.averaged(): ...`` (w̄ in
    the parameters, for evaluation). Learning rates are the base algorithm's.

    Args:
        base: the algorithm that moves the iterates.
        kind: ``"uniform"`` or ``"ema"``.
        decay: β in [0, 1), for ``"ema"``.
        start: steps before averaging starts (s).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Yazıcı et al. 2019, `The Unusual Effectiveness of Averaging in GAN Training
          <https://arxiv.org/abs/1806.04498>`_
    """

    kind = Setting.choice("uniform", "ema")
    decay = Setting.number(low=0.0, high=1.0, high_open=True)
    start = Setting.integer(low=0)
    _swapped = 0  # how many averaged() blocks hold w̄ in the parameters now (they nest)

    def __init__(self, base: Algorithm, kind: str = "uniform", decay: float = 0.999, start: int = 0) -> None:
        super().__init__(base, kind=kind, decay=decay, start=start)

    def init_state(self, game: GameView) -> AveragingState:
        return {"base": self.base.init_state(game), "avg": game.layout.data.clone(), "count": 0}

    def update(self, oracle: Oracle, state: AveragingState) -> tuple[Step, AveragingState]:
        delta, base_state = self.base.update(oracle, state["base"])
        count = state["count"] + 1
        n = count - self.start
        a = 1.0 if n <= 0 else 1.0 / n if self.kind == "uniform" else 1.0 - self.decay
        avg = oracle.moved(delta).lerp_(state["avg"], 1.0 - a)  # a·w + (1 − a)·w̄ (exactly w for a = 1)
        oracle.project_nonconvex_(avg)
        return delta, {"base": base_state, "avg": avg, "count": count}

    def average(self) -> tuple[Tensor | tuple[Tensor, ...], ...]:
        """w̄ as of the last step (after a player changed, a step carries it over): a
        copy, one flat tensor per player (a tuple for a player with several (device,
        dtype) groups), as ``game.layout.per_player``."""
        game, avg = self._bound()
        return game.layout.per_player([t.clone() for t in avg])

    @contextlib.contextmanager
    def averaged(self, players: Sequence[int] | None = None) -> Iterator[None]:
        """Within the block, the parameters of all players (or of the indices in
        ``players``) hold w̄; on exit, also on an exception, they are restored bit
        for bit. For evaluation (``game.vector_field()``, the losses, the modules):
        a step inside the block is refused (it would start from w̄, and its move
        would be undone on exit but not its state), and so is a checkpoint
        (``game.state_dict()`` would save w̄ as the iterate, a load would be undone
        on exit): ``RuntimeError``, nothing changed. The block holds the game's
        lock: another thread's step or ``state_dict`` waits until it ends."""
        game, _ = self._bound()  # raises unless bound
        with game.lock:  # another thread's step waits for the block to end
            game, avg = self._bound()
            layout = game.layout
            n = layout.num_players
            which = range(n) if players is None else list(players)
            for k, i in enumerate(which):
                check_number(f"players[{k}]", i, low=0, high=n - 1, integer=True)
            saved = [t.clone() for t in layout.data]
            try:
                self._swapped += 1
                with torch.no_grad():
                    for i in which:
                        layout.player_views(layout.data, i).copy_(layout.player_views(avg, i))
                yield
            finally:
                with torch.no_grad():
                    layout.data.copy_(saved)
                self._swapped -= 1

    def _refuse_in_block(self, what: str, why: str) -> None:
        if self._swapped:
            raise RuntimeError(
                f"{what} inside Averaging.averaged() is refused: the parameters hold the average w̄ there, "
                f"not the iterate, so {why}; nothing changed. Call it after the block"
            )

    def _check_groups(self) -> None:
        """The param groups' check, refused inside :meth:`averaged` (a step's first call)."""
        self._refuse_in_block("a step", "it would start from w̄ and the block would undo its move, not its state")
        super()._check_groups()

    def identity(self) -> dict[str, Any]:
        """:meth:`Wrapper.identity`, refused inside :meth:`averaged`: every checkpoint
        (``state_dict``, ``check_state_dict``, ``load_state_dict``, of the game or its
        optimizer) asks for it, also when this one is the base of another wrapper."""
        self._refuse_in_block(
            "a checkpoint (state_dict or load_state_dict)",
            "a checkpoint would resume from w̄ and a load would be undone when the block ends "
            "(the average itself is in the checkpoint's algorithm state; algo.average() gives it)",
        )
        return super().identity()

    def _bound(self) -> tuple[GameView, Vec]:
        if self.game is None:
            raise RuntimeError("Averaging is not part of a game yet: pass it to gameopt.Game(...)")
        avg = self._state(self.game)["avg"]
        if [t.shape for t in avg] != [t.shape for t in self.game.layout.data]:
            raise RuntimeError("the players changed since the last step: take a step to carry the average over")
        return self.game, avg

    def _state(self, game: GameView) -> AveragingState:
        """This one's state within the state the game holds: the game's own, or its
        part under ``"base"`` when this one is the base of another wrapper."""
        algorithm, state = game.algorithm, game.algorithm_state
        while algorithm is not self:
            if not isinstance(algorithm, Wrapper):
                raise RuntimeError("this Averaging is no longer the game's algorithm: its state is gone")
            algorithm, state = algorithm.base, state["base"]
        return state
