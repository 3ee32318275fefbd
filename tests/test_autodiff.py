"""Jacobian products through the layers GANs use: convolutions, normalization,
attention, recurrent layers; BatchNorm statistics untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gameopt


class ConvDisc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.LeakyReLU(0.2),
            nn.Conv2d(4, 4, 3, stride=2, padding=1),
            nn.GroupNorm(2, 4),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


class ConvGen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4 * 4 * 4)
        self.net = nn.Sequential(
            nn.BatchNorm2d(4), nn.ReLU(), nn.ConvTranspose2d(4, 1, 4, stride=2, padding=1), nn.Tanh()
        )

    def forward(self, z):
        return self.net(self.fc(z).view(-1, 4, 4, 4))


class AttnDisc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):  # x: (batch, tokens, 2)
        h = self.embed(x)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        q = torch.nn.functional.scaled_dot_product_attention(h, h, h)
        return self.out(q.mean(1)).squeeze(-1)


class LSTMGen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, 6, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, z):
        return self.out(self.lstm(z)[0])


def _gan_game(gen, disc, real, noise):
    def losses():
        r, f = disc(real), disc(gen(noise))
        d = nn.functional.softplus(-r).mean() + nn.functional.softplus(f).mean()
        return nn.functional.softplus(-f).mean(), d

    return gameopt.Game([gen, disc], losses)


def _explicit_jacobian(game):
    """J column by column via finite differences of ξ (central, float64)."""
    w = game.layout.data[0]
    n = w.numel()
    cols = []
    eps = 1e-6
    for k in range(n):
        old = w[k].item()
        w[k] = old + eps
        plus = torch.cat([t if isinstance(t, torch.Tensor) else torch.cat(t) for t in game.vector_field()])
        w[k] = old - eps
        minus = torch.cat([t if isinstance(t, torch.Tensor) else torch.cat(t) for t in game.vector_field()])
        w[k] = old
        cols.append((plus - minus) / (2 * eps))
    return torch.stack(cols, 1)


def _cases():
    torch.manual_seed(0)
    conv = (ConvGen().double(), ConvDisc().double(), torch.randn(6, 1, 8, 8).double(), torch.randn(6, 4).double())
    attn = (
        nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)).double(),
        AttnDisc().double(),
        torch.randn(4, 3, 2).double(),
        torch.randn(4, 3, 2).double(),
    )
    lstm = (LSTMGen().double(), AttnDisc().double(), torch.randn(4, 3, 2).double(), torch.randn(4, 3, 2).double())
    return {"conv-batchnorm": conv, "attention-layernorm": attn, "lstm": lstm}


@pytest.mark.parametrize("case", ["conv-batchnorm", "attention-layernorm", "lstm"])
def test_jacobian_products_through_gan_layers(case) -> None:
    gen, disc, real, noise = _cases()[case]
    for m in (gen, disc):
        m.eval()  # deterministic ξ for the finite-difference reference
    game = _gan_game(gen, disc, real, noise)
    J = _explicit_jacobian(game)
    g = torch.Generator().manual_seed(1)
    v = tuple(torch.randn(p.numel, generator=g, dtype=torch.float64) for p in game.players)
    flat_v = torch.cat(v)
    jv = torch.cat(game.jvp(v))
    jtv = torch.cat(game.vjp(v))
    torch.testing.assert_close(jv, J @ flat_v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(jtv, J.T @ flat_v, rtol=1e-5, atol=1e-6)
    # the off-diagonal product H_o v, through its own kept graph
    n0 = game.players[0].numel
    Ho = J.clone()
    Ho[:n0, :n0] = 0
    Ho[n0:, n0:] = 0
    ho_v = game.linearize().offdiag_jvp(game.layout.from_per_player(v))
    torch.testing.assert_close(torch.cat(game.layout.per_player(ho_v)), Ho @ flat_v, rtol=1e-5, atol=1e-6)
    # the double-backward fallback agrees with forward mode
    game._forward_mode.ok = False
    torch.testing.assert_close(torch.cat(game.jvp(v)), jv, rtol=1e-10, atol=1e-12)


def test_training_mode_batchnorm_statistics_do_not_change_during_jacobian_products() -> None:
    gen, disc, real, noise = _cases()["conv-batchnorm"]
    game = _gan_game(gen, disc, real, noise)
    stats = {
        k: v.clone()
        for k, v in list(gen.state_dict().items()) + list(disc.state_dict().items())
        if "running" in k or "num_batches" in k
    }
    v = tuple(torch.randn(p.numel, dtype=torch.float64) for p in game.players)
    game.jvp(v)
    game.vjp(v)
    lin = game.linearize()
    lin.offdiag_jvp(lin.xi)
    lin.chi()
    after = dict(list(gen.state_dict().items()) + list(disc.state_dict().items()))
    for k, val in stats.items():
        assert torch.equal(after[k], val), k
    # a real training step still updates them
    gameopt.Game([gen, disc], game.losses, algorithm=gameopt.SimGD(0.01)).step()
    assert not torch.equal(gen.net[0].running_mean, stats["net.0.running_mean"])


def test_second_order_step_on_a_conv_gan_in_training_mode() -> None:
    gen, disc, real, noise = _cases()["conv-batchnorm"]
    ref = copy.deepcopy(gen)
    game = _gan_game(gen, disc, real, noise)
    game.algorithm = gameopt.SGA(0.01)
    game.algorithm.bind(game)
    game.step()
    assert not torch.equal(gen.fc.weight, ref.fc.weight)
    assert all(torch.isfinite(t).all() for t in game.layout.data)
