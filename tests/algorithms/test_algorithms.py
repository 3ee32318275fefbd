"""Every algorithm against its closed-form update, iterate for iterate, in float64;
generic checks (resume, dtypes) driven by one table of algorithms."""

from __future__ import annotations

import math
import re
import sys
import typing

import pytest
import torch
from games import GAMES, assert_same_state, bilinear

import gameopt
from gameopt.testing import (
    ALGORITHMS,
    GENERIC,
    TWO_PLAYERS,
    AlgoInfo,
    check_all_or_nothing,
    check_closed_form,
    check_float32_tracks_float64,
    check_resume,
    learning_rates,
    regularized_bilinear,
)

IDS = [a.name for a in ALGORITHMS]
GENERIC_IDS = [a.name for a in GENERIC]


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize("info", ALGORITHMS, ids=IDS)
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
def test_matches_closed_form(info: AlgoInfo, game_name: str, raw: bool) -> None:
    check_closed_form(info, game_name, raw=raw, steps=7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("info", GENERIC, ids=GENERIC_IDS)
def test_resume_is_bit_exact(info: AlgoInfo, dtype: torch.dtype) -> None:
    check_resume(info, dtype, steps=8, cut=4)


@pytest.mark.parametrize("info", GENERIC, ids=GENERIC_IDS)
def test_float32_tracks_float64(info: AlgoInfo) -> None:
    check_float32_tracks_float64(info, steps=5)


@pytest.mark.parametrize("info", GENERIC + TWO_PLAYERS, ids=GENERIC_IDS + [a.name for a in TWO_PLAYERS])
def test_a_step_failing_at_any_evaluation_is_refused_whole(info: AlgoInfo) -> None:
    check_all_or_nothing(info)


def _distance(tg) -> float:
    return math.sqrt(sum(float(w @ w) for w in tg.params()))


def test_simgd_diverges_on_bilinear_at_the_known_rate() -> None:
    eta = 0.1
    tg = bilinear(1)
    tg.init = [torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)]
    tg.losses_fn = lambda ws: [(ws[0] * ws[1]).sum(), -(ws[0] * ws[1]).sum()]
    game = tg.build(gameopt.SimGD(eta))
    d0 = _distance(tg)
    for t in range(1, 21):
        game.step()
        assert _distance(tg) == pytest.approx(d0 * math.sqrt(1 + eta**2) ** t, rel=1e-12)


def test_extragradient_contracts_on_bilinear_at_the_known_rate() -> None:
    eta = 0.3
    tg = bilinear(1)
    tg.init = [torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)]
    tg.losses_fn = lambda ws: [(ws[0] * ws[1]).sum(), -(ws[0] * ws[1]).sum()]
    game = tg.build(gameopt.Extragradient(eta))
    d0 = _distance(tg)
    for t in range(1, 21):
        game.step()
        assert _distance(tg) == pytest.approx(d0 * math.sqrt(1 - eta**2 + eta**4) ** t, rel=1e-12)


def test_lr_scheduler_drives_per_player_learning_rates() -> None:
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.SimGD([0.1, 0.2, 0.3]))
    sched = torch.optim.lr_scheduler.StepLR(game.optimizer, step_size=2, gamma=0.5)
    for _ in range(4):
        game.step()
        sched.step()
    assert game.algorithm.lrs == pytest.approx([0.025, 0.05, 0.075])
    # the state dict carries the scheduled learning rates
    sd = game.state_dict()
    other = tg.build(gameopt.SimGD([0.1, 0.2, 0.3]))
    other.load_state_dict(sd)
    assert other.algorithm.lrs == pytest.approx([0.025, 0.05, 0.075])


NAN, INF = float("nan"), float("inf")
BAD_HYPERPARAMETERS = [
    # (constructor, the argument the message must name)
    (lambda: gameopt.SimGD(-1.0), "lr"),
    (lambda: gameopt.SimGD(NAN), "lr"),
    (lambda: gameopt.SimGD(INF), "lr"),
    (lambda: gameopt.SimGD("0.1"), "lr"),
    (lambda: gameopt.SimGD([0.1, True]), "lr[1]"),
    (lambda: gameopt.SimGD([]), "lr"),
    (lambda: gameopt.Momentum(1.5), "momentum"),
    (lambda: gameopt.Adam((1.0, 0.9)), "betas[0]"),
    (lambda: gameopt.Adam(0.9), "betas"),
    (lambda: gameopt.Extragradient(0.1, extrapolation_lr=-1), "extrapolation_lr"),
    (lambda: gameopt.Extragradient(0.1, extrapolation_lr=NAN), "extrapolation_lr"),
    (lambda: gameopt.Extragradient(0.1, extrapolation_lr=[0.1, "x"]), "extrapolation_lr[1]"),
    (lambda: gameopt.Lookahead(gameopt.SimGD(0.1), k=0), "k"),
    (lambda: gameopt.Lookahead(gameopt.SimGD(0.1), k=2.0), "k"),
    (lambda: gameopt.Lookahead(gameopt.SimGD(0.1), alpha=0.0), "alpha"),
    (lambda: gameopt.Lookahead(gameopt.SimGD(0.1), alpha=NAN), "alpha"),
    (lambda: gameopt.ConsensusOptimization(0.1, gamma=-1.0), "gamma"),
    (lambda: gameopt.ConsensusOptimization(0.1, gamma=NAN), "gamma"),
    (lambda: gameopt.LA(0.1, alpha=NAN), "alpha"),
    (lambda: gameopt.LOLA(0.1, alpha=INF), "alpha"),
    (lambda: gameopt.LOLA(0.1, shaping_only="yes"), "shaping_only"),
    (lambda: gameopt.SOS(0.1, alpha=-0.5), "alpha"),
    (lambda: gameopt.SOS(0.1, a=1.0), "a"),
    (lambda: gameopt.SOS(0.1, b=NAN), "b"),
    (lambda: gameopt.CGD(0.1, tol=0.0), "tol"),
    (lambda: gameopt.CGD(0.1, tol=NAN), "tol"),
    (lambda: gameopt.CGD(0.1, maxiter=0), "maxiter"),
    (lambda: gameopt.CGD(0.1, maxiter=2.5), "maxiter"),
    (lambda: gameopt.ACGD(0.1, beta=1.0), "beta"),
    (lambda: gameopt.ACGD(0.1, eps=0.0), "eps"),
    (lambda: gameopt.ACGD(0.1, tol=-1.0), "tol"),
    (lambda: gameopt.ACGD(0.1, atol=NAN), "atol"),
]


@pytest.mark.parametrize("make, name", BAD_HYPERPARAMETERS, ids=[str(k) for k in range(len(BAD_HYPERPARAMETERS))])
def test_bad_hyperparameters_raise_a_value_error_naming_the_argument(make, name) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(name)} must be"):
        make()


def test_ints_are_numbers_and_per_player_lengths_are_checked_when_the_game_is_built() -> None:
    game = GAMES["bilinear"]().build(gameopt.Extragradient(1, extrapolation_lr=1))
    assert game.algorithm.lrs == [1.0, 1.0]
    game.step()
    with pytest.raises(ValueError, match="1 values of extrapolation_lr for 2 players"):
        GAMES["bilinear"]().build(gameopt.Extragradient(0.1, extrapolation_lr=[0.1]))


class _Unset(gameopt.Algorithm):
    """A user's algorithm whose declared hyperparameter never got a value."""

    gamma = gameopt.Hyper(low=0.0)

    def update(self, oracle, state):  # pragma: no cover - never reached
        raise AssertionError("a step ran")


@pytest.mark.parametrize("wrap", [lambda a: a, gameopt.Lookahead], ids=["plain", "wrapped"])
def test_a_hyperparameter_without_a_value_is_refused_when_it_is_bound(wrap) -> None:
    game = GAMES["bilinear"]().build(gameopt.SimGD(0.1))
    before, start = game.algorithm, [t.clone() for t in game.layout.data]
    message = r"_Unset has no value for 'gamma': construct it as _Unset\(lr, gamma=...\)"
    with pytest.raises(TypeError, match=message):
        game.algorithm = wrap(_Unset(0.1))
    assert game.algorithm is before and all(map(torch.equal, game.layout.data, start))
    with pytest.raises(TypeError, match=message):
        GAMES["bilinear"]().build(wrap(_Unset(0.1)))
    GAMES["bilinear"]().build(wrap(_Unset(0.1, gamma=0.5)))  # given: accepted
    GAMES["bilinear"]().build(wrap(_SetWhenBound(0.1)))  # or set when bound


class _SetWhenBound(_Unset):
    def bind(self, game) -> None:
        self.gamma = 1.0 / sum(p.numel for p in game.players)
        super().bind(game)


def test_wrong_number_of_learning_rates() -> None:
    with pytest.raises(ValueError, match="2 learning rates for 3 players"):
        GAMES["quadratic"]().build(gameopt.SimGD([0.1, 0.2]))


SCHEDULABLE = [
    ("gamma", lambda g: gameopt.ConsensusOptimization(0.05, gamma=g), 0.5, 0.2),
    ("lam", lambda g: gameopt.SGA(0.05, lam=g, align=False), 0.5, -0.25),
    ("alpha", lambda g: gameopt.LOLA(0.05, alpha=g), 0.3, 0.1),
    ("alpha", lambda g: gameopt.SOS(0.05, alpha=g), 0.3, 0.1),
    ("beta", lambda g: gameopt.ACGD([0.05, 0.02], beta=g), 0.9, 0.5),
]


@pytest.mark.parametrize(
    "name, make, before, after", SCHEDULABLE, ids=[type(m(0.1)).__name__ for _, m, _, _ in SCHEDULABLE]
)
def test_hyperparameters_live_in_the_param_groups_where_a_schedule_reaches_them(name, make, before, after) -> None:
    """Setting ``group[name]`` between steps (what a scheduler does) gives the steps of
    an algorithm built with the new value; checkpoints carry the scheduled value."""
    tg = GAMES["bilinear"]()
    game = tg.build(make(before))
    assert [g[name] for g in game.algorithm.param_groups] == [before, before]
    game.step()
    for g in game.algorithm.param_groups:
        g[name] = after
    assert getattr(game.algorithm, name) == after
    game.step()
    scheduled = tg.params()

    tg2 = GAMES["bilinear"]()
    ref = tg2.build(make(before))
    ref.step()
    state = ref.state_dict()
    ref2 = tg2.build(make(after))
    saved = {
        **state,
        "algorithm": {**state["algorithm"], "param_groups": ref2.state_dict()["algorithm"]["param_groups"]},
    }
    ref2.load_state_dict(saved)  # same point and state, the new value
    ref2.step()
    for a, b in zip(scheduled, tg2.params()):
        assert torch.equal(a, b)
    # the checkpoint carries the scheduled value
    other = tg2.build(make(before))
    other.load_state_dict(game.state_dict())
    assert getattr(other.algorithm, name) == after


def test_a_bad_scheduled_value_is_refused_naming_the_group() -> None:
    tg = GAMES["bilinear"]()
    game = tg.build(gameopt.ConsensusOptimization(0.05, gamma=0.5))
    before = tg.params()
    game.algorithm.param_groups[1]["gamma"] = -1.0
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.gamma must be a finite number in \[0, inf\)"):
        game.step()
    game.algorithm.param_groups[1]["gamma"] = 0.25  # differs from player 0's
    with pytest.raises(ValueError, match="uses one gamma for all players"):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, tg.params()))
    sd = game.state_dict()
    sd["algorithm"]["param_groups"][0]["gamma"] = float("nan")
    fresh = tg.build(gameopt.ConsensusOptimization(0.05, gamma=0.5))
    with pytest.raises(ValueError, match=r"algorithm\.param_groups\[0\]\.gamma must be"):
        fresh.load_state_dict(sd)
    assert fresh.algorithm.gamma == 0.5


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "0.1", None], ids=repr)
@pytest.mark.parametrize(
    "make",
    [
        lambda: gameopt.SimGD(0.05),
        lambda: gameopt.Extragradient(0.05, update=gameopt.Adam()),
        lambda: gameopt.Lookahead(gameopt.SimGD(0.05), k=2),
        lambda: gameopt.Averaging(gameopt.Optimistic(0.05)),
    ],
    ids=["SimGD", "ExtraAdam", "Lookahead", "Averaging"],
)
def test_a_bad_learning_rate_set_between_steps_is_refused_and_changes_nothing(make, value) -> None:
    """Whoever sets it (by hand or a scheduler), an lr a step reads is checked then."""
    tg = GAMES["bilinear"]()
    game = tg.build(make())
    game.step()
    before, state = tg.params(), game.state_dict()
    game.algorithm.param_groups[1]["lr"] = value
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.lr must be a finite number in \[0, inf\)"):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, tg.params()))
    game.algorithm.param_groups[1]["lr"] = state["algorithm"]["param_groups"][1]["lr"]
    assert_same_state(game.state_dict(), state)


def test_a_scheduler_that_drives_lr_negative_is_refused_at_that_step() -> None:
    tg = GAMES["bilinear"]()
    game = tg.build(gameopt.SimGD(0.05))
    sched = torch.optim.lr_scheduler.LambdaLR(game.optimizer, lambda t: 1.0 - t)  # 1, 0, -1, ...
    game.step()
    sched.step()
    game.step()  # lr 0: allowed
    sched.step()
    before = tg.params()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\.lr must be a finite number in \[0, inf\), got -0\.05"):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, tg.params()))


def test_a_checkpoint_without_the_scheduled_keys_still_loads() -> None:
    """Checkpoints written before the hyperparameters moved to the param groups."""
    tg = GAMES["bilinear"]()
    game = tg.build(gameopt.ConsensusOptimization(0.05, gamma=0.5))
    game.step()
    sd = game.state_dict()
    for g in sd["algorithm"]["param_groups"]:
        del g["gamma"]
    other = tg.build(gameopt.ConsensusOptimization(0.05, gamma=0.5))
    other.load_state_dict(sd)
    assert other.algorithm.gamma == 0.5


RULES = [
    ("betas", lambda: gameopt.Adam((0.9, 0.99)), (0.5, 0.9)),
    ("momentum", lambda: gameopt.Momentum(0.5), -0.3),
    ("decay", lambda: gameopt.RMSProp(0.9), 0.5),
]


@pytest.mark.parametrize("name, rule, after", RULES, ids=[n for n, _, _ in RULES])
@pytest.mark.parametrize("wrap", [False, True], ids=["", "lookahead"])
def test_update_rule_settings_live_in_the_param_groups(name, rule, after, wrap) -> None:
    """Adam's betas, momentum and RMSProp's decay follow the param groups (where
    schedulers write them), are checkpointed there, and a bad value is refused."""

    def make(r):
        algo = gameopt.Extragradient(0.05, update=r)
        return gameopt.Lookahead(algo, k=3) if wrap else algo

    tg = GAMES["quadratic"]()
    game = tg.build(make(rule()))
    game.step()
    for g in game.algorithm.param_groups:
        g[name] = after
    game.step()
    scheduled = tg.params()
    tg2 = GAMES["quadratic"]()
    ref = tg2.build(make(rule()))
    ref.step()
    sd = ref.state_dict()
    for g in sd["algorithm"]["param_groups"]:
        g[name] = after
    ref.load_state_dict(sd)  # same point and state, the new setting
    ref.step()
    assert all(torch.equal(a, b) for a, b in zip(scheduled, tg2.params()))
    assert game.state_dict()["algorithm"]["param_groups"][0][name] == (after if name != "betas" else tuple(after))
    bad = (1.5, 0.9) if name == "betas" else 1.5
    game.algorithm.param_groups[2][name] = bad
    before = [w.clone() for w in tg.params()]
    with pytest.raises(ValueError, match=rf"param_groups\[2\]\.{name}"):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, tg.params()))


@pytest.mark.parametrize("wrap", [False, True], ids=["", "averaging"])
def test_one_cycle_lr_cycles_adams_beta1(wrap) -> None:
    tg = GAMES["quadratic"]()
    algo = gameopt.SimGD(0.05, update=gameopt.Adam((0.9, 0.99)))
    game = tg.build(gameopt.Averaging(algo) if wrap else algo)
    sched = torch.optim.lr_scheduler.OneCycleLR(game.optimizer, max_lr=0.1, total_steps=10, base_momentum=0.8)
    seen = []
    for _ in range(5):
        game.step()
        sched.step()
        seen.append(algo.rule.betas[0])
    assert seen[0] == 0.95 and min(seen[1:]) < 0.95  # the rule took the scheduled values
    assert all(g["betas"][1] == 0.99 for g in game.algorithm.param_groups)


@pytest.mark.parametrize("order", [(2, 0, 1), (1, 2, 0), None])
def test_altgd_moves_the_players_in_the_given_order(order) -> None:
    """Closed form on the non-quadratic 3-player game: each player steps on ξ_i at the
    point left by the players before it in ``order``."""
    tg = GAMES["nonquadratic"]()
    game = tg.build(gameopt.AltGD([0.1, 0.2, 0.15], order=order))
    ws = [w.clone() for w in tg.init]
    lrs = [0.1, 0.2, 0.15]
    for _ in range(5):
        game.step()
        for i in order or range(3):
            ws[i] = ws[i] - lrs[i] * tg.xi_ref(ws)[i]
        for a, b in zip(tg.params(), ws):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_altgd_refuses_an_order_that_is_not_a_permutation_of_the_players() -> None:
    tg = GAMES["nonquadratic"]()
    with pytest.raises(ValueError, match=r"permutation of the players' indices 0\.\.2, got \(0, 0, 1\)"):
        tg.build(gameopt.AltGD(0.1, order=(0, 0, 1)))
    with pytest.raises(ValueError, match="permutation"):
        tg.build(gameopt.AltGD(0.1, order=(0, 1)))
    with pytest.raises(TypeError, match="player indices"):
        gameopt.AltGD(0.1, order=[0, 1.0, 2])


# ----------------------------------------------------- typed states (issue 24)
def _state_type(cls: type) -> type:
    """The TypedDict an algorithm class is parameterized with (``Algorithm[S]``)."""
    for c in cls.__mro__:
        for base in getattr(c, "__orig_bases__", ()):
            if typing.get_origin(base) in (gameopt.Algorithm, gameopt.Wrapper):
                return typing.get_args(base)[0]
    raise AssertionError(f"{cls.__name__} names no state type")


def _assert_state_keys(algo: gameopt.Algorithm, state: dict, when: str) -> None:
    expected = _state_type(type(algo))
    assert typing.is_typeddict(expected) and expected.__module__ == "gameopt.algorithms.api"
    assert type(state) is dict, f"{type(algo).__name__}: the state is a plain dict ({when})"
    assert set(state) == set(expected.__annotations__), f"{type(algo).__name__} {when}"
    if isinstance(algo, gameopt.Wrapper):
        _assert_state_keys(algo.base, state["base"], when)


@pytest.mark.parametrize("info", GENERIC + TWO_PLAYERS, ids=GENERIC_IDS + [a.name for a in TWO_PLAYERS])
def test_the_state_has_the_keys_of_its_typed_dict(info: AlgoInfo) -> None:
    if info in TWO_PLAYERS:
        algo = info.make(learning_rates(2))
        game = regularized_bilinear().build(algo)  # min_x max_y xᵀAy + ½‖x‖² − ½‖y‖²
    else:
        algo = info.make(learning_rates(3))
        game = GAMES["nonquadratic"]().build(algo)
    _assert_state_keys(algo, game.algorithm_state, "after init_state")
    for _ in range(2):
        game.step()
    _assert_state_keys(algo, game.algorithm_state, "after a step")


def test_every_algorithm_is_typed_by_its_state() -> None:
    from gameopt.algorithms import api

    classes = [c for c in map(getattr, [gameopt] * len(gameopt.__all__), gameopt.__all__) if isinstance(c, type)]
    algorithms = [
        c for c in classes if issubclass(c, gameopt.Algorithm) and c not in (gameopt.Algorithm, gameopt.Wrapper)
    ]
    assert len(algorithms) == 18  # every algorithm gameopt exports
    for cls in algorithms:
        state = _state_type(cls)
        assert getattr(api, state.__name__) is state
        hints = typing.get_type_hints(cls.update, {**vars(api), **vars(sys.modules[cls.__module__])})
        assert hints["state"] is state and hints["return"] in (tuple[gameopt.Vec, state], tuple[api.Step, state]), (
            cls.__name__
        )


def test_a_wrapper_takes_no_learning_rate_of_its_own() -> None:
    wrapped = gameopt.Lookahead(gameopt.SimGD(0.1), k=2)
    assert wrapped._lr is None and wrapped.settings == {"k": 2, "alpha": 0.5}

    class Plain(gameopt.Wrapper):
        def update(self, oracle, state):
            return self.base.update(oracle, state)

    algo = Plain(gameopt.SimGD(0.1))
    assert repr(algo) == "Plain(SimGD(lr=0.1))" and algo.identity()["settings"] == {}
