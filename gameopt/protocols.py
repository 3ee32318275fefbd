"""What the algorithms and the diagnostics see of a game: the interfaces they are
written against. :class:`gameopt.game.Game` and :class:`gameopt.game.Oracle`
implement them; ``algorithms/`` and ``diagnostics.py`` import only these, so no
module imports ``game.py`` back (not even for type checking; a test checks that
gameopt has no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from .autodiff import Linearization, ZeroSumLinearization
    from .evaluation import StepLosses
    from .layout import JointLayout
    from .player import Player
    from .vec import Vec

Along = tuple["Vec", Sequence[float]]  # (direction, one factor per player)


class Linearizable(Protocol):
    """A game as the diagnostics read it: its layout and its linearization."""

    layout: JointLayout

    def linearize(self, *args: Any, **kwargs: Any) -> Linearization: ...


class GameView(Protocol):
    """The game an algorithm is bound to."""

    players: list[Player]
    layout: JointLayout
    lock: Any  # a threading.RLock: held by every step, state_dict and load_state_dict


class Steppable(Protocol):
    """The game a :class:`~gameopt.optim.GameOptimizer` steps."""

    losses: Callable[..., Any]

    @property
    def algorithm(self) -> Any: ...

    def step_closure(self, closure: Callable[[], Any]) -> StepLosses: ...


class OracleInterface(Protocol):
    """What an algorithm may ask of the game during one step (see
    :class:`gameopt.game.Oracle` for the contract: what is borrowed, what is the
    caller's, what is checked)."""

    layout: JointLayout

    @property
    def num_players(self) -> int: ...

    @property
    def params(self) -> Vec: ...

    def empty(self) -> Vec: ...

    def xi(self, at: Vec | None = None, players: Sequence[int] | None = None, along: Along | None = None) -> Vec: ...

    def linearize(
        self,
        at: Vec | None = None,
        check: bool = True,
        zero_sum: bool = False,
        batched: bool = False,
        cross: bool = False,
    ) -> Linearization | ZeroSumLinearization: ...

    def moved(self, delta: Vec, at: Vec | None = None) -> Vec: ...

    def delta_to(self, target: Vec) -> Vec: ...

    def project_nonconvex_(self, vec: Vec) -> Vec: ...

    def scaled(self, vec: Vec, factors: Sequence[float]) -> Vec: ...

    def scale_(self, vec: Vec, factors: Sequence[float]) -> Vec: ...

    def dot(self, a: Vec, b: Vec) -> Tensor: ...
