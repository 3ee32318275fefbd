"""The multiplier player's module: a multiplier per constraint, or a model of the
constraints' features (Narasimhan et al. 2020, "Approximate Heavily-Constrained
Learning with Lagrange Multiplier Models"; cooper's ``ImplicitMultiplier``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .observations import KINDS, Observed


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

    def observed(self, kind: str, observed: Observed) -> Tensor:
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


def multiplier_models(multipliers: Any, num_ineq: int, num_eq: int) -> dict[str, nn.Module]:
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
