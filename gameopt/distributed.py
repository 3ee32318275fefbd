"""Data-parallel games on ``torch.distributed``: every vector field and Jacobian
product is averaged across the ranks of a process group with one collective per
joint tensor (one in all when the players share a device and dtype).

DDP cannot help here: it does not support the double backward that consensus,
SGA, CGD and LOLA need. Averaging the flat joint vectors directly does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import _torch_compat as tc


class DataParallel:
    """Averaging of joint vectors over a process group (gloo on CPU, NCCL on GPUs)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("process_group given but torch.distributed is not initialized (init_process_group)")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def mean_(self, vec: Sequence[Tensor]) -> Sequence[Tensor]:
        """Average in place across ranks: one all_reduce per tensor."""
        for t in vec:
            torch.distributed.all_reduce(t, group=self.group)
            t.div_(self.world_size)
        return vec

    def broadcast_(self, vec: Sequence[Tensor]) -> None:
        """Copy rank 0's values to every rank, in place."""
        src = dist.get_global_rank(self.group, 0)
        for t in vec:
            torch.distributed.broadcast(t, src=src, group=self.group)

    def broadcast_coalesced_(self, tensors: Sequence[Tensor]) -> None:
        """Copy rank 0's values to every rank, in place: one broadcast per
        (device, dtype) group of ``tensors`` (module buffers: many small tensors)."""
        groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        for group in groups.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            self.broadcast_([flat])
            tc.foreach_copy_(group, [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in group]), group)])

    def check_replicas(self, vec: Sequence[Tensor]) -> None:
        """Raise if the ranks' copies differ (one small all_reduce)."""
        vec = [t for t in vec if t.numel()]
        if not vec:
            return
        device = vec[0].device
        sums = [torch.stack([t.double().sum(), t.double().square().sum()]).to(device) for t in vec]
        fingerprint = torch.cat(sums)
        both = torch.cat([fingerprint, -fingerprint])
        torch.distributed.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        n = fingerprint.numel()
        if not torch.equal(both[:n], -both[n:]):
            raise RuntimeError(
                "the ranks' parameters or module buffers have drifted apart: every rank must apply the same steps "
                "(check that each rank calls game.step the same number of times, with shards of one batch)"
            )

    def __repr__(self) -> str:
        return f"DataParallel(rank={self.rank}, world_size={self.world_size})"
