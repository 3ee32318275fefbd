"""Small constrained problems shared by the constrained-learning tests (float64): a
quadratic program with known KKT point, and a grouped classification with one rate
constraint per group (``RATES``) and the index samples ``SAMPLES`` of sampled constraints."""

from __future__ import annotations

import torch
from torch import nn


def qp(with_equality: bool):
    """min ½‖w − a‖² s.t. bᵀw ≤ c (active at the solution) [and dᵀw = e]."""
    a = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    b = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    c = 1.0
    d = torch.tensor([0.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    e = 0.5
    if not with_equality:
        return a, b[None], torch.tensor([c], dtype=torch.float64)
    return a, torch.stack([b, d]), torch.tensor([c, e], dtype=torch.float64)


RATES = 4  # groups, one rate constraint each


def grouped():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 3, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * torch.randn(64, generator=g, dtype=torch.float64) > 0).double()
    group = torch.arange(64) % RATES
    model = nn.Linear(3, 1).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 3, generator=g, dtype=torch.float64))
        model.bias.fill_(0.8)
    return model, x, y, group


def group_rates(model, x, y, group):
    """f: the logistic loss; per group, the positive rate minus 0.4: soft (sigmoid) and
    strict (hard predictions, not differentiable)."""
    logits = model(x).squeeze(-1)
    f = nn.functional.binary_cross_entropy_with_logits(logits, y)
    soft = torch.stack([torch.sigmoid(logits[group == k]).mean() - 0.4 for k in range(RATES)])
    hard = torch.stack([(logits[group == k] > 0).double().mean() - 0.4 for k in range(RATES)])
    return f, soft, hard


SAMPLES = [torch.tensor(ix) for ix in ([0, 2], [1, 3], [3, 0], [2], [1, 2, 3], [0, 1])]
