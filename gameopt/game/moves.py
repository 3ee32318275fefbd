"""Feasible points: the one place where a game forms a new point.

:class:`Moves` knows, for one joint layout, which parameters have a feasible set
(:mod:`gameopt.constraints`) and where they sit in a joint vector. It forms the
point a step reaches (:meth:`Moves.move`), the step that reaches a point
(:meth:`Moves.delta_to`), projections (:meth:`Moves.project_`), and the points an
algorithm evaluates at (:meth:`Moves.at`). The game builds one per layout.

A committed point is a finite one: before a step moves the live point in place,
:meth:`Moves.check_step` refuses a step whose new point would overflow its dtype
(float16's 65504, float32's 3.4e38), without a pass over the point in the common
case (see there).
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, cast

import torch
from torch import Tensor

from .. import _torch_compat as tc
from ..constraints import checked
from ..layout import Entry, JointLayout
from ..player import Player
from ..protocols import Along
from ..vec import Pieces, Scaled, Step, Vec, all_finite, filled_step, finite_bounds, max_abs
from .errors import NonFiniteError
from .verdict import Checks, max_abs_on_device

V = TypeVar("V", bound=Sequence[Tensor])


class Moves:
    """The feasible-set maths of one joint layout.

    Args:
        layout: the game's joint layout.
        players: the game's players, in the layout's order (their constraints and names).
    """

    def __init__(
        self, layout: JointLayout, players: Sequence[Player], agree: Callable[[bool], bool] | None = None
    ) -> None:
        self.layout = layout
        #: with sharded players, whether any rank refuses (``Shards.agree``): a point one
        #: rank refuses to evaluate at, every rank refuses, before anyone's forward
        self.agree = agree
        self.players = players  # their names, read when a message needs them
        # (entry, parameter index in its buffer, constraint) for every constrained parameter
        self.constrained = [
            (e, k, checked(c, f"parameter {k} of player {players[e.player].name!r}"))
            for e in layout.entries
            for k, p in enumerate(e.buffer.params)
            if (c := players[e.player].constraints.get(id(p))) is not None
        ]
        # the joint groups that the constrained parameters do not fill (a move adds the step there)
        filled = [0] * len(layout.data)
        for e, k, _ in self.constrained:
            filled[e.group] += e.buffer.segments[k].numel
        self._uncovered = [g for g, (n, t) in enumerate(zip(filled, layout.data)) if n != t.numel()]
        self._made_views = [
            (vec, [self._param_view(vec, e, k) for e, k, _ in self.constrained]) for vec in (layout.data, layout.grad)
        ]
        self.backup: Vec | None = None  # the current point, only while :meth:`at` is away from it
        # the guard of the live point (:meth:`check_step`): per group, a bound on max|w|, valid
        # while the group's version counter reads as it did when the bound was known
        self._limits = [torch.finfo(t.dtype).max for t in layout.data]
        self._bounds = [math.inf] * len(layout.data)  # unknown: read at the first step
        self._versions = [-1] * len(layout.data)
        # the writes a move makes into each group, each a version: one add, or through sets,
        # an add where the sets' points do not fill the group and one copy per constrained parameter
        self._writes = [1 if not self.constrained or g in self._uncovered else 0 for g in range(len(layout.data))]
        for e, _, _ in self.constrained:
            self._writes[e.group] += 1
        self._constrained_groups = sorted({e.group for e, _, _ in self.constrained})
        #: the checks of the running step under the device verdict (``Game(verdict="device")``),
        #: which :meth:`at` adds to instead of reading; None otherwise
        self.checks: Checks | None = None
        # the device verdict's guard of the live point (:meth:`check_step_on_device`): per group,
        # a bound on max|w| (a 0-d float64 tensor; None: unknown), the steps since it was read
        # exactly, and the bounds a move that the verdict takes leaves (settle_bounds)
        self._device_bounds: list[Tensor | None] = [None] * len(layout.data)
        self._device_age = [0] * len(layout.data)
        self._device_next: list[tuple[Tensor, Tensor]] = []

    def _param_view(self, vec: Vec, e: Entry, k: int) -> Tensor:
        return e.buffer.views(self.layout.entry_view(vec, e))[k]

    def _views(self, vec: Vec, scale: Sequence[float] | None = None) -> list[Tensor]:
        """The constrained parameters' views of ``vec`` (times their player's factor);
        those of the joint parameters and gradients are made once per layout."""
        for tensors, made in self._made_views:
            if len(vec) == len(tensors) and all(map(operator.is_, vec, tensors)):
                views = made
                break
        else:
            views = [self._param_view(vec, e, k) for e, k, _ in self.constrained]
        if scale is None:
            return views
        return [v * scale[e.player] for v, (e, _, _) in zip(views, self.constrained)]

    @contextlib.contextmanager
    def at(self, at: Vec | None, along: Along | None = None, why: Callable[[], str] | None = None) -> Iterator[None]:
        """Evaluate at ``at``, or at w + factorᵢ·dᵢ for ``along=(d, factors)`` (a
        constrained parameter through its set's step), and put the current point back
        afterwards (also on error). Refuses a non-finite point with
        :class:`NonFiniteError` (``why()``: the message)."""
        if at is None and along is None:
            yield
            return
        data = self.layout.data
        intact = self._versions == list(map(tc.version, data))  # the bounds hold (see check_step)
        self.backup = self.layout.empty()
        tc.foreach_copy_(self.backup, data)
        try:
            with torch.no_grad():
                if at is not None:
                    tc.foreach_copy_(data, at)
                elif along is not None:
                    d, factors = along
                    if isinstance(d, Pieces) and not self.constrained:  # ξ where autograd left it
                        d.add_to(factors)
                    else:
                        self._move_along(data, d.filled() if isinstance(d, Pieces) else d, factors)
            if self.checks is not None:  # the device verdict: checked there, read with the step's
                self.checks.finite(data, why or _not_finite_point)
            elif not self._agreed(all_finite(data)):
                raise NonFiniteError(why() if why else "a point to evaluate at is not finite; nothing changed")
            yield
        finally:
            tc.foreach_copy_(data, self.backup)
            self.backup = None  # not held through the rest of the step (its peak)
            if intact:  # the point is back as it was: so are the bounds
                self._versions = list(map(tc.version, data))

    def _move_along(self, data: Vec, d: Vec, factors: Sequence[float]) -> None:
        """:meth:`at`'s point w + factorᵢ·dᵢ, in place, through the feasible sets."""
        self.layout.add_scaled_(data, d, factors)
        points = [
            c.step(w, step)
            for (_, _, c), w, step in zip(
                self.constrained, self._views(cast(Vec, self.backup)), self._views(d, scale=factors)
            )
        ]
        if not self._agreed(all_finite(points)):
            raise NonFiniteError(self._not_finite_through_sets(points))
        for (e, k, _), point in zip(self.constrained, points):
            self._param_view(data, e, k).copy_(point)

    def move(self, w: Vec, delta: Step, out: Vec, empty: Callable[[], Vec] | None = None) -> Vec:
        """The point reached from ``w`` by the step ``delta``: ``w + delta``, and for
        a constrained parameter its set's step (the projection ``P(w + delta)``, or
        a mirror step such as ``w · exp(delta)`` normalized). ``out`` may be ``w``.
        A :class:`~gameopt.algorithms.api.Scaled` step moves ``w`` in place by ``factorᵢ · dᵢ`` in
        one pass; elsewhere it is formed first (``layout.resolve``, ``empty``).
        Raises :class:`NonFiniteError`, with nothing written, if a set returns a
        point that is not finite."""
        try:
            if isinstance(delta, Scaled) and isinstance(delta.direction, Pieces):
                if not self.constrained:  # added where ξ lies, into the point (the live one: in place)
                    pieces = delta.direction
                    if out is w and w is self.layout.data:
                        pieces.add_to(delta.factors)
                    else:
                        _add_pieces(out, w, pieces, delta.factors)
                    return out
                delta = filled_step(delta)
            if isinstance(delta, Scaled):
                # one add per group (one write, as check_step expects): one factor in each
                if not self.constrained and self.layout.one_factor_per_group(delta.factors):
                    if not any(map(_requires_grad, (*w, *cast(Vec, delta.direction)))):
                        return self.layout.add_scaled(out, w, cast(Vec, delta.direction), delta.factors)
                    with torch.no_grad():
                        return self.layout.add_scaled(out, w, cast(Vec, delta.direction), delta.factors)
                # formed first; into a new vector unless the game moves (the step is then spent)
                delta = self.layout.resolve(delta if out is w else Scaled(delta.direction, delta.factors), empty)
            if not self.constrained and not any(map(_requires_grad, (*w, *delta))):
                return _add(out, w, delta)  # tensors outside any graph: no grad mode to switch
            with torch.no_grad():
                if not self.constrained:
                    return _add(out, w, delta)
                return self._move_through_sets(w, delta, out)
        except BaseException:
            self._versions = [-1] * len(self._versions)  # a move cut short: the bounds are read again
            raise

    def _agreed(self, finite: bool) -> bool:
        """``finite`` here, and on every rank when the players are sharded."""
        return finite if self.agree is None else not self.agree(not finite)

    def _move_through_sets(self, w: Vec, delta: Vec, out: Vec) -> Vec:
        """:meth:`move` with constrained parameters (under ``no_grad``)."""
        moved = [c.step(wv, dv) for (_, _, c), wv, dv in zip(self.constrained, self._views(w), self._views(delta))]
        point_bounds = finite_bounds(moved)
        if point_bounds is None:
            raise NonFiniteError(self._not_finite_through_sets(moved))
        if self._uncovered:  # groups that the sets' points do not fill
            _add(*([vec[k] for k in self._uncovered] for vec in (out, w, delta)))
        tc.foreach_copy_(self._views(out), moved)
        if out is self.layout.data:  # the sets' points may lie beyond the bound that check_step left
            largest = max(point_bounds)
            for g in self._constrained_groups:
                self._bounds[g] = max(self._bounds[g], largest)
        return out

    def check_step(self, delta: Step, delta_bounds: Sequence[float]) -> None:
        """Before the game moves its live point by ``delta`` (``move(w, delta, out=w)``,
        next): refuse the step with :class:`NonFiniteError`, nothing written, if the
        new point would overflow its dtype. ``delta_bounds``: for each group, a bound
        on ``max|delta|`` (:func:`~gameopt.vec.finite_bounds`, read with the step's
        finiteness verdict).

        No pass over the point in the common case: each group keeps a bound on
        ``max|w|``, which each step raises by its own (``|w + δ| <= max|w| + max|δ|``).
        Only when that sum reaches the dtype's largest value is ``w`` read (exactly,
        one pass), and only if it is still too close, ``w + delta`` formed and checked
        element by element. The bound holds while the group's version counter reads
        as the game left it: a write the game did not make (parameters set in place,
        a module's ``load_state_dict``, a ``torch.optim`` step, a checkpoint) moves it,
        and the bound is read again. A write that autograd cannot see (through
        ``.data`` or numpy) is not seen either."""
        bounds, versions, limits, writes = self._bounds, self._versions, self._limits, self._writes_of(delta)
        version_of = tc.version
        g = 0
        try:
            for w in self.layout.data:  # (no zip or enumerate: this runs every step)
                version = version_of(w)
                bound = bounds[g] if version == versions[g] else _INF
                if not bound + delta_bounds[g] <= limits[g]:  # (a NaN never passes)
                    bound = self._read(g, delta, delta_bounds[g])
                bounds[g] = bound + delta_bounds[g]  # an upper bound whether or not the move follows
                versions[g] = version + writes[g]  # as the move will leave it
                g += 1
        except BaseException:  # refused: no move follows, so no version is to be expected
            self._versions = [-1] * len(versions)
            raise

    def _writes_of(self, delta: Step) -> Sequence[int]:
        """Per group, the writes (version counts) that moving the live point by ``delta``
        makes: one add per group, one copy per constrained parameter; one add per
        parameter for a direction in :class:`~gameopt.vec.Pieces`."""
        if isinstance(delta, Scaled) and isinstance(delta.direction, Pieces) and not self.constrained:
            return delta.direction.where.group_params
        return self._writes

    def check_step_on_device(
        self, delta: Step, delta_bounds: Sequence[Tensor | float], scales: Sequence[float], checks: Checks
    ) -> None:
        """:meth:`check_step` under the device verdict: nothing read on the host. For each
        group, the step is refused (``checks``) unless ``max|w| + max|delta| <= limit``,
        with ``scales[g] · delta_bounds[g]`` (0-d tensors or floats) bounding
        ``max|delta|`` (a :class:`~gameopt.algorithms.api.Scaled` step's factor, with a
        margin for its rounding; else 1), and the
        bound on ``max|w|`` kept on the device as :meth:`check_step` keeps it on the host:
        raised by each step that the verdict takes (:meth:`settle_bounds`), read again
        exactly (one pass over the group) when the group's version counter moved, every
        :data:`EXACT_EVERY` steps, and at every step in float16 (whose range a sum of
        steps' bounds reaches soon). Unlike the host's check, which then reads the new
        point itself, the bound decides: a step whose new point fits but whose bound
        does not is refused."""
        self._device_next = []
        writes = self._writes_of(delta)
        for g, w in enumerate(self.layout.data):
            version, bound = tc.version(w), self._device_bounds[g]
            fresh = self._device_age[g] >= EXACT_EVERY or w.dtype == torch.float16
            if bound is None or fresh or version != self._versions[g]:
                bound, self._device_age[g] = max_abs_on_device(w), 0
                checks.at_most(bound, _FINITE64, self._not_finite_now(g))
            self._device_age[g] += 1
            step = delta_bounds[g]
            raised = torch.add(bound, step, alpha=scales[g]) if isinstance(step, Tensor) else bound + step * scales[g]
            checks.at_most(raised, self._limits[g], self._overflow(g))
            self._device_next.append((bound, raised))
            self._versions[g] = version + writes[g]  # the move: one fused add per group (or parameter)

    def settle_bounds(self, found_inf: Tensor) -> None:
        """After :meth:`move_unless`: each group's bound on ``max|w|``, raised by the
        step where the verdict took it."""
        taken = found_inf == 0
        self._device_bounds = [torch.where(taken, raised, old) for old, raised in self._device_next]
        self._device_next = []

    def forget_bounds(self) -> None:
        """Read every group's bound again at the next step, under either verdict (after
        a refusal was read, or when the game changes verdicts: each verdict's bounds
        follow the version counters only while its own steps move them)."""
        self._device_bounds = [None] * len(self._device_bounds)
        self._versions = [-1] * len(self._versions)

    def move_unless(self, w: Vec, delta: Step, found_inf: Tensor, empty: Callable[[], Vec] | None = None) -> None:
        """In place, ``w + delta`` unless ``found_inf`` (a 0-d float32 tensor on the
        device) is nonzero: one ``torch._fused_sgd_`` per group, which skips the move on
        the device, as ``torch.optim``'s fused optimizers skip a step that a
        ``GradScaler`` found overflowing. For parameters without feasible sets."""
        if isinstance(delta, Scaled) and isinstance(delta.direction, Pieces):
            delta.direction.add_to_point_unless(delta.factors, found_inf)
            return
        with torch.no_grad():
            factors = self.layout.group_factors(delta.factors) if isinstance(delta, Scaled) else None
            if isinstance(delta, Scaled) and factors is not None:
                pairs = zip(cast(Vec, delta.direction), factors)
            else:
                pairs = zip(self.layout.resolve(delta, empty), [1.0] * len(w))
            for x, (d, f) in zip(w, pairs):
                tc.fused_add_unless_([x], [d], f, found_inf)

    def _not_finite_now(self, g: int) -> Callable[[], str]:
        def why() -> str:
            names = ", ".join(repr(self.players[e.player].name) for e in self.layout.group_entries(g))
            return (
                f"the current point of {names} is not finite: a value written into a parameter outside the game; "
                "the step was refused and nothing changed (write finite values, or load a checkpoint)"
            )

        return why

    def _overflow(self, g: int) -> Callable[[], str]:
        def why() -> str:
            names = ", ".join(repr(self.players[e.player].name) for e in self.layout.group_entries(g))
            dtype = str(self.layout.data[g].dtype).removeprefix("torch.")
            return (
                f"the new point of {names} may overflow {dtype} (max {self._limits[g]:g}): its bound "
                "max|w| + max|step| does not fit; the step was refused and nothing changed (take smaller steps, or "
                "keep the parameters in a wider dtype)"
            )

        return why

    def _read(self, g: int, step: Step, step_bound: float) -> float:
        """Group ``g``'s bound read exactly; if the step may still overflow, the new
        point checked element by element (:meth:`_check_sum`)."""
        w = self.layout.data[g]
        bound = self._bounds[g] = max_abs(w)  # kept, also if the step is refused
        self._versions[g] = tc.version(w)
        if not bound + step_bound <= self._limits[g]:
            self._check_sum(g, step)
        return bound

    def _check_sum(self, g: int, step: Step) -> None:
        """Form group ``g``'s new point ``w + step`` (a temporary, as :meth:`move` forms
        it) and refuse a step that overflows, naming the players; the constrained
        parameters' points come from their sets (checked in :meth:`move`), not from the sum."""
        w, limit = self.layout.data[g], self._limits[g]
        with torch.no_grad():
            if isinstance(step, Scaled):
                step = filled_step(step)
                point = w.clone()
                for e in self.layout.group_entries(g):
                    point[e.start : e.stop].add_(
                        cast(Vec, step.direction)[g][e.start : e.stop], alpha=step.factors[e.player]
                    )
            else:
                point = w + step[g]
            for e, k, _ in self.constrained:
                if e.group == g:
                    e.buffer.views(point[e.start : e.stop])[k].zero_()
        bad = [e for e in self.layout.entries if e.group == g and not all_finite([point[e.start : e.stop]])]
        if not bad:
            return
        dtype = str(w.dtype).removeprefix("torch.")
        for e in bad:
            if not all_finite([w[e.start : e.stop]]):
                raise NonFiniteError(
                    f"the current point of player {self.players[e.player].name!r} is not finite ({dtype}): a value "
                    "written into a parameter outside the game; the step was refused and nothing changed (write "
                    "finite values, or load a checkpoint)"
                )
        names = sorted({repr(self.players[e.player].name) for e in bad})
        raise NonFiniteError(
            f"the new point of player{'s' if len(names) > 1 else ''} {', '.join(names)} overflows {dtype} "
            f"(max {limit:g}): a finite step would make it "
            "infinite; the step was refused and nothing changed (take smaller steps, or keep the parameters in "
            "a wider dtype)"
        )

    def _not_finite_through_sets(self, points: Sequence[Tensor]) -> str:
        """A message naming the constrained parameters whose new point is not finite."""
        bad = [
            f"parameter {k} of player {self.players[e.player].name!r} ({c!r})"
            for (e, k, c), x in zip(self.constrained, points)
            if not all_finite([x])
        ]
        where = ", ".join(bad) if bad else "a parameter on another rank"
        return f"the point formed through a feasible set is not finite for {where}; nothing changed"

    def delta_to(self, w: Vec, target: Vec, out: Vec) -> Vec:
        """The step whose :meth:`move` from ``w`` lands on ``target`` (feasible):
        ``target − w``, or the constraint's own (``log target − log w`` for the
        entropic simplex)."""
        with torch.no_grad():
            steps = [
                c.delta_to(wv, tv) for (_, _, c), wv, tv in zip(self.constrained, self._views(w), self._views(target))
            ]
            for o, t, x in zip(out, target, w):
                torch.sub(t, x, out=o)
            for (e, k, _), step in zip(self.constrained, steps):
                self._param_view(out, e, k).copy_(step)
        return out

    def project_(self, vec: Vec, nonconvex_only: bool = False) -> list[str]:
        """In place: project each constrained parameter's part of ``vec`` onto its set
        (with ``nonconvex_only``, only where the set is not convex); returns what moved."""
        moved = []
        with torch.no_grad():
            for (e, k, c), w in zip(self.constrained, self._views(vec)):
                if nonconvex_only and c.convex:
                    continue
                p = c.project(w)
                if not torch.equal(p, w):
                    moved.append(f"parameter {k} of player {self.players[e.player].name!r} onto {c!r}")
                    w.copy_(p)
        return moved


_requires_grad = operator.attrgetter("requires_grad")


def _not_finite_point() -> str:
    return "a point to evaluate at is not finite; nothing changed"


#: under the device verdict, each group's bound on max|w| is read exactly every this many steps
EXACT_EVERY = 1024
_FINITE64 = torch.finfo(torch.float64).max
_INF = math.inf


def _add_pieces(out: Vec, w: Vec, pieces: Pieces, factors: Sequence[float]) -> None:
    """``out = w + factorᵢ · ξᵢ`` as the live move forms it (each parameter's
    ``add_(alpha=)``, the same bits), for a point other than the live one."""
    with torch.no_grad():
        if out is not w:
            tc.foreach_copy_(out, w)
        pieces.add_to(factors, pieces.where.views_of(out))


def _add(out: V, w: Sequence[Tensor], delta: Sequence[Tensor]) -> V:
    """``out = w + delta``, tensor by tensor (one per (device, dtype) group); ``out`` may be ``w``."""
    for o, x, d in zip(out, w, delta):
        o.add_(d) if o is x else torch.add(x, d, out=o)
    return out
