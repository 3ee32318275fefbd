"""A step's launches and memory traffic, counted exactly (no timing).

Every ATen op that a call runs, backward included, passes through a
``TorchDispatchMode``. Views (``func.is_view``, and ops that only change a tensor's
metadata), allocations (``empty_like``: memory handed out, no element read or
written) and the profiler's own records cost nothing and are not counted. Each
other op counts as one launch, and adds the elements it reads and writes in tensors
of at least ``big`` elements, as its schema declares them: each input it reads once
(``dot(x, x)`` reads ``x`` once), each tensor it writes once more. An argument the
op mutates is read and written (``w.add_(d)``: 3 passes, as ``torch.add(w, d,
out=v)``), except an ``out=`` argument and the first argument of the ops that only
write it (``copy_``, ``fill_``, ``zero_``, random fills); ``zeros_like(x)`` does not
read ``x``. With ``big`` a player's size, that is the step's memory traffic in units
of N. Copies and host syncs are counted apart (a host sync: ``item``, or a ``tolist``,
which a ``TorchFunctionMode`` sees).

The counts do not depend on the CPU's vector unit or on the machine's load, so a
test may assert them (``tests/game/test_step_traffic.py``), and
``benchmarks/traffic.py`` prints them beside the bare loop's::

    from gameopt.testing.traffic import count

    c = count(game.step, big=n)
    c.touched / n, c.ops, c.copies, c.syncs
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode

from .. import _torch_compat as tc

#: ops that wait for the device (a value read on the host)
SYNCS = frozenset({"item", "_local_scalar_dense", "is_nonzero", "equal"})
#: ops that copy a tensor (``cat``: a flat backup)
COPIES = frozenset({"copy_", "clone", "_to_copy", "copy", "_foreach_copy_", "cat"})
#: ops that only hand out memory: no kernel, no element read or written
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
#: in-place ops that write their first argument without reading it (and random fills:
#: in-place ops tagged ``nondeterministic_seeded``)
WRITE_ONLY = frozenset({"copy_", "_foreach_copy_", "fill_", "_foreach_fill_", "zero_", "_foreach_zero_"})
#: ops that change a tensor's metadata only (besides the views and those tagged ``inplace_view``)
METADATA = frozenset({"_unsafe_view", "set_", "resize_"})
#: arguments that an op's schema declares mutated but its kernels write only when
#: another argument is given: ``torch.optim``'s fused SGD writes the gradients back
#: only when it unscales them (``grad_scale``), as its CUDA kernel and CPU kernel do
WRITTEN_ONLY_WITH = {("_fused_sgd_", "grads"): "grad_scale"}


@dataclass
class Count:
    """What one call ran: launches (non-view ops), copies, host syncs, the elements read
    and written in tensors of at least ``big`` elements, and the launches by op name."""

    big: int
    ops: int = 0
    copies: int = 0
    syncs: int = 0
    touched: int = 0
    names: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, reads: list[Tensor], writes: list[Tensor]) -> None:
        """One launch of ``name``, which reads ``reads`` and writes ``writes``."""
        self.ops += 1
        self.names[name] = self.names.get(name, 0) + 1
        self.copies += name in COPIES
        self.syncs += name in SYNCS
        self.touched += sum(t.numel() for t in reads + writes if t.numel() >= self.big)


class HostReads(TorchFunctionMode):
    """Adds to ``count`` a host sync for every ``Tensor.tolist`` run inside it: a read of
    a tensor's values into Python that no ATen op shows on the CPU (``item`` is seen as
    ``_local_scalar_dense``)."""

    def __init__(self, count: Count) -> None:
        super().__init__()
        self.count = count

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is Tensor.tolist:
            self.count.syncs += 1
            self.count.names["tolist"] = self.count.names.get("tolist", 0) + 1
        return func(*args, **(kwargs or {}))


class Counting(tc.TorchDispatchMode):
    """Adds every non-view op run inside it to ``count``."""

    def __init__(self, count: Count) -> None:
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not _free(func, name):
            reads, writes = _reads_and_writes(func, name, args, kwargs, out)
            self.count.add(name, reads, writes)
        return out


def _free(func: Any, name: str) -> bool:
    """Whether ``func`` costs no launch: a view, an allocation, a change of metadata, or
    the profiler's own record."""
    tags = getattr(func, "tags", ())
    return (
        func.is_view
        or name in ALLOCATIONS
        or name in METADATA
        or func.namespace == "profiler"
        or tc.INPLACE_VIEW_TAG in tags
    )


def _reads_and_writes(
    func: Any, name: str, args: Any, kwargs: dict[str, Any], out: Any
) -> tuple[list[Tensor], list[Tensor]]:
    """The distinct tensors ``func`` read and wrote, from its schema: a mutated argument
    is read and written (an ``out=`` argument, or the first argument of a write-only
    op, written only), a template (``zeros_like(x)``) not read, and every returned
    tensor that is no argument written."""
    write_only = name in WRITE_ONLY or tc.SEEDED_TAG in getattr(func, "tags", ())
    template = name.endswith("_like") or name.startswith("new_")
    reads: list[Tensor] = []
    writes: list[Tensor] = []
    for k, arg in enumerate(tc.op_arguments(func)):
        if k < len(args):
            value = args[k]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            continue
        tensors = _tensors(value)
        if not tensors:
            continue
        condition = WRITTEN_ONLY_WITH.get((name, arg.name))
        if condition is not None and _given(func, condition, args, kwargs) is None:
            reads += tensors  # declared mutated, written only with ``condition``
        elif arg.alias_info is not None and arg.alias_info.is_write:
            writes += tensors
            if not arg.kwarg_only and not (write_only and k == 0):  # mutated in place: read first
                reads += tensors
        elif not (template and k == 0):
            reads += tensors
    seen = {id(t) for t in reads + writes}
    writes += [t for t in _tensors(out) if id(t) not in seen]
    return _distinct(reads), _distinct(writes)


def _given(func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> Any:
    """The value ``func`` was given for its argument ``name`` (``None`` if none)."""
    for k, arg in enumerate(tc.op_arguments(func)):
        if arg.name == name:
            return args[k] if k < len(args) else kwargs.get(name)
    return None


def _tensors(tree: Any) -> list[Tensor]:
    """The tensors in nested tuples, lists and dicts (an op's arguments or results)."""
    if isinstance(tree, Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    return []


def _distinct(tensors: list[Tensor]) -> list[Tensor]:
    """Each tensor once (an op that takes one tensor twice reads it once)."""
    return list({id(t): t for t in tensors}.values())


def count(call: Callable[[], object], big: int, warmup: int = 2) -> Count:
    """The counts of one ``call()``, after ``warmup`` calls (lazy state made: a rule's
    moments, the copies a game keeps between steps)."""
    for _ in range(warmup):
        call()
    c = Count(big)
    with Counting(c), HostReads(c):
        call()
    return c
