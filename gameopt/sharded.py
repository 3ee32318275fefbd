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
  (:func:`saved_form`), so that ``torch.distributed.checkpoint`` saves every rank's
  shards and reshards them on load (:func:`local_form`); a load is agreed as a step is.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import _torch_compat as tc
from .buffer import FlatBuffer, Segment, contiguous_strides
from .vec import Vec

if TYPE_CHECKING:
    from .layout import JointLayout
    from .player import Player

_grad = operator.attrgetter("grad")


def is_sharded(p: Tensor) -> bool:
    """``p`` is a ``DTensor`` (a parameter that ``fully_shard`` sharded, say)."""
    dtensor = tc.dtensor_type()
    return dtensor is not None and isinstance(p, dtensor)


def fsdp_params_of(name: str, modules: Sequence[nn.Module], params: Sequence[Tensor]) -> list[Any]:
    """The ``FSDPParam`` of each of ``params`` (all sharded), in order; refuses
    ``DTensor`` parameters that FSDP2 did not shard (tensor parallelism) and torches
    without a public FSDP2."""
    if not tc.FSDP_PUBLIC:
        raise ValueError(
            f"player {name!r} has DTensor (sharded) parameters: gameopt's sharded players need torch 2.6 or newer "
            f"(public torch.distributed.fsdp.fully_shard), this is torch {torch.__version__}"
        )
    by_param = {id(fp.sharded_param): fp for m in modules[:1] for fp in tc.fsdp_params(m)}
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


# ----------------------------------------------------------------- checkpoints
# A sharded game's checkpoint holds each flat local vector (a player's parameters, a
# joint vector of the algorithm's state) as one DTensor per parameter: the parameter's
# global shape, sharded like it, over a copy of this rank's shard. What
# ``torch.distributed.checkpoint`` saves is then every rank's shard, and what it loads
# is resharded to the loading world's shards, whatever its size. Only here does a
# checkpoint change form: :func:`saved_form` after the game's checkpoint is taken, and
# :func:`local_form` before it is checked and loaded.


def saved_form(
    state_dict: dict[str, Any], players: Sequence[Player], layout: JointLayout, algorithm_state: Any
) -> dict[str, Any]:
    """A sharded game's checkpoint (``state_dict``: copies, in the local form of
    :func:`gameopt.game.checkpoint.state_dict`) in the form it is saved in: each
    player's flat parameter buffer as a list of DTensors, one per parameter; each joint
    vector of the algorithm's state (where ``algorithm_state``, the live state it was
    copied from, holds a :class:`~gameopt.vec.Vec`) as one such list per joint group,
    the group's parameters in storage order; tuples as lists (``torch.distributed.
    checkpoint`` pickles a tuple whole, with one rank's tensors). Each DTensor's
    shard is a copy of its own (see :func:`_saved_buffer`)."""
    out = dict(state_dict)
    out["players"] = [
        {**saved, "params": [_saved_buffer(b, flat) for b, flat in zip(p.buffers, saved["params"])]}
        for p, saved in zip(players, state_dict["players"])
    ]
    algorithm = dict(state_dict["algorithm"])
    algorithm["state"] = _saved_state(algorithm["state"], algorithm_state, layout)
    out["algorithm"] = algorithm
    return out


def local_form(state_dict: Any, players: Sequence[Player], layout: JointLayout, algorithm_state: Any) -> Any:
    """A saved checkpoint (:func:`saved_form`; loaded by ``torch.distributed.checkpoint``
    into a game's :meth:`~gameopt.Game.state_dict`, or by ``torch.load`` from this rank's
    file) back in the local form that :mod:`gameopt.game.checkpoint` checks and loads:
    new flat tensors, each parameter's local shard copied into its segment, the padding
    as the live tensor's (the game's parameters, ``algorithm_state``). Raise
    ``ValueError`` naming the entry where a DTensor is not a shard of its parameter on
    this rank (another shape, dtype, placement or mesh); the rest of the structure is
    left to :func:`gameopt.game.checkpoint.check_state_dict`. Changes nothing."""
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("players"), list):
        return state_dict  # not a checkpoint: check_state_dict says what is wrong
    out = dict(state_dict)
    saved_players = state_dict["players"]
    if len(saved_players) == len(players):
        out["players"] = [
            _local_player(p, saved, f"players[{i}]") for i, (p, saved) in enumerate(zip(players, saved_players))
        ]
    algorithm = state_dict.get("algorithm")
    if isinstance(algorithm, dict) and "state" in algorithm:
        state = _local_state(algorithm["state"], algorithm_state, layout, "algorithm.state")
        out["algorithm"] = {**algorithm, "state": state}
    return out


def _saved_buffer(buf: FlatBuffer, flat: Tensor) -> list[Tensor]:
    """``flat`` (laid out like ``buf``) as one DTensor per parameter, each shard in
    storage of its own: ``torch.save`` fails on a DTensor over a view at an offset
    ("invalid python storage", torch 2.13), and a file holds no padding."""
    if not isinstance(buf, ShardedBuffer):  # a sharded game's players are all sharded
        raise TypeError(f"a sharded game holds a buffer that is not sharded: {buf!r}")
    return [tc.sharded_dtensor(fp, view.clone()) for fp, view in zip(buf._fsdp, buf.views(flat))]


def _saved_vec(vec: Sequence[Tensor], layout: JointLayout) -> list[list[Tensor]]:
    """A joint vector (flat local groups) as one list of DTensors per group."""
    return [
        [t for e in layout.group_entries(g) for t in _saved_buffer(e.buffer, group[e.start : e.stop])]
        for g, group in enumerate(vec)
    ]


def _saved_state(state: Any, live: Any, layout: JointLayout) -> Any:
    if isinstance(live, Vec):
        return _saved_vec(state, layout)
    if isinstance(state, dict):
        return {k: _saved_state(v, live[k], layout) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_saved_state(v, w, layout) for v, w in zip(state, live)]
    return state


def _local_player(player: Player, saved: Any, path: str) -> Any:
    if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
        return saved
    params = saved["params"]
    if len(params) != len(player.buffers):
        raise ValueError(f"{path}.params: expected {len(player.buffers)} parameter groups, got {len(params)}")
    flats = []
    for j, (b, s) in enumerate(zip(player.buffers, params)):
        flat = b.data.detach().clone()
        _copy_shards(b, s, flat, f"{path}.params[{j}]")
        flats.append(flat)
    return {**saved, "params": flats}


def _copy_shards(buf: FlatBuffer, saved: Any, out: Tensor, path: str, first: int = 0) -> None:
    """Copy the local shards of the DTensors of ``saved`` into their parameters'
    segments of ``out`` (laid out like ``buf``), each checked to be this rank's shard
    of its parameter (named ``path[first + k]``)."""
    assert isinstance(buf, ShardedBuffer)
    n = len(buf.params)
    if not isinstance(saved, (list, tuple)) or len(saved) != n:
        got = f"{len(saved)} entries" if isinstance(saved, (list, tuple)) else _describe(saved)
        raise ValueError(
            f"{path}: expected {n} DTensors, one per sharded parameter (a sharded game's checkpoint), got {got}"
        )
    for k, (p, view, t) in enumerate(zip(buf.params, buf.views(out), saved)):
        where = f"{path}[{first + k}]"
        if not is_sharded(t):
            raise ValueError(
                f"{where}: expected a DTensor (this rank's shard of a {tuple(p.shape)} parameter), got "
                f"{_describe(t)}: a sharded game loads the checkpoint of a sharded game (game.state_dict())"
            )
        if t.shape != p.shape or t.dtype != out.dtype:
            raise ValueError(
                f"{where}: expected a DTensor of a {tuple(p.shape)} {out.dtype} parameter, got "
                f"{tuple(t.shape)} {t.dtype}"
            )
        mesh, mine = t.device_mesh, p.device_mesh  # type: ignore[attr-defined]  # p: a DTensor
        placed, mine_placed = tuple(t.placements), tuple(p.placements)  # type: ignore[attr-defined]
        if mesh.size() != mine.size():
            raise ValueError(
                f"{where}: saved by a world of {mesh.size()} ranks, this game is sharded over {mine.size()}: a "
                "checkpoint saved per rank (torch.save) loads into the same world size only; to load it into "
                "another, save with torch.distributed.checkpoint, which reshards"
            )
        if mesh != mine or placed != mine_placed:
            raise ValueError(f"{where}: sharded as {placed} over {mesh}, the parameter as {mine_placed} over {mine}")
        local = tc.local_shard(t)
        if local.shape != view.shape:
            raise ValueError(
                f"{where}: a local shard of shape {tuple(local.shape)}, this rank's is {tuple(view.shape)}"
            )
        with torch.no_grad():
            view.copy_(local)


def _local_vec(saved: Any, live: Sequence[Tensor] | None, layout: JointLayout, path: str) -> Vec:
    """A joint vector from its saved form: a copy of ``live`` (or zeros where the live
    state holds none: a step count saved per element) with the saved local shards."""
    groups = len(layout.data)
    if not isinstance(saved, (list, tuple)) or len(saved) != groups:
        got = f"{len(saved)} entries" if isinstance(saved, (list, tuple)) else _describe(saved)
        raise ValueError(f"{path}: expected a joint vector saved as {groups} lists of DTensors, got {got}")
    out = []
    for g in range(groups):
        entries, items = layout.group_entries(g), saved[g]
        sizes = [len(e.buffer.params) for e in entries]
        if not isinstance(items, (list, tuple)) or len(items) != sum(sizes):
            got = f"{len(items)} entries" if isinstance(items, (list, tuple)) else _describe(items)
            raise ValueError(f"{path}[{g}]: expected {sum(sizes)} DTensors, one per parameter, got {got}")
        if live is not None:
            like = live[g]
        else:  # its dtype is the saved one's
            first = next((t for t in items if isinstance(t, Tensor)), None)
            like = torch.zeros_like(layout.data[g], dtype=None if first is None else first.dtype)
        flat = like.detach().clone()
        start = 0
        for e, size in zip(entries, sizes):
            _copy_shards(e.buffer, items[start : start + size], flat[e.start : e.stop], f"{path}[{g}]", start)
            start += size
        out.append(flat)
    return Vec(out)


def _local_state(saved: Any, live: Any, layout: JointLayout, path: str) -> Any:
    if isinstance(live, Vec):
        return _local_vec(saved, live, layout, path)
    if isinstance(saved, dict):
        mine = live if isinstance(live, dict) else {}
        return {k: _local_state(v, mine.get(k), layout, f"{path}.{k}") for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        if _saved_as_vec(saved, layout):  # a step count saved per element, kept as one number here
            return _local_vec(saved, None, layout, path)
        lives = list(live) if isinstance(live, (list, tuple)) and len(live) == len(saved) else [None] * len(saved)
        items = [_local_state(v, w, layout, f"{path}[{k}]") for k, (v, w) in enumerate(zip(saved, lives))]
        return tuple(items) if isinstance(live, tuple) else items
    if is_sharded(saved):
        raise ValueError(f"{path}: a DTensor where the game holds {_describe(live)}")
    return saved


def _saved_as_vec(saved: Sequence[Any], layout: JointLayout) -> bool:
    """Whether ``saved`` is a joint vector's saved form (one list of DTensors per group)."""
    return len(saved) == len(layout.data) and all(
        isinstance(items, (list, tuple)) and any(is_sharded(t) for t in items) for items in saved
    )


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {tuple(value.shape)} {value.dtype} tensor"
    return type(value).__name__
