"""The Krylov solvers against dense solves, and CG's device path (residual read
every k iterations) against its host path."""

from __future__ import annotations

import pytest
import torch

from gameopt.linalg import cg, gmres
from gameopt.vec import Vec


def _spd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return torch.eye(n, dtype=torch.float64) + 0.1 * a @ a.T


def _split(v: torch.Tensor) -> list[torch.Tensor]:
    return [v[:7].clone(), v[7:].clone()]  # a joint vector of two groups


def _op(m: torch.Tensor):
    return lambda x: _split(m @ torch.cat(x))


@pytest.mark.parametrize("warm", [False, True])
def test_cg_and_gmres_solve_the_system(warm) -> None:
    m = _spd(20, 0)
    b = torch.randn(20, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = torch.linalg.solve(m, b)
    x0 = _split(torch.ones(20, dtype=torch.float64)) if warm else None
    x, it = cg(_op(m), _split(b), x0=x0, tol=1e-28)
    torch.testing.assert_close(torch.cat(x), want, rtol=1e-9, atol=1e-10)
    assert 0 < it <= 20
    nonsym = m + 0.3 * torch.randn(20, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x, _ = gmres(_op(nonsym), _split(b), x0=x0, tol=1e-13, restart=8)
    torch.testing.assert_close(torch.cat(x), torch.linalg.solve(nonsym, b), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("check_every", [2, 3, 8])
@pytest.mark.parametrize(("tol", "maxiter"), [(1e-20, None), (1e-8, None), (1e-30, 7)])
def test_cg_device_path_stops_at_the_same_iterate(check_every, tol, maxiter) -> None:
    """Reading the residual every k iterations, the iterations after convergence
    are no-ops: same count, same iterate (to rounding of α·p)."""
    m = _spd(30, 3)
    b = _split(torch.randn(30, dtype=torch.float64, generator=torch.Generator().manual_seed(4)))
    calls = {"n": 0}

    def op(x):
        calls["n"] += 1
        return _op(m)(x)

    host, it_host = cg(op, b, tol=tol, maxiter=maxiter, check_every=1)
    host_calls, calls["n"] = calls["n"], 0
    dev, it_dev = cg(op, b, tol=tol, maxiter=maxiter, check_every=check_every)
    assert it_dev == it_host
    assert host_calls <= calls["n"] < host_calls + check_every  # at most k − 1 no-op iterations
    torch.testing.assert_close(torch.cat(dev), torch.cat(host), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("check_every", [1, 4])
def test_cg_stops_on_an_exact_solution_without_dividing_by_zero(check_every) -> None:
    """tol = 0 and a system solved exactly in one iteration: r = 0, no 0/0."""
    b = _split(torch.arange(1.0, 31.0, dtype=torch.float64))
    x, it = cg(lambda v: [2.0 * t for t in v], b, tol=0.0, maxiter=10, check_every=check_every)
    assert it == 1
    torch.testing.assert_close(torch.cat(x), torch.arange(1.0, 31.0, dtype=torch.float64) / 2)
    x, it = cg(lambda v: [2.0 * t for t in v], b, x0=x, tol=0.0, check_every=check_every)
    assert it == 0


def test_dot_stays_on_the_device_in_float64() -> None:
    a = _split(torch.ones(30, dtype=torch.float32))
    out = Vec(a).dot(a)
    assert out.dtype == torch.float64 and out.device == a[0].device and float(out) == 30.0


@pytest.mark.parametrize("check_every", [2, 3, 8])
@pytest.mark.parametrize(
    ("tol", "restart", "maxiter"), [(1e-10, 30, None), (1e-10, 4, None), (1e-6, 30, None), (1e-14, 5, 13)]
)
def test_gmres_device_path_takes_the_same_solution(check_every, tol, restart, maxiter) -> None:
    """The Hessenberg system on the device, convergence read every k products: the
    same useful products and the same solution (to rounding). Here GMRES converges
    after 23, 28 and 16 products: inside a block of k, so products after it run."""
    g = torch.Generator().manual_seed(7)
    m = torch.eye(30, dtype=torch.float64) + 0.08 * torch.randn(30, 30, dtype=torch.float64, generator=g)
    b = _split(torch.randn(30, dtype=torch.float64, generator=g))
    x0 = _split(0.1 * torch.ones(30, dtype=torch.float64))
    host, n_host = gmres(_op(m), b, x0=x0, tol=tol, restart=restart, maxiter=maxiter, check_every=1)
    dev, n_dev = gmres(_op(m), b, x0=x0, tol=tol, restart=restart, maxiter=maxiter, check_every=check_every)
    assert n_dev == n_host
    torch.testing.assert_close(torch.cat(dev), torch.cat(host), rtol=1e-9, atol=1e-10)
    residual = torch.linalg.norm(m @ torch.cat(dev) - torch.cat(b)) / torch.linalg.norm(torch.cat(b))
    assert float(residual) <= (1.01 * tol if maxiter is None else 1.0)
