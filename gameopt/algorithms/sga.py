"""Symplectic gradient adjustment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .api import Algorithm, DescentState, Hyper, Setting, UpdateRule

if TYPE_CHECKING:
    from .api import Oracle, Step

SIGN_NORMALIZERS = ("dimension", "tensors")
JVP_PATHS = ("double_backward", "forward")


class SGA(Algorithm[DescentState]):
    """Symplectic gradient adjustment (Balduzzi et al. 2018, "The Mechanics of n-Player
    Differentiable Games"; Letcher et al. 2019, "Differentiable Game Mechanics"):
    gradient play plus λ times the antisymmetric part of the game Jacobian applied to ξ.

    One step:

    .. math::
        w_{t+1} = w_t - η \\, u(ξ + λ A^⊤ ξ), \\qquad A^⊤ξ = ½(J^⊤ξ - Jξ),

    with A = ½(J − Jᵀ) the antisymmetric part of the game Jacobian. With ``align``,
    λ's sign is chosen to align with the Hamiltonian's gradient ∇H = Jᵀξ
    (Balduzzi et al. 2018, Algorithm 1), computed on the device (no host sync):

    .. math:: λ = |λ_0| \\, \\mathrm{sign}\\big(⟨ξ, J^⊤ξ⟩ ⟨A^⊤ξ, J^⊤ξ⟩ / n + ε\\big).

    The papers' text takes n = d, the number of parameters (``sign_normalizer=
    "dimension"``, the default); the authors' code (the symplectic-gradient-
    adjustment notebook) divides by the number of weight tensors instead
    (``"tensors"``: the fused parameter tensors of all players, biases included).
    The two differ only in how small the product must be for ε to decide the sign.

    Args:
        lr: η, one float or one per player.
        lam: λ₀, a finite number (only its magnitude is used with ``align``).
        align: choose λ's sign to align with the Hamiltonian's gradient.
        eps: ε ≥ 0 in the sign rule (the papers use 1/10); with ε = 0 a zero
            product gives λ = 0.
        sign_normalizer: n in the sign rule, ``"dimension"`` or ``"tensors"``.
        update: per-player update rule (default: plain gradient).
        zero_sum: the game is two players with losses (f, −f): Jᵀξ = ∇²f ∇f and
            Jξ = S ∇²f ξ, two Hessian-vector products through one ``create_graph``
            backward of f (no re-evaluation of the losses; ``jvp`` is not used).
        jvp: how a general game's Jξ is taken. ``"double_backward"`` (the default,
            the faster): Jᵀξ is the value of one ``create_graph`` reverse pass of
            ⟨ξ, u⟩ at u = ξ, and Jξ one more reverse pass through that pass's graph;
            the losses run once. ``"forward"`` (less memory): ξ's graph is freed by
            the pass that takes Jᵀξ, then the losses run again with dual parameters
            (forward-over-reverse). On a DCGAN-style pair (convolutions, BatchNorm)
            it held about half the memory at its peak, at about the same time; on
            plain MLPs about 15% more time (``benchmarks.second_order``). It needs
            forward-mode AD for every op of the losses and players given as modules.

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
        TypeError: a setting left without a value, when the algorithm is bound to a game.
        RuntimeError: (a step, with ``jvp="forward"``) forward-mode AD unavailable for
            the losses; nothing changes.

    References:
        - Balduzzi et al. 2018, `The Mechanics of n-Player Differentiable Games <https://arxiv.org/abs/1802.05642>`_
        - Letcher et al. 2019, `Differentiable Game Mechanics <https://arxiv.org/abs/1905.04926>`_
    """

    first_order = False
    lam = Hyper()
    align = Setting.flag()
    eps = Setting.number(low=0.0)
    sign_normalizer = Setting.choice(*SIGN_NORMALIZERS)
    zero_sum = Setting.flag()
    jvp = Setting.choice(*JVP_PATHS)

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        lam: float = 1.0,
        align: bool = True,
        eps: float = 0.1,
        update: UpdateRule | Sequence[UpdateRule] | None = None,
        sign_normalizer: str = "dimension",
        zero_sum: bool = False,
        jvp: str = "double_backward",
    ) -> None:
        super().__init__(
            lr, update, lam=lam, align=align, eps=eps, sign_normalizer=sign_normalizer, zero_sum=zero_sum, jvp=jvp
        )

    def identity(self) -> dict[str, Any]:
        """Without ``jvp``: how Jξ is taken, not which run (a checkpoint resumes under
        either, and from before the setting existed)."""
        identity = super().identity()
        del identity["settings"]["jvp"]
        return identity

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Step, DescentState]:
        lin = oracle.linearize(check=False, zero_sum=self.zero_sum)  # the update is non-finite if ξ is
        xi = lin.xi
        if self.jvp == "forward" and not self.zero_sum:
            jt_xi = lin.vjp(xi, last=True)  # ξ's graph freed before the losses run again
            j_xi = lin.jvp(xi)
        else:
            jt_xi, j_xi = lin.vjp_jvp(xi)
        # in Jξ's own vector: j_xi − jt_xi = −2Aᵀξ, then the direction ξ + λAᵀξ (the
        # factors ½ are exact; two vectors fewer than forming Aᵀξ on its own)
        minus_2a = j_xi
        minus_2a -= jt_xi
        lam = self.lam
        if self.align:
            n = oracle.layout.num_elements if self.sign_normalizer == "dimension" else oracle.layout.num_tensors
            score = xi.dot(jt_xi) * (minus_2a.dot(jt_xi) * -0.5) / n + self.eps
            minus_2a *= -0.5 * abs(lam) * torch.sign(score)
        else:
            minus_2a *= -0.5 * lam
        direction = minus_2a.add_(xi)
        delta, rule_state = self.scaled_descent(oracle, direction, state["rule"], scratch=True)
        return delta, {"rule": rule_state}
