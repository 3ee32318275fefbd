"""Formulations: how a :class:`~gameopt.LagrangianGame`'s losses compose the objective
``f``, the observed constraints, the multipliers and the penalty coefficients. One
small class each; :func:`formulation` turns the user's string into one of them, the
only place that reads it."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from .multipliers import Multipliers
from .observations import Observed


class Formulation:
    """A formulation with multipliers: the model minimizes :meth:`primal`, the
    multiplier player ascends on ``λᵀg + μᵀh`` (its loss is ``−(λᵀg + μᵀh)``, on the
    strict values of the constraints), as in the method of multipliers."""

    #: the string ``LagrangianGame(formulation=...)`` names it by
    name: ClassVar[str]
    #: whether the game has a multiplier player
    has_multipliers: ClassVar[bool] = True
    #: whether it has penalty coefficients (which a ``penalty_update`` may grow)
    penalized: ClassVar[bool] = True

    def check_penalty(self, penalty: float) -> None:
        """Refuse a penalty coefficient that does not fit (here: 0)."""
        if penalty == 0:
            raise ValueError(f"formulation={self.name!r} needs a penalty coefficient c > 0 (penalty=c)")

    def check_models(self, models: dict[str, Any]) -> None:
        """Refuse multiplier models where there are no multipliers."""
        if models and not self.has_multipliers:
            raise ValueError(f"formulation={self.name!r} has no multipliers; drop multipliers=")

    def losses(
        self,
        f: Tensor,
        g: Observed,
        h: Observed,
        multipliers: Multipliers | None,
        cg: Tensor | float,
        ch: Tensor | float,
    ) -> tuple[Tensor, ...]:
        """The players' losses: the model's, then the multipliers'. ``cg``, ``ch``: the
        observed constraints' penalty coefficients."""
        assert multipliers is not None
        lam = multipliers.observed("ineq", g)
        mu = multipliers.observed("eq", h)
        primal = self.primal(f, g.primal, h.primal, lam, mu, cg, ch)
        dual = -((lam * g.dual).sum() + (mu * h.dual).sum())
        return primal, dual

    def primal(
        self, f: Tensor, g: Tensor, h: Tensor, lam: Tensor, mu: Tensor, cg: Tensor | float, ch: Tensor | float
    ) -> Tensor:
        """The model's loss at the observed constraints ``g``, ``h`` and multipliers ``λ``, ``μ``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Lagrangian(Formulation):
    """The Lagrangian, without penalty:

    .. math:: L(w, λ, μ) = f(w) + λ^⊤ g(w) + μ^⊤ h(w), \\qquad λ ≥ 0.

    A saddle point with λ ≥ 0 is a KKT point of the problem (Bertsekas 1982,
    "Constrained Optimization and Lagrange Multiplier Methods")."""

    name = "lagrangian"
    penalized = False

    def check_penalty(self, penalty: float) -> None:
        if penalty > 0:
            raise ValueError("formulation='lagrangian' takes no penalty (penalty > 0 is the augmented Lagrangian)")

    def primal(
        self, f: Tensor, g: Tensor, h: Tensor, lam: Tensor, mu: Tensor, cg: Tensor | float, ch: Tensor | float
    ) -> Tensor:
        return f + (lam * g).sum() + (mu * h).sum()


class AugmentedLagrangian(Formulation):
    """The augmented Lagrangian of Hestenes, Powell and Rockafellar (Bertsekas 1982,
    ch. 2 for equalities, ch. 3 for inequalities: turned into equalities with squared
    slack variables, which are then minimized out in closed form; Rockafellar 1973),
    with one coefficient ``c`` for all constraints or one per constraint:

    .. math::
        L_c(w, λ, μ) = f(w) + \\frac{1}{2c} \\sum_i \\big(\\max(0, λ_i + c\\,g_i(w))^2 - λ_i^2\\big)
            + μ^⊤ h(w) + \\frac{c}{2} \\lVert h(w) \\rVert^2.

    With the primal minimization exact and a dual step ``η = c`` it is Bertsekas's
    ``λ ← max(0, λ + c g)``. For c → 0 the penalty term tends to ``λᵀg``. cooper's
    ``AugmentedLagrangian`` (Gallego-Posada et al. 2025, "Cooper: A Library for
    Constrained Optimization in Deep Learning"). The fixed points are still the KKT
    points: ``[λ + ηg]₊ = λ`` is complementary slackness, and there
    ``max(0, λ + cg) = λ``, so ∇_w L_c = ∇_w L."""

    name = "augmented_lagrangian"

    def primal(
        self, f: Tensor, g: Tensor, h: Tensor, lam: Tensor, mu: Tensor, cg: Tensor | float, ch: Tensor | float
    ) -> Tensor:
        return (
            f
            + (((lam + cg * g).clamp_min(0).square() - lam.square()) / (2 * cg)).sum()
            + (mu * h).sum()
            + (ch * h.square()).sum() / 2
        )


class QuadraticPenalty(Formulation):
    """The quadratic penalty method (Nocedal & Wright 2006, §17.1; cooper's
    ``QuadraticPenalty``): no multipliers, the model alone minimizes

    .. math::
        P_c(w) = f(w) + \\frac{1}{2} \\sum_i c_i \\max(0, g_i(w))^2 + \\frac{1}{2} \\sum_j c_j h_j(w)^2.

    Its minimizers reach the feasible set only as c → ∞ (a ``MultiplicativePenalty``
    grows the coefficients)."""

    name = "quadratic_penalty"
    has_multipliers = False

    def losses(
        self,
        f: Tensor,
        g: Observed,
        h: Observed,
        multipliers: Multipliers | None,
        cg: Tensor | float,
        ch: Tensor | float,
    ) -> tuple[Tensor, ...]:
        return (f + (cg * g.primal.clamp_min(0).square()).sum() / 2 + (ch * h.primal.square()).sum() / 2,)


#: the formulations by name, in the order the error message lists them
FORMULATIONS: dict[str, type[Formulation]] = {
    cls.name: cls for cls in (Lagrangian, AugmentedLagrangian, QuadraticPenalty)
}


def formulation(name: Any, penalty: float) -> Formulation:
    """The formulation that ``LagrangianGame(formulation=name, penalty=penalty)``
    names (None: the Lagrangian, augmented when ``penalty > 0``), checked against the
    penalty."""
    if name is None:
        name = "augmented_lagrangian" if penalty > 0 else "lagrangian"
    if not isinstance(name, str) or name not in FORMULATIONS:
        raise ValueError(f"formulation must be one of {tuple(FORMULATIONS)}, got {name!r}")
    chosen = FORMULATIONS[name]()
    chosen.check_penalty(penalty)
    return chosen
