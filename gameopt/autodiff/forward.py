"""J v by forward-over-reverse: dual tensors through the losses and ξ's backward."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .. import _torch_compat as tc
from ..evaluation import split_losses
from ..vec import Vec
from .joint import joint_vector
from .problem import Problem, no_path_error
from .substitution import jacobian_mode, substituted

_NO_FORWARD_AD = re.compile(r"Trying to use forward AD with .* that does not support it")


def lacks_forward_ad(err: NotImplementedError) -> bool:
    """``err`` is PyTorch's own "no forward-mode formula for this op" (not the user's error)."""
    return _NO_FORWARD_AD.search(str(err)) is not None


def dual_tangents(problem: Problem, closure: Callable[[], Any], v: Vec, scale: float) -> Vec:
    """J v by forward-over-reverse, inside a ``forward_ad.dual_level``: each entry's
    slice of the joint storage becomes a leaf made dual with v's slice, ``split``
    views of it are substituted for the modules' parameters, the losses run and each
    player's ξ is differentiated (dual tensors through the backward); the tangents of
    ξ are J v."""
    layout = problem.layout
    leaves: list[Tensor] = []
    values: dict[int, Tensor] = {}
    for e in layout.entries:
        leaf = layout.entry_view(layout.data, e).detach().requires_grad_()
        source = tc.make_dual(leaf, layout.entry_view(v, e))
        for p, view in zip(e.buffer.params, e.buffer.views(source)):
            values[id(p)] = view
        leaves.append(source)
    tangents: dict[int, Tensor | None] = {}
    with jacobian_mode(problem), substituted(problem, values):
        losses, _ = split_losses(closure(), problem.names)
        for i, name in enumerate(problem.names):
            if losses[i].grad_fn is None:
                raise no_path_error(name)
            loss = losses[i] if scale == 1.0 else losses[i] * scale
            ks = problem.entries_of[i]
            # no graph of the backward itself: the tangents ride along
            grads = torch.autograd.grad([loss], [leaves[k] for k in ks], retain_graph=True, allow_unused=True)
            if all(g is None for g in grads):
                raise no_path_error(name)
            for k, g in zip(ks, grads):
                if g is not None and scale != 1.0:
                    g = g / scale  # loss scaling: the product is unscaled
                t = None if g is None else fwAD.unpack_dual(g).tangent
                tangents[k] = None if t is None else t.detach()
    return joint_vector(problem, tangents)
