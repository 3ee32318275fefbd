"""The νPI controller, an update rule made for Lagrange multipliers."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import check_number
from ..settings import Setting
from ..updates import Empty, State, UpdateRule, next_count, stepped
from ..vec import Vec


class NuPI(UpdateRule):
    """The νPI controller for Lagrange multipliers, where plain gradient ascent
    oscillates (Sohrabi, Ramirez, Zhang, Lacoste-Julien & Gallego-Posada 2024).

    Given the gradient d at each step:

    .. math::
        \\text{out}_0 = K_I d_0, \\qquad
        \\text{out}_t = K_I d_t + K_P (1 − ν)(d_t − e_{t−1}), \\qquad
        e_0 = 0, \\; e_t = ν e_{t−1} + (1 − ν) d_t,

    then ``w ← w − η out`` (the projection of a constrained player after it, as
    everywhere). This is ``cooper.optim.nuPI(lr, Kp, Ki, ema_nu)`` with its default
    ``init_type=SGD``: the first step is SGD's with rate ηK_I, and the error signal's
    average starts at e₀ = 0 after it, as cooper's code does (its docstring says
    e₀ = d₀; the parity test follows the code). ``NuPI(kp=0, ki=1)`` is plain
    gradient steps. A parameter that joins a running game starts the same way (its
    step count is its own: ``counts``).

    Args:
        kp: K_P ≥ 0, the proportional gain.
        ki: K_I ≥ 0, the integral gain (not both 0).
        ema: ν in (−1, 1), the smoothing of the error signal.

    Raises:
        ValueError: a gain that is negative or not finite, both gains 0, or ν outside (−1, 1).

    References:
        - Sohrabi et al. 2024, `On PI Controllers for Updating Lagrange Multipliers in
          Constrained Optimization <https://arxiv.org/abs/2406.04558>`_
    """

    memory_flags = True
    counts = {"t": "e"}  # its step count, per element once parameters join later
    kp = Setting(lambda rule, name, value: _gain(rule, name, value, other="ki"))
    ki = Setting(lambda rule, name, value: _gain(rule, name, value, other="kp"))
    ema = Setting.number(low=-1.0, high=1.0, low_open=True, high_open=True)

    def __init__(self, kp: float = 0.0, ki: float = 1.0, ema: float = 0.0) -> None:
        self.kp = kp
        self.ki = ki
        self.ema = ema

    def init(self, like: Vec) -> State:
        return {"e": Vec(torch.zeros_like(t) for t in like), "t": 0}

    def apply(
        self, d: Vec, state: State, empty: Empty | None = None, scratch: bool = False, own_state: bool = False
    ) -> tuple[Vec, State]:
        empty = empty or _empty_like(d)
        e = state["e"] if own_state else empty()
        out = empty()
        for g, (x, e0, e1, o) in enumerate(zip(d, state["e"], e, out)):
            torch.mul(x, self.ki, out=o)
            done = stepped(state["t"], g)  # else the first step: SGD's (cooper's SGD initialization)
            if done is False:
                e1.zero_()  # e₀ = 0, as cooper starts it
                continue
            p = torch.sub(x, e0).mul_(1 - self.ema).mul_(self.kp)
            torch.mul(e0, self.ema, out=e1).add_(x, alpha=1 - self.ema)
            if done is not True:  # one count per element: parameters that joined later start fresh
                p.mul_(done)
                e1.mul_(done)
            o.add_(p)
        return out, {"e": e, "t": next_count(state["t"])}


def _gain(rule: NuPI, name: str, value: Any, other: str) -> float:
    """A gain of :class:`NuPI`: a number ≥ 0, not 0 while the ``other`` gain is 0."""
    gain = check_number(name, value, low=0.0)
    if gain == 0 and rule.__dict__.get(other) == 0:
        raise ValueError(
            f"{name} must be > 0 while {other} is 0: NuPI needs kp > 0 or ki > 0 (both are 0: it would not move)"
        )
    return gain


def _empty_like(d: list[Tensor]) -> Empty:
    return lambda: Vec(torch.empty_like(t) for t in d)
