"""The one place that knows autograd's subtleties.

* First-order ξ: ``autograd.grad`` of each player's loss with respect to that
  player's own parameters only (a pruned backward, no ``create_graph``, no hooks
  firing), copied into the fused gradient buffers with one ``_foreach_copy_``.
* Jacobian products: each player buffer's slice of the joint storage becomes a
  leaf (``detach().requires_grad_()`` shares the storage); ``torch.split`` views
  of it are substituted for the module's parameters while the losses run;
  ``autograd.grad(..., create_graph=True)`` gives a differentiable ξ.
  ``Jᵀv`` is one reverse pass over that graph. ``Jv`` is forward-over-reverse
  (dual tensors through the backward) where every op supports forward-mode AD,
  else the double-vjp trick.
* During Jacobian products module buffers (BatchNorm running statistics) are
  restored afterwards, scaled-dot-product attention uses the math backend and
  mkldnn is off, since the fused CPU kernels have no double backward.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .layout import Entry, Vec

if TYPE_CHECKING:
    from .game import Game

log = logging.getLogger(__name__)


class LossError(ValueError):
    """The losses callable returned something that is not one scalar loss per player."""


def evaluate_losses(game: Game, args: tuple, kwargs: dict) -> list[Tensor]:
    """Call the game's losses and check that they are one scalar per player."""
    out = game.losses(*args, **kwargs)
    if isinstance(out, Tensor):
        out = list(out.unbind()) if out.dim() == 1 else [out]
    out = list(out)
    n = len(game.players)
    if len(out) != n:
        raise LossError(f"losses returned {len(out)} values for {n} players")
    for loss, player in zip(out, game.players):
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            what = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise LossError(f"the loss of player {player.name!r} is not a scalar tensor (got {what})")
    return out


def _no_path(player_name: str) -> LossError:
    return LossError(f"the loss of player {player_name!r} does not depend on that player's parameters")


def first_order(game: Game, which: Sequence[int], args: tuple, kwargs: dict) -> list[Tensor]:
    """ξ_i for the players in ``which`` into the fused gradient buffers; returns the
    detached losses. Other players' gradient buffers are left untouched."""
    losses = evaluate_losses(game, args, kwargs)
    for k, i in enumerate(which):
        player = game.players[i]
        try:
            grads = torch.autograd.grad(losses[i], player._params, retain_graph=k < len(which) - 1, allow_unused=True)
        except RuntimeError as err:
            if losses[i].grad_fn is None:
                raise _no_path(player.name) from err
            raise
        views = game._grad_views[i]
        have = [(v, g) for v, g in zip(views, grads) if g is not None]
        if not have:
            raise _no_path(player.name)
        with torch.no_grad():
            for v, g in zip(views, grads):
                if g is None:
                    v.zero_()
            if player.has_sparse_grad:
                have = [(v, g.to_dense() if g.is_sparse else g) for v, g in have]
            torch._foreach_copy_([v for v, _ in have], [g for _, g in have])
    return [loss.detach().reshape(()) for loss in losses]


@contextlib.contextmanager
def _substituted(game: Game, values: dict[int, Tensor]) -> Iterator[None]:
    """Let the modules use ``values[id(param)]`` in place of their parameters."""
    swapped = []
    try:
        for player in game.players:
            for p, places in zip(player._params, player._owners):
                for sub, name in places:
                    del sub._parameters[name]
                    setattr(sub, name, values[id(p)])
                    swapped.append((sub, name, p))
        yield
    finally:
        for sub, name, p in reversed(swapped):
            delattr(sub, name)
            sub._parameters[name] = p


@contextlib.contextmanager
def jacobian_mode(game: Game) -> Iterator[None]:
    """Module buffers unchanged afterwards; kernels that support double backward."""
    saved = [(b, b.clone()) for m in game._modules() for b in m.buffers()]
    try:
        with contextlib.ExitStack() as stack:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(SDPBackend.MATH))
            stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
            yield
    finally:
        with torch.no_grad():
            for b, copy in saved:
                b.copy_(copy)


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

    ``xi`` is the joint vector field (detached). :meth:`vjp` and :meth:`jvp` may be
    called many times; each reuses the graph (``jvp`` re-runs the losses with dual
    tensors when forward mode is available).
    """

    def __init__(self, game: Game, args: tuple, kwargs: dict, tangent: Vec | None = None) -> None:
        self.game, self.args, self.kwargs = game, args, kwargs
        layout = game.layout
        self.inputs: list[list[Tensor]] = []  # per entry: what is differentiated
        values: dict[int, Tensor] = {}
        self.functional = all(p.module is not None for p in game.players)
        for e in layout.entries:
            if self.functional:
                leaf = layout.entry_view(layout.data, e).detach().requires_grad_()
                source = leaf if tangent is None else _make_dual(leaf, layout.entry_view(tangent, e))
                for p, view in zip(e.buffer.params, e.buffer.views(source)):
                    values[id(p)] = view
                self.inputs.append([source])
            else:
                self.inputs.append(list(e.buffer.params))
        context = _substituted(game, values) if self.functional else contextlib.nullcontext()
        with context:
            self.losses = evaluate_losses(game, args, kwargs)
        self.pieces: list[Tensor] = []  # per entry: differentiable ξ
        for i, player in enumerate(game.players):
            entries = [k for k, e in enumerate(layout.entries) if e.player == i]
            inputs = [t for k in entries for t in self.inputs[k]]
            if self.losses[i].grad_fn is None:
                raise _no_path(player.name)
            grads = torch.autograd.grad(self.losses[i], inputs, create_graph=True, allow_unused=True)
            if all(g is None for g in grads):
                raise _no_path(player.name)
            pos = 0
            for k in entries:
                n = len(self.inputs[k])
                self.pieces.append(self._as_flat(k, grads[pos : pos + n]))
                pos += n
        self.xi = self._to_vec([p.detach() for p in self.pieces])

    def _as_flat(self, k: int, grads: Sequence[Tensor | None]) -> Tensor:
        entry = self.game.layout.entries[k]
        if self.functional:
            g = grads[0]
            return (
                torch.zeros(entry.buffer.numel, dtype=entry.buffer.dtype, device=entry.buffer.device)
                if g is None
                else g
            )
        return _flatten(entry, grads)

    def _to_vec(self, pieces: Sequence[Tensor]) -> Vec:
        layout = self.game.layout
        out = layout.zeros()
        with torch.no_grad():
            for e, t in zip(layout.entries, pieces):
                layout.entry_view(out, e).copy_(t)
        return out

    def _split(self, v: Vec) -> list[Tensor]:
        layout = self.game.layout
        return [layout.entry_view(v, e) for e in layout.entries]

    def _differentiable(self) -> tuple[list[Tensor], list[int]]:
        keep = [k for k, p in enumerate(self.pieces) if p.requires_grad]
        return [self.pieces[k] for k in keep], keep

    def vjp(self, v: Vec) -> Vec:
        """Jᵀ v."""
        pieces, keep = self._differentiable()
        flat_inputs = [t for ts in self.inputs for t in ts]
        if not pieces:
            return self.game.layout.zeros()
        vs = self._split(v)
        grads = torch.autograd.grad(
            pieces, flat_inputs, grad_outputs=[vs[k] for k in keep], retain_graph=True, allow_unused=True
        )
        out, pos = [], 0
        for k in range(len(self.inputs)):
            n = len(self.inputs[k])
            out.append(self._as_flat(k, grads[pos : pos + n]).detach())
            pos += n
        return self._to_vec(out)

    def jvp(self, v: Vec) -> Vec:
        """J v: forward-over-reverse where possible, else the double-vjp trick."""
        game = self.game
        if self.functional and game._forward_mode_ok:
            try:
                with fwAD.dual_level():
                    dual = Linearization(game, self.args, self.kwargs, tangent=v)
                    tangents = [fwAD.unpack_dual(p).tangent for p in dual.pieces]
                pieces = [torch.zeros_like(p) if t is None else t.detach() for p, t in zip(self.pieces, tangents)]
                return self._to_vec(pieces)
            except (RuntimeError, NotImplementedError) as err:
                if "forward" not in str(err).lower() and "not implemented" not in str(err).lower():
                    raise
                log.info("forward-mode AD unavailable (%s); using double backward for Jv", err)
                game._forward_mode_ok = False
        return self._jvp_double_backward(v)

    def _jvp_double_backward(self, v: Vec) -> Vec:
        pieces, keep = self._differentiable()
        if not pieces:
            return self.game.layout.zeros()
        flat_inputs = [t for ts in self.inputs for t in ts]
        us = [torch.zeros_like(p, requires_grad=True) for p in pieces]
        w = torch.autograd.grad(pieces, flat_inputs, grad_outputs=us, create_graph=True, allow_unused=True)
        vs_entries = self._split(v)
        vs = [vs_entries[k] for k, ts in enumerate(self.inputs) for _ in ts]
        if not self.functional:
            layout = self.game.layout
            vs = []
            for e in layout.entries:
                vs.extend(e.buffer.views(layout.entry_view(v, e)))
        pairs = [(wi, vi) for wi, vi in zip(w, vs) if wi is not None and wi.requires_grad]
        out = [torch.zeros_like(p) for p in self.pieces]
        if pairs:
            res = torch.autograd.grad(
                [a for a, _ in pairs], us, grad_outputs=[b for _, b in pairs], retain_graph=True, allow_unused=True
            )
            for k, r in zip(keep, res):
                if r is not None:
                    out[k] = r.detach()
        return self._to_vec(out)


def linearize(game: Game, args: tuple, kwargs: dict[str, Any]) -> Linearization:
    """ξ with its graph at the current point (the game checks finiteness)."""
    return Linearization(game, args, kwargs)
