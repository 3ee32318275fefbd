"""The one place that knows autograd's subtleties.

* First-order ξ: a backward of each player's loss pruned to that player's own
  parameters (no ``create_graph``). A player with large tensors gets its gradient
  through ``.grad``, one tensor at a time (gameopt's relinking hook copies each into
  the buffer, so the player's gradient is never alive whole beside it); a player
  with small ones has it captured with ``autograd.grad`` and copied with one
  ``_foreach_copy_`` (cheaper per tensor). The same bits either way.
* Jacobian products: a detached alias of each parameter (the same storage, a leaf
  of its own, so the kept graph pins no parameter; made once per layout) is
  substituted for it while the losses run; ``autograd.grad(..., create_graph=True)``
  gives a differentiable ξ, one tensor per parameter. ``Jᵀv`` is one reverse pass
  over that graph with per-parameter grad_outputs (views of ``v``): no ``split``,
  view or ``cat`` node in the graph; joint vectors are formed outside it (one
  ``cat`` per group where the parameters tile it). Products go to autograd's engine
  without ``autograd.grad``'s Python-side check of each grad_output
  (:func:`_product`), whose cost grows with the number of tensors. ``Jv`` is
  forward-over-reverse where every op supports forward-mode AD (dual tensors on a
  flat leaf per player buffer, whose ``split`` views are substituted), else the
  double-vjp trick. A zero-sum pair (f, −f) has every product as a Hessian-vector
  product of f (:class:`ZeroSumLinearization`).
* During Jacobian products scaled-dot-product attention uses the math backend and
  mkldnn is off, since the fused CPU kernels have no double backward.
* Every evaluation runs inside the step's :class:`~gameopt.evaluation.Evaluations`
  (same random numbers, module buffers moved once); a re-evaluation with dual
  tensors falls back to the double-vjp trick only where PyTorch reports an op
  without a forward-mode formula, never on the user's errors.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor, nn

from . import _torch_compat as tc
from .buffer import _grad, _shape
from .evaluation import Evaluations, LossError, split_losses
from .layout import Entry, JointLayout
from .vec import Vec

log = logging.getLogger(__name__)


class ForwardMode:
    """Whether Jv may use forward-mode AD for these losses: set to False, once, when
    PyTorch reports an op without a forward-mode formula (then double backward)."""

    def __init__(self) -> None:
        self.ok = True


@dataclass(frozen=True)
class Problem:
    """All that this module sees of a game (it never sees the ``Game``): per player
    its name, parameters, their views into the flat gradient buffer, where each is
    registered in its module, and whether it has sparse gradients; the joint layout;
    the cross-rank average of a joint vector. The game builds one per layout."""

    names: list[str]
    params: list[list[nn.Parameter]]
    grad_views: list[list[Tensor]]
    places: list[list[list[tuple[nn.Module, str]]]]
    sparse: list[bool]
    sizes: list[int]  # trainable elements per player
    modules: list[nn.Module]  # the players' modules (players given as tensors have none)
    recurrent: bool  # a recurrent layer among them (its CPU kernel has no forward-mode AD)
    layout: JointLayout
    mean_: Callable[[Vec], Vec]  # average across ranks in place (identity on one process)
    parallel: bool  # data-parallel: ξ is an average across ranks
    forward_mode: ForwardMode

    @property
    def functional(self) -> bool:
        """Every player has a module whose parameters can be substituted."""
        return len(self.modules) == len(self.names)

    # Made once per layout (the game builds a new problem when a player re-fuses):
    @functools.cached_property
    def registrations(self) -> list[tuple[nn.Module, str, nn.Parameter]]:
        """(module, name, parameter) for every place a parameter is registered."""
        return [
            (sub, name, p)
            for params, registered in zip(self.params, self.places)
            for p, places in zip(params, registered)
            for sub, name in places
        ]

    @functools.cached_property
    def aliases(self) -> dict[int, Tensor]:
        """Per parameter (by id): a detached alias (the same storage and version
        counter, a leaf of its own) that kept graphs are built on, so that they pin
        no parameter. Shared by every linearization of this layout."""
        return {id(p): p.detach().requires_grad_() for ps in self.params for p in ps}

    @functools.cached_property
    def inputs(self) -> list[tuple[nn.Parameter, ...]]:
        """Per player, its parameters as the tuple autograd's engine takes."""
        return [tuple(ps) for ps in self.params]

    @functools.cached_property
    def group_params(self) -> list[list[nn.Parameter]]:
        """Per joint group, its parameters in storage order."""
        layout = self.layout
        return [[p for e in layout.group_entries(g) for p in e.buffer.params] for g in range(len(layout.data))]

    @functools.cached_property
    def packed(self) -> list[bool]:
        """Per joint group: its parameters tile it in storage order (see :func:`_packed`)."""
        return [_packed(self.layout, g) for g in range(len(self.layout.data))]

    @functools.cached_property
    def entry_packed(self) -> list[bool]:
        """Per layout entry: its parameters tile its buffer (see :func:`_entry_packed`)."""
        return list(map(_entry_packed, self.layout.entries))

    @functools.cached_property
    def entries_of(self) -> list[list[int]]:
        """Per player, the indices of its layout entries."""
        entries = self.layout.entries
        return [[k for k, e in enumerate(entries) if e.player == i] for i in range(len(self.names))]

    @functools.cached_property
    def group_entries(self) -> list[list[int]]:
        """Per joint group, the indices of its layout entries in storage order."""
        layout = self.layout
        index = {id(e): k for k, e in enumerate(layout.entries)}
        return [[index[id(e)] for e in layout.group_entries(g)] for g in range(len(layout.data))]


def evaluate_losses(problem: Problem, closure: Callable[[], Any]) -> tuple[list[Tensor], dict[str, Any]]:
    """Evaluate the losses (``closure()``): one scalar per player (checked) and the metrics."""
    return split_losses(closure(), problem.names)


def _no_path(player_name: str) -> LossError:
    return LossError(f"the loss of player {player_name!r} does not depend on that player's parameters")


def first_order(
    problem: Problem, which: Sequence[int], closure: Callable[[], Any], scale: float = 1.0
) -> tuple[list[Tensor], dict[str, Any]]:
    """ξ_i for the players in ``which`` into the fused gradient buffers; returns the
    detached losses and the metrics. Other players' gradient buffers are left untouched.
    With ``scale`` (loss scaling), the losses are differentiated times ``scale`` and
    the gradients divided by it (an overflow shows as a non-finite ξ).

    Each player's backward is pruned to its own parameters. A player whose tensors
    are large (:data:`_IN_PLACE`) gets its gradient into its buffer through ``.grad``,
    one tensor at a time (:func:`_through_grad`: the player's gradient is never alive
    whole beside the buffer); the others' gradients are captured (``autograd.grad``)
    and copied into the buffers, several players at once (:data:`_COPY_BATCH`). Both
    write the same bits."""
    losses, metrics = evaluate_losses(problem, closure)
    if scale != 1.0:
        losses = [loss * scale for loss in losses]
    last = len(which) - 1
    dst: list[Tensor] = []
    src: list[Tensor] = []
    pending = 0
    for k, i in enumerate(which):
        if _in_place(problem, i):
            _through_grad(problem, i, losses[i], retain_graph=k < last)
            if scale != 1.0:
                with torch.no_grad():
                    tc.foreach_div_(problem.grad_views[i], scale)
            continue
        pending += _captured(problem, i, losses[i], k < last, dst, src)
        # copy many small players' gradients at once; large ones right away (memory)
        if pending >= _COPY_BATCH:
            _copy_into(dst, src, scale)
            dst, src, pending = [], [], 0
    if dst:
        _copy_into(dst, src, scale)
    if scale == 1.0:
        return [loss.detach() if loss.dim() == 0 else loss.detach().reshape(()) for loss in losses], metrics
    return [(loss.detach() / scale).reshape(()) for loss in losses], metrics


_COPY_BATCH = 1 << 18  # elements of pending gradients that trigger a copy into the buffers
#: a player whose parameter tensors hold at least this many elements on average gets
#: its gradient through ``.grad`` (one tensor alive at a time; a little more per
#: tensor), a smaller one has it captured and copied (cheaper per tensor)
_IN_PLACE = 1 << 12


def _captured(problem: Problem, i: int, loss: Tensor, retain_graph: bool, dst: list[Tensor], src: list[Tensor]) -> int:
    """``autograd.grad`` of player i's loss: queue its gradients (``src``) for a copy into
    its views (``dst``); a view no gradient reaches is zeroed now. Returns its size."""
    try:
        grads = _gradient(loss, problem.inputs[i], retain_graph)
    except RuntimeError as err:
        if loss.grad_fn is None:
            raise _no_path(problem.names[i]) from err
        raise
    views = problem.grad_views[i]
    if all(map(operator.is_not, grads, repeat(None))) and not problem.sparse[i]:
        dst += views  # the common case
        src += grads
        return problem.sizes[i]
    have = [(v, g) for v, g in zip(views, grads) if g is not None]
    if not have:
        raise _no_path(problem.names[i])
    with torch.no_grad():  # the zeroing
        for v, g in zip(views, grads):
            if g is None:
                v.zero_()
    dst += [v for v, _ in have]
    src += [g.to_dense() if g.is_sparse else g for _, g in have]
    return problem.sizes[i]  # ``grads`` goes with this frame: once copied, no gradient outlives its batch


def _gradient(loss: Tensor, inputs: tuple[Tensor, ...], retain_graph: bool) -> tuple[Tensor | None, ...]:
    """``torch.autograd.grad(loss, inputs, allow_unused=True)`` of a one-element loss:
    straight to autograd's engine with ``ones_like(loss)`` as the output's gradient
    (what ``grad`` forms for it), without ``grad``'s Python-side handling of its
    arguments. A loss that is not a real floating-point tensor, or tensors with
    ``__torch_function__``, take the public function (and its errors)."""
    if (
        tc.engine_run_backward is None
        or not loss.is_floating_point()
        or torch.overrides.has_torch_function((loss, *inputs))
    ):
        return torch.autograd.grad(loss, inputs, retain_graph=retain_graph, allow_unused=True)
    ones = (torch.ones_like(loss, memory_format=torch.preserve_format),)
    return tc.engine_run_backward((loss,), ones, retain_graph, False, inputs, True, accumulate_grad=False)


def _copy_into(dst: list[Tensor], src: list[Tensor], scale: float) -> None:
    """The captured gradients into the gradient buffers' views (tensors outside any
    graph: no grad mode to switch)."""
    tc.foreach_copy_(dst, src)
    if scale != 1.0:
        tc.foreach_div_(dst, scale)


def _in_place(problem: Problem, i: int) -> bool:
    """Whether player i's gradient goes into its buffer through ``.grad``: large
    tensors, every ``.grad`` its buffer's view or ``None``, and no post-accumulate-grad
    hook but gameopt's own relinking one (``autograd.grad``, the other path, fires
    none: users' hooks behave the same on both)."""
    params = problem.params[i]
    if not params or problem.sizes[i] < _IN_PLACE * len(params):
        return False
    views = problem.grad_views[i]
    if not all(map(operator.is_, map(_grad, params), views)):
        if any(g is not None and g is not v for g, v in zip(map(_grad, params), views)):
            return False  # a gradient of the user's own (one with a graph, say): left as it is
    for p in params:  # few tensors here (large ones)
        hooks = tc.post_accumulate_grad_hooks(p)
        if not hooks or not all(getattr(fn, "_gameopt_relink", False) for fn in hooks.values()):
            return False
    return True


def _through_grad(problem: Problem, i: int, loss: Tensor, retain_graph: bool) -> None:
    """Player i's gradient into its buffer through ``.grad``, one tensor at a time: with
    every ``.grad`` set to ``None``, ``backward(inputs=...)`` hands each parameter its
    gradient (AccumulateGrad takes the tensor, no copy) and runs gameopt's relinking
    hook, which copies it into the buffer's view (densified if sparse) and makes the
    view ``.grad`` again; the tensor is freed there. A player's gradient is never alive
    whole beside the buffer, and the buffer holds what the other path's copy writes."""
    params, views = problem.params[i], problem.grad_views[i]
    for p in params:
        p.grad = None
    try:
        torch.autograd.backward(loss, inputs=params, retain_graph=retain_graph)
    except BaseException as err:
        _relink(problem, i, check=False)
        if isinstance(err, RuntimeError) and loss.grad_fn is None:
            raise _no_path(problem.names[i]) from err
        raise
    if not all(map(operator.is_, map(_grad, params), views)):
        _relink(problem, i)


def _relink(problem: Problem, i: int, check: bool = True) -> None:
    """After :func:`_through_grad`: a parameter the backward did not reach (``.grad``
    still ``None``) gets exact zeros, as ``autograd.grad``'s ``None`` does on the other
    path; each ``.grad`` is the view again; with ``check``, none reached is a
    :class:`LossError`."""
    params, views = problem.params[i], problem.grad_views[i]
    reached = 0
    with torch.no_grad():
        for p, v in zip(params, views):
            g = p.grad
            if g is None:
                v.zero_()
            else:
                reached += 1
                if g is not v:  # not relinked by the hook (an error midway): copy it
                    v.copy_(g.to_dense() if g.is_sparse else g)
            p.grad = v
    if check and not reached:
        raise _no_path(problem.names[i])


@contextlib.contextmanager
def _substituted(problem: Problem, values: dict[int, Tensor]) -> Iterator[None]:
    """Let the modules use ``values[id(param)]`` in place of their parameters."""
    places = problem.registrations
    try:
        for sub, name, p in places:
            # in the dict itself (as torch.func.functional_call does): the module's
            # parameter order stays; looked up each time (a module's dict may be new)
            sub._parameters[name] = values[id(p)]
        yield
    finally:
        for sub, name, p in places:
            sub._parameters[name] = p


def _graph_inputs(
    problem: Problem, params: Sequence[Sequence[nn.Parameter]]
) -> tuple[list[list[Tensor]], contextlib.AbstractContextManager[None]]:
    """What a kept graph is built on, for each list of ``params``, and the context
    the losses run in. With modules: the problem's detached alias of each parameter
    (``Problem.aliases``), substituted for it, so that the graph pins no
    parameter (gameopt could not fuse it again while the graph lives). Players
    given as tensors: the tensors themselves."""
    if not problem.functional:
        return [list(ps) for ps in params], contextlib.nullcontext()
    aliases = problem.aliases
    return [[aliases[id(p)] for p in ps] for ps in params], _substituted(problem, aliases)


@contextlib.contextmanager
def jacobian_mode(problem: Problem) -> Iterator[None]:
    """Kernels with double backward: the math attention backend, and mkldnn off where
    a recurrent layer would use its (forward-AD-less) CPU kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rnn = problem.recurrent
    with tc.mkldnn_disabled(bool(rnn)), sdpa_kernel(SDPBackend.MATH):
        yield


def _make_dual(primal: Tensor, tangent: Tensor) -> Tensor:
    return tc.make_dual(primal, tangent)


def _entry_packed(e: Entry) -> bool:
    """The parameters of entry ``e`` tile its buffer in order, each contiguous (no
    padding): the entry is the ``cat`` of their flattened tensors."""
    end = 0
    for seg in e.buffer.segments:
        if seg.offset != end or not seg.contiguous:
            return False
        end += seg.numel
    return end == e.buffer.numel


def _entries_to_vec(layout: JointLayout, parts: dict[int, Tensor | None]) -> Vec:
    """A joint vector from one flat tensor (or None: zero) per entry."""
    if not layout.dense:
        out = layout.zeros()
    else:  # zero only what no part writes
        out = layout.empty()
        for k, e in enumerate(layout.entries):
            if parts.get(k) is None:
                layout.entry_view(out, e).zero_()
    with torch.no_grad():
        for k, t in parts.items():
            if t is not None:
                layout.entry_view(out, layout.entries[k]).copy_(t)
    return out


def _dual_tangents(problem: Problem, closure: Callable[[], Any], v: Vec, scale: float) -> Vec:
    """J v by forward-over-reverse: each entry's slice of the joint storage becomes a
    leaf made dual with v's slice, ``split`` views of it are substituted for the
    modules' parameters, the losses run and each player's ξ is differentiated
    (dual tensors through the backward); the tangents of ξ are J v."""
    layout = problem.layout
    leaves: list[Tensor] = []
    values: dict[int, Tensor] = {}
    for e in layout.entries:
        leaf = layout.entry_view(layout.data, e).detach().requires_grad_()
        source = _make_dual(leaf, layout.entry_view(v, e))
        for p, view in zip(e.buffer.params, e.buffer.views(source)):
            values[id(p)] = view
        leaves.append(source)
    tangents: dict[int, Tensor | None] = {}
    with jacobian_mode(problem), _substituted(problem, values):
        losses, _ = evaluate_losses(problem, closure)
        for i, name in enumerate(problem.names):
            if losses[i].grad_fn is None:
                raise _no_path(name)
            loss = losses[i] if scale == 1.0 else losses[i] * scale
            ks = [k for k, e in enumerate(layout.entries) if e.player == i]
            # no graph of the backward itself: the tangents ride along
            grads = torch.autograd.grad([loss], [leaves[k] for k in ks], retain_graph=True, allow_unused=True)
            if all(g is None for g in grads):
                raise _no_path(name)
            for k, g in zip(ks, grads):
                if g is not None and scale != 1.0:
                    g = g / scale  # loss scaling: the product is unscaled
                t = None if g is None else fwAD.unpack_dual(g).tangent
                tangents[k] = None if t is None else t.detach()
    return _entries_to_vec(layout, tangents)


#: per entry, one tensor (or None: zero, unreached) per parameter of its buffer
_Part = list[Tensor | None]


class Linearization:
    """ξ at the current point with its graph, for Jacobian products.

    ``xi`` is the joint vector field (detached). Every product below may be called
    many times and reuses the graph; :meth:`jvp` re-runs the losses with dual
    tensors when forward-mode AD is available, else uses the double-vjp trick.

    The reverse-mode products differentiate against one leaf per parameter (a
    detached alias of a module's parameter, substituted for it while the losses run;
    a player given as tensors: the tensors): no flat leaf, so no ``split``, view or
    ``cat`` node in the graph of ξ or of a product. ξ is kept as one differentiable
    tensor per parameter, a product's grad_outputs are per-parameter views of its
    joint vector, and its per-parameter results become a joint vector outside the graph.

    Notation: J = ∂ξ/∂w; D = blockdiag(∂ξ_i/∂w_i) (symmetric Hessians ∇²_{w_i} f_i);
    H_o = J − D, the off-diagonal blocks.
    """

    def __init__(
        self,
        problem: Problem,
        closure: Callable[[], Any],
        evaluations: Evaluations,
        average: bool = True,
        scale: float = 1.0,
        cross: bool = False,
    ) -> None:
        self.problem, self.closure, self.scale = problem, closure, scale
        self.evaluations = evaluations
        self._spent = False  # a product with last=True freed the graph
        self._mean = problem.mean_
        layout = problem.layout
        self.layout = layout
        self.entries_of = problem.entries_of
        self.functional = problem.functional
        # per entry, per parameter: the tensors differentiated against
        self.inputs, substituted = _graph_inputs(problem, [e.buffer.params for e in layout.entries])
        self._entry_packed = problem.entry_packed
        self._groups = problem.group_entries
        self._all_packed = all(problem.packed)
        with jacobian_mode(problem), substituted:
            self.losses, self.metrics = evaluate_losses(problem, closure)
            # per entry, per parameter: differentiable ξ
            self.pieces: list[_Part] = [[None] * len(ins) for ins in self.inputs]
            # with ``cross``, per player i: ∇_{w_k} f_i for the other players' entries k, with its graph
            self.cross: list[dict[int, _Part | None]] | None = [] if cross else None
            for i, name in enumerate(problem.names):
                if self.losses[i].grad_fn is None:
                    raise _no_path(name)
                loss = self.losses[i] if scale == 1.0 else self.losses[i] * scale
                ins = self._all() if self.cross is not None else self.entries_of[i]
                grads = self._grad([loss], None, ins, create_graph=True)
                if scale != 1.0:  # loss scaling: every product below is unscaled
                    grads = {
                        k: None if g is None else [None if t is None else t / scale for t in g]
                        for k, g in grads.items()
                    }
                if all(grads[k] is None for k in self.entries_of[i]):
                    raise _no_path(name)
                for k in self.entries_of[i]:
                    g = grads.pop(k)
                    if g is not None:
                        self.pieces[k] = g
                if self.cross is not None:
                    self.cross.append(grads)
        self.xi = self._to_vec(dict(enumerate(self.pieces)))  # formed outside the graph
        if average:
            self._mean(self.xi)

    # ------------------------------------------------------------ primitives
    def _zeros(self, k: int) -> Tensor:
        buf = self.layout.entries[k].buffer
        return torch.zeros(buf.numel, dtype=buf.dtype, device=buf.device)

    def _views(self, flat: Tensor, k: int) -> list[Tensor]:
        """Per-parameter views of ``flat``, laid out like entry ``k``'s buffer."""
        if self._entry_packed[k]:
            return tc.unflatten_dense(flat, self.inputs[k])
        return self.layout.entries[k].buffer.views(flat)

    def _parts(self, v: Vec, ks: list[int]) -> list[list[Tensor]]:
        """Per-parameter views of the entries ``ks`` of ``v`` (grad_outputs)."""
        return [self._views(self.layout.entry_view(v, self.layout.entries[k]), k) for k in ks]

    def _filled(self, k: int, part: _Part) -> list[Tensor]:
        """``part`` with a zero tensor for each parameter no gradient reached (grad_outputs)."""
        return [torch.zeros_like(p) if t is None else t for t, p in zip(part, self.inputs[k])]

    def _grad(
        self,
        outputs: Sequence[Tensor | None],
        grad_outputs: Sequence[Tensor | None] | None,
        ins: list[int],
        create_graph: bool = False,
        last: bool = False,
    ) -> dict[int, _Part | None]:
        """Reverse mode: Σ ⟨outputs, grad_outputs⟩ differentiated against the inputs
        of entries ``ins``; one tensor (or None) per parameter, None for an entry no
        gradient reached. Outputs that are None or have no graph are left out.
        ``last``: free the graph as the pass goes (no product may follow)."""
        _check_unspent(self)
        self._spent = last
        keep = [n for n, o in enumerate(outputs) if o is not None and o.requires_grad]
        if not keep:
            return dict.fromkeys(ins)
        inputs = [t for k in ins for t in self.inputs[k]]
        retain = create_graph or not last
        if grad_outputs is None:  # losses: scalars
            grads = torch.autograd.grad(
                [outputs[n] for n in keep], inputs, retain_graph=retain, create_graph=create_graph, allow_unused=True
            )
        else:
            grads = _product(
                [outputs[n] for n in keep],  # type: ignore[misc]
                inputs,
                [grad_outputs[n] for n in keep],  # type: ignore[misc]
                retain_graph=retain,
                create_graph=create_graph,
            )
        out: dict[int, _Part | None] = {}
        pos = 0
        for k in ins:
            n = len(self.inputs[k])
            part = list(grads[pos : pos + n])
            pos += n
            out[k] = None if all(g is None for g in part) else part
        return out

    def _reverse(self, outs: list[int], u: Vec, ins: list[int], last: bool = False) -> dict[int, _Part | None]:
        """Σ_{k in outs} (∂ξ_k/∂w_ins)ᵀ u_k."""
        pieces = [t for k in outs for t in self.pieces[k]]
        us = [w for part in self._parts(u, outs) for w in part]
        return self._grad(pieces, us, ins, last=last)

    def _to_vec(self, parts: dict[int, _Part | None]) -> Vec:
        """A joint vector from per-parameter tensors (None: zero) per entry, outside the graph."""
        layout = self.layout
        with torch.no_grad():
            if any(self.problem.sparse):
                parts = {k: None if p is None else [_dense(t) for t in p] for k, p in parts.items()}
            if (
                self._all_packed
                and len(parts) == len(layout.entries)
                and all(p is not None and _complete(p) for p in parts.values())
            ):
                # the parameters tile each group in order: one cat per group
                return Vec(_cat([t for k in ks for t in parts[k]]) for ks in self._groups)  # type: ignore[union-attr]
            out = layout.empty() if layout.dense else layout.zeros()
            dst: list[Tensor] = []
            src: list[Tensor] = []
            zero: list[Tensor] = []
            for k, e in enumerate(layout.entries):
                flat = layout.entry_view(out, e)
                part = parts.get(k)
                if part is None or not self._entry_packed[k] or any(t is None for t in part):
                    zero.append(flat)  # padding, or what no part writes
                if part is not None:
                    for view, t in zip(self._views(flat, k), part):
                        if t is not None:
                            dst.append(view)
                            src.append(t)
            if zero and layout.dense:
                tc.foreach_zero_(zero)
            if dst:
                tc.foreach_copy_(dst, src)
        return out

    def _flat(self, k: int, part: _Part | None) -> Tensor:
        """Entry ``k`` as a new flat tensor from its per-parameter tensors (None: zero)."""
        if part is None:
            return self._zeros(k)
        if any(self.problem.sparse):
            part = [_dense(t) for t in part]
        with torch.no_grad():
            if self._entry_packed[k] and _complete(part):
                return _cat(part)  # type: ignore[arg-type]
            out = self._zeros(k)
            have = [(view, t) for view, t in zip(self._views(out, k), part) if t is not None]
            if have:
                tc.foreach_copy_([view for view, _ in have], [t for _, t in have])
        return out

    def _all(self) -> list[int]:
        return list(range(len(self.layout.entries)))

    def _others(self, i: int) -> list[int]:
        """The entries of every player but ``i``."""
        return [k for j, ks in enumerate(self.entries_of) if j != i for k in ks]

    def _offdiag_reverse(self, us: list[list[Tensor | None]], create_graph: bool = False) -> dict[int, _Part | None]:
        """H_oᵀ u for ``u`` given per entry and parameter: Σ_{i≠owner(k)} (∂ξ_i/∂w_k)ᵀ u_i,
        one reverse pass per player toward the other players' parameters only."""
        res: dict[int, _Part | None] = dict.fromkeys(self._all())
        for i, ks in enumerate(self.entries_of):
            others = self._others(i)
            if not others or not any(t is not None and t.requires_grad for k in ks for t in self.pieces[k]):
                continue
            pieces = [t for k in ks for t in self.pieces[k]]
            part = self._grad(pieces, [w for k in ks for w in us[k]], others, create_graph=create_graph)
            for k, ts in part.items():
                if ts is None:
                    continue
                prev = res[k]
                if prev is None:
                    res[k] = ts
                else:  # as flat tensors would add: a parameter no gradient reached adds exact zeros
                    zeros = torch.zeros_like
                    res[k] = [
                        (a if a is not None else zeros(p)) + (b if b is not None else zeros(p))
                        if a is not None or b is not None
                        else None
                        for a, b, p in zip(prev, ts, self.inputs[k])
                    ]
        return res

    # -------------------------------------------------------------- products
    # Every public product is averaged across ranks in a data-parallel game (one
    # collective each); the _local_ ones are this rank's alone.
    def _local_vjp(self, u: Vec, last: bool = False) -> Vec:
        return self._to_vec(self._reverse(self._all(), u, self._all(), last=last))

    def _local_diag(self, v: Vec) -> Vec:
        parts: dict[int, _Part | None] = {}
        for ks in self.entries_of:
            parts.update(self._reverse(ks, v, ks))
        return self._to_vec(parts)

    def vjp(self, u: Vec, last: bool = False) -> Vec:
        """Jᵀ u. ``last``: no product follows (the graph is freed during this pass:
        less memory held, a little faster; a later product raises)."""
        return self._mean(self._local_vjp(u, last))

    def diag(self, v: Vec) -> Vec:
        """D v = (∇²_{w_i} f_i v_i)_i: one reverse pass per player."""
        return self._mean(self._local_diag(v))

    def offdiag_vjp(self, u: Vec) -> Vec:
        """H_oᵀ u: one reverse pass per player, toward the other players' parameters."""
        return self._mean(self._to_vec(self._offdiag_reverse(self._parts(u, self._all()))))

    def offdiag_jvp(self, v: Vec) -> Vec:
        """H_o v. With ``cross``: n reverse passes (see :meth:`shaping`). Else ∂/∂u
        ⟨H_oᵀu, v⟩ on a kept graph of u ↦ H_oᵀu that holds only the off-diagonal
        blocks (n reverse passes to build, once; then one reverse pass per product:
        the choice for many products, as in a Krylov solver)."""
        if self.cross is not None:
            return self.shaping(v, chi=False)
        return self._mean(self._jvp_double_backward(v, offdiag=True))

    def block_vjp(self, i: int, j: int, u: Vec) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i, in player j's part of the result."""
        return self._mean(self._to_vec(self._reverse(self.entries_of[i], u, self.entries_of[j])))

    def block_vjp_parts(self, i: int, j: int, u_i: Sequence[Tensor]) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i on players' parts: ``u_i`` one flat tensor per buffer of
        player i (as ``layout.player_views``), the result one per buffer of player j,
        fresh tensors (no joint vector formed: for solvers that live in one player's
        space, CGD's Schur complement)."""
        ins = self.entries_of[j]
        outs = self.entries_of[i]
        pieces = [t for k in outs for t in self.pieces[k]]
        us = [w for k, flat in zip(outs, u_i) for w in self._views(flat, k)]
        res = self._grad(pieces, us, ins)
        return self._mean(Vec(self._flat(k, res[k]) for k in ins))

    def cross_gradients(self) -> list[Vec]:
        """For each player i, the joint vector (∇_{w_j} f_i)_{j≠i} (zero in i's own part),
        all averaged across ranks in one collective."""
        out = []
        for i in range(len(self.entries_of)):
            others = self._others(i)
            if self.cross is not None:
                parts = self.cross[i]
            else:
                parts = self._grad([self.losses[i]], None, others) if others else {}
            out.append(self._to_vec(parts))
        if self.problem.parallel:
            stacked = [torch.cat([vec[g] for vec in out]) for g in range(len(out[0]))]
            self._mean(stacked)
            out = [Vec(t.chunk(len(out))[i].clone() for t in stacked) for i in range(len(out))]
        return out

    def chi(self) -> Vec:
        """χ = diag(H_oᵀ ∇L): χ_i = Σ_{j≠i} (∂ξ_j/∂w_i)ᵀ ∇_{w_j} f_i. n reverse passes
        (2n without ``cross``); in a data-parallel game both factors are full-batch averages."""
        return self.shaping(None, chi=True)

    def shaping(self, v: Vec | None, chi: bool = True) -> Vec:
        """H_o v + χ (either term may be left out: ``v=None``, ``chi=False``), one
        reverse pass per player. With ``cross`` (the cross gradients ∇_{w_j} f_i kept
        with their graphs), symmetry of second derivatives gives both terms of
        player i as one gradient toward w_i:

            (H_o v)_i + χ_i = ∇_{w_i} Σ_{j≠i} (⟨∇_{w_j} f_i, v_j⟩ + ⟨ξ_j, c_{ij}⟩),

        with v and c_{ij} = ∇_{w_j} f_i held constant. Without ``cross``, the
        products of :meth:`offdiag_jvp` and the passes of :meth:`cross_gradients`."""
        cbar: list[dict[int, list[Tensor] | None]] | None
        if not chi:
            cbar = None
        elif self.cross is not None and not self.problem.parallel:  # no average to take: no copies
            cbar = [{k: None if c is None else self._filled(k, c) for k, c in cross.items()} for cross in self.cross]
        else:
            cbar = [dict(zip(self._all(), self._parts(g, self._all()))) for g in self.cross_gradients()]
        if self.cross is None:
            terms = []
            if v is not None:
                terms.append(self._jvp_double_backward(v, offdiag=True))
            if cbar is not None:
                parts: dict[int, _Part | None] = {}
                for i, g in enumerate(cbar):
                    outs = self._others(i)
                    pieces = [t for k in outs for t in self.pieces[k]]
                    parts.update(self._grad(pieces, [w for k in outs for w in g[k]], self.entries_of[i]))  # type: ignore[union-attr]
                terms.append(self._to_vec(parts))
            return self._mean(terms[0] if len(terms) == 1 else terms[0] + terms[1])
        parts = {}
        for i, ks in enumerate(self.entries_of):
            outs: list[Tensor | None] = []
            grad_outs: list[Tensor | None] = []
            for k in self._others(i):
                c = self.cross[i][k]
                if v is not None and c is not None:
                    outs += c
                    grad_outs += self._parts(v, [k])[0]
                if cbar is not None and cbar[i][k] is not None:
                    outs += self.pieces[k]
                    grad_outs += cbar[i][k]  # type: ignore[operator]
            parts.update(self._grad(outs, grad_outs, ks))
        return self._mean(self._to_vec(parts))

    def jvp(self, v: Vec) -> Vec:
        """J v: forward-over-reverse where possible, else the double-vjp trick."""
        return self._mean(self._local_jvp(v))

    def _local_jvp(self, v: Vec) -> Vec:
        if self.functional and self.problem.forward_mode.ok:
            try:
                # the same random numbers as ξ's evaluation; buffers left as they are
                with self.evaluations(plain=False), fwAD.dual_level():
                    return _dual_tangents(self.problem, self.closure, v, self.scale)
            except NotImplementedError as err:
                # only PyTorch's own "no forward AD formula for this op": anything else
                # (the user's errors included) propagates
                if not _NO_FORWARD_AD.search(str(err)):
                    raise
                log.info("forward-mode AD unavailable (%s); using double backward for Jv", err)
                self.problem.forward_mode.ok = False
        return self._jvp_double_backward(v)

    def _transposed(self, offdiag: bool) -> tuple[list[list[Tensor | None]], dict[int, _Part | None]]:
        """The graph of u ↦ Jᵀu (or H_oᵀu) for a dummy u, built once and kept: one
        dummy per parameter whose piece of ξ has a graph."""
        key = "offdiag" if offdiag else "full"
        cache = self.__dict__.setdefault("_transposed_cache", {})
        if key not in cache:
            if any(self.problem.sparse):
                # PyTorch's backward of a sparse gradient (nn.Embedding(sparse=True)) has
                # no graph toward its grad_output: ∂/∂u ⟨Jᵀu, v⟩ would be silently wrong
                raise NotImplementedError(
                    "J v and H_o v need the double-vjp trick, which PyTorch does not support for "
                    "parameters with sparse gradients (nn.Embedding(sparse=True), say): use dense gradients"
                )
            us: list[list[Tensor | None]] = [
                [_dummy(t) if t is not None and t.requires_grad else None for t in piece] for piece in self.pieces
            ]
            if offdiag:
                res = self._offdiag_reverse(us, create_graph=True)
            else:
                pieces = [t for piece in self.pieces for t in piece]
                res = self._grad(pieces, [w for part in us for w in part], self._all(), create_graph=True)
            cache[key] = (us, res)
        return cache[key]

    def _jvp_double_backward(self, v: Vec, offdiag: bool = False) -> Vec:
        """J v (or H_o v) = ∂/∂u ⟨Jᵀu, v⟩: Jᵀu is linear in u, its graph is kept,
        so repeated products (Krylov solvers) cost one reverse pass each."""
        us, res = self._transposed(offdiag)
        outs: list[Tensor] = []
        grad_outs: list[Tensor] = []
        for k, ts in res.items():
            if ts is None:
                continue
            for t, w in zip(ts, self._parts(v, [k])[0]):
                if t is not None and t.requires_grad:
                    outs.append(t)
                    grad_outs.append(w)
        dummies = [(k, n, u) for k, part in enumerate(us) for n, u in enumerate(part) if u is not None]
        if not outs or not dummies:
            return self.layout.zeros()
        grads = _product(outs, [u for _, _, u in dummies], grad_outs, retain_graph=True)
        parts: dict[int, _Part | None] = {}
        for (k, n, _), g in zip(dummies, grads):
            if g is not None:
                part = parts.get(k)
                if part is None:
                    part = parts[k] = [None] * len(self.inputs[k])
                part[n] = g
        return self._to_vec(parts)

    def jvp_repeated(self, v: Vec) -> Vec:
        """J v for many v at this point: after the first call, one reverse pass each."""
        return self._mean(self._jvp_double_backward(v))

    def vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        """(Jᵀv, Jv)."""
        return self.vjp(v), self.jvp(v)


def _complete(part: Sequence[Tensor | None]) -> bool:
    """No ``None`` among the tensors (a C-level pass: no tensor comparisons)."""
    return all(map(operator.is_not, part, repeat(None)))


def _dummy(t: Tensor) -> Tensor:
    """A zero leaf shaped like ``t`` (dense, also for a sparse gradient), to differentiate against."""
    return (
        torch.zeros_like(t, requires_grad=True)
        if not t.is_sparse
        else torch.zeros(t.shape, dtype=t.dtype, device=t.device, requires_grad=True)
    )


def _dense(t: Tensor | None) -> Tensor | None:
    return t.to_dense() if t is not None and t.is_sparse else t


_NO_FORWARD_AD = re.compile(r"Trying to use forward AD with .* that does not support it")


def _product(
    outputs: Sequence[Tensor],
    inputs: Sequence[Tensor],
    grad_outputs: Sequence[Tensor],
    retain_graph: bool = False,
    create_graph: bool = False,
) -> tuple[Tensor | None, ...]:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)`` for
    grad_outputs that gameopt formed itself (views of a joint vector, ∇f's own
    tensors, or dummies), without ``grad``'s Python-side check of each
    (output, grad_output) pair, which on models of many tensors costs more than
    gameopt's whole bookkeeping of a step (see the docs' Performance page). Shapes are
    compared here in one C-level pass (the engine alone would sum a broadcastable
    grad_output); the engine casts dtypes and checks devices, as under ``grad``.
    Tensor subclasses with ``__torch_function__`` take the public function."""
    outputs, inputs, grad_outputs = tuple(outputs), tuple(inputs), tuple(grad_outputs)
    if (
        tc.engine_run_backward is None
        or not _complete(grad_outputs)
        or torch.overrides.has_torch_function(outputs + inputs + grad_outputs)
    ):
        return torch.autograd.grad(
            outputs, inputs, grad_outputs, retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
        )
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"{len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    if list(map(_shape, outputs)) != list(map(_shape, grad_outputs)):
        k = next(k for k, (o, g) in enumerate(zip(outputs, grad_outputs)) if o.shape != g.shape)
        shapes = f"{tuple(grad_outputs[k].shape)} and output[{k}] has a shape of {tuple(outputs[k].shape)}"
        raise RuntimeError(f"Mismatch in shape: grad_output[{k}] has a shape of {shapes}")
    engine = tc.engine_run_backward
    return engine(outputs, grad_outputs, retain_graph, create_graph, inputs, True, accumulate_grad=False)


def _check_unspent(lin: Linearization | ZeroSumLinearization) -> None:
    if lin._spent:
        raise RuntimeError("this linearization's graph was freed by a product with last=True: linearize again")


def _packed(layout: JointLayout, g: int) -> bool:
    """The parameters of joint group ``g`` tile it in storage order, each contiguous
    (no padding): the group is the ``cat`` of their flattened tensors."""
    end = 0
    for e in layout.group_entries(g):
        if e.start != end or not _entry_packed(e):
            return False
        end += e.buffer.numel
    return end == layout.data[g].numel()


def _cat(tensors: Sequence[Tensor]) -> Tensor:
    """A new flat tensor: the flattened ``tensors`` one after the other."""
    flat = tc.flatten_dense(tensors)
    return flat.clone() if len(tensors) == 1 else flat  # of one tensor, flatten returns a view


class ZeroSumLinearization:
    """ξ with its graph for a two-player zero-sum game given as losses (f, −f).

    One ``create_graph`` backward of the one scalar f (player 0's loss) against all
    parameters gives ∇f with its graph. With H = ∇²f (symmetric) and
    S = diag(I, −I) (player 0 minimizes f, player 1 minimizes −f): ξ = S∇f,
    J = S H, so every product is a Hessian-vector product through that one kept
    graph: Jᵀu = H(Su), Jv = S(Hv); Jᵀξ = H∇f. The inputs are one leaf per
    parameter, as in the bare code (the layout's aliases, ``Problem.aliases``:
    no flat leaf, no ``split``, view or ``cat`` node in either pass); the
    per-parameter results become joint vectors with one ``cat`` (or
    ``_foreach_copy_``) outside the graph, and Jᵀξ's grad_outputs are ∇f's own
    per-parameter tensors.

    Same interface as :class:`Linearization`. The losses must be exactly (f, −f)
    (checked on their values each time: one scalar read).
    ``batched``: compute two products at once (:meth:`vjp_jvp`) in one double
    backward (``is_grads_batched=True``) instead of two in sequence.
    """

    def __init__(
        self,
        problem: Problem,
        closure: Callable[[], Any],
        evaluations: Evaluations,
        scale: float = 1.0,
        batched: bool = False,
    ) -> None:
        if len(problem.names) != 2:
            n = len(problem.names)
            raise ValueError(f"zero_sum=True is for two-player games given as losses (f, -f), got {n} players")
        self.problem, self.closure, self.evaluations = problem, closure, evaluations
        self.scale, self.batched = scale, batched
        self._spent = False  # a product with last=True freed the graph
        self._mean = problem.mean_
        self.layout = problem.layout
        # per group, in storage order: the tensors differentiated against
        self.inputs, substituted = _graph_inputs(problem, problem.group_params)
        self._flat_inputs = [t for ins in self.inputs for t in ins]
        self._packed = problem.packed
        with jacobian_mode(problem), substituted:
            self.losses, self.metrics = evaluate_losses(problem, closure)
            f = self.losses[0]
            if f.grad_fn is None:
                raise _no_path(problem.names[0])
            a, b = float(f.detach()), float(self.losses[1].detach())  # exact as doubles
            # non-finite losses cannot show it: the game refuses them as non-finite
            if math.isfinite(a) and math.isfinite(b) and a + b != 0:
                raise ValueError("zero_sum=True needs a two-player zero-sum game given as losses (f, -f)")
            grads = torch.autograd.grad(
                f if scale == 1.0 else f * scale, self._flat_inputs, create_graph=True, allow_unused=True
            )
        if scale != 1.0:
            grads = tuple(None if t is None else t / scale for t in grads)  # every product below is unscaled
        self._keep = [k for k, t in enumerate(grads) if t is not None and t.requires_grad]
        self._outputs = [grads[k] for k in self._keep]  # ∇f with its graph
        # ∇f per input, with its graph: read only under no_grad and as grad_outputs
        # (no detached copies of 244 tensors)
        self._grad_f = list(grads)
        self.xi = self._sign_(self._to_vec(self._grad_f))
        self._mean(self.xi)

    @functools.cached_property
    def grad_f(self) -> Vec:
        """∇f on this rank, as a joint vector (a new one)."""
        return self._to_vec(self._grad_f)

    # ------------------------------------------------------------ primitives
    def _to_vec(self, per_input: Sequence[Tensor | None]) -> Vec:
        """A joint vector from one tensor (or None: zero) per input (outside any graph)."""
        with torch.no_grad():
            if any(self.problem.sparse):
                per_input = [t.to_dense() if t is not None and t.is_sparse else t for t in per_input]
            parts, pos = [], 0
            for ins in self.inputs:
                parts.append(per_input[pos : pos + len(ins)])
                pos += len(ins)
            if all(self._packed) and _complete(per_input):
                # the parameters tile each group in order: one cat per group
                return Vec(map(_cat, parts))
            out = self.layout.zeros()
            dst, src = [], []
            for g, part in enumerate(parts):
                for (_, view), t in zip(self.layout.param_views(g, out[g]), part):
                    if t is not None:
                        dst.append(view)
                        src.append(t)
            if dst:
                tc.foreach_copy_(dst, src)
        return out

    def _split(self, v: Vec | list[Tensor]) -> list[Tensor]:
        """``v`` as one tensor per input (the grad_outputs of a product); ∇f's own
        per-input tensors (``self._grad_f``) are taken as they are."""
        if v is self._grad_f:
            return v
        out: list[Tensor] = []
        for g, (ins, flat) in enumerate(zip(self.inputs, v)):
            if self._packed[g]:
                out += tc.unflatten_dense(flat, ins)
            else:
                out += [view for _, view in self.layout.param_views(g, flat)]
        return out

    def _signed(self, v: Vec) -> Vec:
        """S v: a new vector, player 1's part negated."""
        out = Vec(v).clone()
        for e in self.layout.by_player[1]:
            self.layout.entry_view(out, e).neg_()
        return out

    def _sign_(self, v: Vec) -> Vec:
        for e in self.layout.by_player[1]:
            self.layout.entry_view(v, e).neg_()
        return v

    def _hvps(self, vs: list[Vec | list[Tensor]], last: bool = False) -> list[Vec]:
        """H v for each v: in sequence, or batched in one double backward. ``last``:
        the graph is freed during the last pass (no product may follow)."""
        _check_unspent(self)
        self._spent = last
        if not self._outputs:
            return [self.layout.zeros() for _ in vs]
        if len(vs) > 1 and self.batched:
            parts = [self._split(v) for v in vs]
            with torch.no_grad():
                stacked = [torch.stack([p[k] for p in parts]) for k in self._keep]
            res = torch.autograd.grad(
                self._outputs,
                self._flat_inputs,
                grad_outputs=stacked,
                retain_graph=not last,
                allow_unused=True,
                is_grads_batched=True,
            )
            return [self._to_vec([None if t is None else t[n].detach() for t in res]) for n in range(len(vs))]
        out = []
        for n, v in enumerate(vs, 1):
            part = self._split(v)
            res = _product(
                self._outputs,
                self._flat_inputs,
                [part[k] for k in self._keep],
                retain_graph=not last or n < len(vs),
            )
            out.append(self._to_vec(res))  # no graph: nothing to detach
        return out

    def _only(self, v: Vec, i: int) -> Vec:
        return self.layout.only(v, i)

    # -------------------------------------------------------------- products
    def hvp(self, v: Vec) -> Vec:
        """H v, H = ∇²f."""
        return self._mean(self._hvps([v])[0])

    def vjp(self, u: Vec, last: bool = False) -> Vec:
        """Jᵀ u = H S u (Jᵀξ = H∇f: no copy, where ξ is this rank's own). ``last``: no
        product follows (the graph is freed during this pass; a later product raises)."""
        own = u is self.xi and not self.problem.parallel
        return self._mean(self._hvps([self._grad_f if own else self._signed(u)], last)[0])

    def jvp(self, v: Vec) -> Vec:
        """J v = S H v."""
        return self._mean(self._sign_(self._hvps([v])[0]))

    jvp_repeated = jvp

    def vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        """(Jᵀv, Jv): two Hessian-vector products, batched when ``batched``."""
        h_sv, h_v = self._hvps([self._signed(v), v])
        return self._mean(h_sv), self._mean(self._sign_(h_v))

    def block_vjp_parts(self, i: int, j: int, u_i: Sequence[Tensor]) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i on players' parts (see :meth:`Linearization.block_vjp_parts`)."""
        u = self.layout.zeros()
        Vec(self.layout.player_views(u, i)).copy_(u_i)
        return Vec(self.layout.player_views(self.block_vjp(i, j, u), j))

    def block_vjp(self, i: int, j: int, u: Vec) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i = s_i H_ji u_i, in player j's part of the result."""
        ui = self._only(u, i)
        if i == 1:
            self._sign_(ui)
        return self._mean(self._only(self._hvps([ui])[0], j))

    def _local_diag(self, v: Vec) -> Vec:
        parts = self._hvps([self._only(v, 0), self._only(v, 1)])
        return self._sign_(self._only(parts[0], 0) + self._only(parts[1], 1))

    def diag(self, v: Vec) -> Vec:
        """D v = (s_i H_ii v_i)_i: two Hessian-vector products."""
        return self._mean(self._local_diag(v))

    def offdiag_jvp(self, v: Vec) -> Vec:
        """H_o v = (s_i H_ij v_j)_i: two Hessian-vector products."""
        parts = self._hvps([self._only(v, 1), self._only(v, 0)])
        return self._mean(self._sign_(self._only(parts[0], 0) + self._only(parts[1], 1)))

    def offdiag_vjp(self, u: Vec) -> Vec:
        """H_oᵀ u = (s_j H_ij u_j)_i: two Hessian-vector products."""
        su = self._signed(u)
        parts = self._hvps([self._only(su, 1), self._only(su, 0)])
        return self._mean(self._only(parts[0], 0) + self._only(parts[1], 1))

    def shaping(self, v: Vec | None, chi: bool = True) -> Vec:
        """H_o v + χ (either term may be left out: ``v=None``, ``chi=False``)."""
        terms = ([self.offdiag_jvp(v)] if v is not None else []) + ([self.chi()] if chi else [])
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    def cross_gradients(self) -> list[Vec]:
        """(∇_{w_1} f_0, 0) = P_1 ∇f and (0, ∇_{w_0} f_1) = −P_0 ∇f."""
        first = self._only(self.grad_f, 1)
        second = -self._only(self.grad_f, 0)
        return [self._mean(first), self._mean(second)]

    def chi(self) -> Vec:
        """χ_i = (∂ξ_j/∂w_i)ᵀ ∇_{w_j} f_i (j ≠ i)."""
        c0, c1 = self.cross_gradients()
        return self.block_vjp(1, 0, c0) + self.block_vjp(0, 1, c1)


def linearize(
    problem: Problem,
    closure: Callable[[], Any],
    evaluations: Evaluations,
    scale: float = 1.0,
    zero_sum: bool = False,
    batched: bool = False,
    cross: bool = False,
) -> Linearization | ZeroSumLinearization:
    """ξ with its graph at the current point (the game checks finiteness); with
    ``zero_sum``, through the one scalar f of a two-player game (f, −f); with
    ``cross``, the cross gradients ∇_{w_j} f_i kept too (for opponent shaping)."""
    if zero_sum:
        return ZeroSumLinearization(problem, closure, evaluations, scale=scale, batched=batched)
    return Linearization(problem, closure, evaluations, scale=scale, cross=cross)
