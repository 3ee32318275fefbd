"""Closed-form reference updates: what each algorithm's iterates must be, written
with plain tensor arithmetic on the hand-written ξ of a :class:`ReferenceGame`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .games import Points, ReferenceGame

#: a closed form of your own: ``reference(xi, ws, lrs, memory) -> next ws``, with ``xi(ws)``
#: the game's hand-written vector field and ``memory`` a dict kept from step to step
#: (empty at the first step) for what the update remembers
Reference = Callable[[Callable[[Points], Points], Points, list[float], dict[str, Any]], Points]


class RefRule:
    """Closed-form per-element update rules: ``"plain"``, ``"momentum"``
    (``momentum=``) and ``"adam"`` (``betas=``, ``eps=``), called on the per-player
    directions; the state it keeps is in :attr:`state`."""

    def __init__(self, kind: str = "plain", **kw: Any) -> None:
        self.kind, self.kw = kind, kw
        self.state: dict[str, Any] = {}

    def __call__(self, ds: Points) -> Points:
        if self.kind == "plain":
            return ds
        if self.kind == "momentum":
            mu = self.kw["momentum"]
            buf = self.state.get("buf", [torch.zeros_like(d) for d in ds])
            buf = [mu * b + d for b, d in zip(buf, ds)]
            self.state["buf"] = buf
            return buf
        b1, b2 = self.kw.get("betas", (0.9, 0.999))
        eps = self.kw.get("eps", 1e-8)
        t = self.state.get("t", 0) + 1
        m = [b1 * m + (1 - b1) * d for m, d in zip(self.state.get("m", [torch.zeros_like(d) for d in ds]), ds)]
        v = [b2 * v + (1 - b2) * d * d for v, d in zip(self.state.get("v", [torch.zeros_like(d) for d in ds]), ds)]
        self.state.update(t=t, m=m, v=v)
        return [math.sqrt(1 - b2**t) / (1 - b1**t) * mi / (vi.sqrt() + eps) for mi, vi in zip(m, v)]


def _axpy(ws: Points, ds: Points, scales: list[float]) -> Points:
    return [w - s * d for w, d, s in zip(ws, ds, scales)]


def _altgd(ws: Points, xi: Callable[[Points], Points], rule: RefRule, lrs: list[float]) -> Points:
    """Players move in turn; the elementwise rule sees one shared step count."""
    before: dict[str, Any] = dict(rule.state)
    merged: dict[str, Any] | None = None
    new = list(ws)
    for i in range(len(ws)):
        rule.state = dict(before)
        out_i = rule(xi(new))
        if merged is None:
            merged = {k: list(v) if isinstance(v, list) else v for k, v in rule.state.items()}
        for k, v in rule.state.items():
            if isinstance(v, list):
                merged[k][i] = v[i]
            else:
                merged[k] = v
        new[i] = new[i] - lrs[i] * out_i[i]
    rule.state = merged or {}
    return new


def ref_trajectory(
    game: ReferenceGame, algo: str | Reference, lrs: list[float], steps: int, rule: RefRule | None = None, **kw: Any
) -> list[Points]:
    """The first ``steps`` iterates of a closed-form update from ``game.init``.

    ``algo``: a :data:`Reference` of your own, or one of the built-in ones by name:
    ``"simgd"``, ``"altgd"``, ``"eg"`` (``extrapolation_lrs=``), ``"optimistic"``,
    ``"lookahead"`` (``k=``, ``alpha=``), ``"peg"`` (past extragradient), ``"eag"``
    (anchored extragradient); ``rule`` turns ξ into the direction (plain by default)."""
    xi = game.xi_ref
    rule = rule or RefRule()
    ws = [w.clone() for w in game.init]
    out: list[Points] = []
    prev: Points | None = None
    slow = [w.clone() for w in ws]
    memory: dict[str, Any] = {}
    for t in range(steps):
        if callable(algo):
            ws = algo(xi, ws, lrs, memory)
        elif algo == "simgd":
            ws = _axpy(ws, rule(xi(ws)), lrs)
        elif algo == "altgd":
            ws = _altgd(ws, xi, rule, lrs)
        elif algo == "eg":
            eta_x = kw.get("extrapolation_lrs", lrs)
            mid = _axpy(ws, rule(xi(ws)), eta_x)
            ws = _axpy(ws, rule(xi(mid)), lrs)
        elif algo == "optimistic":
            d = rule(xi(ws))
            p = d if prev is None else prev
            ws = [w - lr * (2 * di - pi) for w, di, pi, lr in zip(ws, d, p, lrs)]
            prev = d
        elif algo == "lookahead":
            ws = _axpy(ws, rule(xi(ws)), lrs)
            if (t + 1) % kw["k"] == 0:
                slow = [s + kw["alpha"] * (w - s) for s, w in zip(slow, ws)]
                ws = [s.clone() for s in slow]
        elif algo == "peg":  # w' = w − η u_{t−1}, u_t = u(ξ(w')), w ← w − η u_t, u_{−1} = 0
            prev = prev or [torch.zeros_like(w) for w in ws]
            prev = rule(xi(_axpy(ws, prev, lrs)))
            ws = _axpy(ws, prev, lrs)
        elif algo == "eag":  # EAG-C: anchored at the start, β_t = 1/(t+2)
            anchored = [w + (z0 - w) / (t + 2) for w, z0 in zip(ws, game.init)]
            ws = _axpy(anchored, xi(_axpy(anchored, xi(ws), lrs)), lrs)
        else:
            raise ValueError(f"no built-in reference update named {algo!r}")
        out.append([w.clone() for w in ws])
    return out
