"""What the algorithms and the diagnostics see of a game: the interfaces they are
written against. :class:`gameopt.Game` and :class:`gameopt.game.Oracle`
implement them; ``algorithms/`` and ``diagnostics.py`` import only these, so no
module imports ``gameopt.game`` back (not even for type checking; a test checks that
gameopt has no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import Tensor

    from .evaluation import StepLosses
    from .layout import JointLayout
    from .player import Player
    from .vec import Vec

Along = tuple["Vec", Sequence[float]]  # (direction, one factor per player)


class Linearization(Protocol):
    """ξ at a point with its graph, and the Jacobian products through it (the
    general game's :class:`gameopt.autodiff.GeneralLinearization` and the two-player
    zero-sum game's :class:`gameopt.autodiff.ZeroSumLinearization` implement it).

    Notation: J = ∂ξ/∂w; D = blockdiag(∂ξ_i/∂w_i); H_o = J − D, the off-diagonal
    blocks. Every product is averaged across ranks in a data-parallel game.
    """

    xi: Vec  # the joint vector field (detached)
    losses: list[Tensor]  # the players' losses, with their graphs
    metrics: dict[str, Any]
    layout: JointLayout

    def vjp(self, u: Vec, last: bool = False) -> Vec:
        """Jᵀ u. ``last``: no product follows (the graph is freed during this pass)."""
        ...

    def jvp(self, v: Vec) -> Vec:
        """J v."""
        ...

    def jvp_many(self, v: Vec) -> Vec:
        """J v, one of many at this point (a Krylov or eigenvalue solver's products)."""
        ...

    def vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        """(Jᵀv, Jv)."""
        ...

    def diag(self, v: Vec) -> Vec:
        """D v."""
        ...

    def offdiag_jvp(self, v: Vec) -> Vec:
        """H_o v."""
        ...

    def offdiag_vjp(self, u: Vec) -> Vec:
        """H_oᵀ u."""
        ...

    def block_vjp(self, i: int, j: int, u: Vec) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i, in player j's part of the result."""
        ...

    def block_vjp_parts(self, i: int, j: int, u_i: Sequence[Tensor]) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i on players' parts: one flat tensor per buffer of player i
        in, one per buffer of player j out."""
        ...

    def cross_gradients(self) -> list[Vec]:
        """For each player i, the joint vector (∇_{w_j} f_i)_{j≠i} (zero in i's own part)."""
        ...

    def chi(self) -> Vec:
        """χ_i = Σ_{j≠i} (∂ξ_j/∂w_i)ᵀ ∇_{w_j} f_i."""
        ...

    def shaping(self, v: Vec | None, chi: bool = True) -> Vec:
        """H_o v + χ (either term may be left out: ``v=None``, ``chi=False``)."""
        ...


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
    ) -> Linearization: ...

    def moved(self, delta: Vec, at: Vec | None = None) -> Vec: ...

    def delta_to(self, target: Vec) -> Vec: ...

    def project_nonconvex_(self, vec: Vec) -> Vec: ...

    def scaled(self, vec: Vec, factors: Sequence[float]) -> Vec: ...

    def scale_(self, vec: Vec, factors: Sequence[float]) -> Vec: ...

    def dot(self, a: Vec, b: Vec) -> Tensor: ...
