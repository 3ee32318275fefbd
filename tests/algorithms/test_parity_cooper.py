"""Extra-SGD and Extra-Adam against cooper-optim's implementations (test extra),
iterate for iterate on a small GAN in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from models import gan_mlps
from torch import nn

import gameopt

cooper = pytest.importorskip("cooper")


def _losses(gen, disc, x, z):
    real, fake = disc(x), disc(gen(z))
    d = nn.functional.softplus(-real).mean() + nn.functional.softplus(fake).mean()
    g = nn.functional.softplus(-fake).mean()
    return g, d


def _grads(gen, disc, x, z):
    g_loss, d_loss = _losses(gen, disc, x, z)
    for p in list(gen.parameters()) + list(disc.parameters()):
        p.grad = None
    torch.autograd.backward(g_loss, inputs=list(gen.parameters()), retain_graph=True)
    torch.autograd.backward(d_loss, inputs=list(disc.parameters()))


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: gameopt.Extragradient([0.1, 0.05]), lambda ps, lr: cooper.optim.ExtraSGD(ps, lr=lr)),
        (
            lambda: gameopt.Extragradient([0.1, 0.05], update=gameopt.Momentum(0.7)),
            lambda ps, lr: cooper.optim.ExtraSGD(ps, lr=lr, momentum=0.7),
        ),
        (
            lambda: gameopt.Extragradient([0.01, 0.02], update=gameopt.Adam((0.5, 0.9))),
            lambda ps, lr: cooper.optim.ExtraAdam(ps, lr=lr, betas=(0.5, 0.9)),
        ),
    ],
    ids=["ExtraSGD", "ExtraSGD-momentum", "ExtraAdam"],
)
def test_matches_cooper_iterate_for_iterate(ours, theirs) -> None:
    gen, disc = gan_mlps()
    ref_gen, ref_disc = copy.deepcopy(gen), copy.deepcopy(disc)
    algo = ours()
    game = gameopt.Game([gen, disc], lambda x, z: _losses(gen, disc, x, z), algorithm=algo)
    lrs = algo.lrs
    opt_g = theirs(ref_gen.parameters(), lrs[0])
    opt_d = theirs(ref_disc.parameters(), lrs[1])
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        x = torch.randn(16, 2, generator=g, dtype=torch.float64) + 1.0
        z = torch.randn(16, 2, generator=g, dtype=torch.float64)
        game.step(x, z)
        _grads(ref_gen, ref_disc, x, z)
        opt_g.extrapolation()
        opt_d.extrapolation()
        _grads(ref_gen, ref_disc, x, z)
        opt_g.step()
        opt_d.step()
        ours_flat = torch.cat([p.detach().reshape(-1) for p in list(gen.parameters()) + list(disc.parameters())])
        ref_flat = torch.cat([p.detach().reshape(-1) for p in list(ref_gen.parameters()) + list(ref_disc.parameters())])
        torch.testing.assert_close(ours_flat, ref_flat, rtol=1e-12, atol=1e-13)
