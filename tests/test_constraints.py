"""Feasible sets: projections against numpy references and the projection's
variational inequality; mirror steps; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gameopt import constraints as C


def _simplex_ref(v: np.ndarray) -> np.ndarray:
    """Duchi et al. 2008, Figure 1, one row at a time."""
    out = np.empty_like(v)
    for r, row in enumerate(v.reshape(-1, v.shape[-1])):
        u = np.sort(row)[::-1]
        css = np.cumsum(u)
        rho = max(j for j in range(1, len(u) + 1) if u[j - 1] - (css[j - 1] - 1) / j > 0)
        theta = (css[rho - 1] - 1) / rho
        out.reshape(-1, v.shape[-1])[r] = np.maximum(row - theta, 0)
    return out


SETS = {
    "nonnegative": (C.NonNegative(), lambda v: np.maximum(v, 0)),
    "box": (C.Box(-0.5, 0.25), lambda v: np.clip(v, -0.5, 0.25)),
    "ball": (C.Ball(1.5), lambda v: v * min(1.0, 1.5 / np.linalg.norm(v))),
    "simplex": (C.Simplex(), _simplex_ref),
}


@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_projection_matches_numpy_and_is_the_closest_point(name, shape) -> None:
    c, ref = SETS[name]
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        v = 2 * torch.randn(shape, generator=g, dtype=torch.float64)
        p = c.project(v)
        np.testing.assert_allclose(p.numpy(), ref(v.numpy()), rtol=1e-13, atol=1e-14)
        assert c.contains(p, tol=1e-12)
        assert torch.equal(c.project(p), p) or torch.allclose(c.project(p), p, atol=1e-15)  # idempotent
        # ⟨v − P v, y − P v⟩ ≤ 0 for every feasible y
        for _ in range(20):
            y = c.project(3 * torch.randn(shape, generator=g, dtype=torch.float64))
            if name == "simplex":
                assert ((v - p) * (y - p)).sum(-1).max() <= 1e-12
            else:
                assert ((v - p) * (y - p)).sum() <= 1e-12


def test_entropic_simplex_step_is_multiplicative_weights() -> None:
    x = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], dtype=torch.float64)
    d = torch.tensor([[0.1, -0.4, 0.2], [1.0, -1.0, 3.0]], dtype=torch.float64)
    got = C.Simplex(mirror="entropic").step(x, d)
    want = x * torch.exp(d)
    want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-15)
    assert got[1, 2] == 0  # a zero weight stays zero
    torch.testing.assert_close(C.Simplex().step(x, d), C.Simplex().project(x + d))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: C.Box(1.0, -1.0), "low <= high"),
        (lambda: C.Box(float("nan"), 1.0), "low"),
        (lambda: C.Ball(-1.0), "non-negative radius"),
        (lambda: C.Ball(float("inf")), "radius"),
        (lambda: C.Simplex(mirror="kl"), "mirror"),
    ],
)
def test_bad_sets_are_refused_at_construction(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_simplex_on_a_scalar_does_not_fit() -> None:
    with pytest.raises(ValueError, match="last dimension"):
        C.Simplex().check(torch.Size([]), "w")
