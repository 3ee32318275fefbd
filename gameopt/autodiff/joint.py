"""Joint vectors from the per-parameter tensors of products, and per-parameter views
of joint vectors (a product's grad_outputs), outside any graph.

A *part* is what a product gives for one layout entry: one tensor per parameter of
the entry's buffer (``None``: zero, a parameter no gradient reached). Where the
parameters tile every joint group (no padding, each contiguous) a joint vector is
one ``cat`` per group; else the parts are copied into a new vector with one
``_foreach_copy_``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import cast

import torch
from torch import Tensor

from .. import _torch_compat as tc
from ..vec import Vec
from .problem import Problem

#: per entry, one tensor (or None: zero, unreached) per parameter of its buffer
Part = list[Tensor | None]


def complete(part: Sequence[Tensor | None]) -> bool:
    """No ``None`` among the tensors (a C-level pass: no tensor comparisons)."""
    return all(map(operator.is_not, part, repeat(None)))


def dense(t: Tensor | None) -> Tensor | None:
    """``t`` as a dense tensor (a sparse gradient densified); ``None`` stays."""
    return t.to_dense() if t is not None and t.is_sparse else t


def cat(tensors: Sequence[Tensor]) -> Tensor:
    """A new flat tensor: the flattened ``tensors`` one after the other."""
    flat = tc.flatten_dense(tensors)
    return flat.clone() if len(tensors) == 1 else flat  # of one tensor, flatten returns a view


def param_views(problem: Problem, flat: Tensor, k: int) -> Sequence[Tensor]:
    """Per-parameter views of ``flat``, laid out like entry ``k``'s buffer."""
    if problem.entry_packed[k]:
        return tc.unflatten_dense(flat, problem.entry_params[k])
    return problem.layout.entries[k].buffer.views(flat)


def entry_views(problem: Problem, v: Vec, ks: Sequence[int]) -> list[Sequence[Tensor]]:
    """Per-parameter views of the entries ``ks`` of ``v`` (the grad_outputs of a product)."""
    layout = problem.layout
    return [param_views(problem, layout.entry_view(v, layout.entries[k]), k) for k in ks]


def joint_vector(problem: Problem, parts: Mapping[int, Part | Tensor | None]) -> Vec:
    """A new joint vector from one part per layout entry: per-parameter tensors, or
    one flat tensor of the entry's length; an entry whose part is ``None`` or
    missing is zero."""
    layout = problem.layout
    with torch.no_grad():
        if any(problem.sparse):
            parts = {k: p if p is None or isinstance(p, Tensor) else [dense(t) for t in p] for k, p in parts.items()}
        if (
            problem.all_packed
            and len(parts) == len(layout.entries)
            and all(p is not None and not isinstance(p, Tensor) and complete(p) for p in parts.values())
        ):
            # the parameters tile each group in order: one cat per group
            full = cast("Mapping[int, list[Tensor]]", parts)  # every part there, each complete
            return Vec(cat([t for k in ks for t in full[k]]) for ks in problem.group_entries)
        out = layout.empty() if layout.dense else layout.zeros()
        dst: list[Tensor] = []
        src: list[Tensor] = []
        zero: list[Tensor] = []
        for k, e in enumerate(layout.entries):
            flat = layout.entry_view(out, e)
            part = parts.get(k)
            if isinstance(part, Tensor):
                dst.append(flat)
                src.append(part)
                continue
            if part is None or not problem.entry_packed[k] or not complete(part):
                zero.append(flat)  # padding, or what no part writes
            if part is not None:
                for view, t in zip(param_views(problem, flat, k), part):
                    if t is not None:
                        dst.append(view)
                        src.append(t)
        if zero and layout.dense:
            tc.foreach_zero_(zero)
        if dst:
            tc.foreach_copy_(dst, src)
    return out


def entry_flat(problem: Problem, k: int, part: Part | None) -> Tensor:
    """Entry ``k`` as a new flat tensor from its per-parameter tensors (None: zero)."""
    buf = problem.layout.entries[k].buffer
    if part is None:
        return torch.zeros(buf.padded_numel, dtype=buf.dtype, device=buf.device)
    if any(problem.sparse):
        part = [dense(t) for t in part]
    with torch.no_grad():
        if problem.entry_packed[k] and complete(part):
            return cat(part)  # type: ignore[arg-type]
        out = torch.zeros(buf.padded_numel, dtype=buf.dtype, device=buf.device)
        have = [(view, t) for view, t in zip(param_views(problem, out, k), part) if t is not None]
        if have:
            tc.foreach_copy_([view for view, _ in have], [t for _, t in have])
    return out
