"""Generator and discriminator MLPs for 2-D data, mixture-of-Gaussians data, and
the non-saturating GAN losses."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

ACTIVATIONS = {"relu": nn.ReLU, "leaky": lambda: nn.LeakyReLU(0.2), "tanh": nn.Tanh, "elu": nn.ELU}


INITS = ("default", "xavier", "trunc_normal")


def init_linear(layer: nn.Linear, scheme: str) -> None:
    """Initialize one layer in place (from the global RNG):

    * ``"default"``: PyTorch's (weights and biases U(−1/√fan_in, 1/√fan_in));
    * ``"xavier"``: weights U(−a, a), a = √(6 / (fan_in + fan_out)) (Glorot & Bengio
      2010; TF-slim's ``fully_connected`` default), zero biases;
    * ``"trunc_normal"``: weights N(0, s²) truncated to ±2s, s = 1/√fan_in (Sonnet 1's
      ``Linear`` default, TF's ``truncated_normal_initializer`` semantics: s is the
      std *before* truncation, so the weights' std is ≈ 0.88 s), zero biases.
    """
    if scheme not in INITS:
        raise ValueError(f"unknown init {scheme!r}; choose from {list(INITS)}")
    if scheme == "default":
        return
    with torch.no_grad():
        if scheme == "xavier":
            nn.init.xavier_uniform_(layer.weight)
        else:
            s = 1.0 / math.sqrt(layer.in_features)
            nn.init.trunc_normal_(layer.weight, std=s, a=-2 * s, b=2 * s)
        nn.init.zeros_(layer.bias)


def mlp(
    n_in: int, n_out: int, hidden: int = 64, depth: int = 2, act: str = "relu", init: str = "default"
) -> nn.Sequential:
    """``depth`` hidden layers of width ``hidden`` with activation ``act`` (one of
    :data:`ACTIVATIONS`), every layer initialized by :func:`init_linear`. On the 2-D
    mixtures, tanh networks learn the modes in a few thousand steps where ReLU ones
    of the same size mostly collapse."""
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; choose from {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    width = n_in
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), ACTIVATIONS[act]()]
        width = hidden
    layers.append(nn.Linear(width, n_out))
    for layer in layers:
        if isinstance(layer, nn.Linear):
            init_linear(layer, init)
    return nn.Sequential(*layers)


class Generator(nn.Module):
    def __init__(
        self, latent: int = 2, hidden: int = 64, depth: int = 2, act: str = "relu", init: str = "default"
    ) -> None:
        super().__init__()
        self.latent = latent
        self.net = mlp(latent, 2, hidden, depth, act, init)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 64, depth: int = 2, act: str = "relu", init: str = "default") -> None:
        super().__init__()
        self.net = mlp(2, 1, hidden, depth, act, init)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(-1)


def ring_modes(n: int = 8, radius: float = 2.0) -> Tensor:
    angles = torch.arange(n, dtype=torch.float32) * (2 * math.pi / n)
    return torch.stack([radius * torch.cos(angles), radius * torch.sin(angles)], 1)


def grid_modes(k: int = 5, spacing: float = 2.0) -> Tensor:
    r = (torch.arange(k, dtype=torch.float32) - (k - 1) / 2) * spacing
    return torch.cartesian_prod(r, r)


def sample_mixture(
    modes: Tensor, n: int, std: float, generator: torch.Generator | None = None, balanced: bool = False
) -> Tensor:
    """``n`` points from the equal-weight mixture of N(mode, std² I). With ``balanced``,
    sample k comes from mode k mod len(modes), so each mode has ⌊n / len(modes)⌋ or
    one more samples in every batch (as in Mescheder et al. 2017's and Balduzzi et
    al. 2018's code); otherwise the modes are drawn at random."""
    if balanced:
        idx = torch.arange(n) % len(modes)
    else:
        idx = torch.randint(len(modes), (n,), generator=generator)
    return modes[idx] + std * torch.randn(n, 2, generator=generator)


def gan_losses(gen: Generator, disc: Discriminator, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """Non-saturating GAN: the generator minimizes −log D(G(z)), the discriminator
    minimizes −log D(x) − log(1 − D(G(z))). One forward of each network."""
    real, fake = disc(x), disc(gen(z))
    d_loss = F.softplus(-real).mean() + F.softplus(fake).mean()
    g_loss = F.softplus(-fake).mean()
    return g_loss, d_loss


def mode_metrics(samples: Tensor, modes: Tensor, std: float) -> tuple[int, float]:
    """Modes covered (a mode counts when it holds ≥ 1/4 of its fair share of
    high-quality samples) and the percentage of high-quality samples (within 3σ
    of some mode)."""
    dist = torch.cdist(samples, modes)
    nearest = dist.min(1)
    good = nearest.values < 3 * std
    counts = torch.bincount(nearest.indices[good], minlength=len(modes))
    fair = len(samples) / len(modes)
    return int((counts >= 0.25 * fair).sum()), 100.0 * float(good.float().mean())
