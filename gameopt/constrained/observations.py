"""What a step observes of the constraints: the ``(f, g, h)`` that
``objective_and_constraints`` returns, checked, each constraint kind as the model's
Lagrangian and the multipliers' ascent see it (:class:`Proxy`), and which of the
constraints (:class:`Sampled`)."""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

#: the kinds of constraint: the name of their values and of their number
KINDS = {"ineq": ("g", "num_ineq"), "eq": ("h", "num_eq")}


class Proxy(NamedTuple):
    """A constraint observed through a differentiable surrogate, in place of ``g`` or ``h``.

    After Cotter, Jiang, Gupta, Wang, Narayan, You & Sridharan 2019 (`Optimization
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


class Observed(NamedTuple):
    """One kind of constraint as a step observed it: what the model's Lagrangian uses,
    what the multipliers ascend on (detached), and which constraints (None: all) —
    their indices, or a multiplier model's features."""

    primal: Tensor
    dual: Tensor
    features: Tensor | None


def observe(out: Any, counts: Mapping[str, int], modeled: Container[str]) -> tuple[Tensor, Observed, Observed]:
    """f and the observed constraints from what ``objective_and_constraints`` returned
    (``counts``: the number of constraints of each kind; ``modeled``: the kinds whose
    multipliers are a model, which must come as :class:`Sampled`)."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
        raise ValueError(f"objective_and_constraints must return (f, g, h), got {got}")
    f, g, h = out
    if not isinstance(f, Tensor) or f.numel() != 1:
        what = tuple(f.shape) if isinstance(f, Tensor) else type(f).__name__
        raise ValueError(f"objective_and_constraints: the objective f must be a scalar tensor, got {what}")
    ineq = _observed("ineq", g, f, counts["ineq"], "ineq" in modeled)
    return f.reshape(()), ineq, _observed("eq", h, f, counts["eq"], "eq" in modeled)


def _observed(kind: str, value: Any, f: Tensor, n: int, model: bool) -> Observed:
    """One kind of constraint, ``n`` of them, as a step observed it (``model``: its
    multipliers are a model)."""
    name, count = KINDS[kind]
    if value is None and n == 0:
        empty = f.new_zeros(0)
        return Observed(empty, empty, None)
    if model and not isinstance(value, Sampled):
        raise ValueError(
            f"objective_and_constraints: the {kind} multipliers are a model, so {name} must be a "
            f"gameopt.Sampled(values, features), got {type(value).__name__}"
        )
    if not isinstance(value, Sampled):
        primal, dual = _pair(value, n, name, f" ({count}={n})")
        return Observed(primal, dual, None)
    features = value.features
    k = _model_inputs(features, name) if model else _indices(features, name, count, n)
    primal, dual = _pair(value.values, k, f"{name}'s Sampled values", "")
    return Observed(primal, dual, features)


def _model_inputs(features: Any, name: str) -> int:
    """How many constraints a multiplier model's input of shape (k, ...) observes."""
    k = features.shape[0] if isinstance(features, Tensor) and features.dim() > 0 else 0
    if k == 0:
        raise ValueError(
            f"objective_and_constraints: {name}'s Sampled features must be a tensor of shape (k, ...), k >= 1, "
            f"got {tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__}"
        )
    return k


def _indices(features: Any, name: str, count: str, n: int) -> int:
    """How many constraints the indices of the observed ones (of ``n``) name."""
    if not isinstance(features, Tensor) or features.dtype != torch.long or features.dim() != 1 or features.numel() == 0:
        raise ValueError(
            f"objective_and_constraints: {name}'s Sampled indices must be a non-empty long tensor of shape "
            f"(k,), got {features.dtype if isinstance(features, Tensor) else type(features).__name__}"
        )
    if bool((features < 0).any()) or bool((features >= n).any()):
        raise ValueError(
            f"objective_and_constraints: {name}'s Sampled indices must lie in 0..{n - 1} ({count}={n}), "
            f"got {features.tolist()}"
        )
    return features.numel()


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


def violation(g: Tensor, h: Tensor) -> Tensor:
    """The largest violation: ``max(0, max gᵢ, max |hⱼ|)``."""
    return torch.cat([g.clamp_min(0), h.abs(), g.new_zeros(1)]).max()
