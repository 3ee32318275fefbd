"""Dynamics for sequential solutions of two-player games (a leader, a follower):
Follow-the-Ridge for local minimax points, implicit Stackelberg learning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .api import Algorithm, BreakdownError, NoState, Setting, Vec, cg, check_zero_sum

if TYPE_CHECKING:
    from .api import GameView, Linearization, Oracle


class _Sequential(Algorithm[NoState]):
    """What Follow-the-Ridge and Stackelberg learning share: two players, no state,
    and a CG solve with the follower's own block of the game Jacobian (settings
    ``tol``, ``maxiter``, ``damping``)."""

    first_order = False
    tol = Setting.number(low=0.0, low_open=True)
    maxiter = Setting.integer(optional=True, low=1)
    damping = Setting.number(low=0.0)

    def init_state(self, game: GameView) -> NoState:
        if len(game.players) != 2:
            raise ValueError(f"{type(self).__name__} is for two-player games, got {len(game.players)} players")
        return {}

    def identity(self) -> dict[str, Any]:
        """Without ``damping`` when it is 0: the run of a checkpoint from before the
        setting existed (the same iterates)."""
        identity = super().identity()
        if identity["settings"].get("damping") == 0:
            del identity["settings"]["damping"]
        return identity

    def _solve(self, lin: Linearization, i: int, b: Vec, block: str, operator: str) -> Vec:
        """(A + λI)⁻¹ b by CG, A = (∂ξ_i/∂w_i)ᵀ (player i's own block of the game
        Jacobian, written ``operator``) and λ = ``damping``. A breakdown (A singular
        along a direction) raises ``gameopt.linalg.BreakdownError`` naming
        ``block`` and player i."""
        damping = self.damping

        def matvec(c: Vec) -> Vec:
            out = lin.block_vjp_parts(i, i, c)
            return out.add_(c, alpha=damping) if damping else out

        try:
            z, _ = cg(matvec, b, tol=self.tol, maxiter=self.maxiter)
        except BreakdownError as err:
            name, kind = self.param_groups[i]["player"], type(self).__name__
            raise BreakdownError(
                f"{kind}: {block} of player {name!r} is singular (CG met a direction of zero curvature; "
                f"a bilinear game's is 0), so the step is not defined; nothing changed. Regularize it: "
                f"{kind}(..., damping=1e-3) solves with {operator} + damping·I"
            ) from err
        return z


class FollowTheRidge(_Sequential):
    """Follow-the-Ridge: gradient descent-ascent with a correction that keeps the
    maximizing player on the ridge of f, for two-player zero-sum games.

    Wang, Zhang & Ba 2020, "On Solving Minimax Optimization Locally: A Follow-the-Ridge
    Approach", https://arxiv.org/abs/1910.07512. The game is given as losses (f, −f): x
    (player 0) minimizes f and leads, y (player 1) maximizes f:

    .. math::
        x ← x - η_x ∇_x f, \\qquad
        y ← y + η_y ∇_y f + η_x H_{yy}^{-1} H_{yx} ∇_x f,

    H = ∇²f. The correction keeps y on the ridge ∇_y f = 0 as x moves; local minimax
    points are its only stable fixed points. The product H_yy⁻¹ v is solved by CG on
    −H_yy (positive definite near a local maximum of f in y), or on −H_yy + λI with
    ``damping`` λ > 0 (H_yy⁻¹ replaced by (H_yy − λI)⁻¹); H_yx ∇_x f and each
    −H_yy c are block products of the linearization, differentiated toward y's
    parameters only. A game that is not (f, −f) is refused with ``ValueError``
    (nothing changed). Cost: one linearization, 1 + (CG iterations) block products.

    Args:
        lr: (η_x, η_y), or one float for both.
        tol: CG stops at ‖r‖² < tol·‖b‖².
        maxiter: the most CG iterations per step (default: y's dimension).
        damping: λ ≥ 0 added to −H_yy (for a singular H_yy: a bilinear game's is 0).

    Raises:
        ArithmeticError: (``gameopt.linalg.BreakdownError``, at a step, nothing changed) H_yy singular
            along a direction CG took and ``damping`` 0.
    """

    def __init__(
        self, lr: float | Sequence[float] = 1e-3, tol: float = 1e-20, maxiter: int | None = None, damping: float = 0.0
    ) -> None:
        super().__init__(lr, None, tol=tol, maxiter=maxiter, damping=damping)

    def update(self, oracle: Oracle, state: NoState) -> tuple[Vec, NoState]:
        lin = oracle.linearize()
        check_zero_sum(lin.losses, "this solver")  # refuses anything but (f, −f)
        layout, (eta_x, eta_y) = oracle.layout, self.lrs
        grad_x = layout.player_views(lin.xi, 0)  # ξ_x = ∇_x f
        rhs = lin.block_vjp_parts(0, 1, grad_x)  # (∂ξ_x/∂y)ᵀ ∇_x f = H_yx ∇_x f
        # (∂ξ_y/∂y)ᵀ c = −H_yy c: z = (−H_yy + λI)⁻¹ H_yx ∇_x f
        z = self._solve(lin, 1, rhs, "the Hessian ∇²_yy f", "−∇²_yy f")
        delta = oracle.scaled(lin.xi, [-eta_x, -eta_y])  # (−η_x ∇_x f, +η_y ∇_y f)
        layout.player_views(delta, 1).add_(z, alpha=-eta_x)
        return delta, {}


class Stackelberg(_Sequential):
    """Implicit Stackelberg learning for two general-sum players: the leader descends
    its total derivative with the follower on its best response, the follower its own
    gradient.

    Fiez, Chasnov & Ratliff 2020, "Implicit Learning Dynamics in Stackelberg Games:
    Equilibria Characterization, Convergence Analysis, and Empirical Study",
    https://arxiv.org/abs/1906.01217. The leader is x (loss f₁), the follower y (loss f₂):

    .. math::
        x ← x - η_x \\big(∇_x f_1 - ∇^2_{xy} f_2 \\, (∇^2_{yy} f_2)^{-1} ∇_y f_1\\big), \\qquad
        y ← y - η_y ∇_y f_2.

    (∇²_yy f₂)⁻¹ ∇_y f₁ is solved by CG (on ∇²_yy f₂ + λI with ``damping`` λ > 0),
    which needs ∇²_yy f₂ positive definite (near a local minimum of the follower).
    Where it is not, CG does not solve the system: on a curvature pᵀAp < 0 it takes
    a step along it (a negative definite block gives the solution of the system all
    the same, an indefinite one a point that depends on the iterations), and a zero
    curvature (a singular block: a bilinear game's is 0) raises
    ``gameopt.linalg.BreakdownError`` naming the block (nothing changed); a
    singular block whose null space CG does not meet exactly also gives a point that
    depends on the iterations: ``damping`` regularizes both. Cost:
    one linearization, the leader's cross gradient ∇_y f₁ (one reverse pass per
    player), 1 + (CG iterations) Jacobian-vector products.

    Args:
        lr: (η_0, η_1), or one float for both.
        leader: the index of the leader (0 or 1).
        tol: CG stops at ‖r‖² < tol·‖b‖².
        maxiter: the most CG iterations per step (default: the follower's dimension).
        damping: λ ≥ 0 added to ∇²_yy f₂ (for a singular follower's Hessian).

    Raises:
        ArithmeticError: (``gameopt.linalg.BreakdownError``, at a step, nothing changed) ∇²_yy f₂ singular
            along a direction CG took and ``damping`` 0.
    """

    leader = Setting.integer(low=0, high=1)

    def __init__(
        self,
        lr: float | Sequence[float] = 1e-3,
        leader: int = 0,
        tol: float = 1e-20,
        maxiter: int | None = None,
        damping: float = 0.0,
    ) -> None:
        super().__init__(lr, None, leader=leader, tol=tol, maxiter=maxiter, damping=damping)

    def update(self, oracle: Oracle, state: NoState) -> tuple[Vec, NoState]:
        lin = oracle.linearize()
        lead, follow, layout = self.leader, 1 - self.leader, oracle.layout
        cross = Vec(layout.player_views(lin.cross_gradients()[lead], follow))  # ∇_y f₁
        f = f"f_{follow + 1}"
        z = self._solve(lin, follow, cross, f"the follower's Hessian ∇²_yy {f}", f"∇²_yy {f}")
        correction = lin.block_vjp_parts(follow, lead, z)  # ∇²_xy f₂ z
        delta = oracle.scaled(lin.xi, [-lr for lr in self.lrs])
        layout.player_views(delta, lead).add_(correction, alpha=self.lrs[lead])
        return delta, {}
