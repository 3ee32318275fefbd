"""Players sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``).

A module sharded with ``fully_shard`` holds ``DTensor`` parameters; each rank keeps
its shard of each. A :class:`ShardedBuffer` fuses a player's local shards as a
:class:`~gameopt.buffer.FlatBuffer` fuses whole parameters: each shard, padded as
FSDP pads it (to rank 0's size), is a slice of one flat tensor, which FSDP's
all-gather reads; each sharded ``.grad`` is a ``DTensor`` over a view of the flat
gradient, into which FSDP's reduce-scatter adds. The algorithms then do their
whole-vector math on the local shards, and nothing is copied per tensor.

What the game does differently for a sharded player (:class:`Shards`):

* ξ: a backward of the player's loss pruned to the *unsharded* parameters that the
  forward used (autograd reaches those, not the sharded ones); FSDP's reduce-scatter
  averages the gradients over the ranks into the flat gradient. With mean losses,
  the ranks' halves of a batch give the whole batch's gradient.
* verdicts: the ranks hold different shards, so every verdict that refuses a step
  is agreed on by all ranks, with one small ``all_reduce`` each: a point to evaluate
  at that is not finite (before anyone's forward: no rank waits in a collective for
  one that stopped), and the step's update (not finite, or a point that would
  overflow). No rank commits a step that another refused.
* checkpoints: each rank's flat vectors are saved as DTensors, one per parameter
  (:mod:`gameopt.game.sharded_checkpoint`), so that ``torch.distributed.checkpoint``
  saves every rank's shards and reshards them on load; a load is agreed as a step is.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import _torch_compat as tc
from .buffer import FlatBuffer, Segment, contiguous_strides

_grad = operator.attrgetter("grad")


def is_sharded(p: Tensor) -> bool:
    """``p`` is a ``DTensor`` (a parameter that ``fully_shard`` sharded, say)."""
    dtensor = tc.dtensor_type()
    return dtensor is not None and isinstance(p, dtensor)


def fsdp_params_of(name: str, module: nn.Module, params: Sequence[Tensor]) -> list[Any]:
    """The ``FSDPParam`` of each of ``params`` (all sharded, of ``module`` and its
    submodules), in order; refuses ``DTensor`` parameters that FSDP2 did not shard
    (tensor parallelism) and torches without a public FSDP2."""
    if not tc.FSDP_PUBLIC:
        raise ValueError(
            f"player {name!r} has DTensor (sharded) parameters: gameopt's sharded players need torch 2.6 or newer "
            f"(public torch.distributed.fsdp.fully_shard), this is torch {torch.__version__}"
        )
    by_param = {id(fp.sharded_param): fp for fp in tc.fsdp_params(module)}
    missing = [k for k, p in enumerate(params) if id(p) not in by_param]
    if missing:
        raise ValueError(
            f"player {name!r}: parameters {missing} are DTensors that fully_shard did not shard (tensor or other "
            "parallelism): gameopt shards players with FSDP2 only (fully_shard the layers, then the root module)"
        )
    out = [by_param[id(p)] for p in params]
    for fp in out:
        if getattr(fp, "offload_to_cpu", False):
            raise ValueError(f"player {name!r}: FSDP's CPU offload is not supported (the shards must stay put)")
    return out


class ShardedBuffer(FlatBuffer):
    """Flat parameter and gradient storage for the local shards of FSDP-sharded
    parameters of one device and dtype (see the module's docstring).

    Each shard's segment is followed by FSDP's padding (zero, and it stays zero:
    no gradient reaches it), so that the padded shard FSDP all-gathers is a slice of
    the flat tensor. The flat tensors of the ranks have the same length."""

    def __init__(self, params: Sequence[Tensor], fsdp: Sequence[Any], modules: Sequence[nn.Module], owner: Any) -> None:
        self._fsdp = list(fsdp)
        super().__init__(params, None, modules, owner)

    def _layout(self, params: Sequence[Tensor], align: int | None) -> tuple[list[Segment], int]:  # type: ignore[override]
        segments, offset = [], 0
        for fp in self._fsdp:
            shape = fp.sharded_size
            segments.append(Segment(offset, shape.numel(), shape, contiguous_strides(shape)))
            offset += fp.padded_sharded_param_size.numel()
        return segments, offset

    def _padded(self, data: Tensor) -> list[Tensor]:
        """Each shard's padded slice of ``data``."""
        return [
            data[s.offset : s.offset + fp.padded_sharded_param_size.numel()] for s, fp in zip(self.segments, self._fsdp)
        ]

    def _install(self, data: Tensor, grad: Tensor) -> None:
        data_views, grad_views = self.views(data), self.views(grad)
        with torch.no_grad():
            for p, view, gview in zip(self.params, data_views, grad_views):
                view.copy_(tc.local_shard(p))
                g = p.grad  # keep an existing gradient (fusing after a backward, or re-fusing)
                if g is not None and is_sharded(g) and tc.local_shard(g) is not gview:
                    gview.copy_(tc.local_shard(g))
        for fp, padded in zip(self._fsdp, self._padded(data)):
            tc.place_shard(fp, padded, tc.shard_length(fp))
        self._handles = [tc.sharded_dtensor(fp, gview) for fp, gview in zip(self._fsdp, grad_views)]
        for p, handle in zip(self.params, self._handles):
            p.grad = handle
        self.grad = grad
        self._grad_views = grad_views
        self._ptrs = self._local_ptrs()
        self._shapes = [tc.local_shard(p).shape for p in self.params]
        self.follow(data)

    def _local_ptrs(self) -> list[int]:
        return [tc.local_shard(p).data_ptr() for p in self.params]

    def why_stale(self) -> str | None:
        if self._local_ptrs() == self._ptrs and [tc.local_shard(p).shape for p in self.params] == self._shapes:
            return None
        return "a sharded parameter's local shard was replaced (load_state_dict(assign=True) or a conversion)"

    def relink_grads(self) -> None:
        if all(map(operator.is_, map(_grad, self.params), self._handles)):
            return
        with torch.no_grad():
            for p, view, handle in zip(self.params, self._grad_views, self._handles):
                g = p.grad
                if g is handle:
                    continue
                if g is None:
                    view.zero_()
                else:
                    view.copy_(tc.local_shard(g) if is_sharded(g) else g)
                p.grad = handle

    def _link_grads(self) -> None:
        for p, handle in zip(self.params, self._handles):
            if p.grad is not handle:
                p.grad = handle

    def release(self, p: Tensor) -> None:
        """``p``'s shard in storage of its own again (padded as FSDP pads it), with its
        gradient: the module as FSDP left it."""
        k = next(k for k, q in enumerate(self.params) if q is p)
        fp = self._fsdp[k]
        g = p.grad
        with torch.no_grad():
            padded = self._padded(self.data.detach())[k].clone()
            tc.place_shard(fp, padded, tc.shard_length(fp))
            p.grad = None if g is None else tc.sharded_dtensor(fp, tc.local_shard(g).clone())

    def as_dtensors(self, flat: Tensor) -> list[Tensor]:
        """``flat`` (laid out like this buffer) as one DTensor per parameter, sharded
        like it, each over a copy of its shard (no padding)."""
        return [tc.sharded_dtensor(fp, view.clone()) for fp, view in zip(self._fsdp, self.views(flat))]

    def unsharded(self) -> list[Tensor]:
        """The unsharded parameters the last forward used (autograd's leaves), in order."""
        out = []
        for p, fp in zip(self.params, self._fsdp):
            u = tc.unsharded_param(fp)
            if u is None:
                raise RuntimeError(f"a sharded parameter of shape {tuple(p.shape)} was not used by the losses' forward")
            out.append(u)
        return out

    def mesh(self) -> Any:
        """The device mesh of the shards (every parameter's, checked equal)."""
        meshes = {p.device_mesh for p in self.params}  # type: ignore[attr-defined]  # equal meshes hash alike
        if len(meshes) != 1:
            raise ValueError("a player's parameters are sharded over different device meshes")
        return next(iter(meshes))


class Shards:
    """What a game with sharded players does across ranks: agree on every verdict
    that refuses a step (see the module's docstring)."""

    def __init__(self, mesh: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError("sharded players need torch.distributed to be initialized (init_process_group)")
        if mesh.size() != dist.get_world_size():
            raise ValueError(
                f"the players are sharded over a device mesh of {mesh.size()} ranks, the world has "
                f"{dist.get_world_size()}: gameopt agrees on each step over the whole world (shard over a mesh of "
                "all ranks)"
            )
        self.mesh = mesh
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()

    def agree(self, refused: bool) -> bool:
        """Whether any rank refused (one ``all_reduce`` of one number; a host sync)."""
        flag = torch.tensor([1.0 if refused else 0.0], device=self.mesh.device_type)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def failed(self, err: BaseException, step: int) -> None:
        """After a step failed on this rank (nothing committed here): a failure of this
        rank's own is left in the process group's store for the others, and returns
        (the caller re-raises it); a collective that could not finish (another rank
        raised, stopped, hung or left: gloo's timeout or a closed connection) raises
        ``RuntimeError`` naming the ranks that failed, with their errors, and those that
        did not answer. Every rank that reached the collective waits for the others'
        word at most :data:`WORD_WAIT` seconds."""
        prefix = f"gameopt/step{step}/"
        if not _collective_failure(err):
            _tell(f"{prefix}failed/{self.rank}", f"{type(err).__name__}: {err}"[:_WORD_MAX])
            return
        _tell(f"{prefix}waited/{self.rank}", "")
        failed, silent, waited = self._others(prefix)
        what = [f"rank {r} failed in it ({msg})" for r, msg in failed]
        if silent:
            what.append(f"{_ranks(silent)} did not answer (stopped, hung or left)")
        if not what:  # every other rank waited: for this one, which was too slow
            what.append(f"{_ranks(waited)} stopped waiting for this rank (past the process group's timeout)")
        raise RuntimeError(
            f"rank {self.rank}: a collective of step {step} could not finish: {'; '.join(what)}. Nothing was "
            "committed on this rank, and no rank commits a step another did not finish"
        ) from err

    def _others(self, prefix: str) -> tuple[list[tuple[int, str]], list[int], list[int]]:
        """The other ranks' word on this step: (rank, error) of those that failed, the
        ranks that said nothing within :data:`WORD_WAIT` seconds, and those that waited
        in the collective too."""
        others = [r for r in range(self.world_size) if r != self.rank]
        deadline = time.monotonic() + WORD_WAIT
        while True:
            heard = {r: _heard(f"{prefix}failed/{r}", f"{prefix}waited/{r}") for r in others}
            if all(w is not None for w in heard.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        failed = [(r, w) for r, w in heard.items() if w]
        return failed, [r for r, w in heard.items() if w is None], [r for r, w in heard.items() if w == ""]

    def __repr__(self) -> str:
        return f"Shards(rank={self.rank}, world_size={self.world_size}, mesh={self.mesh})"


#: how long a rank whose collective failed waits for the other ranks' word (seconds)
WORD_WAIT = 2.0
_WORD_MAX = 500  # characters of an error message left in the store


def _collective_failure(err: BaseException) -> bool:
    """``err`` is a collective that could not finish (gloo's timeout, a closed
    connection, a torch.distributed error), not a failure of this rank's own."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(w in text for w in ("gloo", "timed out", "connection closed"))


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _tell(key: str, message: str) -> None:
    """Leave ``message`` under ``key`` in the default store; a store that is gone
    (its host rank left) takes nothing, and the other ranks name this one silent."""
    try:
        tc.default_store().set(key, message)
    except RuntimeError:
        pass


def _heard(failed: str, waited: str) -> str | None:
    """A rank's word: its error (under ``failed``), ``""`` if it waited in the
    collective too, or None if it said nothing (or the store is gone)."""
    try:
        store = tc.default_store()
        if store.check([failed]):
            return bytes(store.get(failed)).decode(errors="replace")
        return "" if store.check([waited]) else None
    except RuntimeError:
        return None


def sharded_backward(buffers: Sequence[ShardedBuffer], loss: Tensor, retain_graph: bool) -> None:
    """A player's ξ into its flat gradient: zero it, then a backward of its loss pruned
    to the unsharded parameters; FSDP's reduce-scatter adds the average over the ranks
    into the sharded ``.grad``, views of the flat gradient."""
    inputs = [u for b in buffers for u in b.unsharded()]
    for b in buffers:
        b.zero_grad()
    torch.autograd.backward(loss, inputs=inputs, retain_graph=retain_graph)
