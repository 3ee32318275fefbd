"""The linearization of a two-player zero-sum game (f, −f): every Jacobian
product is a Hessian-vector product of the one scalar f."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..evaluation import Evaluations, check_zero_sum, split_losses
from ..vec import Vec
from .engine import KeptGraph, engine_vjp
from .joint import Part, entry_views, joint_vector
from .problem import Problem, no_path_error, refuse_compiled
from .substitution import graph_inputs, jacobian_mode


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

    Same interface as :class:`~gameopt.autodiff.GeneralLinearization`
    (:class:`~gameopt.protocols.Linearization`). The losses must be exactly (f, −f)
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
        self._graph = KeptGraph()
        self._mean = problem.mean_
        self.layout = problem.layout
        # per entry, group by group in storage order: the tensors differentiated against
        self._order = problem.storage_order
        self.inputs, running = graph_inputs(problem, [problem.entry_params[k] for k in self._order])
        self._flat_inputs = [t for ins in self.inputs for t in ins]
        with jacobian_mode(problem), running:
            self.losses, self.metrics = split_losses(closure(), problem.names)
            f = self.losses[0]
            if f.grad_fn is None:
                raise no_path_error(problem.names[0])
            # non-finite losses cannot show it: the game refuses them as non-finite
            check_zero_sum(self.losses, "zero_sum=True", nonfinite_ok=True)
            refuse_compiled(problem.names[:1], [f])
            grads = torch.autograd.grad(
                f if scale == 1.0 else f * scale, self._flat_inputs, create_graph=True, allow_unused=True
            )
        if scale != 1.0:
            grads = tuple(None if t is None else t / scale for t in grads)  # every product below is unscaled
        self._keep = [k for k, t in enumerate(grads) if t is not None and t.requires_grad]
        self._outputs = [grads[k] for k in self._keep]  # ∇f with its graph
        # ∇f per input, with its graph: read only under no_grad and as grad_outputs
        # (no detached copies)
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
        parts: dict[int, Part] = {}
        pos = 0
        for k, ins in zip(self._order, self.inputs):
            parts[k] = list(per_input[pos : pos + len(ins)])
            pos += len(ins)
        return joint_vector(self.problem, parts)

    def _split(self, v: Vec | list[Tensor]) -> list[Tensor]:
        """``v`` as one tensor per input (the grad_outputs of a product); ∇f's own
        per-input tensors (``self._grad_f``) are taken as they are."""
        if v is self._grad_f:
            return v
        return [w for part in entry_views(self.problem, v, self._order) for w in part]  # type: ignore[arg-type]

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
        self._graph.use(last)
        if not self._outputs:
            return [self.layout.zeros() for _ in vs]
        if len(vs) > 1 and self.batched:
            parts = [self._split(v) for v in vs]
            with torch.no_grad():
                stacked = [torch.stack([p[k] for p in parts]) for k in self._keep]
            res: Sequence[Tensor | None] = torch.autograd.grad(
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
            res = engine_vjp(
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
    def vjp(self, u: Vec, last: bool = False) -> Vec:
        """Jᵀ u = H S u (Jᵀξ = H∇f: no copy, where ξ is this rank's own). ``last``: no
        product follows (the graph is freed during this pass; a later product raises)."""
        own = u is self.xi and not self.problem.parallel
        return self._mean(self._hvps([self._grad_f if own else self._signed(u)], last)[0])

    def jvp(self, v: Vec) -> Vec:
        """J v = S H v."""
        return self._mean(self._sign_(self._hvps([v])[0]))

    jvp_many = jvp

    def vjp_jvp(self, v: Vec) -> tuple[Vec, Vec]:
        """(Jᵀv, Jv): two Hessian-vector products, batched when ``batched``."""
        h_sv, h_v = self._hvps([self._signed(v), v])
        return self._mean(h_sv), self._mean(self._sign_(h_v))

    def block_vjp_parts(self, i: int, j: int, u_i: Sequence[Tensor]) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i on players' parts (see :meth:`GeneralLinearization.block_vjp_parts`)."""
        u = self.layout.zeros()
        self.layout.player_views(u, i).copy_(u_i)
        return Vec(self.layout.player_views(self.block_vjp(i, j, u), j))

    def block_vjp(self, i: int, j: int, u: Vec) -> Vec:
        """(∂ξ_i/∂w_j)ᵀ u_i = s_i H_ji u_i, in player j's part of the result."""
        ui = self._only(u, i)
        if i == 1:
            self._sign_(ui)
        return self._mean(self._only(self._hvps([ui])[0], j))

    def offdiag_jvp(self, v: Vec) -> Vec:
        """H_o v = (s_i H_ij v_j)_i: two Hessian-vector products."""
        parts = self._hvps([self._only(v, 1), self._only(v, 0)])
        return self._mean(self._sign_(self._only(parts[0], 0) + self._only(parts[1], 1)))

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
