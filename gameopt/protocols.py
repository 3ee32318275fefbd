"""What the algorithms and the diagnostics see of a game: the interfaces they are
written against. :class:`gameopt.Game` and :class:`gameopt.game.StepOracle`
implement them; ``algorithms/`` and ``diagnostics.py`` import only these, so no
module imports ``gameopt.game`` back (not even for type checking; a test checks that
gameopt has no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

if TYPE_CHECKING:
    from torch import Tensor

    from .evaluation import StepLosses
    from .layout import JointLayout
    from .player import Player
    from .vec import Pieces, Step, Vec

Along = tuple["Vec | Pieces", Sequence[float]]  # (direction, one factor per player)


class Linearization(Protocol):
    """ξ at a point with its graph, and the Jacobian products through it (the
    general game's :class:`gameopt.autodiff.GeneralLinearization` and the two-player
    zero-sum game's :class:`gameopt.autodiff.ZeroSumLinearization` implement it).

    Notation: J = ∂ξ/∂w; D = blockdiag(∂ξ_i/∂w_i); H_o = J − D, the off-diagonal
    blocks. Every product is averaged across ranks in a data-parallel game.
    """

    xi: Vec  # the joint vector field (detached)
    losses: list[Tensor]  # the players' losses, with their graphs
    metrics: Mapping[str, Any]  # what the losses returned beside them (read only)
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

    def offdiag_jvp(self, v: Vec) -> Vec:
        """H_o v."""
        ...

    def block_vjp(self, i: int, j: int, u: Vec) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i, in player j's part of the result."""
        ...

    def block_vjp_parts(self, i: int, j: int, u_i: Sequence[Tensor]) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i on the players' parts: ``u_i`` one flat tensor per buffer of
        player i (as ``layout.player_views``), the result one per buffer of player j."""
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
    algorithm: Any  # the algorithm the game runs (an algorithm may be its base)
    algorithm_state: Any  # the state the game holds for ``algorithm``


class Steppable(Protocol):
    """The game a :class:`~gameopt.optim.GameOptimizer` steps."""

    losses: Callable[..., Any]
    algorithm_state: Any  # the state the game holds for its algorithm
    lock: Any  # a threading.RLock: held by every step, state_dict and load_state_dict

    @property
    def stepping(self) -> bool: ...

    @property
    def algorithm(self) -> Any: ...

    def step_closure(self, closure: Callable[[], Any]) -> StepLosses: ...

    def synchronize(self) -> None: ...


class OracleInterface(Protocol):
    """What an algorithm may ask of the game during one step (the concrete class is
    :class:`gameopt.game.StepOracle`; :mod:`gameopt.algorithms.api` re-exports this
    protocol as ``Oracle``).

    Vectors are joint vectors (:class:`~gameopt.Vec`: one flat tensor per (device,
    dtype) group; ``layout.player_views(vec, i)`` is player i's part).

    Ownership: what :meth:`xi` returns is *borrowed*: the game's gradient buffer,
    valid until the next :meth:`xi`; the algorithm may overwrite it, return it as
    its step, or pass it to the next :meth:`xi` as ``along``, but never keep it in
    its state. Everything else is the caller's: the linearization and its vectors,
    and the vectors of :meth:`empty`, :meth:`moved`, :meth:`delta_to` and
    :meth:`scaled` (tracked by the game: kept after the step only if the
    returned state holds them). :attr:`params` is read only. :mod:`gameopt.debug`
    makes misuse fail loudly.

    Checks: :meth:`xi` does not check finiteness (the step's check of the update and
    the new state covers it); :meth:`linearize` does unless told otherwise; every
    point is checked finite before anything is evaluated there.
    """

    #: the joint layout (``player_views``, ``zeros``, ``empty``, ``scale_``, ``num_elements``)
    layout: JointLayout

    @property
    def num_players(self) -> int:
        """The number of players."""
        ...

    @property
    def params(self) -> Vec:
        """The current point, read only (return a delta instead of writing here)."""
        ...

    def empty(self) -> Vec:
        """A new joint vector of the caller's, contents undefined (tracked by the game for this step)."""
        ...

    @overload
    def xi(
        self,
        at: Vec | None = None,
        players: Sequence[int] | None = None,
        along: Along | None = None,
        pieces: Literal[False] = False,
    ) -> Vec: ...

    @overload
    def xi(
        self, at: Vec | None = None, players: Sequence[int] | None = None, along: Along | None = None, *, pieces: bool
    ) -> Vec | Pieces: ...

    def xi(
        self,
        at: Vec | None = None,
        players: Sequence[int] | None = None,
        along: Along | None = None,
        pieces: bool = False,
    ) -> Vec | Pieces:
        """ξ at the current point, at the point ``at``, or with ``along=(d, factors)`` at
        w + factorᵢ·dᵢ (each player's part with its factor, through the players'
        feasible sets; ``d`` is left as it is). With ``players`` (indices), only those
        players' parts are computed (the rest is meaningless). Borrowed: the game's
        gradient buffer, valid until the next call. Not checked finite.

        With ``pieces`` (all players), ξ may come as :class:`~gameopt.vec.Pieces`: the
        gradients where autograd left them, not copied into the buffer, for an
        algorithm whose rule reads them so (:attr:`~gameopt.Algorithm.reads_pieces`)
        to hand to :meth:`~gameopt.Algorithm.scaled_descent` (or, with the plain rule,
        to ``xi(along=...)``) and nothing else (``Pieces.filled()`` is the joint vector)."""
        ...

    def linearize(
        self,
        at: Vec | None = None,
        check: bool = True,
        zero_sum: bool = False,
        batched: bool = False,
        cross: bool = False,
    ) -> Linearization:
        """ξ at the current point (or ``at``) with its graph, for Jacobian products
        (the caller's). ``check``: refuse a non-finite ξ at once
        (:class:`~gameopt.NonFiniteError`); an algorithm whose update is non-finite
        whenever ξ is may pass False. ``zero_sum``: the game is two players with
        losses (f, −f) (checked): every product is a Hessian-vector product of f;
        ``batched``: its paired products (``vjp_jvp``) in one double backward.
        ``cross``: keep the cross gradients with their graphs, so that H_o v and χ
        cost one reverse pass per player."""
        ...

    def moved(self, delta: Step, at: Vec | None = None) -> Vec:
        """A new vector (the caller's): the point reached from the current point (or
        ``at``) by the step ``delta``, through the players' feasible sets (``w + delta``
        where there are none), as the game's move would form it (a ``Scaled`` step's
        ``w + factor · d`` in one op). ``delta`` is left as it is."""
        ...

    def delta_to(self, target: Vec) -> Vec:
        """A new vector (the caller's): the step whose move from the current point
        lands on the feasible point ``target``."""
        ...

    def project_nonconvex_(self, vec: Vec) -> Vec:
        """In place: project the parts of ``vec`` whose feasible set is not convex
        (an average of feasible points); returns ``vec``."""
        ...

    def scaled(self, vec: Vec, factors: Sequence[float]) -> Vec:
        """A new vector (the caller's): each player's part of ``vec`` times its factor."""
        ...

    def scale_(self, vec: Vec, factors: Sequence[float]) -> Vec:
        """In place: each player's part of ``vec`` times its factor; returns ``vec``."""
        ...
