"""Diagnostics of a game at a point: the Jacobian as a SciPy operator, its
spectrum, the Hamiltonian, and the split of J into potential and rotation.

SciPy and Matplotlib are imported by the functions that use them, so that
``import gameopt`` stays light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .vec import Vec

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from scipy.sparse.linalg import LinearOperator

    from .protocols import Linearizable, Linearization


def _to_numpy(vec: Vec) -> np.ndarray:
    return np.concatenate([t.detach().double().cpu().numpy() for t in vec])


def _from_numpy(game: Linearizable, x: np.ndarray) -> Vec:
    out, pos = [], 0
    for t in game.layout.data:
        n = t.numel()
        out.append(torch.as_tensor(np.ascontiguousarray(x[pos : pos + n]).real).to(t.device, t.dtype))
        pos += n
    return Vec(out)


def jacobian_operator(game: Linearizable, *args: Any, **kwargs: Any) -> LinearOperator:
    """J = ∂ξ/∂w at the current point as a ``scipy.sparse.linalg.LinearOperator``
    over the joint vector (float64): ``matvec`` is Jv, ``rmatvec`` Jᵀv. The graph
    is built once; each product costs one reverse pass after the first.

    Args:
        game: a :class:`~gameopt.Game` (anything with ``layout`` and ``linearize``).
        args, kwargs: passed on to the game's losses.

    Returns:
        An (n, n) ``LinearOperator``, n the number of parameters of all players.

    Raises:
        gameopt.NonFiniteError: ξ is not finite at the current point.
    """
    lin = game.linearize(*args, **kwargs)
    return _operator(game, lin)


def _operator(game: Linearizable, lin: Linearization) -> LinearOperator:
    from scipy.sparse.linalg import LinearOperator

    n = sum(t.numel() for t in game.layout.data)

    def matvec(x: np.ndarray) -> np.ndarray:
        return _to_numpy(lin.jvp_many(_from_numpy(game, np.ravel(x))))

    def rmatvec(x: np.ndarray) -> np.ndarray:
        return _to_numpy(lin.vjp(_from_numpy(game, np.ravel(x))))

    return LinearOperator((n, n), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)


def eigenvalues(game: Linearizable, *args: Any, k: int = 6, dense_below: int = 400, **kwargs: Any) -> np.ndarray:
    """The ``k`` eigenvalues of J of largest modulus (all of them when the game has
    fewer than ``dense_below`` parameters: J is then formed column by column).
    Real parts measure the potential (attracting when positive), imaginary parts
    the rotation (Balduzzi et al. 2018, `The Mechanics of n-Player Differentiable
    Games <https://arxiv.org/abs/1802.05642>`_).

    Args:
        game: a :class:`~gameopt.Game`.
        args, kwargs: passed on to the game's losses.
        k: how many eigenvalues (largest modulus first) for large games.
        dense_below: below this many parameters, all eigenvalues of the dense J.

    Returns:
        Complex eigenvalues, sorted by decreasing modulus.
    """
    from scipy.sparse.linalg import eigs

    op = jacobian_operator(game, *args, **kwargs)
    n = op.shape[0]
    if n < dense_below:
        J = np.stack([op.matvec(e) for e in np.eye(n)], axis=1)
        vals = np.linalg.eigvals(J)
    else:
        vals = eigs(op, k=min(k, n - 2), which="LM", return_eigenvectors=False)
    return vals[np.argsort(-np.abs(vals))]


@dataclass
class Decomposition:
    """The vector field's norm and J's parts along ξ: S = ½(J + Jᵀ), A = ½(J − Jᵀ)."""

    xi_norm: float  # ‖ξ‖
    hamiltonian: float  # ½‖ξ‖²
    potential: float  # ⟨ξ, Sξ⟩ / ‖ξ‖² (= ⟨ξ, Jξ⟩ / ‖ξ‖²)
    rotation: float  # ‖Aξ‖ / ‖ξ‖
    sym_norm: float  # ‖Sξ‖
    antisym_norm: float  # ‖Aξ‖


def decompose(game: Linearizable, *args: Any, **kwargs: Any) -> Decomposition:
    """‖ξ‖, the Hamiltonian ½‖ξ‖², and the symmetric (potential) and antisymmetric
    (rotational) parts of J along ξ: S = ½(J + Jᵀ), A = ½(J − Jᵀ) (Balduzzi et al. 2018,
    `The Mechanics of n-Player Differentiable Games <https://arxiv.org/abs/1802.05642>`_).

    Args:
        game: a :class:`~gameopt.Game`.
        args, kwargs: passed on to the game's losses.

    Returns:
        A :class:`Decomposition` (floats).
    """
    lin = game.linearize(*args, **kwargs)
    xi = _to_numpy(lin.xi)
    jxi = _to_numpy(lin.jvp(lin.xi))
    jtxi = _to_numpy(lin.vjp(lin.xi))
    sxi, axi = 0.5 * (jxi + jtxi), 0.5 * (jxi - jtxi)
    sq = float(xi @ xi)
    norm = float(np.sqrt(sq))
    return Decomposition(
        xi_norm=norm,
        hamiltonian=0.5 * sq,
        potential=float(xi @ sxi) / sq if sq else 0.0,
        rotation=float(np.linalg.norm(axi)) / norm if norm else 0.0,
        sym_norm=float(np.linalg.norm(sxi)),
        antisym_norm=float(np.linalg.norm(axi)),
    )


def plot_spectrum(
    values: np.ndarray, ax: Axes | None = None, label: str | None = None, title: str = "Game Jacobian spectrum"
) -> Axes:
    """Scatter eigenvalues in the complex plane (real part: potential, imaginary
    part: rotation).

    Args:
        values: complex eigenvalues, as :func:`eigenvalues` returns them.
        ax: the axes to draw on (default: a new figure's).
        label: the legend entry.
        title: the axes' title.

    Returns:
        The axes drawn on.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 4))
    ax.scatter(np.real(values), np.imag(values), s=14, alpha=0.8, label=label or "eigenvalues")
    ax.axhline(0, color="0.7", lw=0.8)
    ax.axvline(0, color="0.7", lw=0.8)
    ax.set_xlabel("Re λ (potential)")
    ax.set_ylabel("Im λ (rotation)")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return ax
