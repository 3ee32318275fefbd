"""Reverse-mode products through a kept graph, handed to autograd's engine."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _torch_compat as tc
from ..buffer import shapes
from .joint import complete


def engine_vjp(
    outputs: Sequence[Tensor],
    inputs: Sequence[Tensor],
    grad_outputs: Sequence[Tensor],
    retain_graph: bool = False,
    create_graph: bool = False,
) -> tuple[Tensor | None, ...]:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)`` for
    grad_outputs that gameopt formed itself (views of a joint vector, ∇f's own
    tensors, or dummies), handed to autograd's engine without ``grad``'s Python-side
    check of each (output, grad_output) pair, whose cost grows with the number of
    tensors (see the docs' Performance page). Shapes are compared here in one
    C-level pass (the engine alone would sum a broadcastable grad_output); the
    engine casts dtypes and checks devices, as under ``grad``. Tensor subclasses
    with ``__torch_function__``, a missing grad_output, or a torch without the
    engine entry point take the public function."""
    outputs, inputs, grad_outputs = tuple(outputs), tuple(inputs), tuple(grad_outputs)
    if (
        tc.engine_run_backward is None
        or not complete(grad_outputs)
        or torch.overrides.has_torch_function(outputs + inputs + grad_outputs)
    ):
        return torch.autograd.grad(
            outputs, inputs, grad_outputs, retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
        )
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"{len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    if shapes(outputs) != shapes(grad_outputs):
        k = next(k for k, (o, g) in enumerate(zip(outputs, grad_outputs)) if o.shape != g.shape)
        got = f"{tuple(grad_outputs[k].shape)} and output[{k}] has a shape of {tuple(outputs[k].shape)}"
        raise RuntimeError(f"Mismatch in shape: grad_output[{k}] has a shape of {got}")
    engine = tc.engine_run_backward
    return engine(outputs, grad_outputs, retain_graph, create_graph, inputs, True, accumulate_grad=False)


def dummy(t: Tensor) -> Tensor:
    """A zero leaf shaped like ``t`` (dense, also for a sparse gradient), to differentiate against."""
    return (
        torch.zeros_like(t, requires_grad=True)
        if not t.is_sparse
        else torch.zeros(t.shape, dtype=t.dtype, device=t.device, requires_grad=True)
    )


class KeptGraph:
    """Whether a linearization's graph is still there: a product with ``last=True``
    frees it during its pass, and any later product raises."""

    def __init__(self) -> None:
        self.spent = False

    def use(self, last: bool) -> None:
        """Before a pass through the graph; ``last``: the pass frees it."""
        if self.spent:
            raise RuntimeError("this linearization's graph was freed by a product with last=True: linearize again")
        self.spent = last
