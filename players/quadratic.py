"""Quadratic games with known solutions: the bilinear game min_x max_y xᵀAy, the
tandem game of Letcher et al. (2019), and general-sum n-player quadratic games
ξ = Mw + c with Nash equilibrium w* = −M⁻¹c.

Players are :class:`QuadraticPlayer` modules holding one parameter vector ``w``.
Loss builders return zero-argument callables for :class:`gameopt.Game`; they read
``player.w`` at every call (never a captured tensor), so a game may substitute the
parameters while it differentiates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

Losses = Callable[[], tuple[Tensor, ...]]


class QuadraticPlayer(nn.Module):
    """A player holding one parameter vector ``w``.

    Args:
        init: the initial value (copied), a tensor or a sequence of floats.
        dtype: the parameter's dtype (default: ``init``'s, float64 for sequences).
    """

    def __init__(self, init: Tensor | Sequence[float], dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if isinstance(init, Tensor):
            value = init.detach().clone().to(dtype or init.dtype)
        else:
            value = torch.tensor(list(init), dtype=dtype or torch.float64)
        self.w = nn.Parameter(value.reshape(-1))

    def forward(self) -> Tensor:
        return self.w


# ------------------------------------------------------------------ bilinear
def bilinear_losses(x: QuadraticPlayer, y: QuadraticPlayer, A: Tensor) -> Losses:
    """min_x max_y xᵀAy as losses (xᵀAy, −xᵀAy); ξ = (Ay, −Aᵀx), equilibrium 0
    (unique when A is invertible)."""

    def losses() -> tuple[Tensor, Tensor]:
        f = x.w @ A.to(x.w) @ y.w
        return f, -f

    return losses


# -------------------------------------------------------------------- tandem
def tandem_losses(x: QuadraticPlayer, y: QuadraticPlayer) -> Losses:
    """The tandem game (Letcher et al. 2019, "Stable Opponent Shaping"), scalar x, y:
    L1 = (x+y)² − 2x, L2 = (x+y)² − 2y. ξ = (2(x+y) − 2, 2(x+y) − 2); the Nash
    equilibria are the line x + y = 1."""

    def losses() -> tuple[Tensor, Tensor]:
        s = (x.w + y.w).sum()
        return s**2 - 2 * x.w.sum(), s**2 - 2 * y.w.sum()

    return losses


# ------------------------------------------------------- n-player quadratic
@dataclass
class QuadraticGame:
    """A general-sum n-player quadratic game,

    L_i(w) = ½ w_iᵀ M_ii w_i + Σ_{j≠i} w_iᵀ M_ij w_j + c_iᵀ w_i,

    so that ξ = Mw + c. With every M_ii symmetric positive definite each L_i is
    strictly convex in w_i, and w* = −M⁻¹c (M invertible) is the unique Nash
    equilibrium.

    Attributes:
        blocks: ``blocks[i][j]`` = M_ij, a (d_i, d_j) tensor.
        c: ``c[i]``, a (d_i,) tensor.
    """

    blocks: list[list[Tensor]]
    c: list[Tensor]

    @property
    def num_players(self) -> int:
        return len(self.c)

    @property
    def M(self) -> Tensor:
        """The whole matrix M (the game Jacobian)."""
        return torch.cat([torch.cat(row, 1) for row in self.blocks])

    def nash_equilibrium(self) -> list[Tensor]:
        """w* = −M⁻¹c, one tensor per player."""
        w = torch.linalg.solve(self.M, -torch.cat(self.c))
        return list(torch.split(w, [len(ci) for ci in self.c]))

    def losses(self, players: Sequence[QuadraticPlayer]) -> Losses:
        """The losses callable over ``players`` (one per player, ``w`` of size d_i)."""
        n = self.num_players
        if len(players) != n:
            raise ValueError(f"the game has {n} players, got {len(players)}")

        def losses() -> tuple[Tensor, ...]:
            ws = [p.w for p in players]
            out = []
            for i in range(n):
                wi = ws[i]
                f = 0.5 * wi @ self.blocks[i][i].to(wi) @ wi + self.c[i].to(wi) @ wi
                for j in range(n):
                    if j != i:
                        f = f + wi @ self.blocks[i][j].to(wi) @ ws[j]
                out.append(f)
            return tuple(out)

        return losses


def random_quadratic_game(
    n_players: int = 3, dim: int = 2, coupling: float = 1.0, seed: int = 0, dtype: torch.dtype = torch.float64
) -> QuadraticGame:
    """A random :class:`QuadraticGame`: M_ii = RRᵀ/d + I (symmetric positive
    definite), M_ij = coupling · N(0, 1/d) entries, c ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    blocks: list[list[Tensor]] = []
    for i in range(n_players):
        row = []
        for j in range(n_players):
            R = torch.randn(dim, dim, generator=g, dtype=dtype) / dim**0.5
            row.append(R @ R.T + torch.eye(dim, dtype=dtype) if i == j else coupling * R)
        blocks.append(row)
    c = [torch.randn(dim, generator=g, dtype=dtype) for _ in range(n_players)]
    return QuadraticGame(blocks, c)
