"""Fused flat storage for one (device, dtype) group of parameters.

A :class:`FlatBuffer` owns two 1-D tensors, ``data`` and ``grad``. Every
parameter of the group becomes a view into ``data`` (installed with
:func:`torch.utils.swap_tensors`, so the parameter keeps its Python identity and
shares the version counter of the flat tensor), and its ``.grad`` is the matching
view into ``grad``. Views are made with :func:`torch.split` and keep the
parameter's strides (a ``channels_last`` weight stays ``channels_last``).

``data`` is a :class:`FlatParameter`: a 1-D tensor that any ``torch.optim``
optimizer (LBFGS included) and ``clip_grad_norm_`` take, whose ``.grad`` is the
flat gradient. It is one persistent object: when the buffer moves (into a game's
joint storage) or its player re-fuses, the same tensor object follows the
parameters, so an optimizer built on it keeps training the module.

Every parameter carries a post-accumulate-grad hook of gameopt's that copies a
gradient stored elsewhere into the buffer and makes the view ``.grad`` again; such
a hook has the attribute ``gameopt_relink`` set to ``True`` (:func:`is_relink_hook`).
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from . import _torch_compat as tc
from .unmovable import why_unmovable


@dataclass(frozen=True)
class Segment:
    """Where one parameter lives inside a flat buffer."""

    offset: int
    numel: int
    shape: torch.Size
    stride: tuple[int, ...]
    contiguous: bool = True  # ``stride`` is the row-major one of ``shape``


_shape = operator.attrgetter("shape")
_grad = operator.attrgetter("grad")


def shapes(tensors: Sequence[Tensor]) -> list[torch.Size]:
    """The shapes of ``tensors``, read in one C-level pass."""
    return list(map(_shape, tensors))


def grads_linked(params: Sequence[Tensor], views: Sequence[Tensor], none_ok: bool = False) -> bool:
    """Every ``params[k].grad`` is ``views[k]`` (iterated in C, so it can run every
    step); with ``none_ok``, a ``None`` gradient counts as linked too."""
    if all(map(operator.is_, map(_grad, params), views)):
        return True
    return none_ok and all(g is None or g is v for g, v in zip(map(_grad, params), views))


def split_plan(spans: Sequence[tuple[int, int]], total: int) -> tuple[list[int], list[int]]:
    """How one ``torch.split`` cuts a flat tensor of ``total`` elements into ``spans``
    ((start, numel) in increasing order, not overlapping): the chunk sizes, padding
    included, and per span the index of its chunk. The spans tile the tensor when
    there are as many chunks as spans."""
    sizes: list[int] = []
    index: list[int] = []
    end = 0
    for start, numel in spans:
        if start > end:
            sizes.append(start - end)
        index.append(len(sizes))
        sizes.append(numel)
        end = start + numel
    if total > end:
        sizes.append(total - end)
    return sizes, index


def links_intact(params: Sequence[Tensor], ptrs: list[int], shapes: list[torch.Size]) -> bool:
    """True when every parameter still has the storage pointer and shape it had when
    fused (``ptrs``, ``shapes``: lists): the fused links hold. Iterated in C, so it
    can run every step."""
    return list(map(Tensor.data_ptr, params)) == ptrs and list(map(_shape, params)) == shapes


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


def contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    """The row-major (contiguous) strides of ``shape``."""
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def segment_view(chunk: Tensor, seg: Segment) -> Tensor:
    """A view of the 1-D ``chunk`` with the segment's shape and strides."""
    if seg.contiguous:
        return chunk.view(seg.shape)
    # Lay the dims out from the largest stride to the smallest, then permute back.
    order = sorted(range(len(seg.shape)), key=lambda d: (-seg.stride[d], d))
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    return chunk.view([seg.shape[d] for d in order]).permute(inverse)


_STALE_HINT = "take player.flat_param (or player.buffers[i].data) again and build the optimizer on it"


class FlatParameter(Tensor):
    """The flat parameter tensor of a :class:`~gameopt.buffer.FlatBuffer` (``player.flat_param``).

    A plain 1-D tensor (``requires_grad=False``, a leaf) over the buffer's storage:
    in-place writes are what the module computes with, and it shares the version
    counter of the parameters' views. Its ``.grad`` is the buffer's flat gradient,
    read through the player (so a module converted or changed since fusing is
    re-fused first); assigning ``None`` (what ``optimizer.zero_grad()`` does)
    zeroes the flat gradient in place and keeps every link, so the next backward
    accumulates into zeros. So ``torch.optim.Adam([player.flat_param])``,
    ``LBFGS([player.flat_param])`` and ``clip_grad_norm_([player.flat_param], c)`` work
    like their per-parameter versions on the module. Padding (``align=``) reads as
    zero gradient and stays zero under the usual optimizers.

    Operations on it return plain tensors; pickling and ``copy.deepcopy`` give
    plain tensors too.
    """

    __torch_function__ = tc.disabled_torch_function_impl  # type: ignore[assignment]  # as nn.Parameter does

    @property
    def grad(self) -> Tensor:
        buf = _buffer_of(self)
        buf.relink_grads()
        return buf.grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        buf = _buffer_of(self)
        if value is None:
            buf.zero_grad()
            return
        if value is not buf.grad:
            if not isinstance(value, Tensor) or value.shape != buf.grad.shape:
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                expected = buf.padded_numel
                raise RuntimeError(f"assigned grad has data of a different size: expected {expected}, got {got}")
            if value.dtype != buf.dtype or value.device != buf.device:
                raise RuntimeError(
                    f"assigned grad is {value.device}/{value.dtype}, the flat parameter {buf.device}/{buf.dtype}"
                )
            with torch.no_grad():
                buf.grad.copy_(value)
        buf._link_grads()

    @grad.deleter
    def grad(self) -> None:
        self.grad = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.detach().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> Tensor:
        out = self.detach().clone()
        memo[id(self)] = out
        return out


class _StaleFlatParameter(Tensor):
    """A :class:`FlatParameter` that could not follow its parameters: every use raises."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        why = next((a.__dict__.get("_gameopt_why") for a in args if isinstance(a, cls)), None)
        raise RuntimeError(_stale_message(why))

    def __repr__(self) -> str:  # type: ignore[override]
        return f"<stale gameopt FlatParameter: {self.__dict__.get('_gameopt_why')}>"


def _stale_message(why: str | None) -> str:
    return (
        f"this gameopt flat parameter tensor no longer holds the module's parameters ({why}); "
        f"training it would change nothing: {_STALE_HINT}"
    )


def mark_stale(handle: Tensor, why: str) -> None:
    handle.__class__ = _StaleFlatParameter
    handle.__dict__.clear()
    handle.__dict__["_gameopt_why"] = why


def _held(t: Tensor) -> bool:
    """Something besides ``t`` itself holds it (an autograd graph, a view, a wrapper), or a weakref."""
    return tc.use_count(t) > 1 or bool(weakref.getweakrefs(t))


def _swappable(t: Tensor) -> bool:
    """``swap_tensors`` accepts ``t``: no other C++ reference (an autograd graph) and no weakref."""
    return not _held(t)


def _buffer_of(handle: Tensor) -> FlatBuffer:
    """The buffer a flat parameter belongs to, after its player noticed any change."""
    buf = handle.__dict__.get("_gameopt_buffer")
    if buf is None:
        raise RuntimeError(_stale_message("it belongs to no FlatBuffer"))
    buf._refresh()
    if type(handle) is not FlatParameter:  # re-fusing could not carry it over
        raise RuntimeError(_stale_message(handle.__dict__.get("_gameopt_why")))
    return handle.__dict__["_gameopt_buffer"]


def _relink_hook_fn(ref: weakref.ref, i: int) -> Callable[[Tensor], None]:
    """After a backward that put ``p.grad`` elsewhere (for example after
    ``zero_grad(set_to_none=True)``), copy it into the buffer and relink."""

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

    relink.gameopt_relink = True  # type: ignore[attr-defined]
    return relink


def is_relink_hook(fn: Any) -> bool:
    """``fn`` is gameopt's relinking hook (its ``gameopt_relink`` attribute is ``True``)."""
    return getattr(fn, "gameopt_relink", False) is True


def only_relink_hooks(p: Tensor) -> bool:
    """``p`` has post-accumulate-grad hooks and every one is gameopt's relinking hook."""
    hooks = tc.post_accumulate_grad_hooks(p)
    return hooks is not None and bool(hooks) and all(map(is_relink_hook, hooks.values()))


def _drop_relink_hooks(p: Tensor) -> None:
    """Remove gameopt's relinking hooks (of any buffer, past or present) from ``p``."""
    hooks = tc.post_accumulate_grad_hooks(p)
    if hooks:
        for key in [k for k, fn in hooks.items() if is_relink_hook(fn)]:
            del hooks[key]


def rebind(p: Tensor, value: Tensor) -> None:
    """Make ``value`` the storage of ``p`` with :func:`torch.utils.swap_tensors`: Python
    identity, attributes and hooks stay; the old ``.grad`` is dropped."""
    new = nn.Parameter(value, requires_grad=p.requires_grad)
    new.__dict__.update(p.__dict__)
    try:
        torch.utils.swap_tensors(p, new)
    except RuntimeError as err:
        raise RuntimeError(f"gameopt cannot fuse a parameter: {err}") from err
    # swap_tensors leaves the C++ side of tensor hooks on the old storage:
    # re-assigning the hook dicts registers them on the new one.
    tc.rehome_hooks(p)


def release(p: Tensor) -> None:
    """A parameter that left its buffer (frozen, removed or replaced): its own copy of
    its current value and gradient, no gameopt hooks. Best effort: a parameter that a
    live autograd graph (or a recurrent layer's weak reference) holds stays a view."""
    _drop_relink_hooks(p)
    g = p.grad
    if _swappable(p):
        try:
            rebind(p, p.detach().clone())
        except RuntimeError:
            pass
    if g is not None:
        p.grad = g.detach().clone()


class FlatBuffer:
    """Flat parameter and gradient storage for parameters of one device and dtype.

    Args:
        params: parameters that all share one device and dtype, each listed once.
        align: pad each parameter's start to a multiple of this many bytes
            (``None``: tight packing). Padding is zero and stays zero.
        modules: the modules the parameters belong to (recurrent layers need care).
        owner: the :class:`~gameopt.Player` whose ``refresh()`` re-fuses the buffer
            when its module changed; reading ``data.grad`` runs it.

    Attributes:
        data: the flat parameter (:class:`FlatParameter`), one persistent tensor
            object for the group: give it to a ``torch.optim`` optimizer.
        grad: the flat gradient (``data.grad`` returns it).
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        align: int | None = None,
        modules: Sequence[nn.Module] = (),
        owner: Any = None,
    ) -> None:
        if not params:
            raise ValueError("FlatBuffer needs at least one parameter")
        self.device = params[0].device
        self.dtype = params[0].dtype
        self.align = align
        self.params = list(params)
        self._owner = owner
        self._modules = list(modules)  # named when a parameter cannot move
        # recurrent layers keep weak references to their weights, which swap_tensors refuses
        self._rnns = [m for m in modules if isinstance(m, nn.RNNBase)]
        self.segments, self.padded_numel = self._layout(self.params, align)
        self.num_elements = sum(s.numel for s in self.segments)
        spans = [(s.offset, s.numel) for s in self.segments]
        self._split_sizes, self._chunk_index = split_plan(spans, self.padded_numel)
        #: whether the parameters tile the buffer in order, each contiguous and without
        #: padding, so that the buffer is the ``cat`` of their flattened tensors
        self.packed = len(self._split_sizes) == len(self.segments) and all(s.contiguous for s in self.segments)
        data = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
        grad = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
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
                stride = contiguous_strides(p.shape)
            segments.append(Segment(offset, p.numel(), p.shape, stride, stride == contiguous_strides(p.shape)))
            offset += p.numel()
        total = -(-offset // step) * step if align else offset
        return segments, total

    def views(self, flat: Tensor) -> list[Tensor]:
        """Parameter-shaped views of a flat tensor laid out like this buffer."""
        chunks = torch.split(flat, self._split_sizes)
        return [segment_view(chunks[i], s) for i, s in zip(self._chunk_index, self.segments)]

    def _install(self, data: Tensor, grad: Tensor) -> None:
        """Copy the parameters' current values (and gradients) into ``data`` (and ``grad``)
        and make them views of it; the flat parameter ``self.data`` follows."""
        # A parameter referenced by a live autograd graph (its AccumulateGrad node), a
        # view or a wrapper cannot move: swap_tensors refuses it (or, for a graph, would
        # poison that node). Check them all before swapping any, so a refusal leaves
        # everything untouched.
        if any(map(_held, self.params)):
            why = why_unmovable(self.params, self._modules)
            if why is not None:
                raise RuntimeError(why)
        data_views, grad_views = self.views(data), self.views(grad)
        with torch.no_grad():
            for p, view, gview in zip(self.params, data_views, grad_views):
                view.copy_(p.detach())
                g = p.grad  # keep an existing gradient (fusing after a backward, or re-fusing)
                if g is not None and g is not gview and g.shape == p.shape:
                    gview.copy_(g.to_dense() if g.is_sparse else g.detach())
        for p in self.params:
            _drop_relink_hooks(p)  # of this buffer's earlier home, or of the buffer it re-fuses
        for rnn in self._rnns:
            tc.rnn_flat_weights_cleared(rnn)
        for p, view, gview in zip(self.params, data_views, grad_views):
            rebind(p, view)
            p.grad = gview
        for rnn in self._rnns:
            tc.rnn_flat_weights_init(rnn)
        self.grad = grad
        self._grad_views = grad_views
        self._ptrs = [p.data_ptr() for p in self.params]
        self._shapes = [p.shape for p in self.params]
        ref = weakref.ref(self)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(_relink_hook_fn(ref, i))
        self.follow(data)

    def follow(self, data: Tensor) -> None:
        """Point the flat parameter at ``data``: the same Python object when it can move
        (``swap_tensors``), else a new one and the old one raises when used."""
        alias = data.view(-1)  # own tensor object; shares storage and version counter
        alias.__class__ = FlatParameter
        alias.__dict__["_gameopt_buffer"] = self
        handle = self.__dict__.get("data")
        if type(handle) is FlatParameter and handle.__dict__.get("_gameopt_buffer") is self:
            if _swappable(handle):
                torch.utils.swap_tensors(handle, alias)  # alias now holds the old storage
                alias.__class__ = Tensor
                alias.__dict__.clear()
                alias = handle
            else:
                mark_stale(handle, "it could not move with its buffer while an autograd graph or a weakref held it")
        self.data: Tensor = alias

    def adopt(self, old: FlatBuffer) -> None:
        """Take over the flat parameter object of ``old`` (the buffer this one replaces
        when a player re-fuses), so that optimizers built on it keep working."""
        handle = old.__dict__.get("data")
        if type(handle) is not FlatParameter or handle.__dict__.get("_gameopt_buffer") is not old:
            return
        if not _swappable(handle):
            mark_stale(handle, "the player re-fused while an autograd graph or a weakref held it")
            return
        mine = self.data
        torch.utils.swap_tensors(handle, mine)  # handle: this buffer's storage; mine: the old one
        handle.__dict__["_gameopt_buffer"] = self
        mine.__class__ = Tensor
        mine.__dict__.clear()
        old.data = mine
        self.data = handle

    def _refresh(self) -> None:
        """Let the owning player re-fuse a changed module; without one, refuse a stale buffer."""
        if self._owner is not None:
            self._owner.refresh()
            return
        why = self.why_stale()
        if why is not None:
            raise RuntimeError(f"gameopt: {why}, and this FlatBuffer has no player to re-fuse it")

    def rehome(self, data: Tensor, grad: Tensor) -> None:
        """Move the buffer into the given flat storage (for example a slice of a
        game's joint storage), keeping values and gradients. ``self.data`` (the same
        tensor object) follows."""
        with torch.no_grad():
            data.copy_(self.data)
            grad.copy_(self.grad)
        self._install(data, grad)

    def why_stale(self) -> str | None:
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
        if grads_linked(self.params, self._grad_views):
            return  # fast path, iterated in C
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

    def _link_grads(self) -> None:
        """Point every ``.grad`` at its view of the buffer, whatever it held."""
        if grads_linked(self.params, self._grad_views):
            return
        for p, view in zip(self.params, self._grad_views):
            if p.grad is not view:
                p.grad = view

    def zero_grad(self) -> None:
        """Zero the flat gradient in place; every ``.grad`` stays (or becomes) its view."""
        with torch.no_grad():
            self.grad.zero_()
        self._link_grads()

    def release(self, p: Tensor) -> None:
        """``p`` (one of this buffer's parameters) in storage of its own again
        (:func:`release`)."""
        release(p)

    def grad_view(self, index: int) -> Tensor:
        return self._grad_views[index]

    def __repr__(self) -> str:
        return (
            f"FlatBuffer(device={self.device}, dtype={self.dtype}, tensors={len(self.params)}, "
            f"elements={self.num_elements}, padded_numel={self.padded_numel})"
        )
