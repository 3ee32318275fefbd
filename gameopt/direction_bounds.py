"""Bounds on an update rule's direction known without reading it.

A step's check reads the direction (for the bound on the new point, ``|w + δ| <=
max|w| + max|δ|``) and the new state. Where the new state bounds the direction, the
direction need not be read: one pass over memory fewer
(:meth:`~gameopt.UpdateRule.direction_bounds`).

* RMSProp: where ``v₀ >= 0``, ``v₁ >= (1 − ρ) d²`` element by element, so ``|d| / (√v₁ + ε)
  <= 1 / √(1 − ρ)``, and a finite ``v₁`` makes ``d`` finite. That ``v₀ >= 0`` is kept
  beside each state the rule leaves (:func:`keep`), and read once of a state from
  elsewhere (a loaded checkpoint, or one written in place).
* Adam: the ratio ``r = max|m| / (√v + ε)`` of a state follows a recursion,
  ``r₁ <= β₁/√β₂ · r₀ + (1 − β₁)/√(1 − β₂)`` (``√v₁ >= √β₂ √v₀`` and ``√v₁ >= √(1 − β₂) |d|``),
  so ``max|out| <= c · r₁``. Each state's ratio is kept beside it, and read once of a
  state from elsewhere.

The bounds hold in floating point: each carries a margin for the roundings of the
rule's own kernels, in float32 and float64 (and their complex types) only, and only
where ε is large enough that values below the smallest normal number (an underflow,
or a flush to zero) cannot matter; elsewhere none is known and the direction is read.
Below :data:`WORTH_FROM` elements none is sought: the bookkeeping would cost more
than the pass it saves.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import _torch_compat as tc
from .vec import Vec

#: elements per chunk when a state's ratio is read (temporaries of this size only)
_CHUNK = 1 << 16


def precision(t: Tensor) -> tuple[float, float, float] | None:
    """``(u, tiny, big)``: the unit roundoff, the smallest normal and the largest
    value of ``t``'s (real) dtype; ``None`` below float32's precision (float16,
    bfloat16) or for a dtype that is not floating point."""
    return _precision(t.dtype)


@functools.cache
def _precision(dtype: torch.dtype) -> tuple[float, float, float] | None:
    if not (dtype.is_floating_point or dtype.is_complex):
        return None
    info = torch.finfo(dtype)
    return None if info.eps > 2.0**-23 else (info.eps / 2, info.tiny, info.max)


def rmsprop_bound(t: Tensor, decay: float, eps: float, eps_inside: bool) -> float | None:
    """A bound on ``max|out|`` of RMSProp's direction ``d / (√v₁ + ε)`` (``eps_inside``:
    ``d / √(v₁ + ε)``) wherever ``v₁`` is finite, or ``None``: ``1 / √(1 − ρ)`` with the
    roundings of ``v₁``, the root and the division (``v₁ >= (1 − ρ) d² (1 − 5u) − tiny``
    in floating point, and ε, at least ``√tiny / u`` (``tiny`` inside the root), takes
    the ``tiny``)."""
    p = precision(t)
    if p is None:
        return None
    u, tiny, _ = p
    if eps < (tiny if eps_inside else math.sqrt(tiny) / u):
        return None
    return (1 + 16 * u) / math.sqrt(1 - decay)


#: elements of a joint vector from which a bound is worth its bookkeeping (a few
#: microseconds a step): below, reading the direction costs less
WORTH_FROM = 1 << 16


def worth(vec: Sequence[Tensor]) -> bool:
    """Whether ``vec`` is large enough for its direction's bound to save time."""
    return sum(t.numel() for t in vec) >= WORTH_FROM


#: where a state keeps what is known of it: an attribute of its first joint vector (a
#: Vec), so that it goes with the state
_KEY = "_direction_bounds"


def keep(state: Sequence[Sequence[Tensor]], key: Any, known: Any) -> None:
    """Keep ``known`` (what a rule knows of its state, for the settings ``key``: Adam's
    ratios for its ε) beside the state's joint vectors ``state`` as they are now, on the
    first, a :class:`~gameopt.Vec` (a state of plain lists, one set by hand, keeps
    none)."""
    if isinstance(state[0], Vec):
        vars(state[0])[_KEY] = (tuple(state[1:]), key, [_marks(vec) for vec in state], known)


def kept(state: Sequence[Sequence[Tensor]], key: Any) -> Any:
    """What :func:`keep` kept beside ``state`` for ``key``, while the state is as it was
    left: the same joint vectors holding the same tensors (kept by reference, so that no
    other can take a kept one's place), each at the same version counter (a write the
    game did not make moves it; one through ``.data`` or numpy does not, and is not
    seen); else ``None``."""
    entry = vars(state[0]).get(_KEY) if isinstance(state[0], Vec) else None
    if entry is None or entry[1] != key or len(entry[0]) != len(state) - 1:
        return None
    if any(a is not b for a, b in zip(entry[0], state[1:])):
        return None
    return entry[3] if all(map(_same, entry[2], map(_marks, state))) else None


def _marks(vec: Sequence[Tensor]) -> list[tuple[Tensor, int]]:
    return [(t, tc.version(t)) for t in vec]


def _same(a: list[tuple[Tensor, int]], b: list[tuple[Tensor, int]]) -> bool:
    """The same tensors, each at the same version."""
    return len(a) == len(b) and all(s is t and i == j for (s, i), (t, j) in zip(a, b))


def nonnegative(vec: Sequence[Tensor]) -> bool:
    """Whether every element of ``vec`` (both parts of a complex one) is at least 0, and
    none is NaN: read (one pass, one host sync)."""
    with torch.no_grad():
        lows = [(torch.view_as_real(t) if t.is_complex() else t).min() for t in vec if t.numel()]
        return not lows or min(torch.stack(lows).tolist()) >= 0  # (NaN: not >= 0)


def read_ratios(m: Sequence[Tensor], v: Sequence[Tensor], eps: float) -> list[float]:
    """Each group's ``max|m| / (√v + ε)``, read (one pass over ``m`` and ``v``, in chunks,
    one host sync), with the margin of its roundings and ``tiny`` for a quotient below
    the smallest normal number (flushed to zero); ``inf`` for a group whose dtype
    :func:`precision` refuses."""
    parts: list[Tensor] = []
    which: list[int] = []
    out = [math.inf] * len(m)
    with torch.no_grad():
        for g, (mg, vg) in enumerate(zip(m, v)):
            if precision(mg) is None or not mg.numel():
                out[g] = math.inf if mg.numel() else 0.0
                continue
            if mg.is_complex():
                mg, vg = torch.view_as_real(mg), torch.view_as_real(vg)
            mg, vg = mg.reshape(-1), vg.reshape(-1)
            chunks = []
            for s in range(0, mg.numel(), _CHUNK):
                den = torch.sqrt(vg[s : s + _CHUNK]).add_(eps)
                chunks.append(torch.div(mg[s : s + _CHUNK].abs(), den, out=den).amax())
            parts.append(torch.stack(chunks).amax().double())
            which.append(g)
    if parts:
        for g, r in zip(which, torch.stack(parts).tolist()):
            u, tiny, _ = precision(m[g])  # type: ignore[misc]
            out[g] = r * (1 + 8 * u) + tiny if r < math.inf else math.inf  # (NaN: not < inf)
    return out


def as_scalar(value: float, t: Tensor) -> float | None:
    """``value`` as the kernels of ``t``'s dtype take a Python number (in float32 for
    float32 and complex64 tensors, exactly in float64), or ``None`` if it is not zero and
    falls below the smallest normal number there (flushed to zero, or few bits)."""
    p = precision(t)
    if p is None:
        return None
    if p[0] > 2.0**-30:  # float32: rounded to nearest
        value = struct.unpack("f", struct.pack("f", value))[0]
    return value if value == 0.0 or abs(value) >= p[1] else None


def adam_ratios(
    m: Sequence[Tensor], r0: Sequence[float], betas: tuple[float, float], eps: float, c: float
) -> list[float]:
    """The ratios of the state after one Adam step from a state of ratios ``r0``, per
    group (``inf`` where none is known); ``c``: the step's bias correction
    √(1 − β₂ᵗ)/(1 − β₁ᵗ).

    The betas are taken as the kernels see them (:func:`as_scalar`): ``lerp``'s weight
    w = 1 − β₁ and ``mul``'s and ``addcmul``'s β₂ and 1 − β₂, each rounded to the
    dtype; none is known where β₂ or 1 − β₂ falls below the smallest normal number.
    In floating point, per element (``u``: the unit roundoff): ``|m₁| <= (1 + 6u)((1 −
    w)|m₀| + w|d|)`` (``lerp``), ``√v₁ >= (1 − 3u)√(β₂ v₀ + (1 − β₂) d²) − √tiny`` with ε
    (at least ``√tiny / u``) taking the ``√tiny``; the margin below covers them with
    room. Where ``v₁ <= big`` (finite), ``|d| <= √(2 big / (1 − β₂))`` and ``|m₀| <= r₀ (√big
    + ε)``: while ``c`` times their sum stays below ``big / 4``, no intermediate of
    ``lerp`` overflows, so ``m₁`` is finite (``addcdiv``: :func:`adam_bounds`)."""
    r1: list[float] = []
    for t, r in zip(m, r0):
        p = precision(t)
        w, b2, w2 = (as_scalar(x, t) for x in (1 - betas[0], betas[1], 1 - betas[1]))
        if p is None or w is None or not b2 or not w2 or not r < math.inf or eps < math.sqrt(p[1]) / p[0]:
            r1.append(math.inf)
            continue
        u, _, big = p
        largest = max(c, 1.0) * (r * (math.sqrt(big) + eps) + math.sqrt(2 / w2) * math.sqrt(big))
        ratio = (1 + 32 * u) * ((1 - w) / math.sqrt(b2) * r + w / math.sqrt(w2)) + u
        r1.append(ratio if largest <= big / 4 else math.inf)
    return r1


def adam_bounds(m: Sequence[Tensor], r1: Sequence[float], eps: float, c: float) -> list[float | None]:
    """Bounds on ``max|out|`` of Adam's direction ``c · m₁ / (√v₁ + ε)`` from its state's
    ratios ``r1`` (two roundings: ``addcdiv``, which forms ``c · m₁`` first: it does not
    overflow while ``c · r₁ (√big + ε)``, a bound on it where ``v₁`` is finite, stays
    below ``big / 4``), ``None`` where none is known."""
    out: list[float | None] = []
    for t, r in zip(m, r1):
        p = precision(t)
        if p is None or not r < math.inf or not c * r * (math.sqrt(p[2]) + eps) <= p[2] / 4:
            out.append(None)
        else:
            out.append(c * (1 + 8 * p[0]) * r)
    return out
