"""The one Krylov module: conjugate gradients and restarted GMRES on matrix-vector
callables over joint vectors (:class:`~gameopt.vec.Vec`).

Both return ``(x, iterations)``. On the CPU, convergence is checked every
iteration (reading a scalar costs nothing there). On other devices CG keeps its
scalars on the device and reads the residual on the host only every
``check_every`` iterations: iterations after convergence are no-ops (α = β = 0),
so it stops at the same iterate, without a host synchronisation per iteration.
GMRES keeps its small Hessenberg system on the device there, reads convergence
every ``check_every`` products and solves once per restart cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .vec import Vec

MatVec = Callable[[Vec], Vec]

__all__ = ["BreakdownError", "MatVec", "cg", "gmres"]


class BreakdownError(ArithmeticError):
    """CG met a search direction p of zero curvature, pᵀAp = 0, before the residual
    vanished: the operator is singular (or indefinite) along p, and CG cannot go on.
    Callers name the operator and what to do (a damping, a regularization); nothing
    catches it to compute something else."""


def _breakdown() -> BreakdownError:
    return BreakdownError(
        "CG broke down: a search direction p has zero curvature (pᵀAp = 0) while the residual is not 0, "
        "so the operator is singular (or indefinite) and the system has no solution CG can reach; "
        "regularize it (solve (A + λI) x = b with λ > 0)"
    )


def cg(
    matvec: MatVec,
    b: Vec,
    x0: Vec | None = None,
    tol: float = 1e-10,
    atol: float = 0.0,
    maxiter: int | None = None,
    check_every: int | None = None,
) -> tuple[Vec, int]:
    """Conjugate gradients for a symmetric positive definite operator.

    Stops when ‖r‖² < tol·‖b‖² or ‖r‖² < atol (squared norms, as in the CGDs
    package's ACGD), when r = 0, or after ``maxiter`` iterations (default: the
    dimension). ``check_every``: read the residual on the host every this many
    iterations (default: 1 on the CPU, 8 elsewhere; see the module docstring).

    Raises:
        BreakdownError: a direction p with pᵀAp = 0 before convergence (a singular
            operator: a zero matrix, or b outside its range).
    """
    b = Vec(b)
    if maxiter is None:
        maxiter = sum(t.numel() for t in b)
    if x0 is None:
        x, r = b.zeros_like(), b.clone()
    else:
        x = Vec(x0).clone()
        r = b - matvec(x)
    if check_every is None:
        check_every = 1 if b[0].device.type == "cpu" else 8
    if check_every > 1:
        return _cg_on_device(matvec, b, x, r, tol, atol, maxiter, check_every)
    rr = float(r.dot(r))
    threshold = tol * float(b.dot(b))
    if rr == 0 or rr < threshold or rr < atol:
        return x, 0
    p = r.clone()
    it = 0
    for it in range(1, maxiter + 1):  # noqa: B007 (read after the loop)
        ap = Vec(matvec(p))
        curvature = float(p.dot(ap))
        if curvature == 0:
            raise _breakdown()
        alpha = rr / curvature
        x.add_(p, alpha=alpha)
        r.add_(ap, alpha=-alpha)
        new_rr = float(r.dot(r))
        beta, rr = new_rr / rr, new_rr
        if rr == 0 or rr < threshold or rr < atol:
            break
        p = r.add(p, alpha=beta) if beta == 0 else r + p * beta
    return x, it


def _cg_on_device(
    matvec: MatVec, b: Vec, x: Vec, r: Vec, tol: float, atol: float, maxiter: int, check_every: int
) -> tuple[Vec, int]:
    """CG with its scalars on the device: once converged, α = β = 0 (x and r stay),
    so reading the flag every ``check_every`` iterations changes no iterate. A
    breakdown (pᵀAp = 0) stops it the same way and is read with the count, at the end."""
    rr = r.dot(r)
    threshold = tol * b.dot(b)

    def converged(value: Tensor) -> Tensor:
        return (value == 0) | (value < threshold) | (value < atol)

    done = converged(rr)
    broke = torch.zeros_like(done)
    iterations = torch.zeros((), dtype=torch.int64, device=rr.device)
    p = r.clone()
    zero = torch.zeros_like(rr)
    for it in range(1, maxiter + 1):
        if (it - 1) % check_every == 0 and bool(done):
            break
        ap = Vec(matvec(p))
        curvature = p.dot(ap)
        broke |= ~done & (curvature == 0)
        done = done | broke
        alpha = torch.where(done, zero, rr / curvature)
        x += p * alpha
        r -= ap * alpha
        new_rr = r.dot(r)
        beta = torch.where(done, zero, new_rr / rr)
        iterations += (~done).to(torch.int64)
        rr = torch.where(done, rr, new_rr)
        done = done | converged(rr)
        p = r + p * beta
    count, failed = torch.stack([iterations, broke.to(torch.int64)]).tolist()  # one read
    if failed:
        raise _breakdown()
    return x, count


def gmres(
    matvec: MatVec,
    b: Vec,
    x0: Vec | None = None,
    tol: float = 1e-10,
    atol: float = 0.0,
    restart: int = 30,
    maxiter: int | None = None,
    check_every: int | None = None,
) -> tuple[Vec, int]:
    """Restarted GMRES (modified Gram–Schmidt Arnoldi, Givens rotations) for a
    general operator. Stops when ‖r‖ ≤ max(tol·‖b‖, atol) or after ``maxiter``
    matrix-vector products in all (default: 10 × the dimension). ``check_every``:
    as for :func:`cg` (default: 1 on the CPU, 8 elsewhere); off the CPU the small
    Hessenberg system stays on the device and is read once per restart cycle."""
    b = Vec(b)
    n = sum(t.numel() for t in b)
    if maxiter is None:
        maxiter = 10 * n
    restart = max(1, min(restart, n))
    x = b.zeros_like() if x0 is None else Vec(x0).clone()
    threshold = max(tol * math.sqrt(float(b.dot(b))), atol)
    if check_every is None:
        check_every = 1 if b[0].device.type == "cpu" else 8
    total = 0
    while True:
        r = b - matvec(x) if (x0 is not None or total) else b.clone()
        beta = math.sqrt(float(r.dot(r)))
        if beta <= threshold or total >= maxiter:
            return x, total
        if check_every > 1:
            total += _gmres_cycle_on_device(matvec, x, r, beta, threshold, min(restart, maxiter - total), check_every)
            x0 = x
            continue
        basis = [r / beta]
        h = torch.zeros(restart + 1, restart, dtype=torch.float64)
        cs, sn = torch.zeros(restart, dtype=torch.float64), torch.zeros(restart, dtype=torch.float64)
        g = torch.zeros(restart + 1, dtype=torch.float64)
        g[0] = beta
        k = 0
        for k in range(restart):
            w = Vec(matvec(basis[k]))
            total += 1
            for j in range(k + 1):
                h[j, k] = w.dot(basis[j])
                w.add_(basis[j], alpha=-float(h[j, k]))
            h[k + 1, k] = math.sqrt(float(w.dot(w)))
            for j in range(k):  # apply the previous rotations to the new column
                hj, hj1 = h[j, k].clone(), h[j + 1, k].clone()
                h[j, k] = cs[j] * hj + sn[j] * hj1
                h[j + 1, k] = -sn[j] * hj + cs[j] * hj1
            denom = math.hypot(float(h[k, k]), float(h[k + 1, k]))
            cs[k], sn[k] = (1.0, 0.0) if denom == 0 else (float(h[k, k]) / denom, float(h[k + 1, k]) / denom)
            h[k, k] = denom
            h[k + 1, k] = 0.0
            g[k + 1] = -sn[k] * g[k]
            g[k] = cs[k] * g[k]
            happy = float(h[k + 1, k]) == 0 and denom == 0
            if abs(float(g[k + 1])) <= threshold or total >= maxiter or happy:
                break
            hnorm = math.sqrt(float(w.dot(w)))
            if hnorm == 0:
                break
            basis.append(w / hnorm)
        m = k + 1
        y = torch.linalg.solve_triangular(h[:m, :m], g[:m].unsqueeze(1), upper=True).squeeze(1)
        for j in range(m):
            x.add_(basis[j], alpha=float(y[j]))
        x0 = x
        if abs(float(g[m])) <= threshold or total >= maxiter:
            return x, total


def _gmres_cycle_on_device(
    matvec: MatVec, x: Vec, r: Vec, beta: float, threshold: float, steps: int, check_every: int
) -> int:
    """One restart cycle of GMRES with the Hessenberg system on the device; ``x`` is
    updated in place and the number of useful products returned. Convergence is
    read every ``check_every`` products; the products after it are not used (the
    solution combines the first m basis vectors, m counted on the device)."""
    dev = r[0].device
    f64: dict[str, Any] = {"dtype": torch.float64, "device": dev}
    h = torch.zeros(steps + 1, steps, **f64)
    cs, sn, g = torch.zeros(steps, **f64), torch.zeros(steps, **f64), torch.zeros(steps + 1, **f64)
    g[0] = beta
    basis = [r / beta]
    done = torch.zeros((), dtype=torch.bool, device=dev)
    m = torch.zeros((), dtype=torch.int64, device=dev)
    one = torch.ones((), **f64)
    for k in range(steps):
        if k and k % check_every == 0 and bool(done):
            break
        w = Vec(matvec(basis[k]))
        for j in range(k + 1):
            h[j, k] = w.dot(basis[j])
            w -= basis[j] * h[j, k]
        h[k + 1, k] = w.norm()
        for j in range(k):  # the previous rotations on the new column
            hj, hj1 = h[j, k].clone(), h[j + 1, k].clone()
            h[j, k] = cs[j] * hj + sn[j] * hj1
            h[j + 1, k] = -sn[j] * hj + cs[j] * hj1
        denom = torch.hypot(h[k, k], h[k + 1, k])
        safe = torch.where(denom > 0, denom, one)
        cs[k] = torch.where(denom > 0, h[k, k] / safe, one)
        sn[k] = torch.where(denom > 0, h[k + 1, k] / safe, 0 * one)
        hnorm = h[k + 1, k].clone()
        h[k, k], h[k + 1, k] = denom, 0.0
        g[k + 1] = -sn[k] * g[k]
        g[k] = cs[k] * g[k]
        m = torch.where(done, m, m + 1)
        done = done | (g[k + 1].abs() <= threshold) | (hnorm == 0)
        basis.append(w / torch.where(hnorm > 0, hnorm, one))
    useful = int(m)
    y = torch.linalg.solve_triangular(h[:useful, :useful], g[:useful].unsqueeze(1), upper=True).squeeze(1)
    for j in range(useful):
        x += basis[j] * y[j]
    return useful
