"""Small games with closed-form vector fields.

Each game has players that are tiny modules holding one parameter vector, losses
written with torch ops, and ``xi_ref(ws)``: the vector field written by hand (no
autograd), so that an algorithm can be checked iterate for iterate against its
closed form (:mod:`gameopt.testing.references`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..algorithms import Algorithm
from ..game import Game
from ..player import Player

Points = list[Tensor]  # one parameter vector per player


class VecModule(nn.Module):
    """A module holding one parameter vector ``w`` (a copy of ``init``)."""

    def __init__(self, init: Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(init.clone())


@dataclass
class ReferenceGame:
    """A game with a known vector field ξ and, where written, its Jacobian J.

    Attributes:
        name: what the game is called in :data:`GAMES`.
        init: the starting point, one float64 vector per player.
        losses_fn: the players' losses at a point ``ws`` (torch ops; replace it to
            make a step fail, say).
        xi_ref: ξ at ``ws``, written by hand.
        jac_ref: J at ``ws`` (one dense matrix), or ``None``.
        grads_ref: ``[i][j]`` = ∇_{w_j} f_i at ``ws``, or ``None``.
        modules: the players' modules of the last :meth:`build`.
    """

    name: str
    init: Points
    losses_fn: Callable[[Points], list[Tensor]]
    xi_ref: Callable[[Points], Points]
    jac_ref: Callable[[Points], Tensor] | None = None
    grads_ref: Callable[[Points], list[list[Tensor]]] | None = None
    modules: list[VecModule] = field(default_factory=list)

    def build(
        self,
        algorithm: Algorithm,
        dtype: torch.dtype = torch.float64,
        raw: bool = False,
        device: str | torch.device = "cpu",
        verdict: str = "host",
    ) -> Game:
        """A fresh :class:`~gameopt.Game` at :attr:`init` (new modules, in ``dtype`` on
        ``device``, its step verdict ``verdict``), players named ``p0``, ``p1``, …;
        ``raw``: the players are given as their parameter tensors rather than as modules."""
        self.modules = [VecModule(w.to(device, dtype)) for w in self.init]
        players = [Player([m.w] if raw else m, name=f"p{i}") for i, m in enumerate(self.modules)]
        return Game(players, lambda: self.losses_fn([m.w for m in self.modules]), algorithm=algorithm, verdict=verdict)

    def params(self) -> Points:
        """The current point of the last :meth:`build`'s game (copies)."""
        return [m.w.detach().clone() for m in self.modules]


def bilinear(n: int = 3, seed: int = 0) -> ReferenceGame:
    """min_x max_y xᵀAy: f1 = xᵀAy, f2 = −xᵀAy; ξ = (Ay, −Aᵀx). Two players, zero-sum."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    init = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]

    def losses(ws: Points) -> list[Tensor]:
        f = ws[0] @ A.to(ws[0]) @ ws[1]
        return [f, -f]

    def xi(ws: Points) -> Points:
        return [A.to(ws[1]) @ ws[1], -A.to(ws[0]).T @ ws[0]]

    def jac(ws: Points) -> Tensor:
        z = torch.zeros(n, n, dtype=torch.float64)
        return torch.cat([torch.cat([z, A], 1), torch.cat([-A.T, z], 1)])

    def grads(ws: Points) -> list[list[Tensor]]:
        x, y = ws
        return [[A @ y, A.T @ x], [-(A @ y), -(A.T @ x)]]

    return ReferenceGame("bilinear", init, losses, xi, jac, grads)


def regularized_bilinear(n: int = 3, seed: int = 3) -> ReferenceGame:
    """min_x max_y xᵀAy + ½‖x‖² − ½‖y‖², as losses (f, −f): two players, zero-sum, with
    ξ = (Ay + x, y − Aᵀx) and invertible diagonal blocks (∇²_xx f = I, −∇²_yy f = I),
    which two-player methods that solve with them (a leader and a follower) need."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    init = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]

    def losses(ws: Points) -> list[Tensor]:
        x, y = ws
        f = x @ A.to(x) @ y + 0.5 * x.dot(x) - 0.5 * y.dot(y)
        return [f, -f]

    def xi(ws: Points) -> Points:
        x, y = ws
        return [A.to(x) @ y + x, y - A.to(y).T @ x]

    def jac(ws: Points) -> Tensor:
        eye = torch.eye(n, dtype=torch.float64)
        return torch.cat([torch.cat([eye, A], 1), torch.cat([-A.T, eye], 1)])

    return ReferenceGame("regularized_bilinear", init, losses, xi, jac)


def quadratic(n_players: int = 3, dim: int = 2, seed: int = 1) -> ReferenceGame:
    """General-sum quadratic: f_i = ½ w_iᵀ S_i w_i + Σ_{j≠i} w_iᵀ B_ij w_j + c_iᵀ w_i,
    so ξ = M w + c with M_ii = S_i, M_ij = B_ij."""
    g = torch.Generator().manual_seed(seed)
    S = []
    for _ in range(n_players):
        R = torch.randn(dim, dim, generator=g, dtype=torch.float64)
        S.append(R @ R.T + torch.eye(dim, dtype=torch.float64))
    B = {
        (i, j): torch.randn(dim, dim, generator=g, dtype=torch.float64)
        for i in range(n_players)
        for j in range(n_players)
        if i != j
    }
    c = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(n_players)]
    init = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(n_players)]

    def losses(ws: Points) -> list[Tensor]:
        out = []
        for i in range(n_players):
            d = ws[i]  # dtype and device
            f = 0.5 * ws[i] @ S[i].to(d) @ ws[i] + c[i].to(d) @ ws[i]
            for j in range(n_players):
                if j != i:
                    f = f + ws[i] @ B[i, j].to(d) @ ws[j].to(d)
            out.append(f)
        return out

    def xi(ws: Points) -> Points:
        out = []
        for i in range(n_players):
            d = ws[i]  # dtype and device
            v = S[i].to(d) @ ws[i] + c[i].to(d)
            for j in range(n_players):
                if j != i:
                    v = v + B[i, j].to(d) @ ws[j]
            out.append(v)
        return out

    def jac(ws: Points) -> Tensor:
        rows = []
        for i in range(n_players):
            rows.append(torch.cat([S[i] if i == j else B[i, j] for j in range(n_players)], 1))
        return torch.cat(rows)

    def grads(ws: Points) -> list[list[Tensor]]:
        out = []
        for i in range(n_players):
            row = []
            for j in range(n_players):
                row.append(xi(ws)[i] if i == j else B[i, j].T @ ws[i])
            out.append(row)
        return out

    return ReferenceGame("quadratic", init, losses, xi, jac, grads)


def nonquadratic(seed: int = 2) -> ReferenceGame:
    """A 3-player general-sum game whose Jacobian changes with w:
    f_i = ½‖w_i‖² (1 + ‖w_{i+1}‖²) + a_i · tanh(w_i) · w_{i+2}   (indices mod 3),
    ξ_i = w_i (1 + ‖w_{i+1}‖²) + a_i ⊙ (1 − tanh²(w_i)) ⊙ w_{i+2}."""
    g = torch.Generator().manual_seed(seed)
    dim = 2
    a = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(3)]
    init = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(3)]

    def losses(ws: Points) -> list[Tensor]:
        out = []
        for i in range(3):
            w, u, v = ws[i], ws[(i + 1) % 3], ws[(i + 2) % 3]
            out.append(0.5 * (w @ w) * (1 + u @ u) + (a[i].to(w) * torch.tanh(w)) @ v)
        return out

    def xi(ws: Points) -> Points:
        out = []
        for i in range(3):
            w, u, v = ws[i], ws[(i + 1) % 3], ws[(i + 2) % 3]
            out.append(w * (1 + u @ u) + a[i].to(w) * (1 - torch.tanh(w) ** 2) * v)
        return out

    def jac(ws: Points) -> Tensor:
        flat = torch.cat(ws).detach().requires_grad_()
        sizes = [w.numel() for w in ws]
        jacobian = torch.autograd.functional.jacobian(lambda f: torch.cat(xi(list(torch.split(f, sizes)))), flat)
        return jacobian

    def grads(ws: Points) -> list[list[Tensor]]:
        out = []
        for i in range(3):
            row: list[Tensor] = [ws[i]] * 3  # each entry is set below
            row[i] = xi(ws)[i]
            row[(i + 1) % 3] = (ws[i] @ ws[i]) * ws[(i + 1) % 3]
            row[(i + 2) % 3] = a[i] * torch.tanh(ws[i])
            out.append(row)
        return out

    return ReferenceGame("nonquadratic", init, losses, xi, jac, grads)


#: the reference games by name: two players zero-sum, three players quadratic, three players non-quadratic
#: (:func:`regularized_bilinear`, for two-player methods, is not among them)
GAMES: dict[str, Callable[[], ReferenceGame]] = {
    "bilinear": bilinear,
    "quadratic": quadratic,
    "nonquadratic": nonquadratic,
}
