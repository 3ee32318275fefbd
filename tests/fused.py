"""Assertions about fused storage: parameters as views of a player's flat buffers."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from gameopt import Player


def cat_flat(tensors: Iterable[Tensor]) -> Tensor:
    """The tensors' values, flattened and concatenated (detached)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The module's parameters with ``requires_grad=True``, in ``parameters()`` order."""
    return [p for p in module.parameters() if p.requires_grad]


def cat_grads(module: nn.Module) -> Tensor:
    """The trainable parameters' ``.grad``, flattened and concatenated."""
    return cat_flat(p.grad for p in trainable(module))


def inside(t: Tensor, base: Tensor) -> bool:
    """``t`` lives in ``base``'s memory (same storage, data pointer within its range)."""
    start = base.data_ptr()
    end = start + base.numel() * base.element_size()
    same_storage = t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    return same_storage and start <= t.data_ptr() < end


def assert_fused(player: Player) -> None:
    """Every fused parameter is a view of its buffer's data at its segment's offset,
    its ``.grad`` the matching view of the buffer's grad."""
    for buf in player.buffers:
        assert buf.data.shape == buf.grad.shape == (buf.padded_numel,)
        for p, seg in zip(buf.params, buf.segments):
            assert p.dtype == buf.dtype and p.device == buf.device
            assert p.data_ptr() == buf.data.data_ptr() + seg.offset * buf.data.element_size()
            assert inside(p, buf.data)
            assert p.grad is not None and inside(p.grad, buf.grad)
            assert p.grad.data_ptr() == buf.grad.data_ptr() + seg.offset * buf.grad.element_size()
