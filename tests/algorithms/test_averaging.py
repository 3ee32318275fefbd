"""Iterate averaging (gameopt.Averaging): the average against a hand-written
reference iterate for iterate, the swap into the parameters, checkpoints, feasible
sets, and the known theory on the bilinear game x·y (closed forms in complex
numbers: one step of SimGD multiplies z = x + iy by 1 + iη, one of extragradient
by 1 − η² + iη)."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from games import GAMES, RefRule, assert_same_state, bilinear, ref_trajectory, straight_and_resumed
from torch import Tensor

import gameopt

F64 = torch.float64
LRS = {2: [0.1, 0.15], 3: [0.1, 0.12, 0.14]}
BASES = {
    "SimGD": (lambda lr: gameopt.SimGD(lr), "simgd", RefRule),
    "ExtraAdam": (
        lambda lr: gameopt.Extragradient(lr, update=gameopt.Adam((0.5, 0.9))),
        "eg",
        lambda: RefRule("adam", betas=(0.5, 0.9)),
    ),
}
KINDS = [("uniform", 0), ("uniform", 3), ("ema", 0), ("ema", 3)]


def ref_averages(ws: list[list[Tensor]], kind: str, beta: float, start: int) -> list[list[Tensor]]:
    """w̄_t for t = 0..T from the iterates ws[t] (ws[0] = w₀), each from its definition:
    w_t for t ≤ start; then the mean of w_{start+1..t}, or
    β^(t−s) w_s + Σ_{k=s+1..t} (1−β) β^(t−k) w_k."""
    out = []
    for t in range(len(ws)):
        if t <= start:
            out.append(ws[t])
        elif kind == "uniform":
            out.append([torch.stack([ws[k][i] for k in range(start + 1, t + 1)]).mean(0) for i in range(len(ws[0]))])
        else:
            out.append(
                [
                    beta ** (t - start) * ws[start][i]
                    + sum((1 - beta) * beta ** (t - k) * ws[k][i] for k in range(start + 1, t + 1))
                    for i in range(len(ws[0]))
                ]
            )
    return out


@pytest.mark.parametrize("kind, start", KINDS, ids=[f"{k}-start{s}" for k, s in KINDS])
@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("game_name", list(GAMES))
def test_average_matches_reference_and_iterates_are_the_base_algorithms(game_name, base, kind, start) -> None:
    make, ref_name, rule = BASES[base]
    tg, plain = GAMES[game_name](), GAMES[game_name]()
    lrs = LRS[len(tg.init)]
    steps = 8
    ws = [[w.clone() for w in tg.init], *ref_trajectory(tg, ref_name, lrs, steps, rule=rule())]
    expected = ref_averages(ws, kind, 0.7, start)
    algo = gameopt.Averaging(make(lrs), kind=kind, decay=0.7, start=start)
    game, plain_game = tg.build(algo), plain.build(make(lrs))
    assert all(torch.equal(a, w) for a, w in zip(algo.average(), tg.init))  # w̄₀ = w₀
    for t in range(1, steps + 1):
        game.step()
        plain_game.step()
        # the base algorithm moves the iterates exactly as without the wrapper
        assert all(torch.equal(a, b) for a, b in zip(tg.params(), plain.params())), f"step {t}"
        for a, ref in zip(algo.average(), expected[t]):
            torch.testing.assert_close(a, ref, rtol=1e-12, atol=1e-12, msg=f"step {t}")


def test_average_is_a_copy_and_the_repr_names_everything() -> None:
    tg = GAMES["bilinear"]()
    algo = gameopt.Averaging(gameopt.SimGD(0.1), kind="ema", decay=0.5, start=2)
    tg.build(algo).step()
    avg = algo.average()
    avg[0].add_(1.0)
    assert not torch.equal(algo.average()[0], avg[0])
    assert repr(algo) == "Averaging(SimGD(lr=[0.1, 0.1]), kind='ema', decay=0.5, start=2)"


def test_the_game_holds_the_state_and_an_average_inside_another_wrapper_reads_its_part() -> None:
    tg = GAMES["bilinear"]()
    avg = gameopt.Averaging(gameopt.SimGD(0.1), kind="uniform")
    algo = gameopt.Lookahead(avg, k=2)
    game = tg.build(algo)
    for _ in range(3):
        game.step()
    assert not hasattr(algo, "state") and not hasattr(avg, "state")
    state = game.algorithm_state
    assert set(state) == {"base", "slow", "count"} and state["base"]["count"] == 3
    assert all(torch.equal(a, b) for a, b in zip(avg.average(), game.layout.per_player(state["base"]["avg"])))
    game.algorithm = gameopt.SimGD(0.1)  # the average's state went with it
    with pytest.raises(RuntimeError, match="no longer the game's algorithm"):
        avg.average()


# ---------------------------------------------------------------- the swap
def _stepped(steps: int = 5):
    tg = GAMES["quadratic"]()
    algo = gameopt.Averaging(gameopt.Optimistic(LRS[3]))
    game = tg.build(algo)
    for _ in range(steps):
        game.step()
    return tg, algo, game


def test_averaged_swaps_the_average_in_and_restores_the_parameters_bitwise() -> None:
    tg, algo, game = _stepped()
    before, avg = tg.params(), algo.average()
    assert not any(torch.equal(a, b) for a, b in zip(before, avg))
    with algo.averaged():
        assert all(torch.equal(a, b) for a, b in zip(tg.params(), avg))
        # the game evaluates at the average
        for v, ref in zip(game.vector_field(), tg.xi_ref(list(avg))):
            torch.testing.assert_close(v, ref, rtol=1e-12, atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))
    with algo.averaged(players=[1]):  # only player 1
        now = tg.params()
        assert torch.equal(now[0], before[0]) and torch.equal(now[1], avg[1]) and torch.equal(now[2], before[2])
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))

    # the run goes on as if nothing happened
    tg2, _, game2 = _stepped()
    for _ in range(3):
        game.step()
        game2.step()
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), tg2.params()))


def test_averaged_restores_the_parameters_when_the_body_raises() -> None:
    tg, algo, _ = _stepped()
    before = tg.params()
    with pytest.raises(KeyError, match="inside"), algo.averaged():
        assert not torch.equal(tg.params()[0], before[0])
        raise KeyError("inside")
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))


def test_averaged_refuses_bad_players_and_an_unbound_algorithm() -> None:
    tg, algo, _ = _stepped()
    before = tg.params()
    for players, name in (([3], "players[0]"), ([0, -1], "players[1]"), ([1.0], "players[0]")):
        with pytest.raises(ValueError, match=rf"^{re.escape(name)} must be"), algo.averaged(players=players):
            pass
        assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))
    with pytest.raises(RuntimeError, match="not part of a game"):
        gameopt.Averaging(gameopt.SimGD(0.1)).average()


NAN = float("nan")
BAD = [
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), kind="mean"), "kind"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), kind=None), "kind"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), kind=["ema"]), "kind"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), decay=1.0), "decay"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), decay=-0.1), "decay"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), decay=NAN), "decay"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), decay="0.9"), "decay"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), start=-1), "start"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), start=1.5), "start"),
    (lambda: gameopt.Averaging(gameopt.SimGD(0.1), start=True), "start"),
]


@pytest.mark.parametrize("make, name", BAD, ids=[str(k) for k in range(len(BAD))])
def test_bad_hyperparameters_raise_a_value_error_naming_the_argument(make, name) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(name)} must be"):
        make()


def test_the_base_must_be_an_algorithm_and_first_order_is_the_bases() -> None:
    with pytest.raises(TypeError, match="base must be a gameopt Algorithm"):
        gameopt.Averaging(torch.optim.SGD([torch.zeros(1)], lr=0.1))
    assert gameopt.Averaging(gameopt.Extragradient(0.1)).first_order
    assert not gameopt.Averaging(gameopt.CGD(0.1)).first_order


# ------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_resume_is_bit_exact_average_included(dtype) -> None:
    def make():
        return gameopt.Averaging(gameopt.SimGD(LRS[3], update=gameopt.Momentum(0.5)), kind="ema", decay=0.8, start=2)

    tg = GAMES["nonquadratic"]()
    run = straight_and_resumed(tg, make, steps=8, cut=4, dtype=dtype)
    assert run.checkpoint["algorithm"]["state"]["count"] == 4
    assert_same_state(tg.params(), run.straight)
    assert_same_state(run.game.algorithm.average(), run.straight_game.algorithm.average())


def test_a_refused_load_changes_nothing() -> None:
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.Averaging(gameopt.SimGD(0.1), start=1))
    good = game.state_dict()
    game.step()
    game.step()  # the game now differs from ``good``
    now = copy.deepcopy(game.state_dict())
    wrong_shape = copy.deepcopy(good)
    wrong_shape["algorithm"]["state"]["avg"][0] = torch.zeros(5, dtype=F64)
    no_avg = copy.deepcopy(good)
    del no_avg["algorithm"]["state"]["avg"]
    bad_count = copy.deepcopy(good)
    bad_count["algorithm"]["state"]["count"] = "4"
    lookahead = GAMES["quadratic"]().build(gameopt.Lookahead(gameopt.SimGD(0.1))).state_dict()
    for bad, match in ((wrong_shape, "avg"), (no_avg, "avg"), (bad_count, "count"), (lookahead, "Lookahead")):
        with pytest.raises(ValueError, match=match):
            game.load_state_dict(bad)
        assert_same_state(game.state_dict(), now)
    game.load_state_dict(good)  # a good one still loads
    assert_same_state(game.state_dict(), good)


# ------------------------------------------------------------- feasible sets
class Sphere(gameopt.constraints.Constraint):
    """The unit sphere ‖w‖ = 1: not convex, so averages are projected back."""

    convex = False

    def project(self, w: Tensor) -> Tensor:
        return w / torch.linalg.vector_norm(w)


def test_constrained_players_average_inside_their_sets() -> None:
    tg = bilinear(3)
    mods = [torch.nn.Module(), torch.nn.Module()]
    for m, w in zip(mods, tg.init):
        m.w = torch.nn.Parameter(w.clone())
    sphere, box = Sphere(), gameopt.constraints.Box(-0.5, 0.5)
    algo = gameopt.Averaging(gameopt.SimGD(0.2))
    game = gameopt.Game(
        [gameopt.Player(mods[0], constraint=sphere), gameopt.Player(mods[1], constraint=box)],
        lambda: tg.losses_fn([m.w for m in mods]),
        algorithm=algo,
    )
    ws = [[m.w.detach().clone() for m in mods]]
    for _ in range(6):
        game.step()
        ws.append([m.w.detach().clone() for m in mods])
    # reference: the sphere player's running mean, projected after every step
    x_bar = ws[1][0]
    for n in range(2, 7):
        x_bar = sphere.project(x_bar + (ws[n][0] - x_bar) / n)
    x_avg, y_avg = algo.average()
    torch.testing.assert_close(x_avg, x_bar, rtol=1e-12, atol=1e-12)
    assert torch.linalg.vector_norm(x_avg).item() == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(y_avg, torch.stack([w[1] for w in ws[1:]]).mean(0), rtol=1e-12, atol=1e-12)
    assert box.contains(y_avg)
    with pytest.raises(ValueError, match="first-order"):
        gameopt.Game(
            [gameopt.Player(mods[0], constraint=box)],
            lambda: [mods[0].w.sum()],
            algorithm=gameopt.Averaging(gameopt.CGD(0.1)),
        )


# ------------------------------------------------------------- known theory
def _scalar_bilinear(algo: gameopt.Algorithm, z0: complex):
    tg = bilinear(1)
    tg.init = [torch.tensor([z0.real], dtype=F64), torch.tensor([z0.imag], dtype=F64)]
    tg.losses_fn = lambda ws: [(ws[0] * ws[1]).sum(), -(ws[0] * ws[1]).sum()]
    return tg, tg.build(algo)


def _z(pair) -> complex:
    return complex(float(pair[0]), float(pair[1]))


@pytest.mark.trajectory
def test_simgd_diverges_on_x_times_y_but_its_uniform_average_approaches_the_equilibrium() -> None:
    eta, z0 = 0.1, 1 + 0.5j
    c, rho = 1 + 1j * eta, math.sqrt(1 + eta**2)
    algo = gameopt.Averaging(gameopt.SimGD(eta))
    tg, game = _scalar_bilinear(algo, z0)
    for t in range(1, 201):
        game.step()
        z, avg = _z(tg.params()), _z(algo.average())
        # closed forms: z_t = c^t z₀ and w̄_t = (1/t) Σ_{k=1..t} c^k z₀ = c (c^t − 1) / ((c − 1) t) z₀
        assert abs(z) == pytest.approx(rho**t * abs(z0), rel=1e-12)
        assert abs(avg - c * (c**t - 1) / ((c - 1) * t) * z0) <= 1e-11 * abs(z0)
        if t >= 50:  # |w̄_t| ≤ ρ (ρ^t + 1) / (η t) |z₀| < |z₀|/2 < |z₀| < |z_t|
            assert abs(avg) <= rho * (rho**t + 1) / (eta * t) * abs(z0) < 0.5 * abs(z0) < abs(z0) < abs(z)


@pytest.mark.trajectory
def test_extragradients_uniform_average_converges_at_rate_one_over_t() -> None:
    eta, z0 = 0.3, 1 + 0.5j
    c = 1 - eta**2 + 1j * eta  # |c| < 1: the iterates converge linearly
    limit = abs(c / (1 - c) * z0)  # t · w̄_t = c (1 − c^t) / (1 − c) z₀ → c / (1 − c) z₀
    algo = gameopt.Averaging(gameopt.Extragradient(eta))
    tg, game = _scalar_bilinear(algo, z0)
    for t in range(1, 401):
        game.step()
        avg = _z(algo.average())
        assert abs(t * avg - c * (1 - c**t) / (1 - c) * z0) <= 1e-11 * abs(z0) * t
        if t >= 100:  # O(1/t), and not faster
            assert 0.95 * limit <= t * abs(avg) <= 1.05 * limit
