"""Small modules and model factories shared by the tests.

Each factory seeds and initialises exactly as the test files that used to define
it did, so tests that compare values bit for bit keep doing so.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class VecModule(nn.Module):
    """A module holding one parameter vector (a copy of ``init``)."""

    def __init__(self, init: Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(init.clone())


class Bag(nn.Module):
    """A module holding the given tensors as parameters, in order."""

    def __init__(self, **tensors: Tensor) -> None:
        super().__init__()
        for name, t in tensors.items():
            setattr(self, name, nn.Parameter(t))


def tiny_mlp(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    """1 → 10 → 1 with a tanh: 31 parameters (weight, bias, weight, bias at offsets
    0, 10, 20, 30), initialised after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 10), nn.Tanh(), nn.Linear(10, 1)).to(dtype)


def gan_mlps(width: int = 8, dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[nn.Sequential, nn.Sequential]:
    """A generator 2 → ``width`` → 2 and a discriminator 2 → ``width`` → 1, both with a
    tanh, initialised in that order after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    gen = nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, 2)).to(dtype)
    disc = nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, 1)).to(dtype)
    return gen, disc


def gan_with_losses(dtype: torch.dtype = torch.float64, seed: int = 0):
    """:func:`gan_mlps` of width 16 with a fixed batch (32 real points and 32 codes
    drawn after the modules) and the non-saturating GAN losses ``losses(x=x, z=z)``."""
    gen, disc = gan_mlps(16, dtype, seed)
    x = torch.randn(32, 2, dtype=dtype)
    z = torch.randn(32, 2, dtype=dtype)

    def losses(x: Tensor = x, z: Tensor = z) -> tuple[Tensor, Tensor]:
        real, fake = disc(x), disc(gen(z))
        d_loss = nn.functional.softplus(-real).mean() + nn.functional.softplus(fake).mean()
        g_loss = nn.functional.softplus(-fake).mean()
        return g_loss, d_loss

    return gen, disc, losses
