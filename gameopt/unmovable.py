"""Why gameopt cannot move a parameter into new storage, in words.

gameopt moves a parameter with :func:`torch.utils.swap_tensors` (see
:mod:`gameopt.buffer`), which refuses a tensor that anything else references at the
C++ level (its use count is above one) or that has a weak reference. An autograd
graph is one such holder (its ``AccumulateGrad`` node); a view of the parameter
(its ``._base``), a ``DistributedDataParallel`` wrapper (its reducer) and a weak
reference are others. :func:`why_unmovable` names the one that holds a parameter,
so that the refusal says what to drop.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from . import _torch_compat as tc

if TYPE_CHECKING:
    from torch.autograd.graph import Node

_DDP_HINT = (
    "give the game the unwrapped module (ddp.module, dropping the wrapper) and the process group: "
    "gameopt.Game([...], process_group=group) averages every vector field across ranks itself "
    "(docs/data-parallel.md)"
)


def ddp_refusal(name: str, modules: Sequence[nn.Module]) -> str | None:
    """The refusal of a player whose module is (or holds) a ``DistributedDataParallel``
    wrapper, or ``None``."""
    ddp = torch.nn.parallel.DistributedDataParallel
    if not any(isinstance(m, ddp) for m in modules):
        return None
    return (
        f"player {name!r}: its module is (or contains) a torch DistributedDataParallel wrapper, which keeps its own "
        f"references to the parameters and averages gradients in its own backward hooks: {_DDP_HINT}"
    )


def why_unmovable(params: Sequence[Tensor], modules: Sequence[nn.Module]) -> str | None:
    """Why :func:`torch.utils.swap_tensors` would refuse one of ``params`` (the
    parameters of ``modules``), naming the parameter and what holds it, or ``None``.
    Weak references from recurrent layers (which gameopt clears first) do not count."""
    in_rnn = {id(q) for m in modules if isinstance(m, nn.RNNBase) for q in m.parameters(recurse=False)}
    for k, p in enumerate(params):
        if tc.use_count(p) > 1:
            return _held(p, _name(p, k, modules), modules)
        if id(p) not in in_rnn and weakref.getweakrefs(p):
            return (
                f"gameopt cannot fuse {_name(p, k, modules)}: a weak reference to it is alive (a weakref.ref, a "
                "WeakKeyDictionary, or torch.compile's guards), and torch.utils.swap_tensors refuses to move a weakly "
                "referenced tensor (now, and whenever the game moves it later): drop it"
            )
    return None


def _held(p: Tensor, name: str, modules: Sequence[nn.Module]) -> str:
    """The refusal of ``p``, which something else references (its use count is above one)."""
    view = next((where for where, t in _module_tensors(modules) if tc.view_base(t) is p), None)
    if view is not None:
        return (
            f"gameopt cannot fuse {name}: {view} is a view of it kept outside the module's parameters (made by "
            "slicing, .view() or indexing, also under torch.no_grad()). While the view holds it, "
            "torch.utils.swap_tensors cannot move the parameter into gameopt's flat buffer, and the view would keep "
            "reading the old storage: compute it from the parameter in forward() (or a property) instead of storing it"
        )
    if _wrapped_by_ddp(p):
        return f"gameopt cannot fuse {name}: a torch DistributedDataParallel wrapper still holds it: {_DDP_HINT}"
    if _has_grad_accumulator(p):
        return (
            f"gameopt cannot fuse a parameter while an autograd graph still uses it ({name}): drop the outputs and "
            "losses of earlier forward passes first, or fuse before the forward pass"
        )
    return (
        f"gameopt cannot fuse {name}: something else references it (use count {tc.use_count(p)}), and "
        "torch.utils.swap_tensors refuses to move it: a view of it kept elsewhere (made by slicing, .view() or "
        "indexing, also under torch.no_grad(); its ._base is the parameter), or a wrapper or extension that keeps "
        "the parameters. Drop that reference (compute such a view inside forward())"
    )


def _name(p: Tensor, k: int, modules: Sequence[nn.Module]) -> str:
    for m in modules:
        for attr, q in tc.parameter_registry(m).items():
            if q is p:
                return f"parameter {attr!r} of {type(m).__name__}"
    return f"parameter {k} (shape {tuple(p.shape)})"


def _module_tensors(modules: Sequence[nn.Module]) -> Iterator[tuple[str, Tensor]]:
    """Every tensor a module keeps outside its parameter and submodule registries
    (buffers and plain attributes, also inside a list, tuple or dict), with where."""
    for m in modules:
        owner = type(m).__name__
        for attr, value in vars(m).items():
            if attr == "_buffers":
                yield from ((f"buffer {owner}.{k}", t) for k, t in value.items() if isinstance(t, Tensor))
            elif attr not in ("_parameters", "_modules"):
                yield from ((f"attribute {owner}.{attr}{key}", t) for key, t in _tensors(value))


def _tensors(value: Any) -> Iterator[tuple[str, Tensor]]:
    if isinstance(value, Tensor):
        yield "", value
    elif isinstance(value, (list, tuple)):
        yield from ((f"[{i}]", t) for i, t in enumerate(value) if isinstance(t, Tensor))
    elif isinstance(value, dict):
        yield from ((f"[{k!r}]", t) for k, t in value.items() if isinstance(t, Tensor))


def _wrapped_by_ddp(p: Tensor) -> bool:
    """A live ``DistributedDataParallel`` wraps a module that holds ``p`` (its reducer
    references every parameter). Walks the garbage collector's objects: the error path only."""
    ddp = torch.nn.parallel.DistributedDataParallel
    # type(o), not isinstance: some objects warn when their __class__ is read
    return any(issubclass(type(o), ddp) and any(q is p for q in o.module.parameters()) for o in gc.get_objects())


def _has_grad_accumulator(p: Tensor) -> bool:
    """``p``'s ``AccumulateGrad`` node exists already, so an autograd graph holds ``p``:
    the node holds its parameter, so fetching a node that did not exist yet raises the
    use count by one, and fetching the existing one does not."""
    before = tc.use_count(p)
    with torch.inference_mode(False), torch.enable_grad():
        node = cast("Node", p.sum().grad_fn).next_functions[0][0]  # the sum is gone after this line; the node is kept
    existed = tc.use_count(p) == before
    del node
    return existed
