"""The linearization of a general game: ξ with its graph, and the Jacobian
products through it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from ..evaluation import Evaluations, split_losses
from ..vec import Vec
from .engine import KeptGraph, dummy, engine_vjp
from .forward import dual_tangents, lacks_forward_ad
from .joint import Part, entry_flat, entry_views, joint_vector, param_views
from .problem import Problem, no_path_error, refuse_compiled
from .substitution import graph_inputs, jacobian_mode
from .zero_sum import ZeroSumLinearization

log = logging.getLogger(__name__)


class GeneralLinearization:
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
        self._graph = KeptGraph()
        self._mean = problem.mean_
        layout = problem.layout
        self.layout = layout
        self.entries_of = problem.entries_of
        self.functional = problem.functional
        # per entry, per parameter: the tensors differentiated against
        self.inputs, running = graph_inputs(problem, problem.entry_params)
        with jacobian_mode(problem), running:
            self.losses, self.metrics = split_losses(closure(), problem.names)
            # per entry, per parameter: differentiable ξ
            self.pieces: list[Part] = [[None] * len(ins) for ins in self.inputs]
            # with ``cross``, per player i: ∇_{w_k} f_i for the other players' entries k, with its graph
            self.cross: list[dict[int, Part | None]] | None = [] if cross else None
            refuse_compiled(problem.names, self.losses)
            for i, name in enumerate(problem.names):
                if self.losses[i].grad_fn is None:
                    raise no_path_error(name)
                loss = self.losses[i] if scale == 1.0 else self.losses[i] * scale
                ins = self._all() if self.cross is not None else self.entries_of[i]
                grads = self._grad([loss], None, ins, create_graph=True)
                if scale != 1.0:  # loss scaling: every product below is unscaled
                    grads = {
                        k: None if g is None else [None if t is None else t / scale for t in g]
                        for k, g in grads.items()
                    }
                if all(grads[k] is None for k in self.entries_of[i]):
                    raise no_path_error(name)
                for k in self.entries_of[i]:
                    g = grads.pop(k)
                    if g is not None:
                        self.pieces[k] = g
                if self.cross is not None:
                    self.cross.append(grads)
        self.xi = joint_vector(self.problem, dict(enumerate(self.pieces)))  # formed outside the graph
        if average:
            self._mean(self.xi)

    # ------------------------------------------------------------ primitives
    def _filled(self, k: int, part: Part) -> list[Tensor]:
        """``part`` with a zero tensor for each parameter no gradient reached (grad_outputs)."""
        return [torch.zeros_like(p) if t is None else t for t, p in zip(part, self.inputs[k])]

    def _grad(
        self,
        outputs: Sequence[Tensor | None],
        grad_outputs: Sequence[Tensor | None] | None,
        ins: list[int],
        create_graph: bool = False,
        last: bool = False,
    ) -> dict[int, Part | None]:
        """Reverse mode: Σ ⟨outputs, grad_outputs⟩ differentiated against the inputs
        of entries ``ins``; one tensor (or None) per parameter, None for an entry no
        gradient reached. Outputs that are None or have no graph are left out.
        ``last``: free the graph as the pass goes (no product may follow)."""
        self._graph.use(last)
        keep = [(n, o) for n, o in enumerate(outputs) if o is not None and o.requires_grad]
        if not keep:
            return dict.fromkeys(ins)
        inputs = [t for k in ins for t in self.inputs[k]]
        retain = create_graph or not last
        kept = [o for _, o in keep]
        grads: Sequence[Tensor | None]
        if grad_outputs is None:  # losses: scalars
            grads = torch.autograd.grad(kept, inputs, retain_graph=retain, create_graph=create_graph, allow_unused=True)
        else:  # each output kept has its grad_output
            grads = engine_vjp(
                kept,
                inputs,
                [cast(Tensor, grad_outputs[n]) for n, _ in keep],
                retain_graph=retain,
                create_graph=create_graph,
            )
        out: dict[int, Part | None] = {}
        pos = 0
        for k in ins:
            n = len(self.inputs[k])
            part = list(grads[pos : pos + n])
            pos += n
            out[k] = None if all(g is None for g in part) else part
        return out

    def _reverse(self, outs: list[int], u: Vec, ins: list[int], last: bool = False) -> dict[int, Part | None]:
        """Σ_{k in outs} (∂ξ_k/∂w_ins)ᵀ u_k."""
        pieces = [t for k in outs for t in self.pieces[k]]
        us = [w for part in entry_views(self.problem, u, outs) for w in part]
        return self._grad(pieces, us, ins, last=last)

    def _all(self) -> list[int]:
        return list(range(len(self.layout.entries)))

    def _others(self, i: int) -> list[int]:
        """The entries of every player but ``i``."""
        return [k for j, ks in enumerate(self.entries_of) if j != i for k in ks]

    def _offdiag_reverse(self, us: list[list[Tensor | None]], create_graph: bool = False) -> dict[int, Part | None]:
        """H_oᵀ u for ``u`` given per entry and parameter: Σ_{i≠owner(k)} (∂ξ_i/∂w_k)ᵀ u_i,
        one reverse pass per player toward the other players' parameters only."""
        res: dict[int, Part | None] = dict.fromkeys(self._all())
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
        return joint_vector(self.problem, self._reverse(self._all(), u, self._all(), last=last))

    def vjp(self, u: Vec, last: bool = False) -> Vec:
        """Jᵀ u. ``last``: no product follows (the graph is freed during this pass:
        less memory held, a little faster; a later product raises); ξ's per-parameter
        pieces are dropped and ``losses`` keep their values only (what their graphs
        saved that ξ's did not is freed too)."""
        out = self._local_vjp(u, last)
        if last:
            self.pieces = [[None] * len(piece) for piece in self.pieces]
            self.losses = [loss.detach() for loss in self.losses]
        return self._mean(out)

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
        return self._mean(joint_vector(self.problem, self._reverse(self.entries_of[i], u, self.entries_of[j])))

    def block_vjp_parts(self, i: int, j: int, u_i: Sequence[Tensor]) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i on players' parts: ``u_i`` one flat tensor per buffer of
        player i (as ``layout.player_views``), the result one per buffer of player j,
        fresh tensors (no joint vector formed: for solvers that live in one player's
        space, CGD's Schur complement)."""
        ins = self.entries_of[j]
        outs = self.entries_of[i]
        pieces = [t for k in outs for t in self.pieces[k]]
        us = [w for k, flat in zip(outs, u_i) for w in param_views(self.problem, flat, k)]
        res = self._grad(pieces, us, ins)
        return self._mean(Vec(entry_flat(self.problem, k, res[k]) for k in ins))

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
            out.append(joint_vector(self.problem, parts))
        if self.problem.parallel:
            stacked = Vec(torch.cat([vec[g] for vec in out]) for g in range(len(out[0])))
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
        cbar: list[dict[int, Sequence[Tensor] | None]] | None
        if not chi:
            cbar = None
        elif self.cross is not None and not self.problem.parallel:  # no average to take: no copies
            cbar = [{k: None if c is None else self._filled(k, c) for k, c in cross.items()} for cross in self.cross]
        else:
            cbar = [dict(zip(self._all(), entry_views(self.problem, g, self._all()))) for g in self.cross_gradients()]
        if self.cross is None:
            terms = []
            if v is not None:
                terms.append(self._jvp_double_backward(v, offdiag=True))
            if cbar is not None:
                parts: dict[int, Part | None] = {}
                for i, g in enumerate(cbar):
                    others = self._others(i)
                    pieces = [t for k in others for t in self.pieces[k]]
                    parts.update(self._grad(pieces, [w for k in others for w in g[k] or ()], self.entries_of[i]))
                terms.append(joint_vector(self.problem, parts))
            return self._mean(terms[0] if len(terms) == 1 else terms[0] + terms[1])
        parts = {}
        for i, ks in enumerate(self.entries_of):
            outs: list[Tensor | None] = []
            grad_outs: list[Tensor | None] = []
            for k in self._others(i):
                c = self.cross[i][k]
                if v is not None and c is not None:
                    outs += c
                    grad_outs += entry_views(self.problem, v, [k])[0]
                cb = None if cbar is None else cbar[i][k]
                if cb is not None:
                    outs += self.pieces[k]
                    grad_outs += cb
            parts.update(self._grad(outs, grad_outs, ks))
        return self._mean(joint_vector(self.problem, parts))

    def jvp(self, v: Vec) -> Vec:
        """J v: forward-over-reverse where possible, else the double-vjp trick."""
        return self._mean(self._local_jvp(v))

    def _local_jvp(self, v: Vec) -> Vec:
        why = "a player given as tensors (no module to run with dual parameters)"
        if self.functional and self.problem.forward_mode.ok:
            try:
                # the same random numbers as ξ's evaluation; buffers left as they are
                with self.evaluations(plain=False), fwAD.dual_level():
                    return dual_tangents(self.problem, self.closure, v, self.scale)
            except NotImplementedError as err:
                # only PyTorch's own "no forward AD formula for this op": anything else
                # (the user's errors included) propagates
                if not lacks_forward_ad(err):
                    raise
                log.info("forward-mode AD unavailable (%s); using double backward for Jv", err)
                self.problem.forward_mode.ok = False
                why = f"PyTorch: {err}"
        elif self.functional:
            why = "an op without a forward-mode formula, met at an earlier product (see the log)"
        if self._graph.spent:
            raise RuntimeError(
                f"J v: forward-mode AD is unavailable for these losses ({why}), and the double backward "
                "needs the graph that a product with last=True freed: take J v before that product "
                "(SGA: jvp='double_backward')"
            )
        return self._jvp_double_backward(v)

    def _transposed(self, offdiag: bool) -> tuple[list[list[Tensor | None]], dict[int, Part | None]]:
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
                [dummy(t) if t is not None and t.requires_grad else None for t in piece] for piece in self.pieces
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
            for t, w in zip(ts, entry_views(self.problem, v, [k])[0]):
                if t is not None and t.requires_grad:
                    outs.append(t)
                    grad_outs.append(w)
        dummies = [(k, n, u) for k, part in enumerate(us) for n, u in enumerate(part) if u is not None]
        if not outs or not dummies:
            return self.layout.zeros()
        grads = engine_vjp(outs, [u for _, _, u in dummies], grad_outs, retain_graph=True)
        parts: dict[int, Part | None] = {}
        for (k, n, _), g in zip(dummies, grads):
            if g is not None:
                part = parts.get(k)
                if part is None:
                    part = parts[k] = [None] * len(self.inputs[k])
                part[n] = g
        return joint_vector(self.problem, parts)

    def jvp_many(self, v: Vec) -> Vec:
        """J v, one of many at this point (the products of a Krylov or eigenvalue solver):
        after the first call, one reverse pass each, through a kept graph of u ↦ Jᵀu."""
        return self._mean(self._jvp_double_backward(v))

    def vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        """(Jᵀv, Jv) in two reverse passes, no re-evaluation of the losses: the
        ``create_graph`` pass of ⟨ξ, u⟩ at a leaf u holding v's values is Jᵀu = Jᵀv,
        and Jᵀu is linear in u, so ∂/∂u ⟨Jᵀu, v⟩ = Jv (the double-vjp trick whose
        first pass is the product Jᵀv itself). With sparse gradients (no graph
        toward a sparse gradient's grad_output): :meth:`vjp` and :meth:`jvp`."""
        if any(self.problem.sparse):
            return self.vjp(v), self.jvp(v)
        jt, j = self._local_vjp_jvp(v)
        return self._mean(jt), self._mean(j)

    def _local_vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        ks = self._all()
        views = entry_views(self.problem, v, ks)
        # one leaf per piece of ξ with a graph: a detached alias of v's view (no copy)
        us = [
            [w.detach().requires_grad_() if t is not None and t.requires_grad else None for t, w in zip(piece, part)]
            for piece, part in zip(self.pieces, views)
        ]
        pieces = [t for piece in self.pieces for t in piece]
        jt_u = self._grad(pieces, [u for part in us for u in part], ks, create_graph=True)
        outs: list[Tensor] = []
        grad_outs: list[Tensor] = []
        for k, ts in jt_u.items():
            for t, w in zip(ts or (), views[k]):
                if t is not None and t.requires_grad:
                    outs.append(t)
                    grad_outs.append(w)
        leaves = [(k, n, u) for k, part in enumerate(us) for n, u in enumerate(part) if u is not None]
        parts: dict[int, Part] = {}
        if outs:
            grads = engine_vjp(outs, [u for _, _, u in leaves], grad_outs)  # frees the graph of Jᵀu only
            for (k, n, _), g in zip(leaves, grads):
                if g is not None:
                    parts.setdefault(k, [None] * len(self.inputs[k]))[n] = g
        # Jᵀv joined once its graph is gone (one vector less at the peak)
        return joint_vector(self.problem, jt_u), joint_vector(self.problem, parts)


def linearize(
    problem: Problem,
    closure: Callable[[], Any],
    evaluations: Evaluations,
    scale: float = 1.0,
    zero_sum: bool = False,
    batched: bool = False,
    cross: bool = False,
) -> GeneralLinearization | ZeroSumLinearization:
    """ξ with its graph at the current point (the game checks finiteness); with
    ``zero_sum``, through the one scalar f of a two-player game (f, −f); with
    ``cross``, the cross gradients ∇_{w_j} f_i kept too (for opponent shaping)."""
    if zero_sum:
        return ZeroSumLinearization(problem, closure, evaluations, scale=scale, batched=batched)
    return GeneralLinearization(problem, closure, evaluations, scale=scale, cross=cross)
