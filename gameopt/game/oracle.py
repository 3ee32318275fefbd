"""What an algorithm may ask of its game during one step: the :class:`StepOracle`, and
the narrow view of the game it is built on (:class:`StepContext`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import Tensor

from .. import autodiff, debug
from ..autodiff.xi import leaves_in_place
from ..evaluation import Evaluations
from ..layout import JointLayout
from ..player import Player
from ..protocols import Along, Linearization
from ..vec import Pieces, Step, Vec, all_finite
from .errors import NonFiniteError
from .moves import Moves


@dataclass(frozen=True)
class StepContext:
    """All that a :class:`StepOracle` sees of its game. The game builds one per layout."""

    layout: JointLayout
    problem: autodiff.Problem  # what autodiff sees of the game
    moves: Moves  # new points: evaluate at one, move, delta_to, project
    players: Sequence[Player]  # their names, for error messages
    parallel: bool  # data-parallel: every rank must refuse a step together
    mean_: Callable[[Vec], Vec]  # average a joint vector across ranks, in place
    together: Callable[[], AbstractContextManager[None]]  # an evaluation every rank finishes together
    evaluations: Callable[[bool], Evaluations]  # what the evaluations of one step share (arg: once)
    take: Callable[[], Vec]  # a new vector of the step (contents undefined); see StepVectors
    scale: Callable[[], float]  # the loss scale now (1.0 without loss scaling)


class StepOracle:
    """What an algorithm may ask of the game during one step.

    Vectors are joint vectors (``Vec``: one flat tensor per (device, dtype)
    group). :meth:`xi` does not check finiteness (the step's check of the update
    and the new state covers it); :meth:`linearize` does unless told otherwise;
    every point is checked before anything is evaluated there.

    Ownership: what :meth:`xi` returns is *borrowed* (the game's gradient buffer,
    valid until the next :meth:`xi`; the algorithm may overwrite it, return it as
    its step, or pass it to the next :meth:`xi` as ``along``, but never keep it in
    its state). Everything else is the caller's: the linearization and its vectors,
    and the vectors of ``empty``, :meth:`moved`, :meth:`delta_to` and
    :meth:`scaled` (tracked by the game: kept after the step only if the
    returned state holds them). :mod:`gameopt.debug` makes misuse fail loudly.

    The game builds one per step from a ``StepContext`` (all that the oracle sees
    of the game), ``closure`` (the losses at the current point, no arguments) and
    ``once`` (the algorithm's ``evaluates_once``: a second evaluation is refused).
    """

    __slots__ = (  # one is built per step: no dict
        "_context",
        "closure",
        "layout",
        "evaluations",
        "scale",
        "losses",
        "_all_losses",
        "empty",
        "borrowed",
        "debug",
        "_everyone",
        "away",
        "_lent",
    )

    def __init__(self, context: StepContext, closure: Callable[[], Any], once: bool = False) -> None:
        self._context, self.closure = context, closure
        self.layout = context.layout
        self.evaluations = context.evaluations(once)  # same random numbers; buffers move once
        self.scale = context.scale()
        self.losses: tuple[Tensor, ...] | None = None  # at the start of the step
        self._all_losses: list[Sequence[Tensor]] = []
        self.empty = context.take  # a new vector of the step (contents undefined); see StepVectors
        self.borrowed: list[Vec] = []  # what xi() returned (debug mode: copies, poisoned when stale)
        self.debug = debug.enabled()  # debug mode, as the step began (:mod:`gameopt.debug`)
        self._everyone = range(context.layout.num_players)
        # while an evaluation is away from the step's point: that point (``Moves.backup``, saved),
        # for the step to put back should an interrupt cut short ``Moves.at``'s own putting back
        self.away: Vec | None = None
        self._lent: Pieces | None = None  # what xi(pieces=True) lent last: released by the next evaluation

    @property
    def params(self) -> Vec:
        """The current point, read only (return a delta instead of writing here)."""
        return self.layout.data

    @property
    def num_players(self) -> int:
        return self.layout.num_players

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
        """ξ at the current point, at ``at``, or ``along=(d, factors)`` at
        w + factorᵢ·dᵢ (each player's part with its factor; ``d`` is left as it is).
        With ``players``, only those players' parts are computed (the rest of the
        returned vector is meaningless). The result is borrowed (see the class): the
        game's gradient buffer, valid until the next call.

        With ``pieces`` (every player), ξ may come as :class:`~gameopt.vec.Pieces`,
        the gradients where autograd left them (no copy into the buffer), where the
        evaluation allows it (``gameopt.autodiff.xi.leaves_in_place``; not in debug
        mode): for an algorithm that hands it, as it is, to
        :meth:`~gameopt.Algorithm.scaled_descent` or to ``xi(along=...)``. Borrowed too.

        ξ is not checked here: :meth:`~gameopt.Game.step` checks the update and the new state,
        which every ξ flows into. A point is checked before anything runs there."""
        context = self._context
        which = self._everyone if players is None else list(players)
        self._release(keep=along[0] if along is not None else None)  # (along's: once the point is formed)
        keep: list[Sequence[Tensor]] | None = None
        if pieces and players is None and not self.debug and leaves_in_place(context.problem, self.scale):
            keep = []
        if at is None and along is None and not context.parallel:  # no point to form, no rank to wait for
            if self.debug:  # earlier results are stale now
                debug.poison_(t for vec in self.borrowed for t in vec)
            evaluate, problem = autodiff.vector_field, context.problem
            (losses, metrics), own = self.evaluations.run_plain(
                evaluate, problem, which, self.closure, self.scale, keep
            )
        else:
            evaluate = functools.partial(autodiff.vector_field, context.problem, which, self.closure, self.scale, keep)
            with (
                context.moves.at(at, along, self.message_later("a point to evaluate at")),
                context.together(),
                self.evaluations(plain=at is None and along is None) as own,
            ):
                self.away = context.moves.backup
                if along is not None and isinstance(along[0], Pieces):  # read: not held through the evaluation
                    along[0].release()
                if self.debug:  # the point is formed (``along`` read): earlier results are stale now
                    debug.poison_(t for vec in self.borrowed for t in vec)
                losses, metrics = evaluate()
            self.away = None
        self._seen(losses, metrics if own else None)
        if keep is not None:
            self.borrowed = [self.layout.grad]  # (where ``filled`` puts it)
            self._lent = Pieces(context.problem.piece_views, keep)
            return self._lent
        xi = context.mean_(self.layout.grad) if context.parallel else self.layout.grad
        if self.debug:
            xi = self.empty().copy_(xi)
            if players is not None:  # the other players' parts are meaningless
                others = [i for i in self._everyone if i not in which]
                debug.poison_(t for i in others for t in self.layout.player_views(xi, i))
            self.borrowed.append(xi)
        else:
            self.borrowed = [xi]
        return xi

    def _release(self, keep: object = None) -> None:
        """An evaluation begins: the ξ that :meth:`xi` lent in pieces is stale, released
        (its gradients let go; a later use raises), unless it is ``keep`` (``along``'s
        direction, read first and released then)."""
        lent, self._lent = self._lent, None
        if lent is not None and lent is not keep:
            lent.release()

    def _seen(self, losses: Sequence[Tensor], metrics: Mapping[str, Any] | None) -> None:
        if self.losses is None:
            self.losses = tuple(losses)
        if metrics:
            self.evaluations.keep_metrics(metrics)
        self._all_losses.append(losses)

    def linearize(
        self,
        at: Vec | None = None,
        check: bool = True,
        zero_sum: bool = False,
        batched: bool = False,
        cross: bool = False,
    ) -> Linearization:
        """ξ at the current point (or ``at``) with its graph, for Jv and Jᵀv.

        ``check``: refuse a non-finite ξ right away (before an iterative solve, say).
        An algorithm whose update is non-finite whenever ξ is may skip it: the
        check of the update in :meth:`~gameopt.Game.step` covers ξ then. A data-parallel
        game always checks: a rank that failed takes part in no later collective,
        so every rank must stop here together.

        ``zero_sum``: the game is two players with losses (f, −f) (checked on the
        values): every product is a Hessian-vector product of f through one kept
        graph (:class:`~gameopt.autodiff.ZeroSumLinearization`); ``batched``: its
        paired products (``vjp_jvp``) in one double backward. ``cross``: keep the
        cross gradients ∇_{w_j} f_i with their graphs, so that H_o v and χ cost one
        reverse pass per player (:meth:`~gameopt.autodiff.GeneralLinearization.shaping`)."""
        context = self._context
        self._release()
        with context.moves.at(at), context.together(), self.evaluations(plain=at is None) as own:
            self.away = context.moves.backup
            lin = autodiff.linearize(
                context.problem,
                self.closure,
                self.evaluations,
                self.scale,
                zero_sum=zero_sum,
                batched=batched,
                cross=cross,
            )
        self.away = None
        self._seen([l.detach() for l in lin.losses], lin.metrics if own else None)
        if zero_sum and not context.parallel and not all_finite(self._all_losses[-1]):
            # whether they are (f, −f) cannot be checked (a data-parallel game: ξ's check below)
            raise NonFiniteError(self.not_finite_message("a loss of the zero-sum game"))
        if (check or context.parallel) and not all_finite(lin.xi):
            raise NonFiniteError(self.not_finite_message("the vector field ξ"))
        return lin

    def not_finite_message(self, what: str, advice: Callable[[], str] | None = None) -> str:
        """An error message: ``what`` is not finite, with the players whose losses were
        not (or, where all were finite, what ``advice`` says: a setting of the
        algorithm that the players' dtype loses)."""
        return self.message_later(what, advice)()

    def message_later(self, what: str, advice: Callable[[], str] | None = None) -> Callable[[], str]:
        """:meth:`not_finite_message`, formed when called: it holds the step's losses
        (detached) and the players' names, not the oracle (whose closure holds the
        step's arguments, a batch say), for a verdict read after the step."""
        names = [p.name for p in self._context.players]
        return functools.partial(_not_finite_message, what, names, self._all_losses, self._context.parallel, advice)

    def moved(self, delta: Step, at: Vec | None = None) -> Vec:
        """A new vector (the caller's): the point reached from the current point (or ``at``)
        by the step ``delta``, within the players' feasible sets: ``w + delta``, and for a
        constrained parameter its set's step (the projection ``P(w + delta)``, or a mirror
        step such as ``w · exp(delta)`` normalized; see :mod:`gameopt.constraints`)."""
        return self._context.moves.move(self.params if at is None else at, delta, out=self.empty(), empty=self.empty)

    def project_nonconvex_(self, vec: Vec) -> Vec:
        """In place: project the parts of ``vec`` whose feasible set is not convex."""
        self._context.moves.project_(vec, nonconvex_only=True)
        return vec

    def delta_to(self, target: Vec) -> Vec:
        """A new vector (the caller's): the step whose move from the current point lands on
        the feasible point ``target``: ``target − w``, or the constraint's own
        (``log target − log w`` for the entropic simplex)."""
        return self._context.moves.delta_to(self.params, target, out=self.empty())

    def scaled(self, vec: Vec, factors: Sequence[float]) -> Vec:
        """A new vector (the caller's): each player's part of ``vec`` times its factor."""
        return self.layout.scale_(vec, factors, out=self.empty())

    def scale_(self, vec: Vec, factors: Sequence[float]) -> Vec:
        """In place: each player's part of ``vec`` times its factor."""
        return self.layout.scale_(vec, factors)


def _not_finite_message(
    what: str,
    names: Sequence[str],
    all_losses: Sequence[Sequence[Tensor]],
    parallel: bool,
    advice: Callable[[], str] | None = None,
) -> str:
    """``what`` is not finite, with the players whose losses (of each evaluation:
    ``all_losses``) were not, or else ``advice``'s."""
    bad = [
        name
        for i, name in enumerate(names)
        if any(not torch.isfinite(losses[i]).all() for losses in all_losses if i < len(losses))
    ]
    hint = f" (non-finite losses: {', '.join(bad)})" if bad else ""
    if not bad and parallel:
        hint = " (on another rank: its losses failed or were not finite)"
    if not bad and advice is not None and (said := advice()):
        hint = f"{hint} ({said})"
    return f"{what} is not finite{hint}; the step was refused and nothing changed"
