"""The one Krylov module: conjugate gradients and restarted GMRES on matrix-vector
callables over vectors given as lists of flat tensors (joint vectors).

Both return ``(x, iterations)``. On the CPU, convergence is checked every
iteration (reading a scalar costs nothing there). On other devices CG keeps its
scalars on the device and reads the residual on the host only every
``check_every`` iterations: iterations after convergence are no-ops (α = β = 0),
so it stops at the same iterate, without a host synchronisation per iteration.
GMRES reads its small Hessenberg system on the host every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Vec = list[Tensor]
MatVec = Callable[[Vec], Vec]


def dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    """⟨a, b⟩ as a 0-d float64 tensor on the first tensor's device (no host sync)."""
    parts = [torch.dot(x.reshape(-1), y.reshape(-1)).to(a[0].device, torch.float64) for x, y in zip(a, b)]
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


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
    """
    if maxiter is None:
        maxiter = sum(t.numel() for t in b)
    if x0 is None:
        x = [torch.zeros_like(t) for t in b]
        r = [t.clone() for t in b]
    else:
        x = [t.clone() for t in x0]
        r = list(torch._foreach_sub(b, matvec(x)))
    if check_every is None:
        check_every = 1 if b[0].device.type == "cpu" else 8
    if check_every > 1:
        return _cg_on_device(matvec, b, x, r, tol, atol, maxiter, check_every)
    rr = float(dot(r, r))
    threshold = tol * float(dot(b, b))
    if rr == 0 or rr < threshold or rr < atol:
        return x, 0
    p = [t.clone() for t in r]
    it = 0
    for it in range(1, maxiter + 1):  # noqa: B007 (read after the loop)
        ap = matvec(p)
        alpha = rr / float(dot(p, ap))
        torch._foreach_add_(x, p, alpha=alpha)
        torch._foreach_add_(r, ap, alpha=-alpha)
        new_rr = float(dot(r, r))
        beta, rr = new_rr / rr, new_rr
        if rr == 0 or rr < threshold or rr < atol:
            break
        p = (
            list(torch._foreach_add(r, p, alpha=beta))
            if beta == 0
            else list(torch._foreach_add(r, torch._foreach_mul(p, beta)))
        )
    return x, it


def _cg_on_device(
    matvec: MatVec, b: Vec, x: Vec, r: Vec, tol: float, atol: float, maxiter: int, check_every: int
) -> tuple[Vec, int]:
    """CG with its scalars on the device: once converged, α = β = 0 (x and r stay),
    so reading the flag every ``check_every`` iterations changes no iterate."""
    rr = dot(r, r)
    threshold = tol * dot(b, b)

    def converged(value: Tensor) -> Tensor:
        return (value == 0) | (value < threshold) | (value < atol)

    done = converged(rr)
    iterations = torch.zeros((), dtype=torch.int64, device=rr.device)
    p = [t.clone() for t in r]
    zero = torch.zeros_like(rr)
    for it in range(1, maxiter + 1):
        if (it - 1) % check_every == 0 and bool(done):
            break
        ap = matvec(p)
        alpha = torch.where(done, zero, rr / dot(p, ap))
        torch._foreach_add_(x, [t * alpha.to(t.dtype) for t in p])
        torch._foreach_sub_(r, [t * alpha.to(t.dtype) for t in ap])
        new_rr = dot(r, r)
        beta = torch.where(done, zero, new_rr / rr)
        iterations += (~done).to(torch.int64)
        rr = torch.where(done, rr, new_rr)
        done = done | converged(rr)
        p = list(torch._foreach_add(r, [t * beta.to(t.dtype) for t in p]))
    return x, int(iterations)


def gmres(
    matvec: MatVec,
    b: Vec,
    x0: Vec | None = None,
    tol: float = 1e-10,
    atol: float = 0.0,
    restart: int = 30,
    maxiter: int | None = None,
) -> tuple[Vec, int]:
    """Restarted GMRES (modified Gram–Schmidt Arnoldi, Givens rotations) for a
    general operator. Stops when ‖r‖ ≤ max(tol·‖b‖, atol) or after ``maxiter``
    matrix-vector products in all (default: 10 × the dimension)."""
    n = sum(t.numel() for t in b)
    if maxiter is None:
        maxiter = 10 * n
    restart = max(1, min(restart, n))
    x = [torch.zeros_like(t) for t in b] if x0 is None else [t.clone() for t in x0]
    bnorm = math.sqrt(float(dot(b, b)))
    threshold = max(tol * bnorm, atol)
    total = 0
    while True:
        r = list(torch._foreach_sub(b, matvec(x))) if (x0 is not None or total) else [t.clone() for t in b]
        beta = math.sqrt(float(dot(r, r)))
        if beta <= threshold or total >= maxiter:
            return x, total
        basis = [list(torch._foreach_div(r, beta))]
        h = torch.zeros(restart + 1, restart, dtype=torch.float64)
        cs, sn = torch.zeros(restart, dtype=torch.float64), torch.zeros(restart, dtype=torch.float64)
        g = torch.zeros(restart + 1, dtype=torch.float64)
        g[0] = beta
        k = 0
        for k in range(restart):
            w = matvec(basis[k])
            total += 1
            for j in range(k + 1):
                h[j, k] = dot(w, basis[j])
                torch._foreach_add_(w, basis[j], alpha=-float(h[j, k]))
            h[k + 1, k] = math.sqrt(float(dot(w, w)))
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
            hnorm = math.sqrt(float(dot(w, w)))
            if hnorm == 0:
                break
            basis.append(list(torch._foreach_div(w, hnorm)))
        m = k + 1
        y = torch.linalg.solve_triangular(h[:m, :m], g[:m].unsqueeze(1), upper=True).squeeze(1)
        for j in range(m):
            torch._foreach_add_(x, basis[j], alpha=float(y[j]))
        x0 = x
        if abs(float(g[m])) <= threshold or total >= maxiter:
            return x, total
