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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .algorithms.base import Algorithm
from .constraints import NonNegative
from .evaluation import StepLosses
from .game import Game
from .player import Player

ObjectiveAndConstraints = Callable[..., Sequence[Any]]


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
    the multipliers of the constraints at ``indices`` move, and only those
    constraints enter the model's Lagrangian (cooper's ``IndexedMultiplier`` with
    ``ConstraintState(violation=values, constraint_features=indices)``). For very many
    constraints, observed a minibatch at a time.

    Args:
        values: the observed constraints' values, shape (k,), or a :class:`Proxy` of two.
        indices: their indices, a long tensor of shape (k,), each in ``0..num-1``.
    """

    values: Tensor | Proxy
    indices: Tensor


class _Observed(NamedTuple):
    """One kind of constraint as a step observed it: what the model's Lagrangian uses,
    what the multipliers ascend on (detached), and which constraints (None: all)."""

    primal: Tensor
    dual: Tensor
    index: Tensor | None


class Multipliers(nn.Module):
    """The multiplier player's module: ``ineq`` (λ, one per inequality) and ``eq``
    (μ, one per equality), zeros at the start. A group with no constraint has no
    parameter."""

    def __init__(self, num_ineq: int, num_eq: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        if num_ineq:
            self.ineq = nn.Parameter(torch.zeros(num_ineq, dtype=dtype, device=device))
        if num_eq:
            self.eq = nn.Parameter(torch.zeros(num_eq, dtype=dtype, device=device))
        self._empty = torch.zeros(0, dtype=dtype, device=device)

    def values(self) -> tuple[Tensor, Tensor]:
        """(λ, μ) as live parameters; an empty tensor for a group with no constraint."""
        return getattr(self, "ineq", self._empty), getattr(self, "eq", self._empty)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


class LagrangianGame:
    """Minimize ``f(w)`` subject to ``g(w) ≤ 0`` and ``h(w) = 0``, as a game between the model and its
    Lagrange multipliers (see the module docstring for the equations).

    Args:
        model: the primal player: an ``nn.Module`` or a :class:`Player` (which may
            carry a feasible set of its own).
        objective_and_constraints: ``(*args, **kwargs) -> (f, g, h)``: the scalar
            objective, the inequality values ``g`` of shape ``(num_ineq,)`` and the
            equality values ``h`` of shape ``(num_eq,)``. A group with no
            constraint may be ``None`` (or empty); a single constraint may be a
            0-d tensor. Checked at every evaluation.
        num_ineq, num_eq: the numbers of constraints (not both 0).
        algorithm: a first-order gameopt algorithm (default ``SimGD(1e-3)``); its
            per-player learning rates are ``[primal, multipliers]``.
        penalty: ``c ≥ 0`` of the augmented Lagrangian (0: the plain Lagrangian).

    ``step(*args, **kwargs)`` runs one step of the game and returns its losses at the
    start of the step (the primal loss ``L_c`` and the multipliers' ``−(λᵀg + μᵀh)``)
    with the metrics ``objective`` (f) and ``violation`` (max(0, gᵢ) and ``|hⱼ|`` at
    their largest). :attr:`multipliers` is (λ, μ); ``game`` the
    :class:`~gameopt.Game`, whose ``state_dict`` holds the multipliers as a player.

    Raises:
        ValueError: no constraints (``num_ineq`` and ``num_eq`` both 0) or a negative
            or non-finite ``penalty``.
        TypeError: ``objective_and_constraints`` is not callable.
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
    ) -> None:
        self.num_ineq, self.num_eq = _count("num_ineq", num_ineq), _count("num_eq", num_eq)
        if num_ineq == 0 and num_eq == 0:
            raise ValueError("a LagrangianGame needs constraints: num_ineq and num_eq are both 0")
        if not callable(objective_and_constraints):
            raise TypeError("objective_and_constraints must be a callable returning (f, g, h)")
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty):
            raise ValueError(f"penalty must be a finite number >= 0, got {penalty!r}")
        if penalty < 0:
            raise ValueError(f"penalty must be >= 0, got {penalty!r}")
        self.penalty = float(penalty)
        self.objective_and_constraints = objective_and_constraints
        primal = model if isinstance(model, Player) else Player(model)
        first = primal.parameters[0]
        self.multiplier_module = Multipliers(num_ineq, num_eq, first.dtype, first.device)
        dual = Player(
            self.multiplier_module,
            name="multipliers",
            constraint={"ineq": NonNegative()} if num_ineq else None,
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
        return f.reshape(()), self._observed("g", g, self.num_ineq, f), self._observed("h", h, self.num_eq, f)

    @classmethod
    def _observed(cls, name: str, value: Any, n: int, f: Tensor) -> _Observed:
        count = "num_ineq" if name == "g" else "num_eq"
        if value is None and n == 0:
            empty = f.new_zeros(0)
            return _Observed(empty, empty, None)
        if isinstance(value, Sampled):
            index = value.indices
            if not isinstance(index, Tensor) or index.dtype != torch.long or index.dim() != 1 or index.numel() == 0:
                raise ValueError(
                    f"objective_and_constraints: {name}'s Sampled indices must be a non-empty long tensor of shape "
                    f"(k,), got {index.dtype if isinstance(index, Tensor) else type(index).__name__}"
                )
            if bool((index < 0).any()) or bool((index >= n).any()):
                raise ValueError(
                    f"objective_and_constraints: {name}'s Sampled indices must lie in 0..{n - 1} ({count}={n}), "
                    f"got {index.tolist()}"
                )
            primal, dual = cls._pair(value.values, index.numel(), f"{name}'s Sampled values", "")
            return _Observed(primal, dual, index)
        primal, dual = cls._pair(value, n, name, f" ({count}={n})")
        return _Observed(primal, dual, None)

    @classmethod
    def _pair(cls, value: Any, n: int, what: str, counted: str) -> tuple[Tensor, Tensor]:
        """The model's and the multipliers' values of a tensor or a :class:`Proxy`."""
        if isinstance(value, Proxy):
            surrogate = cls._shaped(value.surrogate, n, f"{what}'s Proxy surrogate", counted)
            strict = cls._shaped(value.strict, n, f"{what}'s Proxy strict values", counted)
            return surrogate, strict.detach()
        value = cls._shaped(value, n, what, counted)
        return value, value.detach()

    @staticmethod
    def _shaped(value: Any, n: int, what: str, counted: str) -> Tensor:
        if not isinstance(value, Tensor):
            raise ValueError(
                f"objective_and_constraints: {what} must be a tensor of shape ({n},){counted}, got "
                f"{type(value).__name__} (a tensor, a gameopt.Proxy or a gameopt.Sampled)"
            )
        if value.dim() == 0 and n == 1:
            return value.reshape(1)
        if tuple(value.shape) != (n,):
            raise ValueError(
                f"objective_and_constraints: {what} must have shape ({n},){counted}, got {tuple(value.shape)}"
            )
        return value

    def _losses(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        f, g, h = self._observe(*args, **kwargs)
        lam, mu = self.multiplier_module.values()
        lam = lam if g.index is None else lam[g.index]  # the observed constraints' multipliers
        mu = mu if h.index is None else mu[h.index]
        c = self.penalty
        if c == 0:
            primal = f + (lam * g.primal).sum() + (mu * h.primal).sum()
        else:
            primal = (
                f
                + ((lam + c * g.primal).clamp_min(0).square() - lam.square()).sum() / (2 * c)
                + (mu * h.primal).sum()
                + (c / 2) * h.primal.square().sum()
            )
        dual = -((lam * g.dual).sum() + (mu * h.dual).sum())
        return primal, dual, {"objective": f.detach(), "violation": _violation(g.dual, h.dual)}

    # ------------------------------------------------------------------ API
    def step(self, *args: Any, **kwargs: Any) -> StepLosses:
        """One step of the game; the arguments go to ``objective_and_constraints``."""
        return self.game.step(*args, **kwargs)

    @property
    def multipliers(self) -> tuple[Tensor, Tensor]:
        """The current multipliers (λ, μ) as copies, of shapes (num_ineq,) and (num_eq,)."""
        lam, mu = self.multiplier_module.values()
        return lam.detach().clone(), mu.detach().clone()

    def state_dict(self) -> dict[str, Any]:
        """The game's state (model, multipliers, algorithm): see :meth:`Game.state_dict`."""
        return self.game.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.game.load_state_dict(state_dict)


def _violation(g: Tensor, h: Tensor) -> Tensor:
    """The largest violation: ``max(0, max gᵢ, max |hⱼ|)``."""
    return torch.cat([g.clamp_min(0), h.abs(), g.new_zeros(1)]).max()
