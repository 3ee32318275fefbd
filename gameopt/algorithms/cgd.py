"""Competitive gradient descent and its adaptive variant."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .api import ACGDState, Algorithm, CGDState, Hyper, MatVec, Setting, Vec, cg, check_zero_sum, gmres, next_count

if TYPE_CHECKING:
    from .api import GameView, Linearization, Oracle


def competitive_step(
    oracle: Oracle, lin: Linearization, eta: Vec, warm: Vec, zero_sum: bool, solver: dict
) -> tuple[Vec, Vec]:
    """Δ solving (I + diag(η) H_o) Δ = −diag(η) ξ, and the new warm start.

    General games: GMRES on the whole system, warm-started from the last Δ.
    Two-player zero-sum games (H_o = [[0, B], [−Bᵀ, 0]]): CG on the Schur
    complement of player a = 1 in symmetric form, on a's part of the vectors only:
    (I + √η_a B η_b Bᵀ √η_a) c = −√η_a (ξ_a − B η_b ξ_b), Δ_a = √η_a c,
    Δ_b = −η_b (ξ_b − Bᵀ Δ_a), warm-started from the last c.
    Every product is matrix-free through the game's retained graph.
    """
    xi = lin.xi
    if not zero_sum:
        delta, _ = gmres(lambda d: d + eta * lin.offdiag_jvp(d), -(eta * xi), x0=warm, **solver)
        return delta, delta
    layout = oracle.layout
    a, b = 1, 0
    eta_a, eta_b = layout.player_views(eta, a), layout.player_views(eta, b)
    B, Bt, matvec, sqrt_eta_a = schur_operator(lin, eta_a, eta_b)
    xi_a, xi_b = layout.player_views(xi, a), layout.player_views(xi, b)
    rhs = -(sqrt_eta_a * (xi_a - B(eta_b * xi_b)))
    c, _ = cg(matvec, rhs, x0=layout.player_views(warm, a), **solver)
    delta_a = sqrt_eta_a * c
    delta_b = -(eta_b * (xi_b - Bt(delta_a)))
    delta, new_warm = layout.zeros(), layout.zeros()
    layout.player_views(delta, a).copy_(delta_a)
    layout.player_views(delta, b).copy_(delta_b)
    layout.player_views(new_warm, a).copy_(c)
    return delta, new_warm


def schur_operator(lin: Linearization, eta_a: Vec, eta_b: Vec) -> tuple[MatVec, MatVec, MatVec, Vec]:
    """For a two-player zero-sum game (a = player 1, b = player 0), on the players'
    parts (one tensor per buffer): B u = (∂ξ_a/∂w_b) u (b's part to a's), Bᵀ x (a's to
    b's), the symmetric Schur complement c ↦ c + √η_a B η_b Bᵀ √η_a c on a's part
    (two Jacobian products through the kept graph), and √η_a."""
    a, b = 1, 0
    sqrt_eta_a = eta_a.sqrt()

    def B(u: Vec) -> Vec:  # (∂ξ_a/∂w_b) u = −(∂ξ_b/∂w_a)ᵀ u in the zero-sum case
        return -lin.block_vjp_parts(b, a, u)

    def Bt(x: Vec) -> Vec:  # (∂ξ_a/∂w_b)ᵀ x
        return lin.block_vjp_parts(a, b, x)

    def matvec(c: Vec) -> Vec:  # c + √η B(η Bᵀ(√η c)), with B's sign folded in (exact)
        t = Bt(sqrt_eta_a * c)
        t *= eta_b
        y = lin.block_vjp_parts(b, a, t)
        y *= sqrt_eta_a
        return c - y

    return B, Bt, matvec, sqrt_eta_a


class CGD(Algorithm[CGDState]):
    """Competitive gradient descent (Schäfer & Anandkumar 2019), for n players.

    Each step is

    .. math:: w_{t+1} = w_t + Δ, \\qquad (I + \\mathrm{diag}(η) H_o) Δ = -\\mathrm{diag}(η) ξ,

    the Nash equilibrium of the players' regularized bilinear approximations, with
    H_o the off-diagonal blocks of the game Jacobian. Solved matrix-free with GMRES
    (general-sum), or with CG on the Schur complement when ``zero_sum=True`` (two
    players with losses (f, −f)); warm-started from the previous solution.

    Args:
        lr: η, one float or one per player.
        tol: relative residual ‖r‖ ≤ tol·‖b‖ of the linear solve.
        maxiter: the most matrix-vector products per step (default: the dimension).
        zero_sum: use the two-player zero-sum CG solver.

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).

    References:
        - Schäfer & Anandkumar 2019, `Competitive Gradient Descent <https://arxiv.org/abs/1905.12103>`_
    """

    first_order = False
    tol = Setting.number(low=0.0, low_open=True)
    maxiter = Setting.integer(optional=True, low=1)
    zero_sum = Setting.flag()

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        tol: float = 1e-10,
        maxiter: int | None = None,
        zero_sum: bool = False,
    ) -> None:
        super().__init__(lr, None, tol=tol, maxiter=maxiter, zero_sum=zero_sum)

    def init_state(self, game: GameView) -> CGDState:
        return {"warm": game.layout.zeros()}

    def update(self, oracle: Oracle, state: CGDState) -> tuple[Vec, CGDState]:
        lin = oracle.linearize()
        zero_sum = self.zero_sum
        if zero_sum:
            check_zero_sum(lin.losses, "this solver")
        eta = oracle.scale_(Vec(torch.ones_like(t) for t in lin.xi), self.lrs)
        solver = {"tol": self.tol**2 if zero_sum else self.tol, "maxiter": self.maxiter}
        delta, warm = competitive_step(oracle, lin, eta, state["warm"], zero_sum, solver)
        return delta, {"warm": warm}


class ACGD(Algorithm[ACGDState]):
    """Adaptive competitive gradient descent: competitive gradient descent with
    RMSProp-like per-coordinate step sizes, for two-player zero-sum games.

    From Schäfer, Zheng & Anandkumar 2020, "Implicit competitive regularization in
    GANs", for games given as losses (f, −f):

    .. math::
        v ← βv + (1-β) ξ^2, \\qquad
        η = \\frac{\\sqrt{1-β^t}\\, η_i}{\\sqrt{v} + ε}, \\qquad
        (I + \\mathrm{diag}(η) H_o) Δ = -\\mathrm{diag}(η) ξ,

    solved by CG on the second player's Schur complement, warm-started, with the
    stopping rule of the authors' code: ‖r‖² < tol·‖b‖² or ‖r‖² < atol.

    Args:
        lr: η_i, one float or one per player.
        beta: β, the decay of the squared-gradient average.
        eps: ε.
        tol: relative tolerance on the squared residual.
        atol: absolute tolerance on the squared residual.
        maxiter: the most CG iterations per step (default: the dimension).

    Raises:
        ValueError: a learning rate or setting outside its range (when built; a
            scheduled value when a step reads it).
        TypeError: a setting left without a value, when the algorithm is bound to a game.

    References:
        - Schäfer et al. 2020, `Implicit competitive regularization in GANs <https://arxiv.org/abs/1910.05852>`_
    """

    first_order = False
    counts = {"t": "v"}
    beta = Hyper(low=0.0, high=1.0, high_open=True)
    eps = Setting.number(low=0.0, low_open=True)
    tol = Setting.number(low=0.0)
    atol = Setting.number(low=0.0)
    maxiter = Setting.integer(optional=True, low=1)

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        beta: float = 0.99,
        eps: float = 1e-5,
        tol: float = 1e-12,
        atol: float = 1e-20,
        maxiter: int | None = None,
    ) -> None:
        super().__init__(lr, None, beta=beta, eps=eps, tol=tol, atol=atol, maxiter=maxiter)

    def init_state(self, game: GameView) -> ACGDState:
        if len(game.players) != 2:
            raise ValueError(f"ACGD is for two-player zero-sum games, got {len(game.players)} players")
        return {"v": game.layout.zeros(), "warm": game.layout.zeros(), "t": 0}

    def update(self, oracle: Oracle, state: ACGDState) -> tuple[Vec, ACGDState]:
        lin = oracle.linearize()
        check_zero_sum(lin.losses, "this solver")
        beta, t = self.beta, next_count(state["t"])
        v = (Vec(state["v"]) * beta).addcmul_(lin.xi, lin.xi, value=1 - beta)
        eta = (v.sqrt() + self.eps).reciprocal()
        if isinstance(t, int):
            oracle.scale_(eta, [math.sqrt(1 - beta**t) * lr for lr in self.lrs])
        else:  # one count per element: parameters that joined later have their own correction
            eta *= Vec(torch.sqrt(1 - beta**c) for c in t)
            oracle.scale_(eta, self.lrs)
        solver = {"tol": self.tol, "atol": self.atol, "maxiter": self.maxiter}
        delta, warm = competitive_step(oracle, lin, eta, state["warm"], True, solver)
        return delta, {"v": v, "warm": warm, "t": t}
