"""The joint vector: every player's flat buffers side by side in one tensor per
(device, dtype) group.

A joint vector (``Vec``) is a list with one 1-D tensor per group. All vector math
of an algorithm is done on these few tensors, so its cost does not grow with the
number of players or parameter tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from . import _torch_compat as tc
from . import debug
from .buffer import FlatBuffer, Segment, segment_view, split_plan
from .player import Player
from .vec import Scaled, Vec, filled_step


@dataclass(frozen=True)
class Entry:
    """One player's buffer inside a joint group."""

    player: int
    buffer: FlatBuffer
    group: int
    start: int
    stop: int


class JointLayout:
    """Places every player's buffers into joint storage, one tensor per group."""

    def __init__(self, players: Sequence[Player]) -> None:
        keys: list[tuple[torch.device, torch.dtype]] = []
        self.entries: list[Entry] = []
        sizes: list[int] = []
        for i, player in enumerate(players):
            for buf in player.buffers:
                key = (buf.device, buf.dtype)
                if key not in keys:
                    keys.append(key)
                    sizes.append(0)
                g = keys.index(key)
                step = max(1, (buf.align or 1) // buf.data.element_size())
                start = -(-sizes[g] // step) * step
                self.entries.append(Entry(i, buf, g, start, start + buf.padded_numel))
                sizes[g] = start + buf.padded_numel
        self.keys = keys
        self.num_players = len(players)
        self.data = Vec(torch.zeros(n, dtype=k[1], device=k[0]) for k, n in zip(keys, sizes))
        self.grad = Vec(torch.zeros(n, dtype=k[1], device=k[0]) for k, n in zip(keys, sizes))
        for e in self.entries:
            e.buffer.rehome(self.data[e.group][e.start : e.stop], self.grad[e.group][e.start : e.stop])
        self.by_player: list[list[Entry]] = [[e for e in self.entries if e.player == i] for i in range(len(players))]
        self._group_entries = [[e for e in self.entries if e.group == g] for g in range(len(keys))]
        self._uniform_groups = [len({e.player for e in es}) == 1 for es in self._group_entries]
        self._splits = [self._split_plan(g) for g in range(len(keys))]
        #: per group, whether its parameters tile it in storage order, each contiguous
        #: and without padding, so that the group is the ``cat`` of their flattened tensors
        self.packed = [
            len(sizes) == len(where) and all(seg.contiguous for _, _, seg in where) for sizes, where in self._splits
        ]
        self.num_elements = sum(e.buffer.num_elements for e in self.entries)
        self.num_tensors = sum(len(e.buffer.params) for e in self.entries)
        # no padding anywhere: writing every entry of a vector defines all of it
        self.dense = all(
            sum(e.stop - e.start for e in es) == t.numel() for es, t in zip(self._group_entries, self.data)
        )

    # ------------------------------------------------------------- vectors
    def zeros(self) -> Vec:
        return Vec(torch.zeros_like(t) for t in self.data)

    def empty(self) -> Vec:
        return Vec(torch.empty_like(t) for t in self.data)

    def entry_view(self, vec: Sequence[Tensor], e: Entry) -> Tensor:
        """The part of a joint vector that belongs to one player buffer (a plain slice;
        never use it inside a differentiated computation)."""
        return vec[e.group][e.start : e.stop]

    def player_views(self, vec: Sequence[Tensor], i: int) -> Vec:
        """Player ``i``'s part of a joint vector: views, one per parameter group of its."""
        return Vec(self.entry_view(vec, e) for e in self.by_player[i])

    def per_player(self, vec: Sequence[Tensor]) -> tuple[Tensor | tuple[Tensor, ...], ...]:
        """One flat tensor per player (a tuple of tensors for a player with several groups)."""
        out = []
        for i in range(self.num_players):
            views = self.player_views(vec, i)
            out.append(views[0] if len(views) == 1 else tuple(views))
        return tuple(out)

    def from_per_player(self, per_player: Sequence[Tensor | Sequence[Tensor]], what: str = "v") -> Vec:
        """A joint vector from one flat tensor (or tuple) per player; checks shapes."""
        if len(per_player) != self.num_players:
            raise ValueError(f"{what} has {len(per_player)} entries, the game has {self.num_players} players")
        vec = self.zeros()
        for i, item in enumerate(per_player):
            items = [item] if isinstance(item, Tensor) else list(item)
            entries = self.by_player[i]
            if len(items) != len(entries):
                raise ValueError(f"{what}[{i}] must hold {len(entries)} flat tensor(s), one per parameter group")
            for e, t in zip(entries, items):
                if t.shape != (e.buffer.padded_numel,):
                    raise ValueError(f"{what}[{i}] has shape {tuple(t.shape)}, expected ({e.buffer.padded_numel},)")
                self.entry_view(vec, e).copy_(t.detach())
        return vec

    def only(self, vec: Vec, player: int) -> Vec:
        """A copy of ``vec`` with every part but ``player``'s set to zero."""
        out = self.zeros()
        for e in self.by_player[player]:
            self.entry_view(out, e).copy_(self.entry_view(vec, e))
        return out

    def _factors(self, factors: Sequence[float]) -> list[list[float] | float]:
        """Per joint group, each entry's factor, or one float when they are all the same
        (every player's factor the same, the common case, or one player's group)."""
        factors = list(factors)
        if factors.count(factors[0]) == len(factors):
            return [float(factors[0])] * len(self._group_entries)
        return [
            float(factors[es[0].player]) if uniform else [float(factors[e.player]) for e in es]
            for es, uniform in zip(self._group_entries, self._uniform_groups)
        ]

    def scale_(self, vec: Vec, factors: Sequence[float], out: Vec | None = None) -> Vec:
        """Each player's part of ``vec`` times its factor: in place, or into ``out``."""
        out = vec if out is None else out
        for t, o, fs, entries in zip(vec, out, self._factors(factors), self._group_entries):
            if isinstance(fs, float):
                t.mul_(fs) if o is t else torch.mul(t, fs, out=o)
            else:
                if o is not t:
                    o.copy_(t)
                tc.foreach_mul_([o[e.start : e.stop] for e in entries], fs)
        return out

    def add_scaled_(self, out: Vec, vec: Vec, factors: Sequence[float]) -> Vec:
        """In place: ``out += factor · vec``, each player's part with its factor."""
        for o, t, fs, entries in zip(out, vec, self._factors(factors), self._group_entries):
            if isinstance(fs, float):
                o.add_(t, alpha=fs)
            else:
                for e, f in zip(entries, fs):
                    o[e.start : e.stop].add_(t[e.start : e.stop], alpha=f)
        return out

    def resolve(self, step: Vec | Scaled, empty: Callable[[], Vec] | None = None) -> Vec:
        """A step as a vector: ``step`` itself, or a :class:`~gameopt.algorithms.api.Scaled` step's
        ``factorᵢ · dᵢ``, written where it says (``into``), else into ``empty()``."""
        if isinstance(step, Vec):
            return step
        step = filled_step(step)  # (a direction where autograd left it: into the buffer first)
        into = cast(Vec, step.into) if step.into is not None else (empty or self.empty)()
        return self.scale_(cast(Vec, step.direction), step.factors, out=into)

    def add_scaled(self, out: Vec, w: Vec, vec: Vec, factors: Sequence[float]) -> Vec:
        """``out = w + factor · vec`` with one factor per joint group
        (:meth:`one_factor_per_group`): one add with ``alpha`` per group, in place when
        ``out`` is ``w``."""
        for o, x, t, f in zip(out, w, vec, self._factors(factors)):
            o.add_(t, alpha=f) if o is x else torch.add(x, t, alpha=f, out=o)  # type: ignore[arg-type]
        return out

    def group_factors(self, factors: Sequence[float]) -> list[float] | None:
        """Per joint group, its players' one factor; ``None`` unless the players of
        each group share one (:meth:`one_factor_per_group`)."""
        out = self._factors(factors)
        return out if all(isinstance(f, float) for f in out) else None  # type: ignore[return-value]

    def one_factor_per_group(self, factors: Sequence[float]) -> bool:
        """Whether the players of each joint group share one factor (as in one player's
        group, or when every player's factor is the same)."""
        return all(isinstance(fs, float) for fs in self._factors(factors))

    def factor_bounds(self, factors: Sequence[float]) -> list[float]:
        """Per joint group, the largest ``|factor|`` of the players in it."""
        return [abs(fs) if isinstance(fs, float) else max(map(abs, fs)) for fs in self._factors(factors)]

    def group_entries(self, g: int) -> list[Entry]:
        """The player buffers in joint group ``g``, in storage order."""
        return list(self._group_entries[g])

    def param_views(self, g: int, flat: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(parameter, parameter-shaped view of ``flat``) for every parameter of joint
        group ``g``, from one ``torch.split`` of ``flat`` (whose backward is one ``cat``)."""
        sizes, where = self._splits[g]
        chunks = torch.split(flat, sizes)
        return [(p, segment_view(chunks[k], seg)) for p, k, seg in where]

    def _split_plan(self, g: int) -> tuple[list[int], list[tuple[Tensor, int, Segment]]]:
        """Sizes that cut group ``g`` into its parameters (and padding), and per
        parameter (parameter, chunk index, segment)."""
        placed = [
            (p, e.start + seg.offset, seg)
            for e in self._group_entries[g]
            for p, seg in zip(e.buffer.params, e.buffer.segments)
        ]
        sizes, index = split_plan([(start, seg.numel) for _, start, seg in placed], self.data[g].numel())
        return sizes, [(p, k, seg) for (p, _, seg), k in zip(placed, index)]


class StepVectors:
    """The joint vectors an algorithm takes during a step (``oracle.empty()``),
    tracked so that the game keeps only those its committed state holds.

    :meth:`take` allocates a vector (contents undefined) and tracks it. After a step
    the game calls :meth:`keep_only` with the algorithm state it keeps: the vectors
    that state holds stay tracked (compared by storage, so views count) and every
    other one is let go, so between steps a game holds only the state its algorithm
    needs (freed memory goes back to the allocator: the caching allocator on a GPU,
    the process's heap on the CPU). Nothing is reused: each :meth:`take` allocates.
    """

    def __init__(self, layout: JointLayout) -> None:
        self.layout = layout
        self._owned: list[Vec] = []

    def take(self) -> Vec:
        vec = self.layout.empty()
        self._owned.append(vec)
        return vec

    @property
    def lent(self) -> bool:
        """Whether any vector is out (taken since the last :meth:`keep_only`, or kept then)."""
        return bool(self._owned)

    @property
    def taken(self) -> list[Vec]:
        """The vectors out (taken since the last :meth:`keep_only`, or kept then)."""
        return list(self._owned)

    def let_go(self, tensors: Sequence[Tensor], keep: Sequence[Tensor] = ()) -> None:
        """Let go of the vectors that hold ``tensors``, unless they hold one of ``keep``;
        every other vector stays tracked."""
        gone = _storages(tensors) - _storages(keep)
        if gone:
            self._release(gone, stay=False)

    def keep_only(self, keep: Sequence[Tensor]) -> None:
        """Let go of every vector ``keep`` does not hold."""
        self._release(_storages(keep), stay=True)

    def _release(self, storages: set[int], stay: bool) -> None:
        """Keep tracking the vectors whose storage is in ``storages`` (``stay``) or is
        not (``not stay``), and let go of the others (filled with NaN first in debug
        mode, see :mod:`gameopt.debug`)."""
        kept = [v for v in self._owned if (v[0].untyped_storage().data_ptr() in storages) == stay]
        if debug.enabled() and len(kept) < len(self._owned):
            held = {id(v) for v in kept}
            debug.poison_(t for v in self._owned if id(v) not in held for t in v)
        self._owned = kept


def _storages(tensors: Sequence[Tensor]) -> set[int]:
    """The storages of ``tensors`` (so that views count as their base)."""
    return {t.untyped_storage().data_ptr() for t in tensors}
