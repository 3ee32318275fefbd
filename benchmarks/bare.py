"""Bare reference steps: what a user writes by hand, on unfused modules, for the GPU
table (``benchmarks/gpu.py``) to set each gameopt step beside.

Each function takes a pair (G, D), ``losses_of(G, D)`` (a callable of the batch
returning (loss_G, loss_D)) and the batch ``x, z``, and returns one step as a
callable. Gradients come from ``torch.autograd.grad`` per player, updates from
``torch._foreach_*`` or ``torch.optim(foreach=True)``: the fastest plain-PyTorch
form, with nothing kept for a rollback.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

LossesOf = Callable[[nn.Module, nn.Module], Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]]
Losses = Callable[[], tuple[Tensor, Tensor]]


def xi(losses: Losses, first: list[Tensor], second: list[Tensor]) -> list[Tensor]:
    """ξ as a user writes it: each player's gradient of its own loss."""
    f, g = losses()
    return [*torch.autograd.grad(f, first, retain_graph=True), *torch.autograd.grad(g, second)]


def simgd_of(losses: Losses, first: list[Tensor], second: list[Tensor], lr: float) -> Callable[[], None]:
    """w ← w − η ξ(w) for the players' tensors ``first`` and ``second``: one ``_foreach_add_``."""
    params = first + second

    def step() -> None:
        gs = xi(losses, first, second)
        with torch.no_grad():
            torch._foreach_add_(params, gs, alpha=-lr)

    return step


def _batch(G: nn.Module, D: nn.Module, losses_of: LossesOf, x: Tensor, z: Tensor) -> Losses:
    losses = losses_of(G, D)
    return lambda: losses(x, z)


def simgd(G: nn.Module, D: nn.Module, losses_of: LossesOf, x: Tensor, z: Tensor, lr: float) -> Callable[[], None]:
    """:func:`simgd_of` for the pair (G, D) on the batch (x, z)."""
    return simgd_of(_batch(G, D, losses_of, x, z), list(G.parameters()), list(D.parameters()), lr)


def extra_adam(
    G: nn.Module,
    D: nn.Module,
    losses_of: LossesOf,
    x: Tensor,
    z: Tensor,
    lr: float,
    betas: tuple[float, float],
    eps: float = 1e-8,
) -> Callable[[], None]:
    """Extra-Adam (Gidel et al. 2019) with ``torch.optim.Adam(foreach=True)``: an Adam
    step to the extrapolated point, ξ there, back to the start (one fused copy), and an
    Adam step with that ξ; both steps advance the moments, as gameopt's does."""
    first, second, losses = list(G.parameters()), list(D.parameters()), _batch(G, D, losses_of, x, z)
    params = first + second
    opt = torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, foreach=True)
    saved = [p.detach().clone() for p in params]

    def step() -> None:
        with torch.no_grad():
            torch._foreach_copy_(saved, params)
        for p, g in zip(params, xi(losses, first, second)):
            p.grad = g
        opt.step()
        gs = xi(losses, first, second)
        with torch.no_grad():
            torch._foreach_copy_(params, saved)
        for p, g in zip(params, gs):
            p.grad = g
        opt.step()

    return step


def consensus(
    G: nn.Module, D: nn.Module, losses_of: LossesOf, x: Tensor, z: Tensor, lr: float, gamma: float
) -> Callable[[], None]:
    """Consensus optimization (Mescheder et al. 2017): w ← w − η (ξ + γ ∇½‖ξ‖²), with
    ξ from ``create_graph`` gradients and ∇½‖ξ‖² from one more reverse pass."""
    gp, dp = list(G.parameters()), list(D.parameters())
    params, losses = gp + dp, losses_of(G, D)

    def step() -> None:
        lg, ld = losses(x, z)
        xi = torch.autograd.grad(lg, gp, create_graph=True) + torch.autograd.grad(ld, dp, create_graph=True)
        half = 0.5 * sum(torch.dot(t.reshape(-1), t.reshape(-1)) for t in xi)
        reg = torch.autograd.grad(half, params)
        with torch.no_grad():
            torch._foreach_add_(params, [t.detach() for t in xi], alpha=-lr)
            torch._foreach_add_(params, list(reg), alpha=-lr * gamma)

    return step


def captured(step: Callable[[], None], warmup: int = 3) -> Callable[[], None]:
    """``step`` captured whole in a CUDA graph (``torch.cuda.graph``) after ``warmup``
    eager calls on a side stream, as the CUDA graphs docs' whole-network capture does;
    returns the replay. Every tensor ``step`` reads must stay where it is (static
    inputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay
