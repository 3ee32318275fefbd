"""Small games with closed-form vector fields, and closed-form reference updates.

Each game has players that are tiny modules holding one parameter vector, losses
written with torch ops, and ``xi_ref(ws)``: the vector field written by hand
(no autograd), so algorithms can be checked iterate for iterate.
"""

from __future__ import annotations

import io
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from models import VecModule
from torch import Tensor

import gameopt


@dataclass
class TestGame:
    name: str
    init: list[Tensor]
    losses_fn: Callable[[list[Tensor]], list[Tensor]]
    xi_ref: Callable[[list[Tensor]], list[Tensor]]
    jac_ref: Callable[[list[Tensor]], Tensor] | None = None
    grads_ref: Callable[[list[Tensor]], list[list[Tensor]]] | None = None  # [i][j] = ∇_{w_j} f_i
    modules: list[VecModule] = field(default_factory=list)

    def build(
        self,
        algorithm: gameopt.Algorithm,
        dtype: torch.dtype = torch.float64,
        raw: bool = False,
        device: str | torch.device = "cpu",
    ) -> gameopt.Game:
        self.modules = [VecModule(w.to(device, dtype)) for w in self.init]
        players = [gameopt.Player([m.w] if raw else m, name=f"p{i}") for i, m in enumerate(self.modules)]
        return gameopt.Game(players, lambda: self.losses_fn([m.w for m in self.modules]), algorithm=algorithm)

    def params(self) -> list[Tensor]:
        return [m.w.detach().clone() for m in self.modules]


def assert_same_state(a, b) -> None:
    """``a`` and ``b`` (nested dicts, lists, tuples, tensors, numbers) are equal: the
    same structure, tensors of the same dtype with the same values."""
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_state(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    else:
        assert a == b


@dataclass
class Resumed:
    straight: list[Tensor]  # the parameters after all steps in one run
    straight_game: gameopt.Game
    checkpoint: dict  # the state after ``cut`` steps, through torch.save/load
    game: gameopt.Game  # a fresh game loaded from it, stepped to the end


def straight_and_resumed(tg: TestGame, make: Callable[[], gameopt.Algorithm], steps: int, cut: int, **build) -> Resumed:
    """``steps`` steps in one run; then ``cut`` steps, a checkpoint written and read
    back (``weights_only``), and the remaining steps on a fresh game (fresh modules at
    the initial point) that loads it. ``tg.params()`` is then the resumed run's."""
    straight_game = tg.build(make(), **build)
    for _ in range(steps):
        straight_game.step()
    straight = tg.params()
    game = tg.build(make(), **build)
    for _ in range(cut):
        game.step()
    checkpoint = saved_and_loaded(game.state_dict())
    resumed = tg.build(make(), **build)
    resumed.load_state_dict(checkpoint)
    for _ in range(steps - cut):
        resumed.step()
    return Resumed(straight, straight_game, checkpoint, resumed)


def saved_and_loaded(obj):
    """``obj`` written with ``torch.save`` and read back with ``torch.load(weights_only=True)``,
    as a checkpoint is."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def bilinear(n: int = 3, seed: int = 0) -> TestGame:
    """min_x max_y xᵀAy: f1 = xᵀAy, f2 = −xᵀAy; ξ = (Ay, −Aᵀx)."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    init = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]

    def losses(ws):
        f = ws[0] @ A.to(ws[0]) @ ws[1]
        return [f, -f]

    def xi(ws):
        return [A.to(ws[1]) @ ws[1], -A.to(ws[0]).T @ ws[0]]

    def jac(ws):
        z = torch.zeros(n, n, dtype=torch.float64)
        return torch.cat([torch.cat([z, A], 1), torch.cat([-A.T, z], 1)])

    def grads(ws):
        x, y = ws
        return [[A @ y, A.T @ x], [-(A @ y), -(A.T @ x)]]

    return TestGame("bilinear", init, losses, xi, jac, grads)


def quadratic(n_players: int = 3, dim: int = 2, seed: int = 1) -> TestGame:
    """General-sum quadratic: f_i = ½ w_iᵀ S_i w_i + Σ_{j≠i} w_iᵀ B_ij w_j + c_iᵀ w_i,
    so ξ = M w + c with M_ii = S_i, M_ij = B_ij."""
    g = torch.Generator().manual_seed(seed)
    S = []
    for _ in range(n_players):
        R = torch.randn(dim, dim, generator=g, dtype=torch.float64)
        S.append(R @ R.T + torch.eye(dim, dtype=torch.float64))
    B = {
        (i, j): torch.randn(dim, dim, generator=g, dtype=torch.float64)
        for i in range(n_players)
        for j in range(n_players)
        if i != j
    }
    c = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(n_players)]
    init = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(n_players)]

    def losses(ws):
        out = []
        for i in range(n_players):
            d = ws[i]  # dtype and device
            f = 0.5 * ws[i] @ S[i].to(d) @ ws[i] + c[i].to(d) @ ws[i]
            for j in range(n_players):
                if j != i:
                    f = f + ws[i] @ B[i, j].to(d) @ ws[j].to(d)
            out.append(f)
        return out

    def xi(ws):
        out = []
        for i in range(n_players):
            d = ws[i]  # dtype and device
            v = S[i].to(d) @ ws[i] + c[i].to(d)
            for j in range(n_players):
                if j != i:
                    v = v + B[i, j].to(d) @ ws[j]
            out.append(v)
        return out

    def jac(ws):
        rows = []
        for i in range(n_players):
            rows.append(torch.cat([S[i] if i == j else B[i, j] for j in range(n_players)], 1))
        return torch.cat(rows)

    def grads(ws):
        out = []
        for i in range(n_players):
            row = []
            for j in range(n_players):
                row.append(xi(ws)[i] if i == j else B[i, j].T @ ws[i])
            out.append(row)
        return out

    return TestGame("quadratic", init, losses, xi, jac, grads)


def nonquadratic(seed: int = 2) -> TestGame:
    """A 3-player general-sum game whose Jacobian changes with w:
    f_i = ½‖w_i‖² (1 + ‖w_{i+1}‖²) + a_i · tanh(w_i) · w_{i+2}   (indices mod 3),
    ξ_i = w_i (1 + ‖w_{i+1}‖²) + a_i ⊙ (1 − tanh²(w_i)) ⊙ w_{i+2}."""
    g = torch.Generator().manual_seed(seed)
    dim = 2
    a = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(3)]
    init = [torch.randn(dim, generator=g, dtype=torch.float64) for _ in range(3)]

    def losses(ws):
        out = []
        for i in range(3):
            w, u, v = ws[i], ws[(i + 1) % 3], ws[(i + 2) % 3]
            out.append(0.5 * (w @ w) * (1 + u @ u) + (a[i].to(w) * torch.tanh(w)) @ v)
        return out

    def xi(ws):
        out = []
        for i in range(3):
            w, u, v = ws[i], ws[(i + 1) % 3], ws[(i + 2) % 3]
            out.append(w * (1 + u @ u) + a[i].to(w) * (1 - torch.tanh(w) ** 2) * v)
        return out

    def jac(ws):
        flat = torch.cat(ws).detach().requires_grad_()
        sizes = [w.numel() for w in ws]
        return torch.autograd.functional.jacobian(lambda f: torch.cat(xi(list(torch.split(f, sizes)))), flat)

    def grads(ws):
        out = []
        for i in range(3):
            row = [None, None, None]
            row[i] = xi(ws)[i]
            row[(i + 1) % 3] = (ws[i] @ ws[i]) * ws[(i + 1) % 3]
            row[(i + 2) % 3] = a[i] * torch.tanh(ws[i])
            out.append(row)
        return out

    return TestGame("nonquadratic", init, losses, xi, jac, grads)


GAMES = {"bilinear": bilinear, "quadratic": quadratic, "nonquadratic": nonquadratic}


# ---------------------------------------------------------------- references
def _axpy(ws, ds, scales):
    return [w - s * d for w, d, s in zip(ws, ds, scales)]


class RefRule:
    """Closed-form per-element update rules: plain, momentum, Adam."""

    def __init__(self, kind: str = "plain", **kw) -> None:
        self.kind, self.kw = kind, kw
        self.state: dict = {}

    def __call__(self, ds: list[Tensor]) -> list[Tensor]:
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


def ref_trajectory(
    game: TestGame, algo: str, lrs: list[float], steps: int, rule: RefRule | None = None, **kw
) -> list[list[Tensor]]:
    """Iterates of the closed-form update."""
    xi = game.xi_ref
    rule = rule or RefRule()
    ws = [w.clone() for w in game.init]
    out, prev = [], None
    slow = [w.clone() for w in ws]
    for t in range(steps):
        if algo == "simgd":
            ws = _axpy(ws, rule(xi(ws)), lrs)
        elif algo == "altgd":
            # players move in turn; the elementwise rule sees one shared step count
            before, merged, new = dict(rule.state), None, list(ws)
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
            rule.state = merged
            ws = new
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
            raise ValueError(algo)
        out.append([w.clone() for w in ws])
    return out


WAIT = 10.0  # seconds: only reached if something is broken (the events are set at once)


def during_second_evaluation(inside: threading.Event, asked: threading.Event) -> Callable[[], None]:
    """A ``pause`` for the losses of a threaded test: at the second evaluation (Extra-Adam's
    extrapolated point), let the other thread call in, then wait a moment."""
    calls = [0]

    def pause() -> None:
        calls[0] += 1
        if calls[0] == 2:
            inside.set()
            assert asked.wait(WAIT)
            time.sleep(0.05)  # the other thread's call would run here, were it not made to wait

    return pause
