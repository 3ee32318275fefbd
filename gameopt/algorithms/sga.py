"""Symplectic gradient adjustment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..updates import UpdateRule
from .base import Algorithm, State

if TYPE_CHECKING:
    from ..game import Oracle
    from ..layout import Vec


class SGA(Algorithm):
    """Symplectic gradient adjustment (Balduzzi et al. 2018; Letcher et al. 2019,
    "Differentiable Game Mechanics"):

    .. math::
        w_{t+1} = w_t - η \\, u(ξ + λ A^⊤ ξ), \\qquad A^⊤ξ = ½(J^⊤ξ - Jξ),

    with A = ½(J − Jᵀ) the antisymmetric part of the game Jacobian. With ``align``,
    λ = |lam| · sign(⟨ξ, Jᵀξ⟩ ⟨Aᵀξ, Jᵀξ⟩ / d + ε), d the number of parameters,
    computed on the device (no host sync).

    Args:
        lr: η, one float or one per player.
        lam: λ (its magnitude when ``align``).
        align: choose λ's sign to align with the Hamiltonian's gradient.
        eps: ε in the sign rule.
        update: per-player update rule (default: plain gradient).
    """

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        lam: float = 1.0,
        align: bool = True,
        eps: float = 0.1,
        update: UpdateRule | None = None,
    ) -> None:
        super().__init__(lr, update, lam=float(lam), align=bool(align), eps=float(eps))

    def update(self, oracle: Oracle, state: State) -> tuple[Vec, State]:
        lin = oracle.linearize(check=False)  # the update is non-finite if ξ is
        xi = lin.xi
        jt_xi = lin.vjp(xi)
        a_xi = list(torch._foreach_mul(torch._foreach_sub(jt_xi, lin.jvp(xi)), 0.5))
        lam = self.hyper["lam"]
        if self.hyper["align"]:
            d = oracle.layout.num_elements
            score = oracle.dot(xi, jt_xi) * oracle.dot(a_xi, jt_xi) / d + self.hyper["eps"]
            lam = abs(lam) * torch.sign(score)
            for t in a_xi:
                t.mul_(lam.to(t.device, t.dtype))
            direction = list(torch._foreach_add(xi, a_xi))
        else:
            direction = list(torch._foreach_add(xi, a_xi, alpha=lam))
        delta, rule_state = self.descend(oracle, direction, state["rule"], scratch=True)
        return delta, {"rule": rule_state}
