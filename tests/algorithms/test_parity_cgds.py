"""ACGD against the authors' package (PyPI ``cgds``, test extra), iterate for
iterate on a small zero-sum GAN."""

from __future__ import annotations

import copy

import pytest
import torch
from models import gan_mlps

import gameopt

CGDs = pytest.importorskip("CGDs")


@pytest.fixture
def float64_default():
    # cgds allocates its CG start vector with the default dtype
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _f(gen, disc, x, z):
    return disc(x).mean() - disc(gen(z)).mean() + 0.1 * (disc(x) ** 2).mean()


@pytest.mark.parametrize(
    "lrs, tols, close",
    [
        # the authors' defaults stop CG at a relative residual of 1e-6: iterates agree to that order
        ((0.01, 0.01), {}, 1e-7),
        ((0.02, 0.005), {}, 1e-7),
        # tight solves: iterates agree to rounding
        ((0.02, 0.005), {"tol": 1e-26, "atol": 1e-40}, 1e-12),
    ],
)
def test_acgd_matches_cgds(float64_default, lrs, tols, close) -> None:
    gen, disc = gan_mlps()
    ref_gen, ref_disc = copy.deepcopy(gen), copy.deepcopy(disc)
    # players: the generator minimizes f, the discriminator minimizes −f
    game = gameopt.Game(
        [gen, disc],
        lambda x, z: (lambda f: (f, -f))(_f(gen, disc, x, z)),
        algorithm=gameopt.ACGD(list(lrs), **tols),
    )
    ref = CGDs.ACGD(
        max_params=ref_disc.parameters(), min_params=ref_gen.parameters(), lr_max=lrs[1], lr_min=lrs[0], **tols
    )
    g = torch.Generator().manual_seed(1)
    for _ in range(8):
        x = torch.randn(16, 2, generator=g) + 1.0
        z = torch.randn(16, 2, generator=g)
        game.step(x, z)
        ref.zero_grad()
        ref.step(_f(ref_gen, ref_disc, x, z))
        ours = torch.cat([p.detach().reshape(-1) for p in list(gen.parameters()) + list(disc.parameters())])
        theirs = torch.cat([p.detach().reshape(-1) for p in list(ref_gen.parameters()) + list(ref_disc.parameters())])
        torch.testing.assert_close(ours, theirs, rtol=close, atol=close)
