"""The contract for algorithm authors, in one place: a new algorithm imports only
from here (``from gameopt.algorithms.api import Algorithm, Hyper, Oracle, ...``).

An algorithm is a subclass of ``Algorithm`` (or of ``Wrapper``, around another
algorithm) that implements ``init_state(game) -> state`` and
``update(oracle, state) -> (delta, new_state)``: it asks the ``Oracle`` for ξ, for a
``Linearization`` (Jacobian products) and for moves through the players' feasible
sets, and returns the step ``delta`` (the game applies ``w ← w + delta``) and its
new state. The state is a plain dict (what checkpoints hold), typed by a
``TypedDict`` (``class MyAlgorithm(Algorithm[MyState])``); everything the algorithm
remembers lives in it. The game holds the state (``game.algorithm_state``), not the
algorithm, which holds only its settings; the game commits the step and the new
state only if both are finite.

What it holds (each name documented where it is defined):

* ``Oracle``: what an algorithm may ask of the game during a step, with what is
  borrowed and what is the caller's (:class:`gameopt.protocols.OracleInterface`);
* ``Linearization``: ξ with its graph, for Jv, Jᵀv, block and shaping products
  (:class:`gameopt.protocols.Linearization`);
* ``Algorithm``, ``Wrapper``, ``Hyper``, ``Setting``: the base classes and the
  declarations of a schedulable hyperparameter and of a fixed setting, each checked
  whenever it is set (:class:`gameopt.Algorithm`, :class:`gameopt.Wrapper`,
  :class:`gameopt.Hyper`, ``Setting``), with what an algorithm
  declares on its class (``first_order``; ``evaluates_once``: one ``oracle.xi()`` per step);
* ``UpdateRule`` and ``RuleState``: the per-player update rules an algorithm
  composes with (``self.descend`` applies one) and their state, with their declared
  capabilities (``memory_flags``; the optional ``extrapolate``/``resume``;
  :class:`gameopt.UpdateRule`), and ``apply_rule``, which calls a rule with the
  memory flags it declares (:func:`gameopt.updates.apply`). A rule owns its state:
  it declares its step counts (``counts``) and may override how the state follows
  the parameters into a new layout (``carry``, given a ``Carry``:
  ``gameopt.state.Carry``) and how a checkpoint's is checked
  (``check_loaded``); ``rule.part``/``rule.with_part`` are one player's part of it;
* ``FeasibleSet`` and ``Constraint``: the contract of a player's feasible set
  (:class:`gameopt.constraints.FeasibleSet`, :class:`gameopt.constraints.Constraint`),
  and ``as_constraint`` (:func:`gameopt.constraints.as_constraint`);
* the typed states of the built-in algorithms (below), :data:`State` (any
  algorithm's state) and ``GameView`` (the game an algorithm is bound to,
  :class:`gameopt.protocols.GameView`);
* ``Vec`` (joint vectors, :class:`gameopt.Vec`: arithmetic, the in-place ``add_``, ``sub_``, ``mul_``, ``div_``,
  ``addcmul_``, ``lerp_``, ``copy_``, ``zero_``, ``+=``, ``-=``, ``*=``, ``/=``, and
  ``dot``/``norm``), ``Layout`` (what an algorithm reads of the game's joint layout,
  ``oracle.layout`` and ``game.layout``) and ``owned`` (a vector of the caller's
  instead of the borrowed gradient buffer, for a state to keep);
* ``Pieces``: ξ where autograd left it (``oracle.xi(pieces=True)``, no copy into the
  gradient buffer), for an algorithm whose rule reads it so (``self.reads_pieces``:
  the plain rule, whose step is ξ itself, ``self.reads_xi_as_is``, or a rule that
  declares ``reads_pieces``) to pass to ``self.scaled_descent``, or, with the plain
  rule, to ``oracle.xi(along=...)``; ``Pieces.filled()`` is the joint vector;
* ``Scaled`` and ``Step``: what ``update`` returns, a step as a joint vector or as a
  direction with one factor per player (``self.scaled_descent``), which the game's
  move applies in its own pass (:class:`gameopt.algorithms.api.Scaled`); a wrapper forms a
  vector of its base's step with ``oracle.layout.resolve(step, oracle.empty)``;
* the step counts of a state (``next_count``, ``stepped``: one count for all
  elements, or one per element once parameters joined a running game);
* the linear solvers ``cg`` and ``gmres`` on joint vectors (``gameopt.linalg``),
  with ``MatVec`` (an operator) and ``BreakdownError``, and ``check_zero_sum``
  (refuse losses that are not (f, −f): ``gameopt.evaluation.check_zero_sum``);
* the argument checks ``check_number``, ``check_bool`` and ``check_per_player``.

The built-in algorithms (every other module of ``gameopt.algorithms``) import
gameopt's names only from here; a test keeps it so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypedDict

from torch import Tensor

from ..checks import check_bool, check_number, check_per_player
from ..constraints import Constraint, FeasibleSet, as_constraint
from ..evaluation import check_zero_sum
from ..linalg import BreakdownError, MatVec, cg, gmres
from ..protocols import GameView, Linearization
from ..protocols import OracleInterface as Oracle
from ..state import Carry
from ..updates import State as RuleState
from ..updates import UpdateRule, next_count, stepped
from ..updates import apply as apply_rule
from ..vec import Pieces, Scaled, Step, Vec
from .base import Algorithm, Hyper, Setting, Wrapper

__all__ = [
    "ACGDState",
    "Algorithm",
    "AnchoredExtragradientState",
    "AveragingState",
    "BreakdownError",
    "CGDState",
    "Carry",
    "Constraint",
    "DescentState",
    "FeasibleSet",
    "GameView",
    "Hyper",
    "Layout",
    "Linearization",
    "LookaheadState",
    "MatVec",
    "NoState",
    "OptimisticState",
    "Oracle",
    "PastExtragradientState",
    "Pieces",
    "RuleState",
    "Scaled",
    "Setting",
    "State",
    "Step",
    "UpdateRule",
    "Vec",
    "Wrapper",
    "apply_rule",
    "as_constraint",
    "cg",
    "check_bool",
    "check_number",
    "check_per_player",
    "check_zero_sum",
    "gmres",
    "next_count",
    "owned",
    "stepped",
]

#: any algorithm's state as the game and checkpoints see it, a dict
State = dict[str, Any]


class Layout(Protocol):
    """What an algorithm reads of the game's joint layout (``oracle.layout``,
    ``game.layout``; the game's is a ``gameopt.layout.JointLayout``)."""

    #: the joint storage, the current point (read only; return a step instead)
    data: Vec
    num_players: int
    #: the number of parameter elements of all players
    num_elements: int
    #: the number of parameter tensors of all players
    num_tensors: int

    def zeros(self) -> Vec:
        """A new joint vector of zeros."""
        ...

    def player_views(self, vec: Sequence[Tensor], i: int) -> Vec:
        """Player i's part of ``vec``: views, one flat tensor per (device, dtype) group it
        has (a ``Vec``: its in-place operations write into ``vec``)."""
        ...

    def per_player(self, vec: Sequence[Tensor]) -> tuple[Tensor | tuple[Tensor, ...], ...]:
        """One flat tensor per player (a tuple of them for a player with several groups): views."""
        ...

    def scale_(self, vec: Vec, factors: Sequence[float], out: Vec | None = None) -> Vec:
        """Each player's part of ``vec`` times its factor: in place, or into ``out``."""
        ...

    def resolve(self, step: Vec | Scaled, empty: Callable[[], Vec] | None = None) -> Vec:
        """A step as a vector (a ``Scaled`` step's ``factorᵢ · dᵢ``)."""
        ...


def owned(oracle: Oracle, vec: Vec, borrowed: Vec) -> Vec:
    """``vec``, or a copy of it in a vector of the caller's (``oracle.empty()``) when
    it is ``borrowed``: what ``oracle.xi()`` returned, the game's gradient buffer,
    which a state must never keep."""
    return oracle.empty().copy_(vec) if vec is borrowed else vec


class DescentState(TypedDict):
    """The state of an algorithm that keeps only its update rule's: :class:`~gameopt.Algorithm`'s
    default, and that of ``SimGD``, ``AltGD``, ``Extragradient``, ``HamiltonianGD``,
    ``ConsensusOptimization``, ``SGA``, ``LA``, ``LOLA`` and ``SOS``."""

    #: the update rule's state (``{}`` for plain steps; Adam's ``m``, ``v``, ``t``)
    rule: RuleState


class NoState(TypedDict):
    """No state (``FollowTheRidge``, ``Stackelberg``)."""


class OptimisticState(TypedDict):
    """``Optimistic``'s state."""

    rule: RuleState
    #: the previous step's direction u(ξ(w_{t−1}))
    prev: Vec
    #: steps taken (one count, or one per element once parameters joined later)
    t: int | Vec


class PastExtragradientState(TypedDict):
    """``PastExtragradient``'s state."""

    rule: RuleState
    #: u_{t−1}, the last direction (zero before the first step)
    prev: Vec


class AnchoredExtragradientState(TypedDict):
    """``AnchoredExtragradient``'s state."""

    #: z₀, the point at the first step
    anchor: Vec
    #: steps taken
    k: int


class CGDState(TypedDict):
    """``CGD``'s state."""

    #: the last solution, the linear solver's warm start
    warm: Vec


class ACGDState(TypedDict):
    """``ACGD``'s state."""

    #: the average of the squared gradients
    v: Vec
    #: the linear solver's warm start
    warm: Vec
    #: steps taken (one count, or one per element once parameters joined later)
    t: int | Vec


class AveragingState(TypedDict):
    """``Averaging``'s state."""

    #: the base algorithm's state
    base: State
    #: w̄, the average of the iterates
    avg: Vec
    #: steps taken
    count: int


class LookaheadState(TypedDict):
    """``Lookahead``'s state."""

    #: the base algorithm's state
    base: State
    #: the slow weights
    slow: Vec
    #: steps taken
    count: int
