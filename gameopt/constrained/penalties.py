"""Penalty coefficients: one per constraint, grown after each step by a
:class:`MultiplicativePenalty`, and carried in checkpoints."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..checks import check_bool, check_number
from ..state import check_like, clone_state
from .observations import Observed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MultiplicativePenalty:
    """Grow each penalty coefficient by ``growth``, up to a cap, after a step that
    violates its constraint by more than ``tolerance``.

    The violation is the strict one (``max(0, gᵢ)``, ``|hⱼ|``):

    .. math:: c_i ← \\begin{cases} \\min(\\text{growth} \\cdot c_i, \\; c_{\\max}) & v_i > \\text{tolerance} \\\\
        c_i^{(0)} & v_i = 0 \\text{ (an inequality, with restart)} \\\\
        c_i & \\text{otherwise} \\end{cases}

    (Nocedal & Wright 2006, Framework 17.1; cooper's
    ``MultiplicativePenaltyCoefficientUpdater`` with one coefficient per constraint).
    The violations are those at the start of the step; only the observed constraints'
    coefficients change (see :class:`Sampled`).

    The cap ``c_max`` is ``max_coefficient``, or the largest finite value of the
    coefficients' dtype (the model's) where that is smaller: a constraint the model
    cannot meet would otherwise grow its coefficient to infinity (float32: after
    about 930 steps at ``growth=1.1``), which no checkpoint can hold. A coefficient
    that reaches the cap stays there, and the game logs a warning naming the
    constraints once, when they reach it (a sign of an infeasible or badly scaled
    constraint). A coefficient above the cap (loaded from a checkpoint saved with a
    larger one) is kept as it is, never lowered.

    Args:
        growth: the factor, ≥ 1.
        tolerance: the violation below which a coefficient stays, ≥ 0.
        restart: whether a satisfied inequality's coefficient returns to its start.
        max_coefficient: the cap, finite and > 0 (default 1e8); the starting
            coefficient (``penalty``) may not exceed it.

    Raises:
        ValueError: a setting outside its range.
    """

    growth: float = 1.01
    tolerance: float = 1e-4
    restart: bool = True
    max_coefficient: float = 1e8

    def __post_init__(self) -> None:
        check_number("growth", self.growth, low=1.0)
        check_number("tolerance", self.tolerance, low=0.0)
        check_bool("restart", self.restart)
        check_number("max_coefficient", self.max_coefficient, low=0.0, low_open=True)

    def cap(self, dtype: torch.dtype) -> float:
        """The largest coefficient of ``dtype`` that growth reaches: ``max_coefficient``
        (as ``dtype`` holds it), or the dtype's largest finite value where that is smaller."""
        return float(torch.tensor(min(self.max_coefficient, torch.finfo(dtype).max), dtype=dtype))

    def updated(self, c: Tensor, start: float, strict: Tensor, *, inequality: bool) -> Tensor:
        """The coefficients ``c`` after a step that observed the strict values ``strict``
        (``start``: their values at the start of the run)."""
        violation = strict.clamp_min(0) if inequality else strict.abs()
        grown = torch.maximum((c * self.growth).clamp_max(self.cap(c.dtype)), c)  # an inf product: the cap
        new = torch.where(violation > self.tolerance, grown, c)
        if self.restart and inequality:
            new = torch.where(violation == 0, start, new)
        return new


def check_update(update: Any, start: float, *, penalized: bool, modeled: bool) -> None:
    """Refuse a ``penalty_update`` that does not fit the game: of the wrong type, for a
    formulation without a penalty (not ``penalized``), with a multiplier model
    (``modeled``), or with a cap below the starting coefficient ``start``."""
    if update is None:
        return
    if not isinstance(update, MultiplicativePenalty):
        raise TypeError(f"penalty_update must be a gameopt.MultiplicativePenalty, got {update!r}")
    if not penalized:
        raise ValueError("penalty_update needs a penalty: formulation='augmented_lagrangian' or 'quadratic_penalty'")
    if modeled:
        raise ValueError("penalty_update keeps a coefficient per constraint index; a multiplier model has none")
    if start > update.max_coefficient:
        raise ValueError(
            f"penalty={start:g} exceeds the cap of its growth, penalty_update.max_coefficient="
            f"{update.max_coefficient:g}: start at or below the cap, or raise it"
        )


class Penalties:
    """The penalty coefficients of each kind of constraint (``ineq``, ``eq``), one per
    constraint, all ``start`` at first; an ``update`` grows them after each step,
    without one they stay ``start``."""

    def __init__(
        self,
        start: float,
        update: MultiplicativePenalty | None,
        counts: Mapping[str, int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.start = start
        self.update = update
        self.coefficients = {kind: torch.full((n,), start, dtype=dtype, device=device) for kind, n in counts.items()}

    def of(self, kind: str, observed: Observed) -> Tensor | float:
        """The observed constraints' coefficients (one number without an update)."""
        if self.update is None:
            return self.start
        c = self.coefficients[kind]
        return c if observed.features is None else c[observed.features]

    def grow(self, seen: tuple[Observed, Observed]) -> None:
        """After a step that observed the constraints ``seen`` (inequalities,
        equalities) at its start: grow their coefficients by their strict violations."""
        if self.update is None:
            return
        for kind, observed in zip(("ineq", "eq"), seen):
            self._grow(kind, observed, self.update)

    def _grow(self, kind: str, observed: Observed, update: MultiplicativePenalty) -> None:
        c = self.coefficients[kind]
        if not c.numel():
            return
        index = slice(None) if observed.features is None else observed.features
        old = c[index]
        new = update.updated(old, self.start, observed.dual, inequality=kind == "ineq")
        cap = update.cap(c.dtype)
        reached = (new >= cap) & (old < cap)  # before the write: ``old`` may be a view of ``c``
        c[index] = new
        if bool(reached.any()):
            _warn_capped(kind, torch.arange(c.numel(), device=c.device)[index][reached].tolist(), cap)

    def copies(self) -> tuple[Tensor, Tensor]:
        """The coefficients (inequalities', equalities') as copies."""
        return self.coefficients["ineq"].clone(), self.coefficients["eq"].clone()

    def state_dict(self) -> dict[str, Tensor]:
        return clone_state(self.coefficients)

    def checked(self, saved: Any) -> dict[str, Tensor]:
        """``saved`` if it fits these coefficients (``{'ineq': ..., 'eq': ...}``, each
        like its own and >= 0), else ``ValueError``."""
        if not isinstance(saved, dict):
            raise ValueError("the state_dict lacks the penalty coefficients ('penalties': {'ineq': ..., 'eq': ...})")
        check_like(self.coefficients, saved, "penalties")  # keys, shapes, dtypes, values there and finite
        for kind, c in saved.items():
            if bool((c < 0).any()):
                raise ValueError(f"penalties.{kind}: coefficients must be >= 0")
        return saved

    def load(self, checked: Mapping[str, Tensor]) -> None:
        """Copy in coefficients that :meth:`checked` passed."""
        for kind, c in checked.items():
            self.coefficients[kind].copy_(c)


def _warn_capped(kind: str, which: list[int], cap: float) -> None:
    log.warning(
        "LagrangianGame: the penalty coefficients of the %s constraints %s reached the cap %g "
        "(MultiplicativePenalty.max_coefficient, or the dtype's largest value) and stay there: "
        "these constraints may be infeasible or badly scaled",
        "inequality" if kind == "ineq" else "equality",
        which,
        cap,
    )
