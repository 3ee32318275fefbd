"""Checks of user-given numbers: a clear ``ValueError`` naming the argument and its
range, before anything is built or changed."""

from __future__ import annotations

import math
from typing import Any


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> Any:
    """``value`` as a float (an int with ``integer``) if it is a finite number in the
    range, else a ``ValueError`` naming ``name`` and the range. Ints count as numbers,
    bools do not."""
    lo = "(" if low_open or low is None else "["
    hi = ")" if high_open or high is None else "]"
    what = "an integer" if integer else "a finite number"
    if low is not None or high is not None:
        what += f" in {lo}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}{hi}"
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value) if integer else float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a ``ValueError`` naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_per_player(name: str, value: Any, **bounds: Any) -> float | list[float]:
    """One number, or a non-empty list or tuple of numbers (one per player), each
    checked with :func:`check_number`. The length is checked when the game is built."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must be a number or one number per player, got {value!r}")
        return [check_number(f"{name}[{k}]", v, **bounds) for k, v in enumerate(value)]
    return check_number(name, value, **bounds)
