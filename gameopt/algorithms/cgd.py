"""Competitive gradient descent and its adaptive variant."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..linalg import MatVec, cg, gmres
from .base import Algorithm, State, check_bool, check_number

if TYPE_CHECKING:
    from ..autodiff import Linearization
    from ..game import Game, Oracle
    from ..layout import Vec


def competitive_step(
    oracle: Oracle, lin: Linearization, eta: Vec, warm: Vec, zero_sum: bool, solver: dict
) -> tuple[Vec, Vec]:
    """Δ solving (I + diag(η) H_o) Δ = −diag(η) ξ, and the new warm start.

    General games: GMRES on the whole system, warm-started from the last Δ.
    Two-player zero-sum games (H_o = [[0, B], [−Bᵀ, 0]]): CG on the Schur
    complement of player a = 1 in symmetric form,
    (I + √η_a B η_b Bᵀ √η_a) c = −√η_a (ξ_a − B η_b ξ_b), Δ_a = √η_a c,
    Δ_b = −η_b (ξ_b − Bᵀ Δ_a), warm-started from the last c.
    Every product is matrix-free through the game's retained graph.
    """
    xi = lin.xi
    if not zero_sum:

        def matvec(d: Vec) -> Vec:
            return list(torch._foreach_add(d, torch._foreach_mul(eta, lin.offdiag_jvp(d))))

        rhs = list(torch._foreach_mul(torch._foreach_mul(eta, xi), -1.0))
        delta, _ = gmres(matvec, rhs, x0=warm, **solver)
        return delta, delta
    layout = oracle.layout
    a, b = 1, 0
    B, Bt, matvec, sqrt_eta = schur_operator(lin, eta)
    xi_a, xi_b = layout.only(xi, a), layout.only(xi, b)
    rhs = list(torch._foreach_mul(torch._foreach_sub(xi_a, B(torch._foreach_mul(eta, xi_b))), -1.0))
    torch._foreach_mul_(rhs, sqrt_eta)
    c, _ = cg(matvec, rhs, x0=warm, **solver)
    delta_a = list(torch._foreach_mul(sqrt_eta, c))
    delta_b = list(torch._foreach_mul(torch._foreach_mul(eta, torch._foreach_sub(xi_b, Bt(delta_a))), -1.0))
    return list(torch._foreach_add(delta_a, delta_b)), c


def schur_operator(lin: Linearization, eta: Vec) -> tuple[MatVec, MatVec, MatVec, Vec]:
    """For a two-player zero-sum game (a = player 1, b = player 0): B u = (∂ξ_a/∂w_b) u,
    Bᵀ x, the symmetric Schur complement c ↦ c + √η_a B η_b Bᵀ √η_a c (two
    Jacobian products through the kept graph), and √η."""
    a, b = 1, 0
    sqrt_eta = list(torch._foreach_sqrt(eta))

    def B(u: Vec) -> Vec:  # (∂ξ_a/∂w_b) u = −(∂ξ_b/∂w_a)ᵀ u in the zero-sum case
        return list(torch._foreach_mul(lin.block_vjp(b, a, u), -1.0))

    def Bt(x: Vec) -> Vec:  # (∂ξ_a/∂w_b)ᵀ x
        return lin.block_vjp(a, b, x)

    def matvec(c: Vec) -> Vec:
        inner = list(torch._foreach_mul(eta, Bt(list(torch._foreach_mul(sqrt_eta, c)))))
        minus_b = lin.block_vjp(b, a, inner)  # −B inner (a fresh vector)
        torch._foreach_mul_(minus_b, sqrt_eta)
        return list(torch._foreach_sub(c, minus_b))  # c + √η B(…), exactly: negation is exact

    return B, Bt, matvec, sqrt_eta


def _check_zero_sum(lin: Linearization, n_players: int) -> None:
    if n_players != 2 or bool(lin.losses[0].detach() + lin.losses[1].detach() != 0):
        raise ValueError("this solver needs a two-player zero-sum game given as losses (f, -f)")


class CGD(Algorithm):
    """Competitive gradient descent (Schäfer & Anandkumar 2019), for n players:

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
    """

    first_order = False

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        tol: float = 1e-10,
        maxiter: int | None = None,
        zero_sum: bool = False,
    ) -> None:
        tol = check_number("tol", tol, low=0.0, low_open=True)
        if maxiter is not None:
            maxiter = check_number("maxiter", maxiter, low=1, integer=True)
        super().__init__(lr, None, tol=tol, maxiter=maxiter, zero_sum=check_bool("zero_sum", zero_sum))

    def init_state(self, game: Game) -> State:
        return {"warm": game.layout.zeros()}

    def update(self, oracle: Oracle, state: State) -> tuple[Vec, State]:
        lin = oracle.linearize()
        zero_sum = self.hyper["zero_sum"]
        if zero_sum:
            _check_zero_sum(lin, oracle.num_players)
        eta = oracle.scale_([torch.ones_like(t) for t in lin.xi], self.lrs)
        tol = self.hyper["tol"]
        solver = {"tol": tol**2 if zero_sum else tol, "maxiter": self.hyper["maxiter"]}
        delta, warm = competitive_step(oracle, lin, eta, state["warm"], zero_sum, solver)
        return delta, {"warm": warm}


class ACGD(Algorithm):
    """Adaptive competitive gradient descent (Schäfer, Zheng & Anandkumar 2020,
    "Implicit competitive regularization in GANs") for two-player zero-sum games
    given as losses (f, −f): CGD with RMSProp-like per-coordinate step sizes,

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
    """

    first_order = False

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        beta: float = 0.99,
        eps: float = 1e-5,
        tol: float = 1e-12,
        atol: float = 1e-20,
        maxiter: int | None = None,
    ) -> None:
        hyper = {
            "beta": check_number("beta", beta, low=0.0, high=1.0, high_open=True),
            "eps": check_number("eps", eps, low=0.0, low_open=True),
            "tol": check_number("tol", tol, low=0.0),
            "atol": check_number("atol", atol, low=0.0),
            "maxiter": None if maxiter is None else check_number("maxiter", maxiter, low=1, integer=True),
        }
        super().__init__(lr, None, **hyper)

    def init_state(self, game: Game) -> State:
        if len(game.players) != 2:
            raise ValueError(f"ACGD is for two-player zero-sum games, got {len(game.players)} players")
        return {"v": game.layout.zeros(), "warm": game.layout.zeros(), "t": 0}

    def update(self, oracle: Oracle, state: State) -> tuple[Vec, State]:
        lin = oracle.linearize()
        _check_zero_sum(lin, oracle.num_players)
        beta, t = self.hyper["beta"], state["t"] + 1
        v = list(torch._foreach_mul(state["v"], beta))
        torch._foreach_addcmul_(v, lin.xi, lin.xi, value=1 - beta)
        eta = list(torch._foreach_add(torch._foreach_sqrt(v), self.hyper["eps"]))
        eta = list(torch._foreach_reciprocal(eta))
        oracle.scale_(eta, [math.sqrt(1 - beta**t) * lr for lr in self.lrs])
        solver = {"tol": self.hyper["tol"], "atol": self.hyper["atol"], "maxiter": self.hyper["maxiter"]}
        delta, warm = competitive_step(oracle, lin, eta, state["warm"], True, solver)
        return delta, {"v": v, "warm": warm, "t": t}
