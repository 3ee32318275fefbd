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
