"""Feasible sets for parameters: projections and mirror maps.

A constraint acts on one parameter tensor. Its :meth:`~Constraint.step` forms the
new point from the current one and a step ``delta`` (``delta = -η u`` for the
update rule's direction ``u``): the Euclidean projection ``P(w + delta)`` for the
sets below, or the mirror step of a mirror map (the entropic simplex:
``x⁺ ∝ x · exp(delta)``, multiplicative weights). Every first-order algorithm of a
game forms its new points (and extrapolation points) through it, so each becomes
its projected or mirror version.

A set of your own is a subclass of :class:`Constraint` (override ``project``,
and what else differs), or any object that follows :class:`FeasibleSet`, the one
documented contract (``project``; optionally ``step``, ``delta_to``, ``check``,
``contains``, ``convex``). A player takes such an object through
:func:`as_constraint`, which fills in the defaults once, so the game calls one
interface, :class:`Constraint`, and probes nothing. Both are re-exported by
:mod:`gameopt.algorithms.api`.

Every point a game forms through a set (a step, an extrapolation or look-ahead
point) is checked finite before it is used or committed: a set that returns NaN
or ±inf makes the step a non-finite one (``NonFiniteError``, or skipped with
``on_nonfinite="skip"``), with nothing changed.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from .checks import check_number


@runtime_checkable
class FeasibleSet(Protocol):
    """The contract of a feasible set for one parameter tensor: what a player takes
    as ``constraint=`` and the game calls.

    Required:

    * ``project(w)``: the Euclidean projection of ``w`` onto the set, a new tensor
      (``w`` is the game's, read only).

    Optional (declared by having them; :func:`as_constraint` fills in the default of
    each one missing, once, when the player is built):

    * ``step(w, delta)``: the new point from the feasible ``w`` along the step
      ``delta`` (a new tensor): a mirror step; default ``project(w + delta)``;
    * ``delta_to(w, target)``: the step from ``w`` whose ``step`` lands on the
      feasible ``target``; default ``target − w``;
    * ``check(shape, name)``: raise ``ValueError`` if the set does not fit a
      parameter of that shape (called once per parameter); default: fits all;
    * ``contains(w, tol)``: whether ``w`` is in the set; default: ``project(w)``
      within ``tol`` of ``w``;
    * ``convex`` (a bool): an average of feasible points is feasible; default True
      (where False, averaging wrappers project their averages).

    :class:`Constraint` implements it with every default; a subclass overrides
    ``project`` and what else differs.
    """

    def project(self, w: Tensor) -> Tensor: ...


class Constraint:
    """Base class of the feasible sets: :class:`FeasibleSet` with every optional
    member, the defaults for those a subclass leaves out. The game calls only these
    methods (a set given as a plain :class:`FeasibleSet` is wrapped once by
    :func:`as_constraint`)."""

    convex = True

    def project(self, w: Tensor) -> Tensor:
        """The Euclidean projection of ``w`` onto the set (a new tensor)."""
        raise NotImplementedError

    def step(self, w: Tensor, delta: Tensor) -> Tensor:
        """The new point from ``w`` (feasible) along ``delta``: ``P(w + delta)``."""
        return self.project(w + delta)

    def delta_to(self, w: Tensor, target: Tensor) -> Tensor:
        """The step from ``w`` whose :meth:`step` lands on ``target`` (feasible): ``target − w``."""
        return target - w

    def check(self, shape: torch.Size, name: str) -> None:
        """Raise ``ValueError`` if the set does not fit a parameter of ``shape``."""

    def contains(self, w: Tensor, tol: float = 0.0) -> bool:
        """Whether ``w`` is in the set (up to ``tol``)."""
        return bool((self.project(w) - w).abs().max() <= tol) if w.numel() else True

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class _Given(Constraint):
    """A set that is not a :class:`Constraint` (only :class:`FeasibleSet`): its own
    methods where it has them, :class:`Constraint`'s defaults for the rest."""

    def __init__(self, given: Any) -> None:
        self.given = given
        self.convex = bool(getattr(given, "convex", True))
        for name in ("step", "delta_to", "check", "contains"):
            method = getattr(given, name, None)
            if callable(method):
                setattr(self, name, method)

    def project(self, w: Tensor) -> Tensor:
        return self.given.project(w)

    def __repr__(self) -> str:
        return repr(self.given)


def as_constraint(c: Any, what: str = "constraint") -> Constraint:
    """``c`` as a :class:`Constraint`: itself if it is one; an object with
    ``project(w)`` (:class:`FeasibleSet`) with the defaults filled in for what it
    lacks (``step(w, delta) = project(w + delta)``, ``delta_to``, ``check``,
    ``convex = True``); ``TypeError`` for anything else."""
    if isinstance(c, Constraint):
        return c
    if not isinstance(c, FeasibleSet) or not callable(getattr(c, "project", None)):
        raise TypeError(
            f"{what} must be a feasible set with a project(w) method (see gameopt.constraints), got {type(c).__name__}"
        )
    return _Given(c)


class _Checked(Constraint):
    """A set of the user's as the game calls it: each point or step it returns is
    checked to be a tensor of the parameter's shape, dtype and device (a comparison,
    no pass over memory), so that a wrong one is refused rather than broadcast or cast."""

    def __init__(self, given: Constraint, what: str) -> None:
        self.given, self.what = given, what
        self.convex = given.convex

    def project(self, w: Tensor) -> Tensor:
        return self._like(w, self.given.project(w), "project")

    def step(self, w: Tensor, delta: Tensor) -> Tensor:
        return self._like(w, self.given.step(w, delta), "step")

    def delta_to(self, w: Tensor, target: Tensor) -> Tensor:
        return self._like(w, self.given.delta_to(w, target), "delta_to")

    def check(self, shape: torch.Size, name: str) -> None:
        self.given.check(shape, name)

    def contains(self, w: Tensor, tol: float = 0.0) -> bool:
        return self.given.contains(w, tol)

    def _like(self, w: Tensor, out: Any, method: str) -> Tensor:
        if isinstance(out, Tensor) and out.shape == w.shape and out.dtype == w.dtype and out.device == w.device:
            return out
        got = f"a {tuple(out.shape)} {out.dtype} tensor on {out.device}" if isinstance(out, Tensor) else repr(out)
        raise ValueError(
            f"the feasible set {self.given!r} of {self.what}: its {method} returned {got} for a "
            f"{tuple(w.shape)} {w.dtype} parameter on {w.device}. It must return a new tensor of the "
            "parameter's shape, dtype and device"
        )

    def __repr__(self) -> str:
        return repr(self.given)


def checked(c: Constraint, what: str) -> Constraint:
    """``c`` as the game calls it: a set of the user's with its results checked (see
    ``_Checked``); gameopt's own sets as they are. ``what`` names the parameter
    in messages."""
    return c if type(c) in _OWN else _Checked(c, what)


class NonNegative(Constraint):
    """w ≥ 0 elementwise (Lagrange multipliers of inequality constraints)."""

    def project(self, w: Tensor) -> Tensor:
        return w.clamp_min(0)


class Box(Constraint):
    """low ≤ w ≤ high elementwise (a WGAN critic's clipped weights)."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = check_number("low", low), check_number("high", high)
        if self.low > self.high:
            raise ValueError(f"Box needs low <= high, got low={low!r} > high={high!r}")

    def project(self, w: Tensor) -> Tensor:
        return w.clamp(self.low, self.high)


class Ball(Constraint):
    """‖w‖₂ ≤ radius, for the whole parameter tensor (an adversarial perturbation)."""

    def __init__(self, radius: float) -> None:
        self.radius = check_number("radius", radius, low=0.0)

    def project(self, w: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(w)
        return w * torch.clamp(self.radius / norm, max=1.0) if norm > 0 else w.clone()


class Simplex(Constraint):
    """Each slice along the last dimension on the probability simplex
    {x ≥ 0, Σ x = 1} (mixed strategies).

    Args:
        mirror: ``"euclidean"``: projected steps (the sort-based projection of
            Duchi et al. 2008, "Efficient Projections onto the ℓ1-Ball");
            ``"entropic"``: the entropic mirror map, x⁺ ∝ x · exp(delta)
            (multiplicative weights; optimistic multiplicative weights with
            ``Optimistic``; mirror-prox with ``Extragradient``, Nemirovski 2004).
    """

    def __init__(self, mirror: str = "euclidean") -> None:
        if mirror not in ("euclidean", "entropic"):
            raise ValueError(f"mirror must be 'euclidean' or 'entropic', got {mirror!r}")
        self.mirror = mirror

    def check(self, shape: torch.Size, name: str) -> None:
        if len(shape) == 0 or shape[-1] == 0:
            raise ValueError(f"Simplex needs a parameter with a last dimension; {name!r} has shape {tuple(shape)}")

    def project(self, w: Tensor) -> Tensor:
        u, _ = torch.sort(w, dim=-1, descending=True)
        css = u.cumsum(-1) - 1
        k = torch.arange(1, w.shape[-1] + 1, dtype=w.dtype, device=w.device)
        # ≥ 1 for finite w; a non-finite w gives a non-finite result, refused by the game
        rho = (u - css / k > 0).sum(-1, keepdim=True).clamp_min(1)
        theta = css.gather(-1, rho - 1) / rho.to(w.dtype)
        return (w - theta).clamp_min(0)

    def step(self, w: Tensor, delta: Tensor) -> Tensor:
        if self.mirror == "euclidean":
            return self.project(w + delta)
        # x·exp(delta) / Σ x·exp(delta), computed as a softmax of log x + delta
        return torch.softmax(torch.log(w) + delta, dim=-1)

    def delta_to(self, w: Tensor, target: Tensor) -> Tensor:
        """The step from ``w`` that lands on ``target``: ``target − w``, or for the
        entropic map ``log target − log w`` (0 where ``w`` is 0: such a weight stays 0)."""
        if self.mirror == "euclidean":
            return super().delta_to(w, target)
        return torch.where(w > 0, torch.log(target) - torch.log(w), torch.zeros_like(w))


#: gameopt's own sets, whose results need no check
_OWN = (NonNegative, Box, Ball, Simplex)
