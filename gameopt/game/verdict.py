"""A step's verdict kept on the device: ``Game(verdict="device")``.

With the host verdict (the default) a step reads, in one host sync, whether its
update, its new state and the points it evaluated at are finite and whether its new
point fits its dtype, and raises :class:`~gameopt.NonFiniteError` before it writes
anything. With the device verdict nothing is read: each check is a 0-d tensor on
the device (:class:`Checks`), the step's verdict their ``any`` (a float ``found_inf``,
as ``torch.optim``'s fused optimizers take it), and the parameters move with
``torch._fused_sgd_``, which skips the move on the device when the verdict refuses
it (``gameopt._torch_compat.fused_add_unless_``). The step commits its new
algorithm state on the host, keeping the state and the module buffers it started
from and its losses (:class:`Pending`) until its verdict is read: by the end of the
next step (whose own move the verdict refuses too: a refusal is sticky until it is
read), by :meth:`~gameopt.Game.synchronize`, or first thing by any call that reads or
replaces the game's state. A refused step is then undone (the state and buffers it
started from put back, into the tensors that hold the buffers' names then; its point
never moved) and :class:`~gameopt.NonFiniteError` raised, or kept for the next step,
``synchronize``, a load or a new algorithm to raise.

On a CUDA device the verdict is copied to pinned host memory as soon as it is
formed (``non_blocking``) with an event recorded after it, so that reading it at the
end of the next step waits for that step's predecessor only, not for the kernels
the next step has queued since.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: a check's message, formed when a refused verdict is read (it may read the step's losses)
Why = Callable[[], str]


class Checks:
    """The checks of one step under the device verdict, each a 0-d float64 tensor on
    the step's device that must be at most its limit (NaN never is), with its message:
    finiteness as ``max|t| <= DBL_MAX``, a new point as ``max|w| + max|δ| <= dtype's
    max``. :meth:`verdict` compares them all at once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.values: list[Tensor] = []
        self.limits: list[float] = []
        self.whys: list[Why] = []

    def finite(self, tensors: Sequence[Tensor], why: Why) -> list[Tensor]:
        """Check that ``tensors`` are finite; returns each one's ``max|t|`` (a 0-d
        float64 tensor, NaN or inf where the check refuses), one read of each."""
        norms = [max_abs_on_device(t) for t in tensors]
        for n in norms:
            self.at_most(n, _FINITE, why)
        return norms

    def at_most(self, value: Tensor, limit: float, why: Why) -> None:
        """Refuse the step unless ``value <= limit`` (``value``: a 0-d float64 tensor)."""
        self.values.append(value)
        self.limits.append(limit)
        self.whys.append(why)

    def verdict(self, before: Tensor | None) -> tuple[Tensor, Tensor]:
        """The step's verdict as ``found_inf`` (a 0-d float32 tensor: 1 refuses the
        step, 0 takes it), refused also where ``before`` (the ``found_inf`` of an
        earlier step not yet read) refused; and which checks passed (a bool vector)."""
        passed = torch.stack(self.values) <= _limits(self.device, tuple(self.limits))  # (one per group at least)
        zero, one = _constants(self.device)
        return torch.where(passed.all(), zero if before is None else before, one), passed


#: the largest float64: a float64 value at most this is finite
_FINITE = torch.finfo(torch.float64).max
_LIMITS: dict[tuple[torch.device, tuple[float, ...]], Tensor] = {}


def _limits(device: torch.device, limits: tuple[float, ...]) -> Tensor:
    """``limits`` as a float64 tensor on ``device``, made once (no copy to the device per step)."""
    key = (device, limits)
    made = _LIMITS.get(key)
    if made is None:
        made = torch.tensor(limits, dtype=torch.float64, device=device)
        if len(_LIMITS) < 256:  # (a few tuples in practice; never cleared: no race between threads)
            _LIMITS[key] = made
    return made


_CONSTANTS: dict[torch.device, tuple[Tensor, Tensor]] = {}


def _constants(device: torch.device) -> tuple[Tensor, Tensor]:
    """0 and 1 as 0-d float32 tensors on ``device``, made once (read only)."""
    if device not in _CONSTANTS:
        f32 = torch.float32  # what the fused kernels read ``found_inf`` as, whatever the default dtype
        _CONSTANTS[device] = (torch.zeros((), dtype=f32, device=device), torch.ones((), dtype=f32, device=device))
    return _CONSTANTS[device]


def max_abs_on_device(t: Tensor) -> Tensor:
    """``max|t|`` as a 0-d float64 tensor (0 for an empty tensor), in one read of ``t``;
    NaN propagates, as inf does. On a GPU the infinity norm (one reduction); on the CPU,
    where that norm is not vectorized (about 20x a dot product's time), ``aminmax`` and
    the larger of ``hi`` and ``−lo``."""
    if not t.numel():
        return torch.zeros((), dtype=torch.float64, device=t.device)
    if t.is_cpu:
        lo, hi = torch.aminmax(t)
        return torch.maximum(hi, lo.neg()).to(torch.float64)
    return torch.linalg.vector_norm(t, ord=math.inf).to(torch.float64)


@dataclass
class Pending:
    """A committed step whose device verdict has not been read, with what it started
    from: the algorithm state, the module buffers (with their saved copies) and the
    messages of its checks."""

    found_inf: Tensor
    passed: list[Tensor]  # which checks passed (bool vectors), in the order of ``whys``
    whys: list[Why]
    state: Any
    buffers: list[tuple[Tensor, Tensor]]  # (buffer, its saved copy), as BufferCopies.save gives them
    step: int  # the steps the game had taken when it began
    keys: list[tuple[dict[str, Any], str]]  # each buffer's (registry, name), in the order of ``buffers``
    host: Tensor | None = None  # found_inf, copied to pinned memory (CUDA)
    event: Any = None
    #: the next step's record, kept behind this one when this one's verdict could not be
    #: read (a device error): read in order, later
    later: Pending | None = None

    def __post_init__(self) -> None:
        if self.found_inf.is_cuda:
            stream = torch.cuda.current_stream(self.found_inf.device)  # the stream the copy is queued on
            with torch.cuda.stream(stream):
                self.host = torch.empty((), dtype=self.found_inf.dtype, pin_memory=True)
                self.host.copy_(self.found_inf, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record(stream)

    def buffers_now(self) -> list[tuple[Tensor, Tensor]]:
        """The saved copies with the tensors that hold each buffer's name now (a module
        converted since, ``.double()`` say, holds new ones; a copy of another shape, a
        buffer gone, is left out)."""
        out = []
        for (registry, name), (_, saved) in zip(self.keys, self.buffers):
            now = registry.get(name)
            if now is not None and now.shape == saved.shape:
                out.append((now, saved))
        return out

    def read(self) -> str | None:
        """Wait for the verdict; ``None`` if the step was taken, else why it was refused."""
        if self.host is not None:
            self.event.synchronize()  # the copy, queued behind this step's kernels only
            refused = self.host.item() > 0
        else:
            refused = self.found_inf.item() > 0
        if not refused:
            return None
        flags = [ok for passed in self.passed for ok in passed.tolist()]
        failed = [why for why, ok in zip(self.whys, flags) if not ok]
        return failed[0]() if failed else "the step before it was refused (a refusal is sticky until it is read)"

    def chain(self) -> list[Pending]:
        """This record and the later ones kept behind it (``later``), in step order."""
        out, later = [self], self.later
        while later is not None:
            out.append(later)
            later = later.later
        return out
