"""Per-player update rules that any algorithm composes with.

A rule maps a direction ``d`` (a list of flat tensors, usually a joint vector) to
the direction actually followed, with explicit state:
``out, new_state = rule.apply(d, state, empty)``. Rules are elementwise, so an
algorithm may apply them to the whole joint vector or to one player's part of it.
By default they modify neither ``d`` nor ``state`` (a failed step leaves the state
as it was): new values are written into tensors from ``empty()`` (tensors shaped
like ``d``, contents undefined; the game's pool, which lets go of every vector the
committed state does not hold). Two flags let a caller save memory:

* ``scratch=True``: ``d`` is the caller's scratch space and may be overwritten;
  ``out`` may then be ``d`` itself (a rule with state still returns fresh state);
* ``own_state=True``: ``state`` is a temporary of the caller's (the state after an
  extrapolation, say), not the committed state: it is updated in place.

An extragradient step calls ``out, memo = rule.extrapolate(d, state, empty)``, evaluates
the extrapolated point, then ``rule.resume(memo, state, empty)`` for the state after the
extrapolation: a rule may keep a smaller memo than that state meanwhile (Adam on large
vectors keeps ``d``, one vector, not its two new moments).

The learning rate is applied by the algorithm afterwards: ``w ← w − η · out``.

Each rule owns its state, typed by a ``TypedDict`` (:class:`AdamState`, ...): what
it holds, how it follows the parameters when the players' layout changes
(:meth:`~gameopt.UpdateRule.carry`) and how a checkpoint's is checked
(:meth:`~gameopt.UpdateRule.check_loaded`); the game and the checkpoints ask the rule, and
never read its keys.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypedDict, TypeVar, cast

import torch
from torch import Tensor

from . import direction_bounds as bounds
from .checks import check_number
from .settings import Setting
from .state import Carry, check_counts, check_like, check_loaded
from .vec import Pieces, Vec, by_piece, copy_by_piece, joint_like

#: any rule's state as the algorithms and checkpoints see it, a dict
State = dict[str, Any]
#: a rule's state, typed per rule (a ``TypedDict`` such as :class:`AdamState`)
RS = TypeVar("RS", bound=Mapping[str, Any])
Empty = Callable[[], Vec]
#: player i's views of a joint vector (``layout.player_views(vec, i)``)
Views = Callable[[Sequence[Tensor]], Vec]


def next_count(t: int | Vec) -> int | Vec:
    """A step count after one more step: one number for all elements, or (once
    parameters joined at different steps) one per element, a joint vector (a count
    its owner declares in ``counts`` becomes one per element when a parameter joins:
    see :meth:`~gameopt.UpdateRule.carry`)."""
    return t + 1 if isinstance(t, int) else Vec(c + 1 for c in t)


def stepped(t: int | Vec, g: int) -> bool | Tensor:
    """Whether group ``g``'s elements have taken a step: one bool for all, or (counts
    per element) a bool tensor, False where a parameter joined since the last step."""
    return t > 0 if isinstance(t, int) else t[g] != 0


def _count_of(t: int | Vec, g: int) -> int | Tensor:
    return t if isinstance(t, int) else t[g]


def _nth(views: Callable[[Sequence[Tensor], int], Vec], i: int, vec: Sequence[Tensor]) -> Vec:
    return views(vec, i)


def _empty_like(d: Vec | Pieces) -> Empty:
    return lambda: Vec(torch.empty_like(t) for t in joint_like(d))


def _out(d: Vec | Pieces, scratch: bool, empty: Empty) -> Vec:
    """Where a rule writes its direction: ``d`` itself with ``scratch`` (the gradient
    buffer for ξ in pieces, whose gradients are read where autograd left them), else new."""
    if not scratch:
        return empty()
    return d.scratch() if isinstance(d, Pieces) else d


def _real(*ts: Tensor) -> tuple[Tensor, ...]:
    """The tensors of one group, complex ones as pairs of reals (``torch.view_as_real``:
    a view, no copy), as torch.optim treats complex parameters; one check per group."""
    return tuple(map(torch.view_as_real, ts)) if ts[0].is_complex() else ts


class PlainState(TypedDict):
    """No state (:class:`Plain`, and the base :class:`UpdateRule`)."""


class MomentumState(TypedDict):
    """:class:`Momentum`'s state."""

    #: the momentum buffer b
    buf: Vec


class AdamState(TypedDict):
    """:class:`Adam`'s state."""

    #: the first moment
    m: Vec
    #: the second moment
    v: Vec
    #: the steps taken (one count, or one per element once parameters joined later)
    t: int | Vec


class RMSPropState(TypedDict):
    """:class:`RMSProp`'s state."""

    #: the mean square
    v: Vec


class PerPlayerState(TypedDict):
    """:class:`PerPlayer`'s state."""

    #: each player's rule's state, in joint vectors (of which it uses its player's part)
    players: list[State]


class UpdateRule(Generic[RS]):
    """Base class: the identity rule (plain gradient steps). Generic in the type of
    its state (``class MyRule(UpdateRule[MyRuleState])``, a ``TypedDict``; at run
    time a plain dict, as checkpoints hold it).

    A rule implements :meth:`init` and :meth:`apply`; the rest is optional, declared
    rather than detected:

    * ``memory_flags`` (class attribute, default False): ``apply`` takes the memory
      flags ``scratch`` and ``own_state`` (see the module). A rule that declares it
      gets them from every algorithm; one that does not is called as
      ``apply(d, state, empty)`` and keeps the default contract (it modifies neither
      ``d`` nor ``state``). A class that defines its own ``apply`` declares it again
      (else it is False for that class: a subclass's ``apply`` written without the
      flags stays safe).
    * ``reads_pieces`` (class attribute, default False): ``apply`` also takes ``d`` as
      :class:`~gameopt.vec.Pieces` (ξ where autograd left it, one tensor per
      parameter: no copy into the gradient buffer), reading it only in elementwise
      operations written with ``gameopt.vec.by_piece`` (per parameter, beside its
      views of the joint vectors); everything else stays joint (``gameopt.vec.joint_like``).
      With ``scratch``, the direction goes into ``d.scratch()``. Such an operation
      writes only the parameters' elements of a joint vector, which is all of it:
      pieces come only where the parameters tile their groups (no padding). The same
      holds for :meth:`extrapolate`. Reset, as ``memory_flags``, for a class that
      defines its own ``apply`` or ``extrapolate`` (and for a subclass of Adam that
      defines its own ``_moments``, which reads ``d``).
    * :meth:`extrapolate` and :meth:`resume`: the two halves of an extragradient
      step. The defaults go through :meth:`apply`; a rule overrides them to hold
      less memory while the extrapolated point is evaluated (Adam).
    * ``schedulable``: the settings a user may schedule. The algorithm keeps them in its
      param groups (``group["betas"]``, ``group["momentum"]``: the keys torch.optim's
      Adam and SGD use, so ``OneCycleLR``/``CyclicLR`` with ``cycle_momentum`` drive
      them) and hands the groups' values to the rule before each step; :meth:`check`
      checks such a value.
    * ``nonnegative``: state entries checked non-negative when a checkpoint loads.
    * ``implied``: entries of the new state that are finite whenever the direction
      ``apply`` returned and the other entries are; a step's check reads them no
      more (one pass over memory fewer: Adam's ``m``). A class that defines its own
      ``apply`` declares it again (else it is empty for that class).
    * ``counts``: the step counts of its state, each with the joint vector whose
      elements it counts (Adam's ``{"t": "m"}``). A parameter that joins a running
      game starts its own count from 0, as under torch.optim: the count becomes one
      per element (:func:`~gameopt.updates.next_count` and :func:`~gameopt.updates.stepped`
      take either form).
    * :meth:`carry` and :meth:`check_loaded`: how the state follows the parameters
      into a new layout, and how a checkpoint's state is checked. The defaults carry
      every joint vector by parameter and each declared count, and check the
      structure, the counts and :meth:`check_state`'s values.

    Settings are ``Setting`` descriptors of the class, checked
    whenever they are set (``rule.eps = -1`` raises ``ValueError`` and changes nothing).

    Complex parameters are pairs of reals, as in torch.optim: a rule that is not
    linear in ``d`` (Adam's and RMSProp's squares) works on ``torch.view_as_real``
    views of a complex group; its state stays complex (a second moment holds one
    real second moment in each of its real and imaginary parts).
    """

    #: whether ``apply`` takes the memory flags ``scratch`` and ``own_state``
    memory_flags: bool = False
    #: whether ``apply`` takes ξ in pieces (:class:`~gameopt.vec.Pieces`) as ``d``
    reads_pieces: bool = False
    schedulable: tuple[str, ...] = ()
    #: state entries that hold second moments (checked non-negative when a checkpoint loads)
    nonnegative: tuple[str, ...] = ()
    #: new-state entries finite whenever the direction and the other entries are
    implied: tuple[str, ...] = ()
    #: the step counts of the state, each with the joint vector whose elements it counts
    counts: ClassVar[Mapping[str, str]] = {}

    def identity(self) -> dict[str, Any]:
        """What a checkpoint records to know the run that saved it: the rule's type and
        every setting that changes the iterates and is not scheduled (those live in
        the param groups): Momentum's ``nesterov``, Adam's ``eps``, RMSProp's ``eps`` and
        ``convention``."""
        fixed = {k: v for k, v in vars(self).items() if k not in self.schedulable and not k.startswith("_")}
        return {"type": type(self).__name__, **fixed}

    def carry(self, old: RS, fresh: RS, carry: Carry) -> RS:
        """The state after the players' layout changed: ``fresh`` (:meth:`init` for the
        new layout) with each surviving parameter's values of ``old`` (the state
        before, its joint vectors taken apart by parameter), each step count of
        :attr:`counts` per element once a parameter joined, other values as ``old``
        holds them (see ``gameopt.state.Carry``)."""
        return cast(RS, carry.state(old, fresh, self.counts))

    def check_loaded(self, live: RS, saved: Any, path: str) -> RS:
        """Raise ``ValueError`` naming the entry (under ``path``) unless ``saved``, a
        checkpoint's state, fits ``live``, the state in use: the same structure,
        shapes and dtypes, each count of :attr:`counts` in either form, and no
        impossible value (:meth:`check_state`). Returns what ``saved`` loads as:
        ``live`` with its counts in ``saved``'s form. Changes nothing."""
        like = check_loaded(live, saved, path, self.counts)
        self.check_state(saved, path)
        return cast(RS, like)

    def check_state(self, state: Any, path: str) -> None:
        """Raise ``ValueError`` naming the entry if a loaded state holds impossible
        values: a negative step count (``counts``) or second moment (``nonnegative``)."""
        if not isinstance(state, dict):
            return
        check_counts(state, self.counts, path)
        for key in self.nonnegative:
            for k, v in enumerate(state.get(key) or ()):
                v = _real(v)[0] if isinstance(v, Tensor) else v
                if isinstance(v, Tensor) and bool((v < 0).any()):
                    raise ValueError(f"{path}.{key}[{k}]: second moments must be >= 0, got {float(v.min()):g}")

    def check(self, name: str, value: Any, path: str | None = None) -> Any:
        """``value`` for the schedulable setting ``name``, checked (``ValueError`` naming ``path``)."""
        raise KeyError(name)

    def init(self, like: Vec) -> RS:
        """The state before the first step, for directions shaped as ``like``."""
        return cast(RS, {})

    def apply(
        self, d: Vec, state: RS, empty: Empty | None = None, scratch: bool = False, own_state: bool = False
    ) -> tuple[Vec, RS]:
        """``(out, new_state)``: the direction followed for the direction ``d``, and the
        new state. New tensors come from ``empty()`` (shaped like ``d``); ``d`` and
        ``state`` stay as they are, unless the rule declares :attr:`memory_flags` and
        the caller passes ``scratch`` (``d`` may be overwritten, ``out`` may be ``d``)
        or ``own_state`` (``state`` is updated in place). Identity here."""
        return d, state

    def direction_bounds(self, new_state: RS, out: Vec) -> list[float | None] | None:
        """For each group, a bound on ``max|out|`` (real and imaginary parts) of the
        direction :meth:`apply` just returned with ``new_state``, known without reading
        ``out``: it holds whenever the entries of ``new_state`` that the step's check
        reads (all but :attr:`implied`) are finite, and then ``out`` is finite too.
        ``None`` for a group where none is known, or for all. The check reads the
        bounded groups no more: one pass over memory fewer (RMSProp, Adam:
        :mod:`gameopt.direction_bounds`). A class that defines its own ``apply``
        declares it again (else it is ``None`` for that class). Here: ``None``."""
        return None

    def extrapolate(self, d: Vec, state: RS, empty: Empty | None = None) -> tuple[Vec, Any]:
        """The direction of an extrapolation (the first half of an extragradient step)
        from ``state``, which stays as it is; ``d`` is scratch (the direction may be
        written into it; for :class:`~gameopt.vec.Pieces`, into ``d.scratch()``).
        Returns ``(out, memo)``: :meth:`resume` turns the memo into the state after the
        extrapolation. By default the memo is that state itself; a rule may keep less
        (Adam keeps ``d``, not the two new moments) while the caller evaluates the
        extrapolated point."""
        return apply(self, d, state, empty, scratch=True)

    def resume(self, memo: Any, state: RS, empty: Empty | None = None) -> RS:
        """The state after :meth:`extrapolate` (its ``memo``, from ``state``): the same
        bits as ``apply(d, state)``'s new state, in tensors the caller owns (it may
        update them in place: ``own_state=True``)."""
        return memo

    def for_player(self, i: int) -> UpdateRule:
        """The rule player ``i`` steps with (this one; a :class:`~gameopt.updates.PerPlayer` has one each)."""
        return self

    def part(self, state: RS, i: int, views: Views) -> State:
        """Player ``i``'s part of ``state``: the state of ``self.for_player(i)`` on player
        i's part of the vectors, each joint vector seen through ``views`` (player i's
        views of a joint vector, ``layout.player_views(vec, i)``), numbers as they are."""
        return {k: views(v) if isinstance(v, list) else v for k, v in state.items()}

    def with_part(self, state: RS, i: int, part: State, views: Views, own_state: bool = False) -> RS:
        """``state`` with player ``i``'s part replaced by ``part`` (the new state
        ``self.for_player(i)`` returned for :meth:`part`): a copy, ``state`` left as it
        is; with ``own_state`` (``state`` is the caller's, not the committed state),
        ``state`` itself, updated in place."""
        joint = cast(State, state)
        out = joint if own_state else {k: Vec(v).clone() if isinstance(v, list) else v for k, v in joint.items()}
        for k, v in part.items():
            if isinstance(v, list):
                Vec(views(out[k])).copy_(v)
            else:
                out[k] = v
        return cast(RS, out)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _unsaid(cls, "memory_flags", "apply"):
            cls.memory_flags = False  # a new apply declares the flags it takes
        if _unsaid(cls, "reads_pieces", "apply", "extrapolate"):
            cls.reads_pieces = False  # and whether it reads ξ in pieces (both take d)
        if _unsaid(cls, "implied", "apply"):
            cls.implied = ()  # a new formula declares what its direction implies
        if _unsaid(cls, "direction_bounds", "apply"):
            cls.direction_bounds = UpdateRule.direction_bounds  # type: ignore[method-assign]  # and what bounds it


def _unsaid(cls: type, declared: str, *methods: str) -> bool:
    """Whether ``cls`` takes one of ``methods`` from a class that did not declare
    ``declared`` with it: one nearer than the declaration in ``cls``'s method
    resolution order (a subclass's own ``apply``, or a mixin's ahead of Adam)."""

    def provider(name: str) -> int:
        return next((k for k, c in enumerate(cls.__mro__) if name in vars(c)), len(cls.__mro__))

    return any(provider(m) < provider(declared) for m in methods)


def apply(
    rule: UpdateRule[RS],
    d: Vec,
    state: RS,
    empty: Empty | None = None,
    scratch: bool = False,
    own_state: bool = False,
) -> tuple[Vec, RS]:
    """``rule.apply`` with the memory flags (``scratch``, ``own_state``) when the rule
    declares that it takes them (``UpdateRule.memory_flags``); a rule written
    without them gets the default contract."""
    if rule.memory_flags:
        return rule.apply(d, state, empty, scratch=scratch, own_state=own_state)
    return rule.apply(d, state, empty)


class Plain(UpdateRule[PlainState]):
    """The plain gradient: out = d (no state). The default of every algorithm."""

    memory_flags = True


class Momentum(UpdateRule[MomentumState]):
    """Heavy-ball momentum: b ← μ b + d, out = b (or d + μ b with ``nesterov``).

    A negative ``momentum`` gives the negative momentum of Gidel et al. 2019,
    "Negative Momentum for Improved Game Dynamics". Same convention as
    ``torch.optim.SGD`` with zero dampening.

    Args:
        momentum: μ in (−1, 1); schedulable as the param group's ``"momentum"``.
        nesterov: use d + μ b instead of b.

    Raises:
        ValueError: ``momentum`` outside (−1, 1), ``nesterov`` not a bool.

    References:
        - Polyak 1964, Some methods of speeding up the convergence of iteration methods
        - Gidel et al. 2019, `Negative Momentum for Improved Game Dynamics
          <https://arxiv.org/abs/1807.04740>`_
    """

    memory_flags = True
    reads_pieces = True
    schedulable = ("momentum",)
    momentum: Setting[float] = Setting.schedulable()
    nesterov = Setting.flag()

    def __init__(self, momentum: float = 0.9, nesterov: bool = False) -> None:
        self.momentum = momentum
        self.nesterov = nesterov

    def check(self, name: str, value: Any, path: str | None = None) -> Any:
        return check_number(path or name, value, low=-1.0, high=1.0, low_open=True, high_open=True)

    def init(self, like: Vec) -> MomentumState:
        return {"buf": Vec(torch.zeros_like(t) for t in like)}

    def apply(
        self,
        d: Vec,
        state: MomentumState,
        empty: Empty | None = None,
        scratch: bool = False,
        own_state: bool = False,
    ) -> tuple[Vec, MomentumState]:
        empty = empty or _empty_like(d)
        buf = state["buf"] if own_state else empty()
        for x, old, b in by_piece(d, state["buf"], buf):
            torch.add(x, old, alpha=self.momentum, out=b)  # b = x + μ·old, one pass
        if not self.nesterov:
            return buf, {"buf": buf}
        out = _out(d, scratch, empty)
        for x, b, o in by_piece(d, buf, out):
            torch.add(x, b, alpha=self.momentum, out=o)
        return out, {"buf": buf}


#: elements (of a joint vector) from which Adam inside an extragradient step keeps the
#: first ξ instead of the two moments after the extrapolation while the extrapolated
#: point is evaluated (one vector less at a step's peak, five more elementwise passes)
_RECOMPUTE_FROM = 1 << 19


class Adam(UpdateRule[AdamState]):
    """Adam: steps scaled per coordinate by running estimates of the gradient's first
    and second moments.

    Kingma & Ba 2015, Algorithm 1 in its efficient form:

    m ← β₁ m + (1 − β₁) d,  v ← β₂ v + (1 − β₂) d²,  t ← t + 1,
    out = √(1 − β₂ᵗ) / (1 − β₁ᵗ) · m / (√v + ε).

    Inside :class:`~gameopt.Extragradient` both the extrapolation and the update
    advance the moments and ``t`` (Extra-Adam, Gidel et al. 2019); for large vectors
    the moments after the extrapolation are recomputed from the first ξ once the
    extrapolated point is evaluated (see :meth:`extrapolate`), so that one vector
    less is held during that evaluation.

    Args:
        betas: (β₁, β₂), each in [0, 1); schedulable as the param group's ``"betas"``.
        eps: ε ≥ 0, added to √v.

    Raises:
        ValueError: ``betas`` not two numbers in [0, 1), or ``eps`` negative.

    References:
        - Kingma & Ba 2015, `Adam: A Method for Stochastic Optimization <https://arxiv.org/abs/1412.6980>`_
        - Gidel et al. 2019, `A Variational Inequality Perspective on Generative Adversarial Networks
          <https://arxiv.org/abs/1802.10551>`_
    """

    memory_flags = True
    reads_pieces = True
    schedulable = ("betas",)
    nonnegative = ("v",)
    # out = c·m/(√v + ε) with c > 0: where v is finite (and ≥ 0), a non-finite m makes
    # out non-finite, so a finite out and v leave m finite (a non-finite d reaches m)
    implied: tuple[str, ...] = ("m",)
    counts = {"t": "m"}
    betas: Setting[tuple[float, float]] = Setting.schedulable()
    eps = Setting.number(low=0.0)

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.betas = betas
        self.eps = eps

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _unsaid(cls, "implied", "_direction"):
            cls.implied = ()  # the direction's own formula declares what it implies
        if _unsaid(cls, "reads_pieces", "_moments"):
            cls.reads_pieces = False  # and whether it reads ξ in pieces (only _moments reads it)
        if _unsaid(cls, "direction_bounds", "_direction", "_moments"):
            cls.direction_bounds = UpdateRule.direction_bounds  # type: ignore[method-assign]  # and what bounds it

    def check(self, name: str, value: Any, path: str | None = None) -> Any:
        path = path or name
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ValueError(f"{path} must be two numbers in [0, 1), got {value!r}")
        return tuple(check_number(f"{path}[{k}]", b, low=0.0, high=1.0, high_open=True) for k, b in enumerate(value))

    def init(self, like: Vec) -> AdamState:
        m, v = Vec(torch.zeros_like(t) for t in like), Vec(torch.zeros_like(t) for t in like)
        bounds.keep((m, v), self.eps, [0.0] * len(like))  # m = 0: its ratio is 0
        return {"m": m, "v": v, "t": 0}

    def apply(
        self,
        d: Vec,
        state: AdamState,
        empty: Empty | None = None,
        scratch: bool = False,
        own_state: bool = False,
    ) -> tuple[Vec, AdamState]:
        t = next_count(state["t"])
        ratios = self._ratios(state)  # read before the moments are written (own_state)
        empty = empty or _empty_like(d)
        m, v = (state["m"], state["v"]) if own_state else (empty(), empty())
        for x, m0, v0, m1, v1 in by_piece(d, state["m"], state["v"], m, v):
            self._moments(x, m0, v0, m1, v1)
        out = _out(d, scratch, empty)  # d is read (into m, v) before out is written
        for g, (m1, v1, o) in enumerate(zip(m, v, out)):
            self._direction(m1, v1, _count_of(t, g), den=o, out=o)
        if ratios is not None:
            bounds.keep((m, v), self.eps, bounds.adam_ratios(m, ratios, self.betas, self.eps, self._correction(t)))
        return out, {"m": m, "v": v, "t": t}

    def direction_bounds(self, new_state: AdamState, out: Vec) -> list[float | None] | None:
        """From the new state's ratio ``max|m| / (√v + ε)``, kept beside it: each step's
        follows from the last one's (:func:`~gameopt.direction_bounds.adam_ratios`); a
        state with none kept (after a checkpoint is loaded) has it read, once. ``None``
        with counts per element, in float16 and bfloat16, and with ε below about
        1e-12 (float32)."""
        m, v, t = new_state["m"], new_state["v"], new_state["t"]
        if not isinstance(t, int) or not bounds.worth(out):
            return None
        ratios = bounds.kept((m, v), self.eps)
        if ratios is None:
            ratios = bounds.read_ratios(m, v, self.eps)
            bounds.keep((m, v), self.eps, ratios)
        return bounds.adam_bounds(m, ratios, self.eps, self._correction(t))

    def _ratios(self, state: AdamState) -> list[float] | None:
        """``state``'s ratios (:meth:`direction_bounds`), where they are kept and may be
        used (one count for all elements, vectors worth it)."""
        m = state["m"]
        return bounds.kept((m, state["v"]), self.eps) if isinstance(state["t"], int) and bounds.worth(m) else None

    def _correction(self, t: int | Vec) -> float:
        """c = √(1 − β₂ᵗ) / (1 − β₁ᵗ), for one count ``t`` (0.0 for counts per element: unused)."""
        b1, b2 = self.betas
        return math.sqrt(1 - b2**t) / (1 - b1**t) if isinstance(t, int) else 0.0

    # The one place each formula is written, so that moments recomputed by
    # :meth:`resume` have the bits :meth:`apply` gives.
    def _moments(self, x: Tensor, m0: Tensor, v0: Tensor, m1: Tensor, v1: Tensor) -> None:
        """m₁ = β₁ m₀ + (1 − β₁) x, v₁ = β₂ v₀ + (1 − β₂) x², into ``m1`` and ``v1``
        (neither may be ``x``: m₁ is written before v₁ reads ``x``)."""
        b1, b2 = self.betas
        x, m0, v0, m1, v1 = _real(x, m0, v0, m1, v1)
        torch.lerp(m0, x, 1 - b1, out=m1)  # one pass, as torch.optim's Adam (m₀ + (1 − β₁)(x − m₀))
        torch.mul(v0, b2, out=v1).addcmul_(x, x, value=1 - b2)

    def _direction(self, m1: Tensor, v1: Tensor, t: int | Tensor, den: Tensor, out: Tensor) -> None:
        """out = √(1 − β₂ᵗ) / (1 − β₁ᵗ) · m₁ / (√v₁ + ε), the denominator in ``den``; ``t``
        one count for all, or one per element (parameters that joined later)."""
        b1, b2 = self.betas
        if m1.is_complex():
            m1, v1, den, out = _real(m1, v1, den, out)
            t = t.real.unsqueeze(-1) if isinstance(t, Tensor) else t  # one count per complex element
        torch.sqrt(v1, out=den).add_(self.eps)
        # 0 + c·m₁/den: one pass, c with it (as torch.optim's addcdiv_), none for c alone
        if isinstance(t, Tensor):  # c per element: the same products, c·m₁ formed first
            torch.addcdiv(m1.new_zeros(()), m1 * (torch.sqrt(1 - b2**t) / (1 - b1**t)), den, out=out)
        else:
            torch.addcdiv(m1.new_zeros(()), m1, den, value=self._correction(t), out=out)

    def extrapolate(self, d: Vec, state: AdamState, empty: Empty | None = None) -> tuple[Vec, Any]:
        """:meth:`apply` with ``scratch``; from ``_RECOMPUTE_FROM`` elements on, its new
        moments are not kept: the memo is a copy of ``d`` (one vector, not two) from
        which :meth:`resume` recomputes them with the same operations (the same bits;
        five more elementwise passes). The moments then live only while the direction
        is computed, one group at a time."""
        if type(self).apply is not Adam.apply or sum(t.numel() for t in joint_like(d)) < _RECOMPUTE_FROM:
            return super().extrapolate(d, state, empty)  # a subclass's own rule, or small vectors
        t = next_count(state["t"])
        kept = (empty or _empty_like(d))()
        copy_by_piece(kept, d)
        d = d.scratch() if isinstance(d, Pieces) else d  # (ξ is read from kept from here on)
        for k, (x, g, m0, v0) in enumerate(zip(d, kept, state["m"], state["v"])):
            o = torch.empty_like(x)  # v1, then the denominator
            self._moments(g, m0, v0, x, o)  # m1 into d (read into g first)
            self._direction(x, o, _count_of(t, k), den=o, out=x)
        return d, {"d": kept}

    def resume(self, memo: Any, state: AdamState, empty: Empty | None = None) -> AdamState:
        if "d" not in memo:  # extrapolate kept the moments
            return super().resume(memo, state, empty)
        empty = empty or _empty_like(memo["d"])
        m, v = empty(), empty()
        ratios = self._ratios(state)
        for x, m0, v0, m1, v1 in zip(memo["d"], state["m"], state["v"], m, v):
            self._moments(x, m0, v0, m1, v1)
        t = next_count(state["t"])
        if ratios is not None:
            bounds.keep((m, v), self.eps, bounds.adam_ratios(m, ratios, self.betas, self.eps, self._correction(t)))
        return {"m": m, "v": v, "t": t}


class RMSProp(UpdateRule[RMSPropState]):
    """RMSProp (Tieleman & Hinton 2012, "Lecture 6.5") without momentum: the gradient
    divided by the root of its running mean square.

    Two conventions differ in where ε goes and where the mean square starts:

    .. math::
        v ← ρ v + (1 − ρ) d², \\qquad
        \\text{out} = \\begin{cases} d / (\\sqrt{v} + ε), & v_0 = 0 \\quad (``"torch"``) \\\\
                                     d / \\sqrt{v + ε},   & v_0 = 1 \\quad (``"tf1"``) \\end{cases}

    ``"torch"`` is ``torch.optim.RMSprop`` (its ``alpha`` is ρ; defaults ρ = 0.99,
    ε = 1e-8); ``"tf1"`` is TensorFlow 1's ``tf.train.RMSPropOptimizer`` (defaults
    ρ = 0.9, ε = 1e-10), which Mescheder et al. 2017 and Balduzzi et al. 2018 used.
    Neither has bias correction. Every call advances ``v`` (inside
    :class:`~gameopt.Extragradient`, both evaluations do).

    Args:
        decay: ρ in [0, 1) (default: the convention's).
        eps: ε ≥ 0 (default: the convention's).
        convention: ``"torch"`` or ``"tf1"``.
    """

    DEFAULTS = {"torch": (0.99, 1e-8), "tf1": (0.9, 1e-10)}  # convention → (decay, eps)
    memory_flags = True
    reads_pieces = True
    schedulable = ("decay",)
    nonnegative = ("v",)
    decay: Setting[float] = Setting.schedulable()
    eps = Setting.number(low=0.0)
    convention = Setting.choice(*sorted(DEFAULTS))

    def __init__(self, decay: float | None = None, eps: float | None = None, convention: str = "torch") -> None:
        if not isinstance(convention, str) or convention not in self.DEFAULTS:  # before its defaults are read
            raise ValueError(f"convention must be one of {sorted(self.DEFAULTS)}, got {convention!r}")
        default_decay, default_eps = self.DEFAULTS[convention]
        self.decay = default_decay if decay is None else decay
        self.eps = default_eps if eps is None else eps
        self.convention = convention

    def check(self, name: str, value: Any, path: str | None = None) -> Any:
        return check_number(path or name, value, low=0.0, high=1.0, high_open=True)

    def init(self, like: Vec) -> RMSPropState:
        start = 0.0 if self.convention == "torch" else 1.0  # both parts of a complex element
        v = Vec(torch.full_like(t, complex(start, start) if t.is_complex() else start) for t in like)
        bounds.keep((v,), "v >= 0", True)
        return {"v": v}

    def apply(
        self,
        d: Vec,
        state: RMSPropState,
        empty: Empty | None = None,
        scratch: bool = False,
        own_state: bool = False,
    ) -> tuple[Vec, RMSPropState]:
        known = bounds.kept((state["v"],), "v >= 0")  # read before v is written (own_state)
        empty = empty or _empty_like(d)
        v = state["v"] if own_state else empty()
        for x, v0, v1 in by_piece(d, state["v"], v):
            x, v0, v1 = _real(x, v0, v1)
            torch.mul(v0, self.decay, out=v1).addcmul_(x, x, value=1 - self.decay)
        out = _out(d, scratch, empty)
        if isinstance(d, Pieces):  # the denominators in out, then ξ divided by them, piece by piece
            for v1, o in zip(v, out):
                self._denominator(v1, o)
            for x, den in by_piece(d, out):
                x, den = _real(x, den)
                torch.div(x, den, out=den)
        else:
            for x, v1, o in zip(d, v, out):
                # the denominator: a temporary where the direction goes into d (which it divides)
                den = self._denominator(v1, torch.empty_like(o) if o is x else o)
                x, den, o = _real(x, den, o)
                torch.div(x, den, out=o)
        if known:  # v₀ >= 0, so v₁ >= 0
            bounds.keep((v,), "v >= 0", True)
        return out, {"v": v}

    def _denominator(self, v1: Tensor, den: Tensor) -> Tensor:
        """√v₁ + ε (``"torch"``) or √(v₁ + ε) (``"tf1"``), into ``den``, returned."""
        v, d = _real(v1, den)
        if self.convention == "torch":
            torch.sqrt(v, out=d).add_(self.eps)
        else:
            torch.add(v, self.eps, out=d).sqrt_()
        return den

    def direction_bounds(self, new_state: RMSPropState, out: Vec) -> list[float | None] | None:
        """``1 / √(1 − ρ)`` with room for rounding where ``v₀ >= 0`` (a finite ``v₁`` then
        bounds ``d``: :func:`~gameopt.direction_bounds.rmsprop_bound`); ``None`` in
        float16 and bfloat16, and where ε is too small to take values below the
        smallest normal. Where ``v₀ >= 0`` is not known (a state from elsewhere), ``None``
        this step, and ``v₁ >= 0`` is read for the next."""
        if not bounds.worth(out):
            return None
        v = new_state["v"]
        if not bounds.kept((v,), "v >= 0"):
            if bounds.nonnegative(v):
                bounds.keep((v,), "v >= 0", True)
            return None
        inside = self.convention != "torch"
        return [bounds.rmsprop_bound(o, self.decay, self.eps, inside) for o in out]


def zero_eps_advice(rule: UpdateRule, dtype: torch.dtype) -> str:
    """Why steps of ``rule`` on parameters of ``dtype`` may be refused, where a setting of
    the rule is lost in that dtype: Adam's and RMSProp's ε rounds to 0 in float16 (the
    default 1e-8; the smallest float16 is 6e-8), so their direction divides by 0 wherever
    the second moment underflows to 0 (at Adam's first step, wherever ``|ξ| < 5e-3``);
    ``""`` otherwise. ``torch.optim``'s Adam writes ±inf there."""
    eps = rule.eps if isinstance(rule, (Adam, RMSProp)) else 0.0
    if not eps or torch.tensor(eps, dtype=dtype).item() != 0:
        return ""
    name = str(dtype).removeprefix("torch.")
    return (
        f"{type(rule).__name__}'s eps={eps:g} is 0 in {name}, so its direction divides by 0 wherever the second "
        "moment underflows to 0, at small gradients: take eps >= 1e-4, or keep the parameters in float32"
    )


class PerPlayer(UpdateRule[PerPlayerState]):
    """One update rule per player: ``update=[gameopt.Adam(), gameopt.Plain()]`` gives
    the first player Adam and the second plain gradient steps (a primal Adam with a
    dual SGD on a :class:`~gameopt.LagrangianGame`). Algorithms build it from a list;
    a list of rules that are all the same is that one rule.

    Each rule runs on its player's part of the joint vectors and keeps its state as
    joint vectors (of which it reads and writes its player's part), so that the state
    follows each parameter across re-fusing as every state does. A rule's schedulable
    settings live in its own player's param group (``param_groups[k]["betas"]``).

    Args:
        rules: one :class:`UpdateRule` per player, in the game's player order.

    Raises:
        TypeError: an entry that is not an :class:`UpdateRule` (or is itself a ``PerPlayer``).
    """

    memory_flags = True

    def __init__(self, rules: Sequence[UpdateRule]) -> None:
        rules = list(rules)
        if not rules:
            raise TypeError("update must be an UpdateRule or a non-empty list of them, one per player")
        for k, r in enumerate(rules):
            if not isinstance(r, UpdateRule) or isinstance(r, PerPlayer):
                raise TypeError(f"update[{k}] must be an UpdateRule (Plain, Momentum, Adam, RMSProp), got {r!r}")
        self.rules = rules
        self._views: Callable[[Sequence[Tensor], int], Vec] | None = None

    def bind(self, views: Callable[[Sequence[Tensor], int], Vec], num_players: int) -> None:
        """Take ``views(vec, i)``, player i's part of a joint vector (the layout's)."""
        if num_players != len(self.rules):
            raise ValueError(f"update has {len(self.rules)} rules for {num_players} players: give one per player")
        self._views = views

    def for_player(self, i: int) -> UpdateRule:
        return self.rules[i]

    def identity(self) -> dict[str, Any]:
        return {"type": "PerPlayer", "rules": [r.identity() for r in self.rules]}

    def check_state(self, state: Any, path: str) -> None:
        players = state.get("players") if isinstance(state, dict) else None
        for k, (rule, st) in enumerate(zip(self.rules, players or ())):
            rule.check_state(st, f"{path}.players[{k}]")

    def carry(self, old: PerPlayerState, fresh: PerPlayerState, carry: Carry) -> PerPlayerState:
        """Each player's rule carries its own state."""
        return {"players": [r.carry(o, f, carry) for r, o, f in zip(self.rules, old["players"], fresh["players"])]}

    def check_loaded(self, live: PerPlayerState, saved: Any, path: str) -> PerPlayerState:
        """Each player's rule checks its own state."""
        players = saved.get("players") if isinstance(saved, dict) else None
        if not isinstance(players, (list, tuple)) or len(players) != len(self.rules) or set(saved) != {"players"}:
            check_like(live, saved, path)  # raises, naming what differs
        players = zip(self.rules, live["players"], saved["players"])
        return {"players": [r.check_loaded(a, b, f"{path}.players[{k}]") for k, (r, a, b) in enumerate(players)]}

    def init(self, like: Vec) -> PerPlayerState:
        return {"players": [r.init(like) for r in self.rules]}

    def apply(
        self,
        d: Vec,
        state: PerPlayerState,
        empty: Empty | None = None,
        scratch: bool = False,
        own_state: bool = False,
    ) -> tuple[Vec, PerPlayerState]:
        if self._views is None:
            raise RuntimeError("a PerPlayer rule is used by an algorithm bound to a game")
        player_views = self._views
        out = d if scratch else (empty or _empty_like(d))()
        new = []
        for i, (rule, st) in enumerate(zip(self.rules, state["players"])):
            views: Views = functools.partial(_nth, player_views, i)
            o, st_i = apply(rule, views(d), rule.part(st, i, views))
            for dst, src in zip(views(out), o):
                if dst is not src:
                    dst.copy_(src)
            new.append(rule.with_part(st, i, st_i, views))
        return out, {"players": new}

    def part(self, state: PerPlayerState, i: int, views: Views) -> State:
        """Player ``i``'s part of its own rule's state (its rule's :meth:`~gameopt.UpdateRule.part`)."""
        return self.rules[i].part(state["players"][i], i, views)

    def with_part(
        self, state: PerPlayerState, i: int, part: State, views: Views, own_state: bool = False
    ) -> PerPlayerState:
        """``state`` with player ``i``'s rule's state holding ``part`` in player i's
        part: that one state a copy (it may still be the committed one's), the others
        shared; with ``own_state``, ``state`` itself, updated in place."""
        players = state["players"] if own_state else list(state["players"])
        players[i] = self.rules[i].with_part(players[i], i, part, views)
        return state if own_state else {"players": players}

    def __repr__(self) -> str:
        return f"PerPlayer({self.rules!r})"


def rule_from(update: UpdateRule | Sequence[UpdateRule] | None) -> UpdateRule:
    """The rule an algorithm's ``update=`` names: one rule (default :class:`Plain`),
    or one per player, collapsed to one when they are all the same (type, fixed and
    schedulable settings), else a :class:`PerPlayer`."""
    if update is None:
        return Plain()
    if isinstance(update, UpdateRule):
        return update
    if isinstance(update, (list, tuple)):
        rules = PerPlayer(update).rules
        first = rules[0]
        same = all(
            r.identity() == first.identity() and all(getattr(r, n) == getattr(first, n) for n in first.schedulable)
            for r in rules[1:]
        )
        return first if same else PerPlayer(rules)
    raise TypeError(f"update must be an UpdateRule (Plain, Momentum, Adam) or a list of them, got {update!r}")
