"""Past and anchored extragradient, Follow-the-Ridge, Stackelberg learning and NashConv
against numpy references of their equations, iterate for iterate in float64; the
generic checks (bit-exact resume, float32) for the two-player methods."""

from __future__ import annotations

import itertools
import re

import games
import numpy as np
import pytest
import torch
from games import GAMES, assert_same_state, bilinear, saved_and_loaded, straight_and_resumed

import gameopt
from gameopt.state import clone_state

# ------------------------------------------------------------ past extragradient


def _w_prime(game: gameopt.Game) -> list[torch.Tensor]:
    """PastExtragradient's next evaluation point w − η u_{t−1} (unconstrained)."""
    algo = game.algorithm
    prev = [t.clone() for t in game.algorithm_state["prev"]]
    scaled = game.layout.scale_(prev, [-lr for lr in algo.lrs])
    return [d + s for d, s in zip(game.layout.data, scaled)]


@pytest.mark.parametrize("rule", [None, lambda: gameopt.Adam((0.5, 0.9))], ids=["plain", "adam"])
@pytest.mark.parametrize("game_name", ["bilinear", "nonquadratic"])
def test_past_extragradient_evaluates_at_optimistic_gradients_iterates(game_name, rule) -> None:
    """Unconstrained, w'_{t+1} = w'_t − 2η u_t + η u_{t−1}: optimistic gradient from
    w'_1 on (with u_{−1} = 0 the first step differs from Optimistic's u_{−1} = u_0)."""
    make_rule = rule or (lambda: None)
    tg = GAMES[game_name]()
    lrs = [0.05 + 0.02 * i for i in range(len(tg.init))]
    peg = tg.build(gameopt.PastExtragradient(lrs, update=make_rule()))
    peg.step()
    after_one = clone_state(peg.algorithm_state)
    points = []
    for _ in range(6):
        points.append(_w_prime(peg))
        peg.step()
    tg2 = GAMES[game_name]()
    tg2.init = [w.clone() for w in torch.split(torch.cat(points[0]), [w.numel() for w in tg.init])]
    opt = tg2.build(gameopt.Optimistic(lrs, update=make_rule()))
    opt.algorithm_state = {"rule": after_one["rule"], "prev": gameopt.Vec(after_one["prev"]), "t": 1}
    for t, expected in enumerate(points[1:]):
        opt.step()
        flat = torch.cat([w.flatten() for w in tg2.params()])
        torch.testing.assert_close(flat, torch.cat(expected), rtol=1e-12, atol=1e-12, msg=f"step {t}")


def _box_bilinear() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = np.random.default_rng(0)
    return g.standard_normal((3, 2)), g.uniform(-0.9, 0.9, 3), g.uniform(-0.9, 0.9, 2)


def _box_game(algo: gameopt.Algorithm) -> tuple[gameopt.Game, list[torch.Tensor]]:
    """min_x max_y f = xᵀAy + 0.3·Σx, both players on the box [−1, 1]."""
    A, x0, y0 = (torch.tensor(a) for a in _box_bilinear())
    x, y = torch.nn.Parameter(x0.clone()), torch.nn.Parameter(y0.clone())
    box = gameopt.constraints.Box(-1.0, 1.0)

    def losses():
        f = x @ A @ y + 0.3 * x.sum()
        return f, -f

    players = [gameopt.Player([x], name="x", constraint=box), gameopt.Player([y], name="y", constraint=box)]
    return gameopt.Game(players, losses, algorithm=algo), [x, y]


def _box_reference(steps: int, lrs: tuple[float, float], method: str = "peg") -> list[np.ndarray]:
    """Projected past extragradient, optimistic gradient or anchored extragradient on the box game."""
    A, x, y = _box_bilinear()
    xi = lambda x, y: (A @ y + 0.3, -(A.T @ x))  # noqa: E731
    clip = lambda v: np.clip(v, -1.0, 1.0)  # noqa: E731
    gx, gy = np.zeros(3), np.zeros(2)
    x0, y0 = x, y
    out = []
    for k in range(steps):
        if method == "peg":
            xh, yh = clip(x - lrs[0] * gx), clip(y - lrs[1] * gy)
            gx, gy = xi(xh, yh)
            x, y = clip(x - lrs[0] * gx), clip(y - lrs[1] * gy)
        elif method == "optimistic":  # P(w − η(2g_t − g_{t−1})), g_{−1} = g_0
            nx, ny = xi(x, y)
            px, py = (nx, ny) if k == 0 else (gx, gy)
            x, y = clip(x - lrs[0] * (2 * nx - px)), clip(y - lrs[1] * (2 * ny - py))
            gx, gy = nx, ny
        else:  # EAG-C: both moves leave the anchored point by a projected step
            ax, ay = x + (x0 - x) / (k + 2), y + (y0 - y) / (k + 2)
            hx, hy = xi(x, y)
            xh, yh = clip(ax - lrs[0] * hx), clip(ay - lrs[1] * hy)
            hx, hy = xi(xh, yh)
            x, y = clip(ax - lrs[0] * hx), clip(ay - lrs[1] * hy)
        out.append(np.concatenate([x, y]))
    return out


BOX = {
    "peg": gameopt.PastExtragradient,
    "optimistic": gameopt.Optimistic,
    "eag": gameopt.AnchoredExtragradient,
}


@pytest.mark.parametrize("method", list(BOX))
def test_projected_methods_match_numpy_on_a_box(method) -> None:
    lrs = (0.4, 0.3)
    expected = _box_reference(12, lrs, method)
    game, (x, y) = _box_game(BOX[method](list(lrs)))
    clipped = 0
    for t, ref in enumerate(expected):
        game.step()
        np.testing.assert_allclose(torch.cat([x, y]).detach().numpy(), ref, rtol=0, atol=1e-13, err_msg=f"step {t}")
        clipped += int(np.isclose(np.abs(ref), 1.0).sum())
    assert clipped > 0  # the projection was active


def test_projected_past_extragradient_differs_from_projected_optimism() -> None:
    """Under projections the evaluation points P(w_t − η u_{t−1}) are not optimism's iterates."""
    lrs = (0.4, 0.3)
    peg, opt = _box_reference(12, lrs, "peg"), _box_reference(12, lrs, "optimistic")
    assert max(np.abs(a - b).max() for a, b in zip(peg, opt)) > 1e-2


# ---------------------------------------------------------- anchored extragradient


def test_anchored_extragradient_keeps_the_point_of_its_first_step_as_anchor() -> None:
    tg = bilinear(2)
    game = tg.build(gameopt.AnchoredExtragradient(0.1))
    with torch.no_grad():
        tg.modules[0].w.add_(1.0)  # moved after the algorithm was bound
    start = torch.cat(tg.params())
    game.step()
    game.step()
    assert game.algorithm_state["k"] == 2
    assert torch.equal(torch.cat(list(game.algorithm_state["anchor"])), start)


def test_anchored_extragradient_reaches_the_rate_of_the_paper_on_a_bilinear_game() -> None:
    """Yoon & Ryu 2021's bound for EAG-C (α ≤ 1/(8L)):
    ‖ξ(z_k)‖² ≤ 4(1 + αL + α²L²)/(α²(1 + αL)) · ‖z_0 − z*‖²/(k+1)² (≈ 260 L²‖z_0 − z*‖²/(k+1)²
    at α = 1/(8L)), checked at every step on min_x max_y xᵀAy (z* = 0)."""
    tg = bilinear(3)
    L = float(torch.linalg.matrix_norm(tg.jac_ref(tg.init), ord=2))
    alpha = 1 / (8 * L)
    game = tg.build(gameopt.AnchoredExtragradient(alpha))
    r0 = float(sum(w @ w for w in tg.init))
    for k in range(1, 60):
        game.step()
        xi = torch.cat(tg.xi_ref(tg.params()))
        constant = 4 * (1 + alpha * L + (alpha * L) ** 2) / (alpha**2 * (1 + alpha * L))
        assert float(xi @ xi) <= constant * r0 / (k + 1) ** 2


# ------------------------------------------------- Follow-the-Ridge, Stackelberg

DX, DY = 3, 2
_RNG = np.random.default_rng(7)
_M = {k: _RNG.standard_normal(s) for k, s in {"A": (DX, DX), "B": (DX, DY), "C": (DY, DY), "D": (DX, DX)}.items()}
GAMMA = 0.1


def _spd(m: np.ndarray, shift: float) -> np.ndarray:
    return m @ m.T / len(m) + shift * np.eye(len(m))


def zero_sum_game() -> games.TestGame:
    """f = ½xᵀAx + xᵀBy − ½yᵀCy + γ‖x‖²‖y‖² (A, C positive definite); losses (f, −f)."""
    A, B, C = _spd(_M["A"], 0.5), _M["B"], _spd(_M["C"], 1.0)
    At, Bt, Ct = (torch.tensor(m) for m in (A, B, C))

    def losses(ws):
        x, y = ws
        f = 0.5 * x @ At.to(x) @ x + x @ Bt.to(x) @ y - 0.5 * y @ Ct.to(y) @ y + GAMMA * (x @ x) * (y @ y)
        return [f, -f]

    init = [torch.tensor(_RNG.standard_normal(DX)), torch.tensor(_RNG.standard_normal(DY))]
    return games.TestGame("zero_sum", init, losses, lambda ws: None)


def ftr_reference(x, y, lrs, steps):
    A, B, C = _spd(_M["A"], 0.5), _M["B"], _spd(_M["C"], 1.0)
    out = []
    for _ in range(steps):
        gx = A @ x + B @ y + 2 * GAMMA * (y @ y) * x
        gy = B.T @ x - C @ y + 2 * GAMMA * (x @ x) * y
        hyy = -C + 2 * GAMMA * (x @ x) * np.eye(DY)
        hyx = B.T + 4 * GAMMA * np.outer(y, x)
        x, y = x - lrs[0] * gx, y + lrs[1] * gy + lrs[0] * np.linalg.solve(hyy, hyx @ gx)
        out.append(np.concatenate([x, y]))
    return out


def general_sum_game() -> games.TestGame:
    """f₁ = ½xᵀAx + xᵀBy + γ‖x‖²‖y‖², f₂ = ½yᵀCy + yᵀBᵀDx + ½γ‖x‖²‖y‖² (A, C positive definite)."""
    A, B, C, D = _spd(_M["A"], 0.5), _M["B"], _spd(_M["C"], 1.0), _M["D"]
    At, Bt, Ct, Dt = (torch.tensor(m) for m in (A, B, C, D))

    def losses(ws):
        x, y = ws
        f1 = 0.5 * x @ At.to(x) @ x + x @ Bt.to(x) @ y + GAMMA * (x @ x) * (y @ y)
        f2 = 0.5 * y @ Ct.to(y) @ y + y @ Bt.T.to(x) @ Dt.to(x) @ x + 0.5 * GAMMA * (x @ x) * (y @ y)
        return [f1, f2]

    init = [torch.tensor(_RNG.standard_normal(DX)), torch.tensor(_RNG.standard_normal(DY))]
    return games.TestGame("general_sum", init, losses, lambda ws: None)


def stackelberg_reference(x, y, lrs, steps, leader=0):
    """The leader x or y (``leader``), in the paper's form, with explicit derivatives."""
    A, B, C, D = _spd(_M["A"], 0.5), _M["B"], _spd(_M["C"], 1.0), _M["D"]
    out = []
    for _ in range(steps):
        g1x = A @ x + B @ y + 2 * GAMMA * (y @ y) * x
        g1y = B.T @ x + 2 * GAMMA * (x @ x) * y
        g2x = D.T @ B @ y + GAMMA * (y @ y) * x
        g2y = C @ y + B.T @ D @ x + GAMMA * (x @ x) * y
        if leader == 0:
            h2yy = C + GAMMA * (x @ x) * np.eye(DY)
            h2xy = (B.T @ D + 2 * GAMMA * np.outer(y, x)).T  # ∂(∇_y f₂)/∂x, transposed
            x, y = x - lrs[0] * (g1x - h2xy @ np.linalg.solve(h2yy, g1y)), y - lrs[1] * g2y
        else:  # y leads with f₂, x follows with f₁
            h1xx = A + 2 * GAMMA * (y @ y) * np.eye(DX)
            h1yx = (B + 4 * GAMMA * np.outer(x, y)).T  # ∂(∇_x f₁)/∂y, transposed
            x, y = x - lrs[0] * g1x, y - lrs[1] * (g2y - h1yx @ np.linalg.solve(h1xx, g2x))
        out.append(np.concatenate([x, y]))
    return out


SEQUENTIAL = {
    "FollowTheRidge": (zero_sum_game, lambda lrs: gameopt.FollowTheRidge(lrs), ftr_reference),
    "Stackelberg": (general_sum_game, lambda lrs: gameopt.Stackelberg(lrs), stackelberg_reference),
    "Stackelberg-leader-1": (
        general_sum_game,
        lambda lrs: gameopt.Stackelberg(lrs, leader=1),
        lambda *a: stackelberg_reference(*a, leader=1),
    ),
}


@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
@pytest.mark.parametrize("name", list(SEQUENTIAL))
def test_sequential_methods_match_numpy(name, raw) -> None:
    make_game, make, reference = SEQUENTIAL[name]
    tg = make_game()
    lrs = [0.07, 0.05]
    expected = reference(*(w.numpy() for w in tg.init), lrs, 8)
    game = tg.build(make(lrs), raw=raw)
    for t, ref in enumerate(expected):
        game.step()
        np.testing.assert_allclose(torch.cat(tg.params()).numpy(), ref, rtol=1e-11, atol=1e-12, err_msg=f"step {t}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(SEQUENTIAL))
def test_sequential_methods_resume_bit_exact(name, dtype) -> None:
    make_game, make, _ = SEQUENTIAL[name]
    tg = make_game()
    r = straight_and_resumed(tg, lambda: make([0.07, 0.05]), steps=6, cut=3, dtype=dtype)
    for a, b in zip(tg.params(), r.straight):
        assert a.dtype == dtype and torch.equal(a, b)
    assert_same_state(r.game.state_dict()["algorithm"], saved_and_loaded(r.straight_game.state_dict()["algorithm"]))


@pytest.mark.parametrize("name", list(SEQUENTIAL))
def test_sequential_methods_float32_tracks_float64(name) -> None:
    make_game, make, _ = SEQUENTIAL[name]
    tg = make_game()
    runs = []
    for dtype in (torch.float64, torch.float32):
        game = tg.build(make([0.07, 0.05]), dtype=dtype)
        for _ in range(5):
            game.step()
        runs.append(tg.params())
    for a, b in zip(runs[1], runs[0]):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def test_follow_the_ridge_refuses_a_game_that_is_not_zero_sum_and_changes_nothing() -> None:
    tg = general_sum_game()
    game = tg.build(gameopt.FollowTheRidge(0.1))
    before = tg.params()
    with pytest.raises(ValueError, match=r"zero-sum game given as losses \(f, -f\)"):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, tg.params()))
    assert game.algorithm_state == {}


@pytest.mark.parametrize("make", [gameopt.FollowTheRidge, gameopt.Stackelberg])
def test_sequential_methods_are_for_two_players(make) -> None:
    with pytest.raises(ValueError, match="two-player games, got 3 players"):
        GAMES["quadratic"]().build(make(0.1))


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: gameopt.FollowTheRidge(0.1, tol=0.0), "tol"),
        (lambda: gameopt.FollowTheRidge(0.1, maxiter=0), "maxiter"),
        (lambda: gameopt.Stackelberg(0.1, leader=2), "leader"),
        (lambda: gameopt.Stackelberg(0.1, leader=True), "leader"),
        (lambda: gameopt.Stackelberg(0.1, tol=float("nan")), "tol"),
        (lambda: gameopt.PastExtragradient(-0.1), "lr"),
        (lambda: gameopt.AnchoredExtragradient([0.1, float("inf")]), "lr[1]"),
    ],
)
def test_bad_arguments_are_refused_naming_them(make, name) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(name)} must be"):
        make()


# ------------------------------------------------------------------- NashConv


def nash_conv_reference(payoffs: list[np.ndarray], strategies: list[np.ndarray]) -> float:
    """By enumeration of the pure profiles."""
    n = len(payoffs)
    total = 0.0
    for i in range(n):
        values = np.zeros(len(strategies[i]))
        for profile in itertools.product(*(range(len(s)) for s in strategies)):
            weight = np.prod([strategies[j][a] for j, a in enumerate(profile) if j != i])
            values[profile[i]] += weight * payoffs[i][profile]
        total += values.max() - values @ strategies[i]
    return total


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (2, 2, 2, 3)])
def test_nash_conv_matches_enumeration(shape) -> None:
    g = np.random.default_rng(len(shape))
    payoffs = [g.standard_normal(shape) for _ in shape]
    strategies = [g.dirichlet(np.ones(a)) for a in shape]
    got = gameopt.nash_conv([torch.tensor(p) for p in payoffs], [torch.tensor(s) for s in strategies])
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(nash_conv_reference(payoffs, strategies), rel=1e-12, abs=1e-14)


def test_nash_conv_is_zero_at_equilibria_and_the_duality_gap_in_zero_sum_games() -> None:
    rps = torch.tensor([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]], dtype=torch.float64)
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    assert float(gameopt.nash_conv([rps, -rps], [uniform, uniform])) == pytest.approx(0.0, abs=1e-15)
    x, y = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    gap = float((rps @ y).max() - (x @ rps).min())
    assert float(gameopt.nash_conv([rps, -rps], [x, y])) == pytest.approx(gap, rel=1e-14)
    # a pure equilibrium of a 3-player coordination game
    coord = torch.zeros(2, 2, 2, dtype=torch.float64)
    coord[0, 0, 0] = coord[1, 1, 1] = 1.0
    e0 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert float(gameopt.nash_conv([coord] * 3, [e0] * 3)) == 0.0


def test_nash_conv_refuses_what_does_not_fit() -> None:
    p = [torch.zeros(2, 3), torch.zeros(2, 3)]
    s = [torch.tensor([0.5, 0.5]), torch.tensor([0.2, 0.3, 0.5])]
    with pytest.raises(ValueError, match="one strategy per player"):
        gameopt.nash_conv(p, s[:1])
    with pytest.raises(ValueError, match=r"payoffs\[1\] has shape \(3, 2\)"):
        gameopt.nash_conv([p[0], torch.zeros(3, 2)], s)
    with pytest.raises(ValueError, match=r"strategies\[1\] is not a probability vector"):
        gameopt.nash_conv(p, [s[0], torch.tensor([0.2, 0.3, 0.6])])
    with pytest.raises(ValueError, match=r"strategies\[0\] is not a probability vector"):
        gameopt.nash_conv(p, [torch.tensor([1.5, -0.5]), s[1]])
