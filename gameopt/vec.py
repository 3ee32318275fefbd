"""The joint vector: the players' flat buffers side by side, one 1-D tensor per
(device, dtype) group, with the arithmetic that the update equations use.

``Vec`` is a list of tensors (so ``torch._foreach_*`` takes it as it is) whose
operators are elementwise over the groups, one ``torch._foreach_*`` call each::

    rhs = -(sqrt_eta * (xi_a - B(eta * xi_b)))     # out of place: new vectors
    x.add_(p, alpha=step); r -= ap                 # in place
    xi.dot(jt_xi), v.norm()                        # 0-d float64 on the first device

A scalar is a Python number or a 0-d tensor; a 0-d tensor stays on the device
(no host synchronisation). ``+`` and ``*`` are arithmetic here, never list
concatenation or repetition. Per-player scaling needs the layout:
:meth:`gameopt.layout.JointLayout.scale_`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import _torch_compat as tc

#: each binary operator: (with a 0-d tensor scalar, one group at a time: out of place,
#: in place; with a number or a joint vector, all groups at once: out of place, in place)
_Op = Callable[..., Any]
_OPS: dict[str, tuple[_Op, _Op, _Op, _Op]] = {
    "add": (torch.add, tc.foreach_add, Tensor.add_, tc.foreach_add_),
    "sub": (torch.sub, tc.foreach_sub, Tensor.sub_, tc.foreach_sub_),
    "mul": (torch.mul, tc.foreach_mul, Tensor.mul_, tc.foreach_mul_),
    "div": (torch.div, tc.foreach_div, Tensor.div_, tc.foreach_div_),
}


class Vec(list[Tensor]):
    """A joint vector: one flat tensor per (device, dtype) group (see the module).

    Arithmetic reads like the equations (``xi + gamma * jt_xi``, ``v.add_(w, alpha=)``,
    ``v.dot(w)``, ``v.norm()``), one ``torch._foreach_*`` operation per group.

    Args:
        tensors: the flat tensors, one per group, in the game's group order.
    """

    def __init__(self, tensors: Iterable[Tensor] = ()) -> None:
        super().__init__(tensors)

    # ------------------------------------------------------------- helpers
    def _scalars(self, s: Tensor) -> list[Tensor]:
        """A 0-d tensor as one scalar per group, on its device and in its dtype."""
        return [s.to(t.device, t.dtype) for t in self]

    def _binary(self, other: Vec | float | Tensor, op: str) -> Vec:
        one, many, _, _ = _OPS[op]
        if isinstance(other, Tensor):
            return Vec(one(t, s) for t, s in zip(self, self._scalars(other)))
        return Vec(many(self, other))

    def _binary_(self, other: Vec | float | Tensor, op: str) -> Vec:
        _, _, one_, many_ = _OPS[op]
        if isinstance(other, Tensor):
            for t, s in zip(self, self._scalars(other)):
                one_(t, s)
            return self
        many_(self, other)
        return self

    # ---------------------------------------------------------- out of place
    def __add__(self, other: Vec | float | Tensor) -> Vec:  # type: ignore[override]
        return self._binary(other, "add")

    __radd__ = __add__

    def __sub__(self, other: Vec | float | Tensor) -> Vec:
        return self._binary(other, "sub")

    def __rsub__(self, other: float | Tensor) -> Vec:
        return (-self) + other

    def __mul__(self, other: Vec | float | Tensor) -> Vec:  # type: ignore[override]
        return self._binary(other, "mul")

    def __rmul__(self, other: float | Tensor) -> Vec:  # type: ignore[override]
        return self._binary(other, "mul")

    def __truediv__(self, other: Vec | float | Tensor) -> Vec:
        return self._binary(other, "div")

    def __neg__(self) -> Vec:
        return Vec(tc.foreach_neg(self))

    def add(self, other: Vec, alpha: float = 1.0) -> Vec:
        """``self + alpha * other`` in one fused op per group (one rounding)."""
        return Vec(tc.foreach_add(self, other, alpha=alpha))

    def sqrt(self) -> Vec:
        return Vec(tc.foreach_sqrt(self))

    def reciprocal(self) -> Vec:
        return Vec(tc.foreach_reciprocal(self))

    def clone(self) -> Vec:
        return Vec(t.clone() for t in self)

    def zeros_like(self) -> Vec:
        return Vec(torch.zeros_like(t) for t in self)

    # --------------------------------------------------------------- in place
    def __iadd__(self, other: Vec | float | Tensor) -> Vec:  # type: ignore[override]
        return self._binary_(other, "add")

    def __isub__(self, other: Vec | float | Tensor) -> Vec:
        return self._binary_(other, "sub")

    def __imul__(self, other: Vec | float | Tensor) -> Vec:  # type: ignore[override]
        return self._binary_(other, "mul")

    def __itruediv__(self, other: Vec | float | Tensor) -> Vec:
        return self._binary_(other, "div")

    def add_(self, other: Vec | float | Tensor, alpha: float = 1.0) -> Vec:
        """In place: ``self += alpha * other`` (a joint vector: one rounding per
        element), as :meth:`torch.Tensor.add_`; ``other`` may be a scalar."""
        if isinstance(other, (Tensor, int, float)):
            return self._binary_(other if alpha == 1 else other * alpha, "add")
        tc.foreach_add_(self, other, alpha=alpha)
        return self

    def sub_(self, other: Vec | float | Tensor, alpha: float = 1.0) -> Vec:
        """In place: ``self -= alpha * other``, as :meth:`torch.Tensor.sub_`."""
        if isinstance(other, (Tensor, int, float)):
            return self._binary_(other if alpha == 1 else other * alpha, "sub")
        tc.foreach_sub_(self, other, alpha=alpha)
        return self

    def mul_(self, other: Vec | float | Tensor) -> Vec:
        """In place: ``self *= other`` (elementwise for a joint vector), as :meth:`torch.Tensor.mul_`."""
        return self._binary_(other, "mul")

    def div_(self, other: Vec | float | Tensor) -> Vec:
        """In place: ``self /= other`` (elementwise for a joint vector), as :meth:`torch.Tensor.div_`."""
        return self._binary_(other, "div")

    def addcmul_(self, a: Vec, b: Vec, value: float = 1.0) -> Vec:
        """In place: ``self += value * a * b``."""
        tc.foreach_addcmul_(self, a, b, value=value)
        return self

    def lerp_(self, end: Iterable[Tensor], weight: float) -> Vec:
        """In place: ``self += weight * (end - self)``."""
        tc.foreach_lerp_(self, list(end), weight)
        return self

    def copy_(self, other: Iterable[Tensor]) -> Vec:
        """In place: ``self`` takes ``other``'s values (a joint vector of the same groups)."""
        tc.foreach_copy_(self, list(other))
        return self

    def zero_(self) -> Vec:
        tc.foreach_zero_(self)
        return self

    # -------------------------------------------------------------- reductions
    def dot(self, other: Iterable[Tensor]) -> Tensor:
        """⟨self, other⟩ as a 0-d float64 tensor on the first group's device (no host sync)."""
        parts = [torch.dot(x.reshape(-1), y.reshape(-1)).to(self[0].device, torch.float64) for x, y in zip(self, other)]
        return torch.stack(parts).sum() if len(parts) > 1 else parts[0]

    def norm(self) -> Tensor:
        """‖self‖ as a 0-d float64 tensor on the first group's device."""
        return self.dot(self).sqrt()

    def __getattr__(self, name: str) -> Any:
        """Only for a name Vec lacks: an ``AttributeError`` that lists what it has
        (a reader used to tensors tries their methods)."""
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"'Vec' object has no attribute {name!r}. A Vec has, in place: {', '.join(IN_PLACE)} "
            f"(and +=, -=, *=, /=); out of place: {', '.join(OUT_OF_PLACE)} (and +, -, *, /, unary -); "
            "reductions: dot, norm; it is a list of flat tensors, one per (device, dtype) group, "
            "for anything else (torch._foreach_* takes it as it is)"
        )

    def __repr__(self) -> str:
        groups = ", ".join(f"{t.numel()} × {t.dtype} on {t.device}" for t in self)
        return f"Vec([{groups}])"


#: the tensor-style methods of a Vec, named by its AttributeError
IN_PLACE = ("add_", "sub_", "mul_", "div_", "addcmul_", "lerp_", "copy_", "zero_")
OUT_OF_PLACE = ("add", "sqrt", "reciprocal", "clone", "zeros_like")


class Scaled:
    """A step given as a direction and one factor per player, ``δᵢ = factorᵢ · dᵢ``,
    for the game's move to apply as ``w + factorᵢ · dᵢ`` in its own pass (as
    ``torch.optim``'s ``p.add_(grad, alpha=-lr)``), where scaling first would take a
    pass of its own (:meth:`gameopt.Algorithm.scaled_descent`).

    It is not a vector: it has no arithmetic. Where a step is needed as a vector (a
    wrapper's ``oracle.moved(delta)``), :meth:`gameopt.JointLayout.resolve`
    forms it.

    Args:
        direction: ``d``, a joint vector, read by the move (it must stay as it is
            until then); or ξ where autograd left it (:class:`~gameopt.vec.Pieces`,
            from :meth:`~gameopt.Algorithm.scaled_descent`), which the move and the
            step's check read there and everything else fills into the buffer first
            (``gameopt.vec.filled_step``).
        factors: one factor per player.
        into: where :meth:`~gameopt.JointLayout.resolve` may write the step
            (the direction itself when it is scratch; for a ``Pieces`` direction, the
            buffer it fills); ``None``: a new vector.
        implied: tensors of the new state that are finite whenever the direction
            and the rest of the new state are (an update rule's ``implied``
            entries): the step's check does not read them.
        bounds: for each group, a bound on ``max|direction|`` known without reading
            it, or ``None`` where it is not known (an update rule's
            :meth:`~gameopt.UpdateRule.direction_bounds`): the step's check reads
            the groups it bounds no more (it reads the new state, which implies them).
    """

    __slots__ = ("direction", "factors", "into", "implied", "bounds")

    def __init__(
        self,
        direction: Vec | Pieces,
        factors: Sequence[float],
        into: Vec | Pieces | None = None,
        implied: Sequence[Tensor] = (),
        bounds: Sequence[float | None] | None = None,
    ) -> None:
        self.direction = direction
        self.factors = [float(f) for f in factors]
        self.into = into
        self.implied = tuple(implied)
        self.bounds = None if bounds is None else list(bounds)

    def __repr__(self) -> str:
        return f"Scaled(factors={self.factors})"


#: what an algorithm's update returns: the step as a vector, or as a direction and factors
Step = Vec | Scaled


# ------------------------------------------------ ξ where autograd left it
#: elements per tensor on average from which an update rule reads ξ in pieces: one
#: operation per parameter, each a dispatch (Adam runs three and takes the views of
#: four vectors), against the copy of ξ into the buffer they spare. Measured on the
#: CPU, SimGD + Adam on MLP pairs (``benchmarks.step_cost``), pieces against the copy:
#: 1.06x at 2·10⁴ elements per tensor, 0.99x at 8·10⁴, 0.98x at 3·10⁵. The plain rule,
#: which runs no operation of its own, reads them from ``PIECES_MIN``
RULE_PIECES_MIN = 1 << 16


@dataclass(frozen=True)
class PieceViews:
    """Where each parameter's piece of a joint vector lies, for :class:`Pieces` (made
    once per layout: ``Problem.piece_views``)."""

    #: the joint gradient buffer (what :meth:`Pieces.filled` returns)
    grad: Vec
    #: per player, its parameters' views of :attr:`grad`
    grad_views: list[list[Tensor]]
    #: per player, its parameters' views of the joint point (sharing its groups' version counters)
    point_views: list[list[Tensor]]
    #: the joint group of each parameter, player after player
    groups: list[int]
    #: per joint group, how many parameters it holds (the writes of a move by pieces)
    group_params: list[int]
    #: per player, its parameters' views of any joint vector (as :attr:`point_views` of the point)
    views_of: Callable[[Sequence[Tensor]], list[list[Tensor]]]
    #: whether the parameters tile every joint group (no padding from a player's ``align``):
    #: an operation through their views then writes every element
    packed: bool = True


class Pieces:
    """ξ held as the gradients autograd returned, one tensor per parameter, not copied
    into the joint gradient buffer.

    A plain gradient step reads ξ twice: the step's check (``max|ξ|``, its finiteness
    verdict) and the move (``w + factor·ξ``). Copying ξ into the fused buffer first is a
    pass over memory (2N per evaluation) that the bare loop, ``autograd.grad`` then
    ``torch._foreach_add_``, does not pay. An algorithm whose rule reads ξ so
    (:attr:`~gameopt.Algorithm.reads_pieces`) asks ``oracle.xi(pieces=True)``; where
    the evaluation allows it (players with large tensors, no loss scale, not
    data-parallel: ``gameopt.autodiff.xi.leaves_in_place``) it gets this, to hand to
    :meth:`~gameopt.Algorithm.scaled_descent` (with the plain rule, a :class:`Scaled`
    step that the game's check and move read here; a rule that declares
    ``reads_pieces`` reads it in its elementwise operations, ``by_piece``, and
    writes its direction into the buffer, :meth:`scratch`) or, with the plain rule, to
    ``oracle.xi(along=...)``, and nowhere else:
    :meth:`filled` is the joint vector (the copy, once), which
    :meth:`~gameopt.JointLayout.resolve` and every other reader take. Borrowed, as
    ``oracle.xi()``'s result: the next evaluation releases it.

    Args:
        where: the layout's ``PieceViews``.
        parts: per player, its gradients (aligned with its parameters): autograd's
            tensors, or the buffer's own views where the evaluation wrote there.
    """

    __slots__ = ("where", "parts", "_filled", "_spent", "_scratched")

    def __init__(self, where: PieceViews, parts: Sequence[Sequence[Tensor]]) -> None:
        self.where = where
        self.parts = [list(p) for p in parts]
        self._filled = False
        self._spent = False
        self._scratched = False

    def filled(self) -> Vec:
        """The joint vector: the gradients copied into the gradient buffer (one foreach
        copy, the first time), which is returned (borrowed, as ``oracle.xi()``'s)."""
        self._check()
        if self._scratched:
            raise RuntimeError("this ξ's gradient buffer was taken as scratch (Pieces.scratch): it cannot be filled")
        if not self._filled:
            self.copy_to(self.where.grad_views)
            self.parts = [list(views) for views in self.where.grad_views]
            self._filled = True
        return self.where.grad

    def copy_to(self, views: Sequence[Sequence[Tensor]]) -> None:
        """In place: each parameter's view in ``views`` (per player, as
        ``PieceViews.views_of`` gives them) takes its gradient, with one foreach copy
        (a gradient that is its view already is left as it is)."""
        self._check()
        pairs = [(v, g) for vs, part in zip(views, self.parts) for v, g in zip(vs, part) if v is not g]
        if pairs:
            tc.foreach_copy_([v for v, _ in pairs], [g for _, g in pairs])

    def tensors(self) -> list[Tensor]:
        """Every gradient, player after player."""
        self._check()
        return [g for part in self.parts for g in part]

    @property
    def rules_read_here(self) -> bool:
        """Whether an update rule's elementwise operations may run per parameter on
        these gradients (``by_piece``): the parameters tile every joint group (no
        padding, which no view would write: a new state's padding would hold whatever
        its memory held), and every player's tensors hold ``RULE_PIECES_MIN``
        elements on average, so that an operation's cost per tensor is repaid by the
        copy into the buffer it spares."""
        large = all(sum(g.numel() for g in part) >= RULE_PIECES_MIN * len(part) for part in self.parts if part)
        return self.where.packed and large

    @property
    def in_buffer(self) -> bool:
        """Whether some gradient is the gradient buffer's own view (written there by the
        evaluation: an unreached parameter's zeros, or filled)."""
        pairs = (zip(vs, part) for vs, part in zip(self.where.grad_views, self.parts))
        return self._filled or any(g is v for player in pairs for v, g in player)

    def like(self) -> Vec:
        """A joint vector shaped as ξ (the gradient buffer; not to be written: see :meth:`scratch`)."""
        return self.where.grad

    def scratch(self) -> Vec:
        """The gradient buffer, to write a direction into while the gradients are read
        where autograd left them (none of them may be in it: :attr:`in_buffer`); from
        then on :meth:`filled` raises ``RuntimeError`` (it would overwrite it)."""
        self._check()
        if self.in_buffer:
            raise RuntimeError("this ξ lies partly in the gradient buffer: fill it (Pieces.filled) instead")
        self._scratched = True
        return self.where.grad

    def by_parameter(self, *vecs: Sequence[Tensor]) -> Iterator[tuple[Tensor, ...]]:
        """For an elementwise operation that reads ξ, per parameter: its gradient (a lazy
        conjugate or negation resolved, as a copy into the buffer would: a rule may take
        real views of it) and its views of each of ``vecs`` (joint vectors shaped as ξ);
        see ``by_piece``."""
        views = [[v for player in self.where.views_of(vec) for v in player] for vec in vecs]
        for part in self.parts:  # (once: kept resolved)
            part[:] = [g.resolve_conj().resolve_neg() if g.is_conj() or g.is_neg() else g for g in part]
        return zip(self.tensors(), *views)

    def group_bounds(self, per_tensor: Sequence[Any]) -> list[Any]:
        """Per joint group, the largest of ``per_tensor`` (one bound per tensor of
        :meth:`tensors`: floats, or 0-d tensors under the device verdict, where NaN
        propagates) over the group's parameters; 0.0 for a group without any."""
        buckets: list[list[Any]] = [[] for _ in self.where.group_params]
        for g, b in zip(self.where.groups, per_tensor):
            buckets[g].append(b)
        return [_largest(bs) for bs in buckets]

    def add_to(self, factors: Sequence[float], views: Sequence[Sequence[Tensor]] | None = None) -> None:
        """In place, ``w += factorᵢ · ξᵢ`` through each parameter's view of ``w`` (``views``,
        per player; by default the joint point's, which share its groups' version counters):
        one write per parameter, ``add_(grad, alpha=factor)`` as ``torch.optim.SGD`` steps,
        one foreach add per joint group and factor."""
        with torch.no_grad():
            for xs, ds, f in self._batches(factors, views):
                tc.foreach_add_(xs, ds, alpha=f)

    def add_to_point_unless(self, factors: Sequence[float], found_inf: Tensor) -> None:
        """:meth:`add_to` the joint point unless ``found_inf`` (a 0-d float32 tensor on the
        device) is nonzero, decided on the device (``torch._fused_sgd_``, one per joint
        group and factor: each call's tensors share a device and a dtype)."""
        with torch.no_grad():
            for xs, ds, f in self._batches(factors, None):
                tc.fused_add_unless_(xs, ds, f, found_inf)

    def release(self) -> None:
        """Let the gradients go (the next evaluation of the step began: they are stale,
        and holding them would keep a vector alive through it); any later use raises
        ``RuntimeError``."""
        self.parts, self._spent = [], True

    def _batches(
        self, factors: Sequence[float], views: Sequence[Sequence[Tensor]] | None
    ) -> list[tuple[list[Tensor], list[Tensor], float]]:
        """The parameters' views and gradients, by joint group and factor."""
        self._check()
        batches: dict[tuple[int, float], tuple[list[Tensor], list[Tensor]]] = {}
        groups = iter(self.where.groups)
        for vs, part, f in zip(self.where.point_views if views is None else views, self.parts, factors):
            for v, g in zip(vs, part):
                xs, ds = batches.setdefault((next(groups), float(f)), ([], []))
                xs.append(v)
                ds.append(g)
        return [(xs, ds, f) for (_, f), (xs, ds) in batches.items()]

    def _check(self) -> None:
        if self._spent:
            raise RuntimeError(
                "this ξ (oracle.xi(pieces=True)) was borrowed until the next evaluation, which has begun: "
                "use it before evaluating again (or keep a copy of pieces.filled())"
            )

    def __repr__(self) -> str:
        return f"Pieces({sum(map(len, self.parts))} tensors, filled={self._filled})"


def by_piece(d: Vec | Pieces, *vecs: Sequence[Tensor]) -> Iterator[tuple[Tensor, ...]]:
    """``zip(d, *vecs)`` for an elementwise operation that reads ``d`` (an update
    rule's ξ) beside joint vectors ``vecs``: per joint group for a joint vector ``d``;
    per parameter for :class:`Pieces` (each gradient where autograd left it, with its
    parameter's views of ``vecs``), which reads ξ with no copy into the buffer. A rule
    written with it declares ``UpdateRule.reads_pieces``."""
    return d.by_parameter(*vecs) if isinstance(d, Pieces) else zip(d, *vecs)


def copy_by_piece(into: Vec, d: Vec | Pieces) -> None:
    """In place: the joint vector ``into`` takes ``d``'s values, with one foreach copy
    (per parameter, through ``into``'s views, for :class:`Pieces`: no copy loop)."""
    if isinstance(d, Pieces):
        d.copy_to(d.where.views_of(into))
    else:
        into.copy_(d)


def joint_like(d: Vec | Pieces) -> Vec:
    """``d`` itself, or the joint vector that :class:`Pieces` ``d`` is shaped as."""
    return d.like() if isinstance(d, Pieces) else d


def filled_step(step: Scaled) -> Scaled:
    """``step`` with its direction a joint vector: a :class:`Pieces` direction filled
    (the step may then be written into the buffer where it was scratch)."""
    if not isinstance(step.direction, Pieces):
        return step
    vec = step.direction.filled()
    into = vec if step.into is step.direction else step.into
    return Scaled(vec, step.factors, into=into, implied=step.implied, bounds=step.bounds)


def _largest(bounds: list[Any]) -> Any:
    if len(bounds) <= 1:
        return bounds[0] if bounds else 0.0
    return max(bounds) if isinstance(bounds[0], float) else torch.stack(bounds).amax()


def dot(a: Iterable[Tensor], b: Iterable[Tensor]) -> Tensor:
    """⟨a, b⟩ for any two joint vectors (lists of tensors): see :meth:`Vec.dot`."""
    return Vec(a).dot(b)


#: a real CPU tensor of at most this many elements is checked value by value in
#: Python: cheaper than a reduction's setup, which after a backward costs as much
#: as a small game's whole bookkeeping (``benchmarks/step_cost.py --small``)
READ_MAX = 64

_HALF = (torch.float16, torch.bfloat16)
_INF = math.inf
_MARGIN = 1 + 2.0**-20  # a norm's rounding (see finite_bounds)


def all_finite(vecs: Sequence[Tensor]) -> bool:
    """True when every element is finite (see :func:`finite_bounds`, which this is)."""
    return finite_bounds(vecs) is not None


def finite_bounds(vecs: Sequence[Tensor]) -> list[float] | None:
    """None when some element is not finite; else, for each tensor, a bound on its
    largest absolute value: ``max|t| <= bound`` (a Python float; a complex tensor's
    real and imaginary parts). The verdict and the bounds come from one reduction per
    tensor, which NaN and ±inf poison, and one host sync for all:

    * a small real tensor on the CPU (:data:`READ_MAX`) is read value by value:
      its norm ``‖t‖₂`` in float64 (``math.hypot``, cheaper than a finiteness test
      of each value);
    * half precision: its minimum and maximum (one pass), the exact bound;
    * other dtypes: ``‖t‖₂`` (a dot product, the cheapest reduction). A sum of
      non-negative terms, rounded to nearest in any order, is at least its largest
      term, so ``‖t‖₂ >= max|t|`` up to the rounding of one square (a factor
      ``1 + 2⁻²⁰`` covers it). Only where the sum of squares overflows, with finite
      values, is the tensor read again, exactly.
    """
    bounds: list[float] = []
    parts: list[Tensor] = []  # 0-d reductions, read in one host sync
    plan: list[tuple[int, bool]] = []  # for each part: its tensor, and whether it is a sum of squares
    for t in vecs:
        if t.is_cpu and t.numel() <= READ_MAX and not t.is_complex():
            values = (t if t.dim() == 1 else t.reshape(-1)).tolist()  # no view when none is needed: each op counts
            bound = math.hypot(*values)  # NaN and inf propagate (to NaN or inf)
            if not bound < _INF:  # not finite, or an overflowing norm of float64 values
                if not all(map(math.isfinite, values)):
                    return None
                bound = max(map(abs, values))
            bounds.append(bound * _MARGIN)
        else:
            _reduce(t, len(bounds), parts, plan)
            bounds.append(0.0)
    return _read(parts, plan, bounds, vecs) if parts else bounds


def _reduce(t: Tensor, i: int, parts: list[Tensor], plan: list[tuple[int, bool]]) -> None:
    """Queue the reductions of :func:`finite_bounds` for ``t``, the ``i``-th tensor."""
    if not t.numel():
        return
    if t.is_complex():  # both parts
        t = torch.view_as_real(t.resolve_conj())
    flat = t if t.dim() == 1 else t.reshape(-1)
    if t.dtype in _HALF or not t.is_floating_point():
        parts.extend(torch.aminmax(flat))
        plan += ((i, False), (i, False))
    else:
        parts.append(torch.dot(flat, flat))
        plan.append((i, True))


def _read(
    parts: list[Tensor], plan: list[tuple[int, bool]], bounds: list[float], vecs: Sequence[Tensor]
) -> list[float] | None:
    """:func:`finite_bounds` from its reductions ``parts`` (one host sync)."""
    if len(parts) == 1:
        values = [float(parts[0])]
    else:  # one read for all (stacked as they are where they can be)
        device, dtype = parts[0].device, parts[0].dtype
        same = all(p.device == device and p.dtype == dtype for p in parts)
        values = torch.stack(parts if same else [p.to(device, torch.float64) for p in parts]).tolist()
    for (i, squares), v in zip(plan, values):
        if v < _INF and v > -_INF:
            bounds[i] = math.sqrt(v) * _MARGIN if squares else max(bounds[i], abs(v))
        elif not squares or not (bound := max_abs(vecs[i])) < _INF:
            return None
        else:
            bounds[i] = bound
    return bounds


def max_abs(t: Tensor) -> float:
    """The largest absolute value of ``t`` (of its real and imaginary parts), read
    exactly in one pass without a temporary; NaN or inf if some element is not
    finite, 0.0 for an empty tensor."""
    if not t.numel():
        return 0.0
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    lo, hi = map(float, torch.aminmax(t))
    return max(-lo, hi) if lo == lo and hi == hi else math.nan  # NaN != NaN
