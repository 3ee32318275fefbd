"""First-order ξ = (∇₁f₁, …, ∇ₙfₙ) into the players' fused gradient buffers.

Each player's backward is pruned to its own parameters (no ``create_graph``). A
CPU player with large tensors gets its gradient through ``.grad``, one tensor at a
time (gameopt's relinking hook copies each into the buffer, so the player's
gradient is never alive whole beside it: :func:`through_grad`); a player with
small ones has it captured with ``autograd.grad`` and copied with one
``_foreach_copy_`` (cheaper per tensor). So has a player off the CPU (a CUDA
device) of up to :data:`DEVICE_CAPTURE_MAX` elements: there a copy per tensor is a launch (a
device-to-device memcpy) and a Python hook each, where ``_foreach_copy_`` is one
fused kernel for many tensors, and holding the player's gradient whole is what the
bare loop's ``autograd.grad`` does. Both paths write the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor
from torch.overrides import has_torch_function_unary

from .. import _torch_compat as tc
from ..buffer import grads_linked, only_relink_hooks
from ..evaluation import split_losses
from ..sharded import sharded_backward
from .problem import Problem, no_path_error

#: elements of pending captured gradients that trigger a copy into the buffers
COPY_BATCH = 1 << 18
#: a player whose parameter tensors hold at least this many elements on average gets
#: its gradient through ``.grad`` (one tensor alive at a time; a little more per
#: tensor), a smaller one has it captured and copied (cheaper per tensor)
IN_PLACE_MIN = 1 << 12
#: a player off the CPU with at most this many elements has its gradient captured and
#: copied whatever the size of its tensors (one fused copy, no launch per tensor); a
#: larger one goes through ``.grad`` (its gradient never alive whole beside the buffer)
DEVICE_CAPTURE_MAX = 1 << 27
#: a CPU player leaves ξ where autograd put it (:func:`leaves_in_place`) only with
#: tensors of at least this many elements on average: a reduction and an add per tensor
#: then cost about what one per group does (measured: SimGD and extragradient on the
#: MLP pair of ``benchmarks.step_cost``, about 2·10⁴ elements per tensor, within noise)
PIECES_MIN = 1 << 12
#: the same off the CPU, where each tensor's check is a launch or two (about 5 µs of
#: host time each), which the copy they spare (two passes at a few TB/s) repays from
#: about 2²¹ elements; an estimate, not yet measured on a GPU
DEVICE_PIECES_MIN = 1 << 21


def vector_field(
    problem: Problem,
    which: Sequence[int],
    closure: Callable[[], Any],
    scale: float = 1.0,
    keep: list[Sequence[Tensor]] | None = None,
) -> tuple[list[Tensor], Mapping[str, Any]]:
    """ξ_i for the players in ``which`` into the fused gradient buffers; returns the
    detached losses and the metrics. Other players' gradient buffers are left untouched.
    With ``scale`` (loss scaling), the losses are differentiated times ``scale`` and
    the gradients divided by it (an overflow shows as a non-finite ξ).

    A CPU player whose tensors are large (:data:`IN_PLACE_MIN`), or a player off the
    CPU larger than :data:`DEVICE_CAPTURE_MAX`, gets its gradient into its buffer
    through ``.grad`` (:func:`through_grad`; see :func:`_goes_through_grad`); the others'
    gradients are captured (``autograd.grad``) and copied into the buffers, several
    players at once (:data:`COPY_BATCH`). The loop is the whole first-order step on a small
    game, so the common capture (every gradient there, dense) is written out in it.

    With ``keep`` (a list, where :func:`leaves_in_place` allows it: every player), each
    player's gradients are captured and appended to it instead (autograd's tensors,
    aligned with ``problem.params[i]``: :class:`gameopt.vec.Pieces`), not copied;
    a player some of whose parameters no gradient reaches has its gradient copied
    (those parts zeroed) and its buffer's views appended."""
    losses, metrics = split_losses(closure(), problem.names)
    if scale != 1.0:
        losses = [loss * scale for loss in losses]
    last = len(which) - 1
    dst: list[Tensor] = []
    src: list[Tensor] = []
    pending = 0
    # the engine itself for a CPU player's backward, which this thread runs alone
    direct = tc.engine_on_caller() if not torch.cuda.is_initialized() else None
    for k, i in enumerate(which):
        loss = losses[i]
        if problem.sharded and problem.sharded[i]:  # FSDP reduce-scatters it into the buffer
            sharded_backward(problem.sharded[i], loss, retain_graph=k < last)
            if scale != 1.0:
                with torch.no_grad():
                    tc.foreach_div_(problem.grad_views[i], scale)
            continue
        if keep is None and _goes_through_grad(problem, i):
            through_grad(problem, i, loss, retain_graph=k < last)
            if scale != 1.0:
                with torch.no_grad():
                    tc.foreach_div_(problem.grad_views[i], scale)
            continue
        grads = _gradient(problem, i, loss, k < last, direct if problem.on_cpu[i] else None)
        views = problem.grad_views[i]
        plain = not problem.sparse[i]  # every gradient there and dense (the common case)
        if plain:
            for g in grads:  # a loop: no C pass over a player's few tensors costs less
                if g is None:
                    plain = False
                    break
        if plain:
            got: Sequence[Tensor] = cast("tuple[Tensor, ...]", grads)  # every one there (checked above)
            if keep is not None:  # left where autograd put it
                keep.append(got)
                continue
        else:  # a view no gradient reaches is zeroed now; sparse gradients densified
            if keep is not None:  # copied below, its buffer's views then hold its ξ
                keep.append(problem.grad_views[i])
            views, got = _reached(problem, i, grads)
        dst += views
        src += got
        pending += problem.sizes[i]
        # copy many small players' gradients at once; large ones right away (memory)
        if pending >= COPY_BATCH:
            _copy_into(dst, src, scale)
            dst, src, pending, grads = [], [], 0, ()  # no gradient outlives its batch
    if dst:
        _copy_into(dst, src, scale)
    if scale == 1.0:  # ``.data``: nothing differentiates these again (no version counter to share); no dispatch
        return [loss.data if loss.dim() == 0 else loss.detach().reshape(()) for loss in losses], metrics
    return [(loss.detach() / scale).reshape(()) for loss in losses], metrics


def _gradient(
    problem: Problem, i: int, loss: Tensor, retain_graph: bool, direct: Callable[..., Any] | None = None
) -> tuple[Tensor | None, ...]:
    """``torch.autograd.grad(loss, inputs, allow_unused=True)`` of player i's one-element
    loss: straight to autograd's engine with ``ones_like(loss)`` as the output's
    gradient (what ``grad`` forms for it), without ``grad``'s Python-side handling of
    its arguments; with ``direct`` (``_torch_compat.engine_on_caller()``: the player's
    parameters on the CPU, CUDA not initialized) and a CPU loss, without torch's
    wrapper either (the calling thread runs the whole backward). A loss that is not a
    real floating-point tensor, or tensors with ``__torch_function__``
    (``Problem.engine_ok``), take the public function (and its errors). A loss that
    does not depend on the player's parameters is a ``LossError``."""
    inputs, run = problem.inputs[i], tc.engine_run_backward
    try:
        if run is not None and problem.engine_ok[i] and loss.is_floating_point() and not has_torch_function_unary(loss):
            ones = (torch.ones_like(loss),)
            if direct is not None and loss.is_cpu:
                return direct((loss,), ones, retain_graph, False, inputs, True, False)
            return run((loss,), ones, retain_graph, False, inputs, True, accumulate_grad=False)
        return torch.autograd.grad(loss, inputs, retain_graph=retain_graph, allow_unused=True)
    except RuntimeError as err:
        if loss.grad_fn is None:
            raise no_path_error(problem.names[i]) from err
        raise


def leaves_in_place(problem: Problem, scale: float = 1.0) -> bool:
    """Whether an evaluation of every player's ξ may leave the gradients where autograd
    puts them (``vector_field(keep=...)``, :class:`gameopt.vec.Pieces`): every player's
    tensors large on average (:data:`PIECES_MIN` on the CPU, :data:`DEVICE_PIECES_MIN`
    off it), dense, whole (not FSDP-sharded),
    small enough to hold whole on a device (:data:`DEVICE_CAPTURE_MAX`), and neither a
    loss scale (whose unscaling writes the buffer) nor data-parallel ranks (whose mean
    does)."""
    if scale != 1.0 or problem.parallel or any(problem.sparse) or any(problem.sharded):
        return False
    for params, size, cpu in zip(problem.params, problem.sizes, problem.on_cpu):
        large = PIECES_MIN if cpu else DEVICE_PIECES_MIN
        if not params or size < large * len(params) or not (cpu or size <= DEVICE_CAPTURE_MAX):
            return False
    return True


def _reached(problem: Problem, i: int, grads: tuple[Tensor | None, ...]) -> tuple[list[Tensor], list[Tensor]]:
    """Player i's views that a gradient reached, and those gradients (dense); the views
    no gradient reaches are zeroed now. None reached is a ``LossError``."""
    have = [(v, g) for v, g in zip(problem.grad_views[i], grads) if g is not None]
    if not have:
        raise no_path_error(problem.names[i])
    with torch.no_grad():  # the zeroing
        for v, g in zip(problem.grad_views[i], grads):
            if g is None:
                v.zero_()
    return [v for v, _ in have], [g.to_dense() if g.is_sparse else g for _, g in have]


def _copy_into(dst: list[Tensor], src: list[Tensor], scale: float) -> None:
    """The captured gradients into the gradient buffers' views (tensors outside any
    graph: no grad mode to switch)."""
    tc.foreach_copy_(dst, src)
    if scale != 1.0:
        tc.foreach_div_(dst, scale)


def _goes_through_grad(problem: Problem, i: int) -> bool:
    """Whether player i gets its gradient through ``.grad`` (:func:`through_grad`) rather
    than captured and copied: its tensors large (:data:`IN_PLACE_MIN` on average), on
    the CPU or too many elements to hold whole on a device (:data:`DEVICE_CAPTURE_MAX`),
    and its ``.grad`` links as the game left them (:func:`_in_place`)."""
    params, size = problem.params[i], problem.sizes[i]
    if not params or size < IN_PLACE_MIN * len(params):
        return False
    return (problem.on_cpu[i] or size > DEVICE_CAPTURE_MAX) and _in_place(problem, i)


def _in_place(problem: Problem, i: int) -> bool:
    """Whether player i, whose tensors are large (the caller checks), gets its gradient
    into its buffer through ``.grad``: every ``.grad`` its buffer's view or ``None``, and no post-accumulate-grad
    hook but gameopt's own relinking one (``autograd.grad``, the other path, fires
    none: users' hooks behave the same on both)."""
    params = problem.params[i]
    if not grads_linked(params, problem.grad_views[i], none_ok=True):
        return False  # a gradient of the user's own (one with a graph, say): left as it is
    return all(map(only_relink_hooks, params))  # few tensors here (large ones)


def through_grad(problem: Problem, i: int, loss: Tensor, retain_graph: bool) -> None:
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
            raise no_path_error(problem.names[i]) from err
        raise
    if not grads_linked(params, views):
        _relink(problem, i)


def _relink(problem: Problem, i: int, check: bool = True) -> None:
    """After :func:`through_grad`: a parameter the backward did not reach (``.grad``
    still ``None``) gets exact zeros, as ``autograd.grad``'s ``None`` does on the other
    path; each ``.grad`` is the view again; with ``check``, none reached is a
    :class:`~gameopt.LossError`."""
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
        raise no_path_error(problem.names[i])
