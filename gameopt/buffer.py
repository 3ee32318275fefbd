"""Fused flat storage for one (device, dtype) group of parameters.

A :class:`FlatBuffer` owns two 1-D tensors, ``data`` and ``grad``. Every
parameter of the group becomes a view into ``data`` (installed with
:func:`torch.utils.swap_tensors`, so the parameter keeps its Python identity and
shares the version counter of the flat tensor), and its ``.grad`` is the matching
view into ``grad``. Views are made with :func:`torch.split` and keep the
parameter's strides (a ``channels_last`` weight stays ``channels_last``).
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Segment:
    """Where one parameter lives inside a flat buffer."""

    offset: int
    numel: int
    shape: torch.Size
    stride: tuple[int, ...]


_shape = operator.attrgetter("shape")
_parameters = operator.attrgetter("_parameters")


def links_intact(
    params: Sequence[Tensor],
    ptrs: Sequence[int],
    shapes: Sequence[torch.Size],
    subs: Sequence[nn.Module] = (),
    names: Sequence[str] = (),
    registered: Sequence[Tensor] = (),
) -> bool:
    """True when every ``subs[k]._parameters[names[k]]`` is still ``registered[k]`` and
    every parameter still has its storage pointer and shape: the fused links hold.
    Iterated in C (a few tenths of a µs per tensor), so it can run every step."""
    return (
        all(map(operator.is_, map(dict.get, map(_parameters, subs), names), registered))
        and list(map(Tensor.data_ptr, params)) == list(ptrs)
        and list(map(_shape, params)) == list(shapes)
    )


def _dense_strides(shape: torch.Size, stride: tuple[int, ...]) -> bool:
    """True when ``stride`` describes a non-overlapping, dense layout of ``shape``."""
    expected = 1
    for size, st in sorted(zip(shape, stride), key=lambda s: (s[1], s[0])):
        if size == 1:
            continue
        if st != expected:
            return False
        expected *= size
    return True


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def _view(chunk: Tensor, seg: Segment) -> Tensor:
    """A view of the 1-D ``chunk`` with the segment's shape and strides."""
    if seg.stride == _contiguous_strides(seg.shape):
        return chunk.view(seg.shape)
    # Lay the dims out from the largest stride to the smallest, then permute back.
    order = sorted(range(len(seg.shape)), key=lambda d: (-seg.stride[d], d))
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    return chunk.view([seg.shape[d] for d in order]).permute(inverse)


class FlatBuffer:
    """Flat parameter and gradient storage for parameters of one device and dtype.

    Args:
        params: parameters that all share one device and dtype, each listed once.
        align: pad each parameter's start to a multiple of this many bytes
            (``None``: tight packing). Padding is zero and stays zero.
    """

    def __init__(
        self, params: Sequence[nn.Parameter], align: int | None = None, modules: Sequence[nn.Module] = ()
    ) -> None:
        if not params:
            raise ValueError("FlatBuffer needs at least one parameter")
        self.device = params[0].device
        self.dtype = params[0].dtype
        self.align = align
        self.params = list(params)
        # recurrent layers keep weak references to their weights, which swap_tensors refuses
        self._rnns = [m for m in modules if isinstance(m, nn.RNNBase)]
        self.segments, self.numel = self._layout(self.params, align)
        self.num_elements = sum(s.numel for s in self.segments)
        sizes, self._chunk_index = [], []
        end = 0
        for seg in self.segments:
            if seg.offset > end:
                sizes.append(seg.offset - end)
            self._chunk_index.append(len(sizes))
            sizes.append(seg.numel)
            end = seg.offset + seg.numel
        if self.numel > end:
            sizes.append(self.numel - end)
        self._split_sizes = sizes
        data = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        grad = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        self.data: Tensor = data
        self.grad: Tensor = grad
        self._install(data, grad)

    @staticmethod
    def _layout(params: Sequence[Tensor], align: int | None) -> tuple[list[Segment], int]:
        itemsize = params[0].element_size()
        step = 1 if not align else max(1, align // math.gcd(align, itemsize))
        if align and (align % itemsize) and (itemsize % align):
            raise ValueError(f"align={align} bytes is not compatible with {itemsize}-byte elements")
        segments, offset = [], 0
        for p in params:
            offset = -(-offset // step) * step
            stride = tuple(p.stride())
            if not _dense_strides(p.shape, stride):
                stride = _contiguous_strides(p.shape)
            segments.append(Segment(offset, p.numel(), p.shape, stride))
            offset += p.numel()
        total = -(-offset // step) * step if align else offset
        return segments, total

    def views(self, flat: Tensor) -> list[Tensor]:
        """Parameter-shaped views of a flat tensor laid out like this buffer."""
        chunks = torch.split(flat, self._split_sizes)
        return [_view(chunks[i], s) for i, s in zip(self._chunk_index, self.segments)]

    def _install(self, data: Tensor, grad: Tensor) -> None:
        """Copy the parameters' current values (and gradients) into ``data`` (and ``grad``)
        and make them views of it."""
        # A parameter referenced by a live autograd graph (its AccumulateGrad node) cannot
        # move: swap_tensors would only poison that node and fail at the next backward.
        # Check them all before swapping any, so a refusal leaves everything untouched.
        if any(p._use_count() > 1 for p in self.params):
            raise RuntimeError(
                "gameopt cannot fuse a parameter while an autograd graph still uses it "
                "(drop the outputs and losses of earlier forward passes first, or fuse before the forward pass)"
            )
        for handle in getattr(self, "_hooks", ()):
            handle.remove()  # our previous relinking hooks; fresh ones are added below
        data_views, grad_views = self.views(data), self.views(grad)
        with torch.no_grad():
            for p, view, gview in zip(self.params, data_views, grad_views):
                view.copy_(p.detach())
                g = p.grad  # keep an existing gradient (fusing after a backward, or re-fusing)
                if g is not None and g is not gview and g.shape == p.shape:
                    gview.copy_(g.to_dense() if g.is_sparse else g.detach())
        for rnn in self._rnns:
            rnn._flat_weight_refs = []
        for p, view, gview in zip(self.params, data_views, grad_views):
            new = nn.Parameter(view, requires_grad=p.requires_grad)
            new.__dict__.update(p.__dict__)
            try:
                torch.utils.swap_tensors(p, new)
            except RuntimeError as err:
                raise RuntimeError(f"gameopt cannot fuse a parameter: {err}") from err
            # swap_tensors leaves the C++ side of tensor hooks on the old storage:
            # re-assigning the hook dicts registers them on the new one.
            for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
                hooks = getattr(p, attr)
                if hooks is not None:
                    setattr(p, attr, hooks)
            p.grad = gview
        for rnn in self._rnns:
            rnn._init_flat_weights()
        self.data, self.grad = data, grad
        self._grad_views = grad_views
        self._ptrs = [p.data_ptr() for p in self.params]
        self._shapes = [p.shape for p in self.params]
        # swap_tensors dropped any hooks: (re)install the relinking hooks
        self._hooks = [p.register_post_accumulate_grad_hook(self._relink_hook(i)) for i, p in enumerate(self.params)]

    def _relink_hook(self, i: int) -> Callable[[Tensor], None]:
        """After a backward that put ``p.grad`` elsewhere (for example after
        ``zero_grad(set_to_none=True)``), copy it into the buffer and relink."""
        ref = weakref.ref(self)

        def relink(p: Tensor) -> None:
            buf = ref()
            if buf is None or buf.params[i] is not p:
                return
            view, g = buf._grad_views[i], p.grad
            if g is view or g is None or g.grad_fn is not None:
                return
            with torch.no_grad():
                view.copy_(g.to_dense() if g.is_sparse else g)
            p.grad = view

        return relink

    def rehome(self, data: Tensor, grad: Tensor) -> None:
        """Move the buffer into the given flat storage (for example a slice of a
        game's joint storage), keeping values and gradients."""
        with torch.no_grad():
            data.copy_(self.data)
            grad.copy_(self.grad)
        self._install(data, grad)

    def stale(self) -> str | None:
        """Why the parameters no longer live in this buffer, or ``None``."""
        # fast path, iterated in C: same storage pointers and shapes as when fused
        if links_intact(self.params, self._ptrs, self._shapes):
            return None
        for p, ptr, seg in zip(self.params, self._ptrs, self.segments):
            if p.data_ptr() != ptr:
                if p.dtype != self.dtype or p.device != self.device:
                    return f"a parameter moved to {p.device}/{p.dtype} (was {self.device}/{self.dtype})"
                return "a parameter's storage was replaced (p.data = ... or a conversion)"
            if p.shape != seg.shape:
                return f"a parameter changed shape from {tuple(seg.shape)} to {tuple(p.shape)}"
        return None

    def relink_grads(self) -> None:
        """Make every ``.grad`` the buffer's view again: a ``None`` gradient becomes
        exact zeros, a gradient stored elsewhere is copied in."""
        with torch.no_grad():
            for p, view in zip(self.params, self._grad_views):
                g = p.grad
                if g is view:
                    continue
                if g is None:
                    view.zero_()
                else:
                    view.copy_(g.to_dense() if g.is_sparse else g.detach())
                    if g.grad_fn is not None:
                        continue  # a create_graph gradient: leave it, the buffer holds its value
                p.grad = view

    def grad_view(self, index: int) -> Tensor:
        return self._grad_views[index]

    def __repr__(self) -> str:
        return (
            f"FlatBuffer(device={self.device}, dtype={self.dtype}, tensors={len(self.params)}, "
            f"elements={self.num_elements}, numel={self.numel})"
        )
