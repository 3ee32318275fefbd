"""Lagrangian constrained learning: a constrained problem as a two-player game.

The problem

.. math::
    \\min_w f(w) \\quad \\text{subject to} \\quad g(w) \\le 0, \\; h(w) = 0
    \\qquad (g: ℝ^d → ℝ^m, \\; h: ℝ^d → ℝ^p)

becomes the min-max game of its Lagrangian

.. math::
    L(w, λ, μ) = f(w) + λ^⊤ g(w) + μ^⊤ h(w), \\qquad λ ≥ 0,

between the primal player (the model, ``w``), which minimizes ``L``, and the
multiplier player (``λ`` on the non-negative orthant, :class:`~gameopt.constraints.NonNegative`;
``μ`` free), which maximizes it (its loss is ``−(λᵀg + μᵀh)``). Its
vector field is ξ = (∇_w L, −g(w), −h(w)), so every first-order algorithm of
:class:`~gameopt.Game` applies: SimGD is projected gradient descent-ascent,
``λ ← [λ + η g(w)]₊``; Extragradient and Optimistic are their projected
versions (the extrapolated multipliers are projected too). A saddle point with
λ ≥ 0 is a KKT point of the problem, and the game's fixed points are its KKT
points (Bertsekas 1982, "Constrained Optimization and Lagrange Multiplier
Methods").

With ``penalty = c > 0`` the primal player minimizes the augmented Lagrangian of
Hestenes, Powell and Rockafellar (Bertsekas 1982, ch. 2 for equalities, ch. 3 for
inequalities: turned into equalities with squared slack variables, which are then
minimized out in closed form; Rockafellar 1973):

.. math::
    L_c(w, λ, μ) = f(w) + \\frac{1}{2c} \\sum_i \\big(\\max(0, λ_i + c\\,g_i(w))^2 - λ_i^2\\big)
        + μ^⊤ h(w) + \\frac{c}{2} \\lVert h(w) \\rVert^2,

while the multiplier player keeps ascending on ``λᵀg(w) + μᵀh(w)`` (its
gradient is the constraint values, as in the method of multipliers: with the
primal minimization exact and a dual step ``η = c`` it is Bertsekas's
``λ ← max(0, λ + c g)``). For c → 0 the penalty term tends to ``λᵀg``: ``c = 0``
is the plain Lagrangian. This is cooper's ``AugmentedLagrangian`` formulation
(Gallego-Posada et al. 2025, "Cooper: A Library for Constrained Optimization in
Deep Learning"), whose dual Lagrangian is also ``λᵀg + μᵀh``. The game's fixed
points are still the KKT points: ``[λ + ηg]₊ = λ`` is complementary slackness,
and there ``max(0, λ + cg) = λ``, so ∇_w L_c = ∇_w L.

With ``formulation="quadratic_penalty"`` there are no multipliers: the model alone
minimizes

.. math::
    P_c(w) = f(w) + \\frac{1}{2} \\sum_i c_i \\max(0, g_i(w))^2 + \\frac{1}{2} \\sum_j c_j h_j(w)^2,

the quadratic penalty method (Nocedal & Wright 2006, §17.1), cooper's
``QuadraticPenalty``. Its minimizers reach the feasible set only as c → ∞; with
:class:`MultiplicativePenalty` each coefficient grows after every step whose strict
violation of its constraint exceeds a tolerance (Nocedal & Wright, Framework 17.1;
cooper's ``MultiplicativePenaltyCoefficientUpdater``). The same updater serves the
augmented Lagrangian, one coefficient per constraint.

Multipliers may also be a model: ``multipliers=module`` maps the features of the
observed constraints (``Sampled(values, features)``) to their multipliers, for more
constraints than one can hold a multiplier each (cooper's ``ImplicitMultiplier``,
Narasimhan et al. 2020, "Approximate Heavily-Constrained Learning with Lagrange
Multiplier Models"). The model is the multiplier player: its parameters ascend
through its outputs, and for inequalities its outputs must be non-negative (end it
with a softplus or a ReLU).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .algorithms.base import Algorithm
from .checks import check_bool, check_number
from .constraints import NonNegative
from .evaluation import StepLosses
from .game import Game
from .player import Player
from .state import check_like, clone_state

ObjectiveAndConstraints = Callable[..., Sequence[Any]]
FORMULATIONS = ("lagrangian", "augmented_lagrangian", "quadratic_penalty")
KINDS = {"ineq": ("g", "num_ineq"), "eq": ("h", "num_eq")}

log = logging.getLogger(__name__)


class Proxy(NamedTuple):
    """A constraint observed through a differentiable surrogate, in place of ``g`` or
    ``h`` (Cotter, Jiang, Gupta, Wang, Narayan, You & Sridharan 2019, `Optimization
    with Non-Differentiable Constraints with Applications to Fairness, Recall, Churn,
    and Other Goals <https://jmlr.org/papers/v20/18-616.html>`_): the model's
    Lagrangian uses ``surrogate``, the multipliers ascend on ``strict``, which need not
    be differentiable (an accuracy, a rate of hard predictions). cooper's
    ``ConstraintState(violation=surrogate, strict_violation=strict)``.

    Args:
        surrogate: the differentiable constraint values, shape (num,) (or (k,) inside
            :class:`Sampled`).
        strict: the true values, the same shape (detached).
    """

    surrogate: Tensor
    strict: Tensor


class Sampled(NamedTuple):
    """Some of the constraints, observed at this step, in place of ``g`` or ``h``: only
    the multipliers of the observed constraints move, and only those constraints
    enter the model's Lagrangian. For very many constraints, observed a minibatch at
    a time.

    With dense multipliers (the default) ``features`` are the observed constraints'
    indices (cooper's ``IndexedMultiplier``, ``ConstraintState(violation=values,
    constraint_features=indices)``); with a multiplier model
    (``LagrangianGame(multipliers=module)``) they are what the model maps to the
    multipliers (cooper's ``ImplicitMultiplier``).

    Args:
        values: the observed constraints' values, shape (k,), or a :class:`Proxy` of two.
        features: their indices, a long tensor of shape (k,), each in ``0..num-1``; or,
            for a multiplier model, its input, a tensor of shape (k, ...).
    """

    values: Tensor | Proxy
    features: Tensor

    @property
    def indices(self) -> Tensor:
        """``features``, as dense multipliers read them."""
        return self.features


@dataclass(frozen=True)
class MultiplicativePenalty:
    """Grow each penalty coefficient by ``growth`` after a step whose strict violation
    of its constraint exceeds ``tolerance`` (``max(0, gᵢ)``, ``|hⱼ|``), up to a cap:

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


class _Observed(NamedTuple):
    """One kind of constraint as a step observed it: what the model's Lagrangian uses,
    what the multipliers ascend on (detached), and which constraints (None: all) —
    their indices, or a multiplier model's features."""

    primal: Tensor
    dual: Tensor
    features: Tensor | None


class Multipliers(nn.Module):
    """The multiplier player's module: for each kind, ``ineq`` (λ, one per inequality)
    and ``eq`` (μ, one per equality), either a parameter (zeros at the start) or a
    model of the constraints' features. A kind with no constraint has neither."""

    def __init__(
        self, num_ineq: int, num_eq: int, dtype: torch.dtype, device: torch.device, models: Mapping[str, nn.Module]
    ) -> None:
        super().__init__()
        for kind, n in (("ineq", num_ineq), ("eq", num_eq)):
            if kind in models:
                self.add_module(kind, models[kind])
            elif n:
                self.register_parameter(kind, nn.Parameter(torch.zeros(n, dtype=dtype, device=device)))
        self._empty = torch.zeros(0, dtype=dtype, device=device)

    def is_model(self, kind: str) -> bool:
        return isinstance(getattr(self, kind, None), nn.Module)

    def observed(self, kind: str, observed: _Observed) -> Tensor:
        """The multipliers of the constraints a step observed (live: with the graph)."""
        held = getattr(self, kind, None)
        if held is None:
            return self._empty
        if not isinstance(held, nn.Module):
            return held if observed.features is None else held[observed.features]
        k = observed.dual.numel()
        out = held(observed.features)
        if not isinstance(out, Tensor) or out.numel() != k:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"the {kind} multiplier model must return one multiplier per constraint ({k}), got {got}")
        out = out.reshape(k)
        if kind == "ineq" and bool((out.detach() < 0).any()):
            raise ValueError(
                "the ineq multiplier model returned a negative multiplier; inequality multipliers are non-negative: "
                "end the model with a non-negative map (softplus, ReLU)"
            )
        return out

    def values(self) -> tuple[Tensor | None, Tensor | None]:
        """(λ, μ) as live parameters; an empty tensor for a kind with no constraint,
        None for a kind held by a model."""
        return tuple(None if self.is_model(k) else getattr(self, k, self._empty) for k in ("ineq", "eq"))  # type: ignore[return-value]


def _models(multipliers: Any, num_ineq: int, num_eq: int) -> dict[str, nn.Module]:
    """The multiplier models by kind, from ``LagrangianGame(multipliers=...)``."""
    if multipliers is None:
        return {}
    if isinstance(multipliers, nn.Module):
        if num_ineq and num_eq:
            raise ValueError(
                "multipliers: one model for both inequalities and equalities; pass {'ineq': model, 'eq': model} "
                "(or a model for one kind: the other keeps a multiplier per constraint)"
            )
        return {"ineq" if num_ineq else "eq": multipliers}
    if not isinstance(multipliers, Mapping):
        raise TypeError(f"multipliers must be an nn.Module or a dict of them by kind, got {type(multipliers).__name__}")
    for kind, model in multipliers.items():
        if kind not in KINDS:
            raise ValueError(f"multipliers: unknown kind {kind!r}; the kinds are 'ineq' and 'eq'")
        if not isinstance(model, nn.Module):
            raise TypeError(f"multipliers[{kind!r}] must be an nn.Module, got {type(model).__name__}")
        if not (num_ineq if kind == "ineq" else num_eq):
            raise ValueError(f"multipliers[{kind!r}]: a model for a kind with no constraint ({KINDS[kind][1]}=0)")
    return dict(multipliers)


def _formulation(formulation: str | None, penalty: float) -> str:
    if formulation is None:
        return "augmented_lagrangian" if penalty > 0 else "lagrangian"
    if formulation not in FORMULATIONS:
        raise ValueError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")
    if formulation == "lagrangian" and penalty > 0:
        raise ValueError("formulation='lagrangian' takes no penalty (penalty > 0 is the augmented Lagrangian)")
    if formulation != "lagrangian" and penalty == 0:
        raise ValueError(f"formulation={formulation!r} needs a penalty coefficient c > 0 (penalty=c)")
    return formulation


class LagrangianGame:
    """Minimize ``f(w)`` subject to ``g(w) ≤ 0`` and ``h(w) = 0``, as a game between the model and its
    Lagrange multipliers, or by a quadratic penalty (see the module docstring for the
    equations).

    Args:
        model: the primal player: an ``nn.Module`` or a :class:`Player` (which may
            carry a feasible set of its own).
        objective_and_constraints: ``(*args, **kwargs) -> (f, g, h)``: the scalar
            objective, the inequality values ``g`` of shape ``(num_ineq,)`` and the
            equality values ``h`` of shape ``(num_eq,)``. A group with no
            constraint may be ``None`` (or empty); a single constraint may be a
            0-d tensor; ``g`` or ``h`` may be a :class:`Proxy` or a :class:`Sampled`.
            Checked at every evaluation.
        num_ineq, num_eq: the numbers of constraints (not both 0).
        algorithm: a first-order gameopt algorithm (default ``SimGD(1e-3)``); its
            per-player learning rates are ``[model, multipliers]`` (only the model's
            with the quadratic penalty).
        penalty: ``c ≥ 0``, the penalty coefficient (0: the plain Lagrangian; > 0: the
            augmented Lagrangian, or the quadratic penalty's starting coefficient).
        formulation: ``"lagrangian"``, ``"augmented_lagrangian"`` or
            ``"quadratic_penalty"`` (default: the Lagrangian, augmented when
            ``penalty > 0``).
        penalty_update: a :class:`MultiplicativePenalty` that grows each constraint's
            coefficient after each step (the coefficients are then one per constraint,
            in :attr:`penalties` and in checkpoints).
        multipliers: a multiplier model (an ``nn.Module`` mapping the observed
            constraints' features, shape (k, ...), to their k multipliers) for the one
            kind of constraint the game has, or ``{"ineq": model, "eq": model}``. With a
            model, that kind must be returned as ``Sampled(values, features)``.

    ``step(*args, **kwargs)`` runs one step of the game and returns its losses at the
    start of the step (the primal loss and the multipliers' ``−(λᵀg + μᵀh)``)
    with the metrics ``objective`` (f) and ``violation`` (max(0, gᵢ) and ``|hⱼ|`` at
    their largest). ``game`` is the :class:`~gameopt.Game`, whose players are
    ``[model, multipliers]`` (``[model]`` with the quadratic penalty).

    Raises:
        ValueError: no constraints (``num_ineq`` and ``num_eq`` both 0), a negative
            or non-finite ``penalty``, a formulation that does not fit it, a
            ``penalty_update`` without a penalty, with a multiplier model or with a
            ``max_coefficient`` below ``penalty``, or ``multipliers`` that do not fit
            the constraints.
        TypeError: ``objective_and_constraints`` is not callable, or ``multipliers``
            or ``penalty_update`` of the wrong type.
    """

    def __init__(
        self,
        model: nn.Module | Player,
        objective_and_constraints: ObjectiveAndConstraints,
        *,
        num_ineq: int = 0,
        num_eq: int = 0,
        algorithm: Algorithm | None = None,
        penalty: float = 0.0,
        formulation: str | None = None,
        penalty_update: MultiplicativePenalty | None = None,
        multipliers: nn.Module | Mapping[str, nn.Module] | None = None,
    ) -> None:
        self.num_ineq = check_number("num_ineq", num_ineq, low=0, integer=True)
        self.num_eq = check_number("num_eq", num_eq, low=0, integer=True)
        if num_ineq == 0 and num_eq == 0:
            raise ValueError("a LagrangianGame needs constraints: num_ineq and num_eq are both 0")
        if not callable(objective_and_constraints):
            raise TypeError("objective_and_constraints must be a callable returning (f, g, h)")
        self.penalty = check_number("penalty", penalty, low=0.0)
        self.formulation = _formulation(formulation, self.penalty)
        models = _models(multipliers, num_ineq, num_eq)
        if self.formulation == "quadratic_penalty" and models:
            raise ValueError("formulation='quadratic_penalty' has no multipliers; drop multipliers=")
        if penalty_update is not None:
            if not isinstance(penalty_update, MultiplicativePenalty):
                raise TypeError(f"penalty_update must be a gameopt.MultiplicativePenalty, got {penalty_update!r}")
            if self.formulation == "lagrangian":
                raise ValueError(
                    "penalty_update needs a penalty: formulation='augmented_lagrangian' or 'quadratic_penalty'"
                )
            if models:
                raise ValueError("penalty_update keeps a coefficient per constraint index; a multiplier model has none")
            if self.penalty > penalty_update.max_coefficient:
                raise ValueError(
                    f"penalty={self.penalty:g} exceeds the cap of its growth, penalty_update.max_coefficient="
                    f"{penalty_update.max_coefficient:g}: start at or below the cap, or raise it"
                )
        self.penalty_update = penalty_update
        self.objective_and_constraints = objective_and_constraints
        primal = model if isinstance(model, Player) else Player(model)
        first = primal.parameters[0]
        self._penalties = {
            kind: torch.full((n,), self.penalty, dtype=first.dtype, device=first.device)
            for kind, n in (("ineq", num_ineq), ("eq", num_eq))
        }
        self._seen: tuple[_Observed, _Observed] | None = None  # the constraints at the start of a step
        if self.formulation == "quadratic_penalty":
            self.multiplier_module = None
            self.game = Game([primal], self._losses, algorithm=algorithm)
            return
        self.multiplier_module = Multipliers(num_ineq, num_eq, first.dtype, first.device, models)
        dense_ineq = num_ineq and "ineq" not in models
        dual = Player(
            self.multiplier_module, name="multipliers", constraint={"ineq": NonNegative()} if dense_ineq else None
        )
        self.game = Game([primal, dual], self._losses, algorithm=algorithm)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:
        """(f, g, h) at the current point as the model's Lagrangian sees them, checked:
        f 0-d, g of shape (num_ineq,), h of shape (num_eq,) (with the graph: detach for
        logging). A :class:`Proxy` gives its surrogate; a :class:`Sampled` its observed
        values only (shape (k,))."""
        f, g, h = self._observe(*args, **kwargs)
        return f, g.primal, h.primal

    def _observe(self, *args: Any, **kwargs: Any) -> tuple[Tensor, _Observed, _Observed]:
        """f and the observed constraints: what the model's Lagrangian and the
        multipliers' ascent each use, and which constraints were observed."""
        out = self.objective_and_constraints(*args, **kwargs)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            raise ValueError(f"objective_and_constraints must return (f, g, h), got {got}")
        f, g, h = out
        if not isinstance(f, Tensor) or f.numel() != 1:
            what = tuple(f.shape) if isinstance(f, Tensor) else type(f).__name__
            raise ValueError(f"objective_and_constraints: the objective f must be a scalar tensor, got {what}")
        return f.reshape(()), self._observed("ineq", g, f), self._observed("eq", h, f)

    def _observed(self, kind: str, value: Any, f: Tensor) -> _Observed:
        name, count = KINDS[kind]
        n = self.num_ineq if kind == "ineq" else self.num_eq
        model = self.multiplier_module is not None and self.multiplier_module.is_model(kind)
        if value is None and n == 0:
            empty = f.new_zeros(0)
            return _Observed(empty, empty, None)
        if model and not isinstance(value, Sampled):
            raise ValueError(
                f"objective_and_constraints: the {kind} multipliers are a model, so {name} must be a "
                f"gameopt.Sampled(values, features), got {type(value).__name__}"
            )
        if not isinstance(value, Sampled):
            primal, dual = _pair(value, n, name, f" ({count}={n})")
            return _Observed(primal, dual, None)
        features = value.features
        if model:
            k = features.shape[0] if isinstance(features, Tensor) and features.dim() > 0 else 0
            if k == 0:
                raise ValueError(
                    f"objective_and_constraints: {name}'s Sampled features must be a tensor of shape (k, ...), k >= 1, "
                    f"got {tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__}"
                )
        else:
            if (
                not isinstance(features, Tensor)
                or features.dtype != torch.long
                or features.dim() != 1
                or features.numel() == 0
            ):
                raise ValueError(
                    f"objective_and_constraints: {name}'s Sampled indices must be a non-empty long tensor of shape "
                    f"(k,), got {features.dtype if isinstance(features, Tensor) else type(features).__name__}"
                )
            if bool((features < 0).any()) or bool((features >= n).any()):
                raise ValueError(
                    f"objective_and_constraints: {name}'s Sampled indices must lie in 0..{n - 1} ({count}={n}), "
                    f"got {features.tolist()}"
                )
            k = features.numel()
        primal, dual = _pair(value.values, k, f"{name}'s Sampled values", "")
        return _Observed(primal, dual, features)

    def _coefficients(self, kind: str, observed: _Observed) -> Tensor | float:
        """The observed constraints' penalty coefficients (one number without an updater)."""
        if self.penalty_update is None:
            return self.penalty
        c = self._penalties[kind]
        return c if observed.features is None else c[observed.features]

    def _losses(self, *args: Any, **kwargs: Any) -> tuple[Tensor, ...]:
        f, g, h = self._observe(*args, **kwargs)
        if self._seen is None:
            self._seen = (g, h)
        metrics = {"objective": f.detach(), "violation": _violation(g.dual, h.dual)}
        cg, ch = self._coefficients("ineq", g), self._coefficients("eq", h)
        if self.multiplier_module is None:  # the quadratic penalty
            primal = f + (cg * g.primal.clamp_min(0).square()).sum() / 2 + (ch * h.primal.square()).sum() / 2
            return primal, metrics
        lam = self.multiplier_module.observed("ineq", g)
        mu = self.multiplier_module.observed("eq", h)
        if self.formulation == "lagrangian":
            primal = f + (lam * g.primal).sum() + (mu * h.primal).sum()
        else:  # one coefficient for all, or one per constraint (a penalty_update)
            primal = (
                f
                + (((lam + cg * g.primal).clamp_min(0).square() - lam.square()) / (2 * cg)).sum()
                + (mu * h.primal).sum()
                + (ch * h.primal.square()).sum() / 2
            )
        dual = -((lam * g.dual).sum() + (mu * h.dual).sum())
        return primal, dual, metrics

    # ------------------------------------------------------------------ API
    def step(self, *args: Any, **kwargs: Any) -> StepLosses:
        """One step of the game; the arguments go to ``objective_and_constraints``.
        With a ``penalty_update``, the observed constraints' coefficients then grow by
        their violations at the start of the step (not after a skipped step)."""
        self._seen = None
        skipped = self.game.skipped_steps
        out = self.game.step(*args, **kwargs)
        if self.penalty_update is not None and self.game.skipped_steps == skipped and self._seen is not None:
            for kind, observed in zip(("ineq", "eq"), self._seen):
                self._grow(kind, observed)
        self._seen = None
        return out

    def _grow(self, kind: str, observed: _Observed) -> None:
        c = self._penalties[kind]
        if not c.numel():
            return
        index = slice(None) if observed.features is None else observed.features
        old = c[index]
        new = self.penalty_update.updated(old, self.penalty, observed.dual, inequality=kind == "ineq")
        cap = self.penalty_update.cap(c.dtype)
        reached = (new >= cap) & (old < cap)  # before the write: ``old`` may be a view of ``c``
        c[index] = new
        if bool(reached.any()):
            _warn_capped(kind, torch.arange(c.numel(), device=c.device)[index][reached].tolist(), cap)

    @property
    def multipliers(self) -> tuple[Tensor | None, Tensor | None]:
        """The current multipliers (λ, μ) as copies, of shapes (num_ineq,) and
        (num_eq,); None for a kind held by a model (call the model on features).

        Raises:
            AttributeError: a quadratic-penalty game, which has no multipliers.
        """
        if self.multiplier_module is None:
            raise AttributeError("a quadratic-penalty LagrangianGame has no multipliers")
        return tuple(None if m is None else m.detach().clone() for m in self.multiplier_module.values())  # type: ignore[return-value]

    @property
    def penalties(self) -> tuple[Tensor, Tensor]:
        """The penalty coefficients (one per inequality, one per equality) as copies."""
        return self._penalties["ineq"].clone(), self._penalties["eq"].clone()

    def state_dict(self) -> dict[str, Any]:
        """The game's state (model, multipliers, algorithm: see :meth:`Game.state_dict`),
        with the penalty coefficients under ``"penalties"`` when a ``penalty_update``
        moves them."""
        state = self.game.state_dict()
        if self.penalty_update is not None:
            state["penalties"] = clone_state(self._penalties)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; one that does not fit raises ``ValueError`` and
        changes nothing."""
        penalties = None
        if self.penalty_update is not None:
            penalties = self._checked_penalties(state_dict.get("penalties") if isinstance(state_dict, dict) else None)
        game_state = (
            {k: v for k, v in state_dict.items() if k != "penalties"} if isinstance(state_dict, dict) else state_dict
        )
        self.game.load_state_dict(game_state)
        if penalties is not None:
            for kind, c in penalties.items():
                self._penalties[kind].copy_(c)

    def _checked_penalties(self, saved: Any) -> dict[str, Tensor]:
        if not isinstance(saved, dict):
            raise ValueError("the state_dict lacks the penalty coefficients ('penalties': {'ineq': ..., 'eq': ...})")
        check_like(self._penalties, saved, "penalties")  # keys, shapes, dtypes, values there and finite
        for kind, c in saved.items():
            if bool((c < 0).any()):
                raise ValueError(f"penalties.{kind}: coefficients must be >= 0")
        return saved


def _warn_capped(kind: str, which: list[int], cap: float) -> None:
    log.warning(
        "LagrangianGame: the penalty coefficients of the %s constraints %s reached the cap %g "
        "(MultiplicativePenalty.max_coefficient, or the dtype's largest value) and stay there: "
        "these constraints may be infeasible or badly scaled",
        "inequality" if kind == "ineq" else "equality",
        which,
        cap,
    )


def _pair(value: Any, n: int, what: str, counted: str) -> tuple[Tensor, Tensor]:
    """The model's and the multipliers' values of a tensor or a :class:`Proxy`."""
    if isinstance(value, Proxy):
        surrogate = _shaped(value.surrogate, n, f"{what}'s Proxy surrogate", counted)
        strict = _shaped(value.strict, n, f"{what}'s Proxy strict values", counted)
        return surrogate, strict.detach()
    value = _shaped(value, n, what, counted)
    return value, value.detach()


def _shaped(value: Any, n: int, what: str, counted: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(
            f"objective_and_constraints: {what} must be a tensor of shape ({n},){counted}, got "
            f"{type(value).__name__} (a tensor, a gameopt.Proxy or a gameopt.Sampled)"
        )
    if value.dim() == 0 and n == 1:
        return value.reshape(1)
    if tuple(value.shape) != (n,):
        raise ValueError(f"objective_and_constraints: {what} must have shape ({n},){counted}, got {tuple(value.shape)}")
    return value


def _violation(g: Tensor, h: Tensor) -> Tensor:
    """The largest violation: ``max(0, max gᵢ, max |hⱼ|)``."""
    return torch.cat([g.clamp_min(0), h.abs(), g.new_zeros(1)]).max()
