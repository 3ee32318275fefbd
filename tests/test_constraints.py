"""Feasible sets: projections against numpy references and the projection's
variational inequality; mirror steps; bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gameopt import constraints as C


def _simplex_ref(v: np.ndarray) -> np.ndarray:
    """Duchi et al. 2008, Figure 1, one row at a time."""
    out = np.empty_like(v)
    for r, row in enumerate(v.reshape(-1, v.shape[-1])):
        u = np.sort(row)[::-1]
        css = np.cumsum(u)
        rho = max(j for j in range(1, len(u) + 1) if u[j - 1] - (css[j - 1] - 1) / j > 0)
        theta = (css[rho - 1] - 1) / rho
        out.reshape(-1, v.shape[-1])[r] = np.maximum(row - theta, 0)
    return out


SETS = {
    "nonnegative": (C.NonNegative(), lambda v: np.maximum(v, 0)),
    "box": (C.Box(-0.5, 0.25), lambda v: np.clip(v, -0.5, 0.25)),
    "ball": (C.Ball(1.5), lambda v: v * min(1.0, 1.5 / np.linalg.norm(v))),
    "simplex": (C.Simplex(), _simplex_ref),
}


@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_projection_matches_numpy_and_is_the_closest_point(name, shape) -> None:
    c, ref = SETS[name]
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        v = 2 * torch.randn(shape, generator=g, dtype=torch.float64)
        p = c.project(v)
        np.testing.assert_allclose(p.numpy(), ref(v.numpy()), rtol=1e-13, atol=1e-14)
        assert c.contains(p, tol=1e-12)
        assert torch.equal(c.project(p), p) or torch.allclose(c.project(p), p, atol=1e-15)  # idempotent
        # ⟨v − P v, y − P v⟩ ≤ 0 for every feasible y
        for _ in range(20):
            y = c.project(3 * torch.randn(shape, generator=g, dtype=torch.float64))
            if name == "simplex":
                assert ((v - p) * (y - p)).sum(-1).max() <= 1e-12
            else:
                assert ((v - p) * (y - p)).sum() <= 1e-12


def test_entropic_simplex_step_is_multiplicative_weights() -> None:
    x = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.4, 0.0]], dtype=torch.float64)
    d = torch.tensor([[0.1, -0.4, 0.2], [1.0, -1.0, 3.0]], dtype=torch.float64)
    got = C.Simplex(mirror="entropic").step(x, d)
    want = x * torch.exp(d)
    want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-15)
    assert got[1, 2] == 0  # a zero weight stays zero
    torch.testing.assert_close(C.Simplex().step(x, d), C.Simplex().project(x + d))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: C.Box(1.0, -1.0), "low <= high"),
        (lambda: C.Box(float("nan"), 1.0), "low"),
        (lambda: C.Ball(-1.0), r"radius must be a finite number in \[0, inf\)"),
        (lambda: C.Ball(float("inf")), "radius"),
        (lambda: C.Simplex(mirror="kl"), "mirror"),
    ],
)
def test_bad_sets_are_refused_at_construction(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_simplex_on_a_scalar_does_not_fit() -> None:
    with pytest.raises(ValueError, match="last dimension"):
        C.Simplex().check(torch.Size([]), "w")


# ------------------------------------------------------ algorithms on feasible sets
from games import assert_same_state  # noqa: E402
from torch import nn  # noqa: E402

import gameopt  # noqa: E402


def _np_step(kind: str, w: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The reference of each set's step from w along d, in numpy."""
    if kind == "simplex":
        return _simplex_ref(w + d)
    if kind == "entropic":
        e = w * np.exp(d)
        return e / e.sum(-1, keepdims=True)
    if kind == "box":
        return np.clip(w + d, -0.5, 0.25)
    if kind == "ball":
        v = w + d
        return v * min(1.0, 1.5 / np.linalg.norm(v))
    if kind == "nonnegative":
        return np.maximum(w + d, 0)
    return w + d


def _np_project(kind: str, w: np.ndarray) -> np.ndarray:
    return _simplex_ref(w) if kind == "entropic" else _np_step(kind, w, np.zeros_like(w))


MAKE_SET = {
    "simplex": lambda: C.Simplex(),
    "entropic": lambda: C.Simplex(mirror="entropic"),
    "box": lambda: C.Box(-0.5, 0.25),
    "ball": lambda: C.Ball(1.5),
    "nonnegative": lambda: C.NonNegative(),
}


def _np_trajectory(algo: str, kind: str, A: np.ndarray, x: np.ndarray, y: np.ndarray, lrs, steps: int, k: int = 2):
    """Projected / mirror versions of the first-order algorithms on min_x max_y xᵀAy
    with x in the set and y free... both players constrained to ``kind``."""

    def xi(x, y):
        return A @ y, -A.T @ x

    def move(ws, ds):
        return [_np_step(kind, w, d) for w, d in zip(ws, ds)]

    ws = [_np_project(kind, x), _np_project(kind, y)]
    prev, slow, out = None, [w.copy() for w in ws], []
    for t in range(steps):
        if algo in ("simgd", "lookahead"):
            ws = move(ws, [-lr * g for lr, g in zip(lrs, xi(*ws))])
            if algo == "lookahead" and (t + 1) % k == 0:
                slow = [s + 0.5 * (w - s) for s, w in zip(slow, ws)]
                ws = [s.copy() for s in slow]
        elif algo == "altgd":
            gx = xi(*ws)[0]
            x1 = _np_step(kind, ws[0], -lrs[0] * gx)
            gy = xi(x1, ws[1])[1]
            ws = [x1, _np_step(kind, ws[1], -lrs[1] * gy)]
        elif algo == "eg":
            mid = move(ws, [-lr * g for lr, g in zip(lrs, xi(*ws))])
            ws = move(ws, [-lr * g for lr, g in zip(lrs, xi(*mid))])
        elif algo == "optimistic":
            g = xi(*ws)
            p = g if prev is None else prev
            ws = move(ws, [-lr * (2 * gi - pi) for lr, gi, pi in zip(lrs, g, p)])
            prev = g
        out.append([w.copy() for w in ws])
    return out


ALGOS = {
    "simgd": lambda lr: gameopt.SimGD(lr),
    "altgd": lambda lr: gameopt.AltGD(lr),
    "eg": lambda lr: gameopt.Extragradient(lr),
    "optimistic": lambda lr: gameopt.Optimistic(lr),
    "lookahead": lambda lr: gameopt.Lookahead(gameopt.SimGD(lr), k=2, alpha=0.5),
}
CASES = [(a, s) for a in ALGOS for s in ["simplex", "box", "ball", "nonnegative"]] + [
    (a, "entropic") for a in ("simgd", "eg", "optimistic", "altgd", "lookahead")
]


def _matrix_game(kind: str, algo, seed: int = 0, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    x0 = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    y0 = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    if kind == "entropic":  # start inside the simplex
        x0, y0 = x0 / x0.sum(), y0 / y0.sum()
    mx, my = nn.Module(), nn.Module()
    mx.w, my.w = nn.Parameter(x0.clone()), nn.Parameter(y0.clone())
    game = gameopt.Game(
        [gameopt.Player(mx, constraint=MAKE_SET[kind]()), gameopt.Player(my, constraint={"w": MAKE_SET[kind]()})],
        lambda: (mx.w @ A @ my.w, -(mx.w @ A @ my.w)),
        algorithm=algo,
    )
    return game, mx, my, A.numpy(), x0.numpy(), y0.numpy()


@pytest.mark.parametrize("algo, kind", CASES, ids=[f"{a}-{s}" for a, s in CASES])
def test_projected_and_mirror_algorithms_match_numpy_iterate_for_iterate(algo, kind) -> None:
    lrs = [0.3, 0.2]
    game, mx, my, A, x0, y0 = _matrix_game(kind, ALGOS[algo](lrs))
    ref = _np_trajectory(algo, kind, A, x0, y0, lrs, steps=12)
    for t in range(12):
        game.step()
        np.testing.assert_allclose(mx.w.detach().numpy(), ref[t][0], rtol=1e-11, atol=1e-12, err_msg=f"step {t}")
        np.testing.assert_allclose(my.w.detach().numpy(), ref[t][1], rtol=1e-11, atol=1e-12, err_msg=f"step {t}")


def test_second_order_algorithms_refuse_constrained_players() -> None:
    for make in (lambda: gameopt.SGA(0.1), lambda: gameopt.ConsensusOptimization(0.1), lambda: gameopt.CGD(0.1)):
        with pytest.raises(ValueError, match="constrained players need a first-order algorithm"):
            _matrix_game("simplex", make())


def test_start_outside_the_set_is_projected_at_build_and_logged(caplog) -> None:
    with caplog.at_level("INFO", logger="gameopt.game"):
        game, mx, _, _, x0, _ = _matrix_game("simplex", gameopt.SimGD(0.1))
    np.testing.assert_allclose(mx.w.detach().numpy(), _simplex_ref(x0), rtol=1e-14)
    assert "projected" in caplog.text


def test_constraint_on_a_missing_name_or_a_shape_that_does_not_fit_is_refused() -> None:
    m = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="no parameter named 'weight2'"):
        gameopt.Player(m, constraint={"weight2": C.Box(0, 1)})
    s = nn.Module()
    s.w = nn.Parameter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="last dimension"):
        gameopt.Player(s, constraint=C.Simplex())
    with pytest.raises(TypeError, match="project"):
        gameopt.Player(m, constraint=object())


def test_a_non_finite_step_on_a_constrained_game_is_refused_with_nothing_changed() -> None:
    game, mx, my, *_ = _matrix_game("simplex", gameopt.Extragradient(0.1, update=gameopt.Adam()))
    game.step()
    before = game.state_dict()
    game.losses = lambda: (mx.w.sum() * float("nan"), -my.w.sum())
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
    after = game.state_dict()
    for a, b in zip(before["players"], after["players"]):
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"]))


# ------------------------------------------------------------ known behaviour
def _gap_after(method: str, payoff: torch.Tensor, steps: int, seed: int = 0) -> float:
    from experiments.matrix_games import trajectory

    return trajectory(method, 0.1, payoff, steps, seed=seed, every=steps)[-1]


def test_projected_extragradient_reaches_the_linear_programs_value_on_random_games() -> None:
    from experiments.matrix_games import build, game_value
    from gameopt_players.matrix_games import random_zero_sum

    for seed in (0, 1, 2):
        payoff = random_zero_sum(5, seed)
        game, x, y = build("peg", 0.1, payoff, seed)
        for _ in range(3000):
            game.step()
        gap = float((payoff @ y.p.detach()).max() - (x.p.detach() @ payoff).min())
        assert gap < 1e-6  # linear convergence: far below on every machine
        assert abs(float(x.p.detach() @ payoff @ y.p.detach()) - game_value(payoff)) < 1e-6


def test_optimistic_multiplicative_weights_converges_on_rock_paper_scissors_where_plain_does_not() -> None:
    from gameopt_players.matrix_games import ROCK_PAPER_SCISSORS as RPS

    start = _gap_after("omwu", RPS, 0)
    omwu, mwu = _gap_after("omwu", RPS, 3000), _gap_after("mwu", RPS, 3000)
    assert omwu < start / 10  # the last iterate approaches the equilibrium
    assert mwu > start  # multiplicative weights spirals out towards the boundary


# ------------------------------------------------- sets of one's own (issue 22)
class _ProjectOnlyBox:
    """A feasible set with nothing but ``project`` (the box [-0.5, 0.25]): ``step``,
    ``delta_to``, ``check`` and ``convex`` take their defaults."""

    def project(self, w: torch.Tensor) -> torch.Tensor:
        return w.clamp(-0.5, 0.25)


MAKE_SET["box-project-only"] = _ProjectOnlyBox


@pytest.mark.parametrize("algo", list(ALGOS))
def test_a_set_with_only_project_steps_by_its_projection(algo) -> None:
    lrs = [0.3, 0.2]
    game, mx, my, A, x0, y0 = _matrix_game("box-project-only", ALGOS[algo](lrs))
    ref = _np_trajectory(algo, "box", A, x0, y0, lrs, steps=6)
    for t in range(6):
        game.step()
        np.testing.assert_allclose(mx.w.detach().numpy(), ref[t][0], rtol=1e-11, atol=1e-12, err_msg=f"step {t}")
        np.testing.assert_allclose(my.w.detach().numpy(), ref[t][1], rtol=1e-11, atol=1e-12, err_msg=f"step {t}")


def test_a_set_of_ones_own_is_taken_through_the_constraint_interface() -> None:
    given = _ProjectOnlyBox()
    c = C.as_constraint(given)
    assert isinstance(c, C.Constraint) and c.convex and repr(c) == repr(given)
    w, d = torch.tensor([0.0, 0.2]), torch.tensor([1.0, -2.0])
    assert torch.equal(c.step(w, d), torch.tensor([0.25, -0.5]))
    assert torch.equal(c.delta_to(w, torch.tensor([0.1, 0.1])), torch.tensor([0.1, 0.1]) - w)
    box = C.Box(0, 1)
    assert C.as_constraint(box) is box
    with pytest.raises(TypeError, match="project"):
        C.as_constraint(object())


class _NonFiniteAt(C.Constraint):
    """The box [-0.5, 0.25] whose ``step`` returns NaN at its ``bad``-th call (from 1)."""

    def __init__(self, bad: int) -> None:
        self.bad, self.calls = bad, 0

    def project(self, w: torch.Tensor) -> torch.Tensor:
        return w.clamp(-0.5, 0.25)

    def step(self, w: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.project(w + delta)
        return torch.full_like(out, float("nan")) if self.calls == self.bad else out


@pytest.mark.parametrize(
    "make, bad",
    [
        (lambda: gameopt.SimGD(0.3), 1),  # the step's new point
        (lambda: gameopt.Extragradient(0.3), 1),  # the extrapolation point
        (lambda: gameopt.Extragradient(0.3), 2),  # the step's new point
        (lambda: gameopt.Lookahead(gameopt.SimGD(0.3), k=1), 1),  # the look-ahead (fast) point
        (lambda: gameopt.Lookahead(gameopt.SimGD(0.3), k=1), 2),  # the step's new point
    ],
    ids=["simgd-step", "eg-extrapolation", "eg-step", "lookahead-fast", "lookahead-step"],
)
@pytest.mark.parametrize("on_nonfinite", ["raise", "skip"])
def test_a_point_formed_through_a_set_is_checked_finite_before_it_is_committed(make, bad, on_nonfinite) -> None:
    x, y = (
        nn.Parameter(torch.tensor([0.1, -0.2], dtype=torch.float64)),
        nn.Parameter(torch.zeros(2, dtype=torch.float64)),
    )
    A = torch.tensor([[1.0, 2.0], [-1.0, 0.5]], dtype=torch.float64)
    game = gameopt.Game(
        [gameopt.Player([x], constraint=_NonFiniteAt(bad)), gameopt.Player([y])],
        lambda: (x @ A @ y + x.square().sum(), -(x @ A @ y)),
        algorithm=make(),
        on_nonfinite=on_nonfinite,
    )
    before = game.state_dict()
    if on_nonfinite == "raise":
        with pytest.raises(gameopt.NonFiniteError, match="feasible set"):
            game.step()
    else:
        game.step()
        assert game.skipped_steps == 1
    after = game.state_dict()
    after["skipped_steps"] = before["skipped_steps"]
    assert_same_state(before, after)
    assert torch.isfinite(x).all() and torch.isfinite(y).all()
    game.step()  # the set behaves now: the next step is taken
    assert torch.isfinite(x).all() and not torch.equal(x.detach(), before["players"][0]["params"][0])


@pytest.mark.parametrize(
    "constraint, start",
    [
        (C.Simplex(), float("nan")),
        (C.Box(-1.0, 1.0), float("inf")),  # its projection would make it finite: refused before
        (None, float("-inf")),
        (_ProjectOnlyBox(), float("nan")),
    ],
)
def test_a_starting_point_that_is_not_finite_is_refused_when_the_game_is_built(constraint, start) -> None:
    w = nn.Parameter(torch.tensor([0.2, start, 0.3]))
    v = nn.Parameter(torch.ones(3))
    player = gameopt.Player([w], constraint=constraint, name="x")
    with pytest.raises(ValueError, match=r"not finite \(parameter 0 of player 'x'\)"):
        gameopt.Game([player, gameopt.Player([v], name="y")], lambda: (w @ v, -(w @ v)))
    assert torch.isnan(w[1]) if start != start else w[1] == start  # nothing projected


def test_refusing_a_second_order_algorithm_names_every_first_order_one() -> None:
    """The message lists the algorithms that do take constrained players, read from the
    package, so a new one (or a wrapper such as Averaging) is never left out."""
    first_order = [
        name
        for name in gameopt.__all__
        if isinstance(getattr(gameopt, name), type)
        and issubclass(getattr(gameopt, name), gameopt.Algorithm)
        and getattr(gameopt, name).first_order is True
        and name != "Algorithm"
    ]
    assert {"SimGD", "PastExtragradient", "AnchoredExtragradient"} <= set(first_order)
    player = gameopt.Player(torch.nn.Parameter(torch.ones(3)), constraint=C.Simplex())
    other = gameopt.Player(torch.nn.Parameter(torch.ones(3)))
    with pytest.raises(ValueError, match="first-order algorithm") as err:
        gameopt.Game(
            [player, other], lambda: (player.parameters[0].sum(), other.parameters[0].sum()), algorithm=gameopt.SGA(0.1)
        )
    assert all(name in str(err.value) for name in [*first_order, "Lookahead", "Averaging"])
