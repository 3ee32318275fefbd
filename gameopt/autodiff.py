"""The one place that knows autograd's subtleties.

* First-order ξ: a backward of each player's loss pruned to that player's own
  parameters (no ``create_graph``). A player with large tensors gets its gradient
  through ``.grad``, one tensor at a time (gameopt's relinking hook copies each into
  the buffer, so the player's gradient is never alive whole beside it); a player
  with small ones has it captured with ``autograd.grad`` and copied with one
  ``_foreach_copy_`` (cheaper per tensor). The same bits either way.
* Jacobian products: each player buffer's slice of the joint storage becomes a
  leaf (``detach().requires_grad_()`` shares the storage); ``torch.split`` views
  of it are substituted for the module's parameters while the losses run;
  ``autograd.grad(..., create_graph=True)`` gives a differentiable ξ.
  ``Jᵀv`` is one reverse pass over that graph. ``Jv`` is forward-over-reverse
  (dual tensors through the backward) where every op supports forward-mode AD,
  else the double-vjp trick.
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
import operator
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor, nn

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
                    torch._foreach_div_(problem.grad_views[i], scale)
            continue
        pending += _captured(problem, i, losses[i], k < last, dst, src)
        # copy many small players' gradients at once; large ones right away (memory)
        if pending >= _COPY_BATCH:
            _copy_into(dst, src, scale)
            dst, src, pending = [], [], 0
    if dst:
        _copy_into(dst, src, scale)
    return [(loss.detach() / scale).reshape(()) for loss in losses], metrics


_COPY_BATCH = 1 << 18  # elements of pending gradients that trigger a copy into the buffers
#: a player whose parameter tensors hold at least this many elements on average gets
#: its gradient through ``.grad`` (one tensor alive at a time; a few µs more per
#: tensor), a smaller one has it captured and copied (cheaper per tensor)
_IN_PLACE = 1 << 12
_grad = operator.attrgetter("grad")


def _captured(problem: Problem, i: int, loss: Tensor, retain_graph: bool, dst: list[Tensor], src: list[Tensor]) -> int:
    """``autograd.grad`` of player i's loss: queue its gradients (``src``) for a copy into
    its views (``dst``); a view no gradient reaches is zeroed now. Returns its size."""
    with torch.no_grad():  # the zeroing; autograd.grad itself does not depend on grad mode
        try:
            grads = torch.autograd.grad(loss, problem.params[i], retain_graph=retain_graph, allow_unused=True)
        except RuntimeError as err:
            if loss.grad_fn is None:
                raise _no_path(problem.names[i]) from err
            raise
        views = problem.grad_views[i]
        if all(map(operator.is_not, grads, repeat(None))) and not problem.sparse[i]:
            dst += views  # the common case
            src += grads
        else:
            have = [(v, g) for v, g in zip(views, grads) if g is not None]
            if not have:
                raise _no_path(problem.names[i])
            for v, g in zip(views, grads):
                if g is None:
                    v.zero_()
            dst += [v for v, _ in have]
            src += [g.to_dense() if g.is_sparse else g for _, g in have]
    return problem.sizes[i]  # ``grads`` goes with this frame: once copied, no gradient outlives its batch


def _copy_into(dst: list[Tensor], src: list[Tensor], scale: float) -> None:
    with torch.no_grad():
        torch._foreach_copy_(dst, src)
        if scale != 1.0:
            torch._foreach_div_(dst, scale)


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
        hooks = p._post_accumulate_grad_hooks
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
    swapped = []
    try:
        for params, registered in zip(problem.params, problem.places):
            for p, places in zip(params, registered):
                for sub, name in places:
                    # assign in the dict itself (as torch.func.functional_call does):
                    # the module's parameter order stays as it was
                    sub._parameters[name] = values[id(p)]
                    swapped.append((sub, name, p))
        yield
    finally:
        for sub, name, p in reversed(swapped):
            sub._parameters[name] = p


@contextlib.contextmanager
def jacobian_mode(problem: Problem) -> Iterator[None]:
    """Kernels with double backward: the math attention backend, and mkldnn off where
    a recurrent layer would use its (forward-AD-less) CPU kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rnn = problem.recurrent
    mkldnn = torch._C._get_mkldnn_enabled()
    try:
        if rnn:
            torch._C._set_mkldnn_enabled(False)
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch._C._set_mkldnn_enabled(mkldnn)


def _make_dual(primal: Tensor, tangent: Tensor) -> Tensor:
    # The first make_dual loads torch's jvp decompositions through torch.jit.script,
    # which warns about its own deprecation; that warning is not the user's concern.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*deprecated", category=DeprecationWarning)
        return fwAD.make_dual(primal, tangent)


def _flatten(entry: Entry, grads: Sequence[Tensor | None]) -> Tensor:
    """A differentiable flat tensor laid out like ``entry.buffer`` from per-parameter grads."""
    buf = entry.buffer
    pieces, end = [], 0
    for seg, g in zip(buf.segments, grads):
        if seg.offset > end:
            pieces.append(torch.zeros(seg.offset - end, dtype=buf.dtype, device=buf.device))
        pieces.append(torch.zeros(seg.numel, dtype=buf.dtype, device=buf.device) if g is None else g.reshape(-1))
        end = seg.offset + seg.numel
    if buf.numel > end:
        pieces.append(torch.zeros(buf.numel - end, dtype=buf.dtype, device=buf.device))
    return torch.cat(pieces)


class Linearization:
    """ξ at the current point with its graph, for Jacobian products.

    ``xi`` is the joint vector field (detached). Every product below may be called
    many times and reuses the graph; :meth:`jvp` re-runs the losses with dual
    tensors when forward-mode AD is available, else uses the double-vjp trick.

    Notation: J = ∂ξ/∂w; D = blockdiag(∂ξ_i/∂w_i) (symmetric Hessians ∇²_{w_i} f_i);
    H_o = J − D, the off-diagonal blocks.
    """

    def __init__(
        self,
        problem: Problem,
        closure: Callable[[], Any],
        evaluations: Evaluations,
        tangent: Vec | None = None,
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
        self.entries_of = [
            [k for k, e in enumerate(layout.entries) if e.player == i] for i in range(len(problem.names))
        ]
        self.inputs: list[list[Tensor]] = []  # per entry: the tensors differentiated against
        values: dict[int, Tensor] = {}
        self.functional = problem.functional
        for e in layout.entries:
            if self.functional:
                leaf = layout.entry_view(layout.data, e).detach().requires_grad_()
                source = leaf if tangent is None else _make_dual(leaf, layout.entry_view(tangent, e))
                for p, view in zip(e.buffer.params, e.buffer.views(source)):
                    values[id(p)] = view
                self.inputs.append([source])
            else:
                self.inputs.append(list(e.buffer.params))
        with jacobian_mode(problem), _substituted(problem, values) if self.functional else contextlib.nullcontext():
            self.losses, self.metrics = evaluate_losses(problem, closure)
            self.pieces: list[Tensor] = [torch.empty(0)] * len(layout.entries)  # per entry: differentiable ξ
            # with ``cross``, per player i: ∇_{w_k} f_i for the other players' entries k, with its graph
            self.cross: list[dict[int, Tensor | None]] | None = [] if cross and tangent is None else None
            for i, name in enumerate(problem.names):
                if self.losses[i].grad_fn is None:
                    raise _no_path(name)
                # forward-over-reverse (a tangent) needs no graph of the backward itself
                loss = self.losses[i] if scale == 1.0 else self.losses[i] * scale
                ins = self._all() if self.cross is not None else self.entries_of[i]
                grads = self._grad([loss], None, ins, create_graph=tangent is None)
                if scale != 1.0:  # loss scaling: every product below is unscaled
                    grads = {k: None if g is None else g / scale for k, g in grads.items()}
                if all(grads[k] is None for k in self.entries_of[i]):
                    raise _no_path(name)
                for k in self.entries_of[i]:
                    g = grads.pop(k)
                    self.pieces[k] = self._zeros(k) if g is None else g
                if self.cross is not None:
                    self.cross.append(grads)
        self.xi = self._to_vec({k: p.detach() for k, p in enumerate(self.pieces)})
        if average:
            self._mean(self.xi)

    # ------------------------------------------------------------ primitives
    def _zeros(self, k: int) -> Tensor:
        buf = self.layout.entries[k].buffer
        return torch.zeros(buf.numel, dtype=buf.dtype, device=buf.device)

    def _grad(
        self,
        outputs: list[Tensor],
        grad_outputs: list[Tensor] | None,
        ins: list[int],
        create_graph: bool = False,
        last: bool = False,
    ) -> dict[int, Tensor | None]:
        """Reverse mode: Σ ⟨outputs, grad_outputs⟩ differentiated against the inputs
        of entries ``ins``; one flat tensor (or None if unreachable) per entry.
        ``last``: free the graph as the pass goes (no product may follow)."""
        _check_unspent(self)
        self._spent = last
        keep = [n for n, o in enumerate(outputs) if o.requires_grad]
        inputs = [t for k in ins for t in self.inputs[k]]
        if not keep:
            return dict.fromkeys(ins)
        grads = torch.autograd.grad(
            [outputs[n] for n in keep],
            inputs,
            grad_outputs=None if grad_outputs is None else [grad_outputs[n] for n in keep],
            retain_graph=create_graph or not last,
            create_graph=create_graph,
            allow_unused=True,
        )
        out: dict[int, Tensor | None] = {}
        pos = 0
        for k in ins:
            n = len(self.inputs[k])
            part = grads[pos : pos + n]
            pos += n
            if all(g is None for g in part):
                out[k] = None
            elif self.functional:
                out[k] = part[0]
            else:
                out[k] = _flatten(self.layout.entries[k], part)
        return out

    def _reverse(self, outs: list[int], u: Vec, ins: list[int], last: bool = False) -> dict[int, Tensor | None]:
        """Σ_{k in outs} (∂ξ_k/∂w_ins)ᵀ u_k."""
        pieces = [self.pieces[k] for k in outs]
        us = [self.layout.entry_view(u, self.layout.entries[k]) for k in outs]
        return self._grad(pieces, us, ins, last=last)

    def _to_vec(self, parts: dict[int, Tensor | None]) -> Vec:
        layout = self.layout
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

    def _all(self) -> list[int]:
        return list(range(len(self.layout.entries)))

    def _others(self, i: int) -> list[int]:
        """The entries of every player but ``i``."""
        return [k for j, ks in enumerate(self.entries_of) if j != i for k in ks]

    def _offdiag_reverse(self, us: list[Tensor], create_graph: bool = False) -> dict[int, Tensor | None]:
        """H_oᵀ u for ``u`` given per entry: Σ_{i≠owner(k)} (∂ξ_i/∂w_k)ᵀ u_i, one reverse
        pass per player toward the other players' parameters only."""
        res: dict[int, Tensor | None] = dict.fromkeys(self._all())
        for i, ks in enumerate(self.entries_of):
            outs = [k for k in ks if self.pieces[k].requires_grad]
            others = self._others(i)
            if not others or not outs:
                continue
            part = self._grad([self.pieces[k] for k in outs], [us[k] for k in outs], others, create_graph=create_graph)
            for k, t in part.items():
                if t is not None:
                    res[k] = t if res[k] is None else res[k] + t
        return res

    # -------------------------------------------------------------- products
    # Every public product is averaged across ranks in a data-parallel game (one
    # collective each); the _local_ ones are this rank's alone.
    def _local_vjp(self, u: Vec, last: bool = False) -> Vec:
        return self._to_vec(self._reverse(self._all(), u, self._all(), last=last))

    def _local_diag(self, v: Vec) -> Vec:
        parts: dict[int, Tensor | None] = {}
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
        entries = self.layout.entries
        return self._mean(self._to_vec(self._offdiag_reverse([self.layout.entry_view(u, e) for e in entries])))

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
        fresh tensors straight from the reverse pass (no joint vector formed: for
        solvers that live in one player's space, CGD's Schur complement)."""
        ins = self.entries_of[j]
        res = self._grad([self.pieces[k] for k in self.entries_of[i]], list(u_i), ins)
        return self._mean(Vec(self._zeros(k) if res[k] is None else res[k] for k in ins))

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
            out.append(self._to_vec({k: None if g is None else g.detach() for k, g in parts.items()}))
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
        if not chi:
            cbar = None
        elif self.cross is not None and not self.problem.parallel:  # no average to take: no copies
            cbar = [{k: None if c is None else c.detach() for k, c in cross.items()} for cross in self.cross]
        else:
            cbar = [
                {k: self.layout.entry_view(g, e) for k, e in enumerate(self.layout.entries)}
                for g in self.cross_gradients()
            ]
        if self.cross is None:
            terms = []
            if v is not None:
                terms.append(self._jvp_double_backward(v, offdiag=True))
            if cbar is not None:
                parts: dict[int, Tensor | None] = {}
                for i, g in enumerate(cbar):
                    outs = self._others(i)
                    pieces = [self.pieces[k] for k in outs]
                    parts.update(self._grad(pieces, [g[k] for k in outs], self.entries_of[i]))
                terms.append(self._to_vec(parts))
            return self._mean(terms[0] if len(terms) == 1 else terms[0] + terms[1])
        parts = {}
        view = self.layout.entry_view
        for i, ks in enumerate(self.entries_of):
            outs: list[Tensor] = []
            grad_outs: list[Tensor] = []
            for k in self._others(i):
                e = self.layout.entries[k]
                c = self.cross[i][k]
                if v is not None and c is not None and c.requires_grad:
                    outs.append(c)
                    grad_outs.append(view(v, e))
                if cbar is not None and self.pieces[k].requires_grad and cbar[i][k] is not None:
                    outs.append(self.pieces[k])
                    grad_outs.append(cbar[i][k])
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
                    dual = Linearization(
                        self.problem, self.closure, self.evaluations, tangent=v, average=False, scale=self.scale
                    )
                    tangents = {k: fwAD.unpack_dual(p).tangent for k, p in enumerate(dual.pieces)}
                return self._to_vec({k: None if t is None else t.detach() for k, t in tangents.items()})
            except NotImplementedError as err:
                # only PyTorch's own "no forward AD formula for this op": anything else
                # (the user's errors included) propagates
                if not _NO_FORWARD_AD.search(str(err)):
                    raise
                log.info("forward-mode AD unavailable (%s); using double backward for Jv", err)
                self.problem.forward_mode.ok = False
        return self._jvp_double_backward(v)

    def _transposed(self, offdiag: bool) -> tuple[list[Tensor], dict[int, Tensor | None]]:
        """The graph of u ↦ Jᵀu (or H_oᵀu) for a dummy u, built once and kept."""
        key = "offdiag" if offdiag else "full"
        cache = self.__dict__.setdefault("_transposed_cache", {})
        if key not in cache:
            us = [torch.zeros_like(p, requires_grad=True) for p in self.pieces]
            if offdiag:
                res = self._offdiag_reverse(us, create_graph=True)
            else:
                outs = [k for k, p in enumerate(self.pieces) if p.requires_grad]
                res = self._grad([self.pieces[k] for k in outs], [us[k] for k in outs], self._all(), create_graph=True)
            cache[key] = (us, res)
        return cache[key]

    def _jvp_double_backward(self, v: Vec, offdiag: bool = False) -> Vec:
        """J v (or H_o v) = ∂/∂u ⟨Jᵀu, v⟩: Jᵀu is linear in u, its graph is kept,
        so repeated products (Krylov solvers) cost one reverse pass each."""
        us, res = self._transposed(offdiag)
        pairs = [(t, self.layout.entry_view(v, self.layout.entries[k])) for k, t in res.items()]
        pairs = [(t, w) for t, w in pairs if t is not None and t.requires_grad]
        if not pairs:
            return self.layout.zeros()
        out = torch.autograd.grad(
            [t for t, _ in pairs], us, grad_outputs=[w for _, w in pairs], retain_graph=True, allow_unused=True
        )
        return self._to_vec({k: None if r is None else r.detach() for k, r in enumerate(out)})

    def jvp_repeated(self, v: Vec) -> Vec:
        """J v for many v at this point: after the first call, one reverse pass each."""
        return self._mean(self._jvp_double_backward(v))

    def vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        """(Jᵀv, Jv)."""
        return self.vjp(v), self.jvp(v)


_NO_FORWARD_AD = re.compile(r"Trying to use forward AD with .* that does not support it")


def _check_unspent(lin: Linearization | ZeroSumLinearization) -> None:
    if lin._spent:
        raise RuntimeError("this linearization's graph was freed by a product with last=True: linearize again")


def _packed(layout: JointLayout, g: int) -> bool:
    """The parameters of joint group ``g`` tile it in storage order, each contiguous
    (no padding): the group is the ``cat`` of their flattened tensors."""
    end = 0
    for e in layout.group_entries(g):
        for seg in e.buffer.segments:
            if e.start + seg.offset != end or not seg.contiguous:
                return False
            end += seg.numel
    return end == layout.data[g].numel()


def _cat(tensors: Sequence[Tensor]) -> Tensor:
    """A new flat tensor: the flattened ``tensors`` one after the other."""
    flat = torch._C._nn.flatten_dense_tensors(tensors)
    return flat.clone() if len(tensors) == 1 else flat  # of one tensor, flatten returns a view


class ZeroSumLinearization:
    """ξ with its graph for a two-player zero-sum game given as losses (f, −f).

    One ``create_graph`` backward of the one scalar f (player 0's loss) against all
    parameters gives ∇f with its graph. With H = ∇²f (symmetric) and
    S = diag(I, −I) (player 0 minimizes f, player 1 minimizes −f): ξ = S∇f,
    J = S H, so every product is a Hessian-vector product through that one kept
    graph: Jᵀu = H(Su), Jv = S(Hv); Jᵀξ = H∇f. The inputs are the parameters
    themselves, as in the bare code (no flat leaf, no substitution: no ``split``,
    view or ``cat`` node in either pass); the per-parameter results become joint
    vectors with one ``cat`` (or ``_foreach_copy_``) outside the graph, and Jᵀξ's
    grad_outputs are ∇f's own per-parameter tensors.

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
        layout = self.layout = problem.layout
        # per group: the parameters differentiated against, in storage order
        self.inputs = [[p for e in layout.group_entries(g) for p in e.buffer.params] for g in range(len(layout.data))]
        self._flat_inputs = [t for ins in self.inputs for t in ins]
        self._packed = [_packed(layout, g) for g in range(len(layout.data))]
        with jacobian_mode(problem):
            self.losses, self.metrics = evaluate_losses(problem, closure)
            f = self.losses[0]
            if f.grad_fn is None:
                raise _no_path(problem.names[0])
            if bool((f.detach() + self.losses[1].detach()).reshape(()) != 0):
                raise ValueError("zero_sum=True needs a two-player zero-sum game given as losses (f, -f)")
            grads = torch.autograd.grad(
                f if scale == 1.0 else f * scale, self._flat_inputs, create_graph=True, allow_unused=True
            )
        if scale != 1.0:
            grads = tuple(None if t is None else t / scale for t in grads)  # every product below is unscaled
        self._keep = [k for k, t in enumerate(grads) if t is not None and t.requires_grad]
        self._outputs = [grads[k] for k in self._keep]  # ∇f with its graph
        self._grad_f = [None if t is None else t.detach() for t in grads]  # ∇f per input
        self.xi = self._sign_(self._to_vec(self._grad_f))
        self._mean(self.xi)

    @functools.cached_property
    def grad_f(self) -> Vec:
        """∇f on this rank, as a joint vector (a new one)."""
        return self._to_vec(self._grad_f)

    # ------------------------------------------------------------ primitives
    def _to_vec(self, per_input: Sequence[Tensor | None]) -> Vec:
        """A joint vector from one tensor (or None: zero) per input."""
        if any(self.problem.sparse):
            per_input = [t.to_dense() if t is not None and t.is_sparse else t for t in per_input]
        parts, pos = [], 0
        for ins in self.inputs:
            parts.append(per_input[pos : pos + len(ins)])
            pos += len(ins)
        with torch.no_grad():
            if all(self._packed) and all(t is not None for t in per_input):
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
                torch._foreach_copy_(dst, src)
        return out

    def _split(self, v: Vec | list[Tensor]) -> list[Tensor]:
        """``v`` as one tensor per input (the grad_outputs of a product); ∇f's own
        per-input tensors (``self._grad_f``) are taken as they are."""
        if v is self._grad_f:
            return v
        out: list[Tensor] = []
        for g, (ins, flat) in enumerate(zip(self.inputs, v)):
            if self._packed[g]:
                out += torch._C._nn.unflatten_dense_tensors(flat, ins)
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
            res = torch.autograd.grad(
                self._outputs,
                self._flat_inputs,
                grad_outputs=[part[k] for k in self._keep],
                retain_graph=not last or n < len(vs),
                allow_unused=True,
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
