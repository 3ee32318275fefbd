"""Debug mode: vectors used past their validity fail loudly.

``oracle.xi()`` returns a *borrowed* vector (the game's gradient buffer, valid
until the next ``oracle.xi()``); the vectors a step took (``oracle.empty()``) that
its committed state does not hold are *let go* after the step. Misusing either reads values that
belong to something else, silently. In debug mode ``oracle.xi()`` returns a copy
that is filled with NaN at the next evaluation (its other players' parts too when
``players=`` asked for some), and vectors let go are filled with NaN: misuse then
shows as a non-finite step. Every step also refuses an algorithm state that holds a
borrowed vector, in either mode.

Off by default (it costs a copy per evaluation); on with ``GAMEOPT_DEBUG=1``,
``gameopt.debug.set_enabled(True)`` or ``with gameopt.debug.enabled_in():``. The
tests run with it on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

_on = os.environ.get("GAMEOPT_DEBUG", "") not in ("", "0")


def enabled() -> bool:
    """Whether debug mode is on."""
    return _on


def set_enabled(on: bool) -> None:
    """Turn debug mode on or off."""
    global _on
    _on = bool(on)


@contextlib.contextmanager
def enabled_in(on: bool = True) -> Iterator[None]:
    """Debug mode on (or off) within the block."""
    before = _on
    set_enabled(on)
    try:
        yield
    finally:
        set_enabled(before)


def poison_(tensors: Iterable[Tensor]) -> None:
    """Fill floating-point tensors with NaN (others are left as they are)."""
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point() or t.is_complex():
                t.fill_(float("nan"))
