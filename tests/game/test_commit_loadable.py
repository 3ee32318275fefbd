"""A game never commits a value it would refuse to load (issue #33, items 6-8): a
finite step that overflows the new point, a penalty coefficient that grows to
infinity, a loss-scale checkpoint resumed under other settings."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

import gameopt
from gameopt import vec
from gameopt.game import moves

# (dtype, a finite value near its largest, a finite step that takes it past the largest)
NEAR_LIMIT = {
    torch.float16: (65000.0, 1000.0),  # float16's largest is 65504
    torch.bfloat16: (3e38, 1e38),  # bfloat16's is 3.39e38
    torch.float32: (3e38, 1e38),  # float32's is 3.40e38
}
ALGORITHMS = {
    "SimGD": lambda lr: gameopt.SimGD(lr),
    "SimGD+Adam": lambda lr: gameopt.SimGD(lr, update=gameopt.Adam()),
}


def _pair(dtype: torch.dtype, n: int, lr: float, make=ALGORITHMS["SimGD"], **kwargs):
    """Two players; 'gen' ascends its sum (its step is +lr per element under SimGD,
    about +lr under Adam), 'disc' descends a quadratic (a gradient that is never 0:
    Adam's 0 / (0 + eps) is NaN in float16)."""
    x = nn.Parameter(torch.zeros(n, dtype=dtype))
    y = nn.Parameter(torch.zeros(n, dtype=dtype))
    game = gameopt.Game(
        [gameopt.Player([x], name="gen"), gameopt.Player([y], name="disc")],
        lambda: (-x.sum(), ((y - 1) * (y - 1)).sum()),
        algorithm=make(lr),
        **kwargs,
    )
    return x, y, game


def _snapshot(game: gameopt.Game):
    return game.state_dict()


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    return a == b


# ------------------------------------------------------------- item 6: the new point
@pytest.mark.parametrize("dtype", list(NEAR_LIMIT), ids=str)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("n", [3, 100], ids=["read", "reduced"])
@pytest.mark.parametrize("mode", ["raise", "skip", "loss_scale"])
def test_a_finite_step_that_overflows_the_new_point_is_refused_and_changes_nothing(dtype, algorithm, n, mode) -> None:
    big, lr = NEAR_LIMIT[dtype]
    kwargs = {"on_nonfinite": "skip"} if mode == "skip" else {}
    if mode == "loss_scale":
        kwargs = {"loss_scale": gameopt.DynamicLossScale(init_scale=4.0)}
    x, y, game = _pair(dtype, n, lr, ALGORITHMS[algorithm], **kwargs)
    with torch.no_grad():
        x[n // 2] = big
    before, state = _snapshot(game), game.algorithm_state
    if mode == "raise":
        name = str(dtype).removeprefix("torch.")
        with pytest.raises(gameopt.NonFiniteError, match=rf"the new point of player 'gen' overflows {name} \(max"):
            game.step()
    else:
        game.step()
        assert game.skipped_steps == 1
    assert game.algorithm_state is state  # the algorithm's state was not committed
    after = _snapshot(game)
    if mode == "loss_scale":  # the skip backed the scale off, as for any overflow
        assert after["loss_scale"]["scale"] == 2.0
        after["loss_scale"], before["loss_scale"] = None, None
    after["skipped_steps"] = before["skipped_steps"]
    assert _same(before, after)
    assert vec.all_finite([x.detach(), y.detach()])
    game.load_state_dict(game.state_dict())  # the game's own checkpoint loads


def test_the_message_names_every_player_that_overflows() -> None:
    x, y, game = _pair(torch.float16, 3, 1000.0)
    game.losses = lambda: (-x.sum(), -y.sum())  # both ascend
    with torch.no_grad():
        x[0], y[1] = 65000.0, 65000.0
    with pytest.raises(gameopt.NonFiniteError, match="the new point of players 'disc', 'gen' overflows float16"):
        game.step()


@pytest.mark.parametrize("write", ["in place", "module load_state_dict", "game load_state_dict"])
def test_a_write_the_game_did_not_make_is_seen_before_the_next_step(write) -> None:
    """The game keeps a bound on |w| between steps; a write it did not make (through
    autograd's version counter) makes it read the point again, so a step from a
    point written near the largest float16 is refused."""
    module = nn.Module()
    module.w = nn.Parameter(torch.zeros(4, dtype=torch.float16))
    y = nn.Parameter(torch.zeros(2, dtype=torch.float16))
    game = gameopt.Game(
        [gameopt.Player(module, name="gen"), gameopt.Player([y], name="disc")],
        lambda: (-module.w.sum(), (y * y).sum()),
        algorithm=gameopt.SimGD(1000.0),
    )
    for _ in range(3):
        game.step()  # the bound now holds 3000
    high = torch.tensor([65000.0, 0.0, 0.0, 0.0], dtype=torch.float16)
    if write == "in place":
        with torch.no_grad():
            module.w.copy_(high)
    elif write == "module load_state_dict":
        module.load_state_dict({"w": high})
    else:
        saved = game.state_dict()
        saved["players"][0]["params"][0].copy_(high)
        game.load_state_dict(saved)
    before = module.w.detach().clone()
    with pytest.raises(gameopt.NonFiniteError, match="overflows float16"):
        game.step()
    assert torch.equal(module.w.detach(), before)


def test_after_a_refused_step_a_write_into_a_group_that_passed_is_seen() -> None:
    """Two groups (float16, float32): a step refused in the second leaves the first's
    bound unsettled, so one write into the first is seen before the next step."""
    x = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    y = nn.Parameter(torch.zeros(3, dtype=torch.float32))
    game = gameopt.Game(
        [gameopt.Player([x], name="gen"), gameopt.Player([y], name="disc")],
        lambda: (-x.sum(), -y.sum()),
        algorithm=gameopt.SimGD([1000.0, 1e38]),
    )
    with torch.no_grad():
        y[0] = 3e38
    with pytest.raises(gameopt.NonFiniteError, match="player 'disc' overflows float32"):
        game.step()
    with torch.no_grad():
        y.zero_()
        x[0] = 65000.0  # one write into gen's group
    with pytest.raises(gameopt.NonFiniteError, match="player 'gen' overflows float16"):
        game.step()


@pytest.mark.parametrize("constrained", [False, True])
def test_a_move_of_the_live_point_outside_a_step_is_seen(constrained) -> None:
    """A write of the game's own point outside a step (not a step's checked move)
    leaves no bound behind: the next step reads the point."""
    module = nn.Module()
    module.w = nn.Parameter(torch.full((3,), 1 / 3, dtype=torch.float16))
    module.v = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    y = nn.Parameter(torch.zeros(2, dtype=torch.float16))
    sets = {"constraint": {"w": gameopt.constraints.Simplex()}} if constrained else {}
    game = gameopt.Game(
        [gameopt.Player(module, name="gen", **sets), gameopt.Player([y], name="disc")],
        lambda: (-module.v.sum() + module.w.sum(), (y * y).sum()),
        algorithm=gameopt.SimGD(1000.0),
    )
    game.step()
    with torch.no_grad():
        module.v[0] += 64000.0  # a view of the game's point: written in place
    assert float(module.v[0].detach()) == 64992.0  # 1000 + 64000, rounded to float16
    with pytest.raises(gameopt.NonFiniteError, match="player 'gen' overflows float16"):
        game.step()


def test_a_constrained_parameter_is_moved_through_its_set_not_refused_for_its_sum() -> None:
    """A box at float16's edge: w + delta overflows, its projection does not. The
    check of the new point looks at the sets' points for constrained parameters."""
    module = nn.Module()
    module.w = nn.Parameter(torch.full((3,), 65000.0, dtype=torch.float16))
    module.v = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    y = nn.Parameter(torch.zeros(2, dtype=torch.float16))
    box = gameopt.constraints.Box(-65000.0, 65000.0)
    game = gameopt.Game(
        [gameopt.Player(module, name="gen", constraint={"w": box}), gameopt.Player([y], name="disc")],
        lambda: (-(module.w.sum() + module.v.sum()), (y * y).sum()),
        algorithm=gameopt.SimGD(1000.0),
    )
    game.step()
    assert torch.equal(module.w.detach(), torch.full((3,), 65000.0, dtype=torch.float16))
    assert torch.equal(module.v.detach(), torch.full((3,), 1000.0, dtype=torch.float16))
    with torch.no_grad():
        module.v[0] = 65000.0  # the unconstrained part of the same group now overflows
    before = _snapshot(game)
    with pytest.raises(gameopt.NonFiniteError, match="the new point of player 'gen' overflows float16"):
        game.step()
    assert _same(before, _snapshot(game))


@pytest.mark.parametrize(
    "make, constraint",
    [
        (lambda: gameopt.SimGD(0.1), None),
        (lambda: gameopt.Extragradient(0.1), None),
        (lambda: gameopt.SimGD(0.1, update=gameopt.Adam()), None),
        (lambda: gameopt.SimGD(0.1), gameopt.constraints.Simplex()),
    ],
    ids=["SimGD", "Extragradient", "SimGD+Adam", "SimGD+simplex"],
)
def test_a_step_far_from_the_limit_reads_the_point_only_after_an_outside_write(monkeypatch, make, constraint) -> None:
    """No pass over the point per step: it is read once (the bound starts unknown),
    then only after a write the game did not make."""
    reads = []
    real = moves.max_abs
    monkeypatch.setattr(moves, "max_abs", lambda t: reads.append(t.numel()) or real(t))
    x = nn.Parameter(torch.full((100,), 0.01, dtype=torch.float32))
    y = nn.Parameter(torch.full((100,), 0.01, dtype=torch.float32))
    sets = {"constraint": constraint} if constraint is not None else {}
    game = gameopt.Game(
        [gameopt.Player([x], name="x", **sets), gameopt.Player([y], name="y", **sets)],
        lambda: ((x * y).sum() + (x * x).sum(), -(x * y).sum() + (y * y).sum()),
        algorithm=make(),
    )
    game.step()
    assert len(reads) == 1
    for _ in range(5):
        game.step()
    assert len(reads) == 1
    with torch.no_grad():
        x.mul_(0.5)
    game.step()
    assert len(reads) == 2


def test_the_finiteness_verdict_does_not_overflow_a_sum_of_finite_values() -> None:
    """The verdict on a step was a sum, which overflows for large finite values (100
    values of 1e37 sum past float32's largest): such a step was refused as non-finite."""
    t = torch.full((100,), 1e37)
    assert vec.all_finite([t]) is True
    assert vec.finite_bounds([t]) == [float(t[0])]  # the sum of squares overflows: read exactly
    x, y, game = _pair(torch.float32, 100, 1e37)
    game.step()
    assert torch.equal(x.detach(), t)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("n", [5, 1000])
def test_finite_bounds_bound_the_largest_absolute_value(dtype, n) -> None:
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype)
    parts = torch.view_as_real(t) if dtype.is_complex else t
    largest = float(parts.abs().max())
    (bound,) = vec.finite_bounds([t])
    assert largest <= bound <= math.sqrt(2 * n) * largest * 1.01  # a norm at worst
    assert vec.finite_bounds([t, torch.zeros(0, dtype=dtype)])[1] == 0.0
    t.view(-1)[n // 2] = float("nan")
    assert vec.finite_bounds([t]) is None


# ------------------------------------------------------ item 7: penalty coefficients
def _infeasible(dtype: torch.dtype = torch.float32, **update):
    """A quadratic-penalty game whose one inequality is violated at every step (its
    strict value is 1; its surrogate 0, so the loss stays finite at any coefficient)."""
    model = nn.Linear(2, 1).to(dtype)

    def fn():
        f = model.weight.square().sum()
        return f, gameopt.Proxy(0 * model.weight.sum().reshape(1), torch.ones(1, dtype=dtype)), None

    return gameopt.LagrangianGame(
        model,
        fn,
        num_ineq=1,
        algorithm=gameopt.SimGD(1e-3),
        penalty=1.0,
        formulation="quadratic_penalty",
        penalty_update=gameopt.MultiplicativePenalty(growth=1.1, **update),
    )


def _set_penalty(problem, value: float) -> None:
    saved = problem.state_dict()
    saved["penalties"]["ineq"].fill_(value)
    problem.load_state_dict(saved)


@pytest.mark.parametrize("cap", [None, 123456789.0], ids=["default", "not-a-float32"])
def test_a_growing_penalty_coefficient_stops_at_max_coefficient_with_one_warning(caplog, cap) -> None:
    problem = _infeasible() if cap is None else _infeasible(max_coefficient=cap)
    cap = float(torch.tensor(cap or 1e8, dtype=torch.float32))  # the default is 1e8; as float32 holds it
    _set_penalty(problem, 0.95 * cap)
    with caplog.at_level(logging.WARNING, logger="gameopt.constrained.penalties"):
        problem.step()
        problem.step()
    assert float(problem.penalties[0]) == cap  # not 0.95 * 1.1 * cap
    warnings = [r for r in caplog.records if "reached the cap" in r.getMessage()]
    assert len(warnings) == 1 and "inequality constraints [0]" in warnings[0].getMessage()


def test_a_penalty_coefficient_near_the_dtype_limit_stays_finite_and_loadable() -> None:
    """float32 at growth 1.1 reaches infinity after about 930 violated steps: start near it."""
    problem = _infeasible(max_coefficient=1e300)  # a cap above float32's range: the dtype's largest
    _set_penalty(problem, 3.2e38)
    problem.step()
    assert float(problem.penalties[0]) == torch.finfo(torch.float32).max
    problem.step()
    assert float(problem.penalties[0]) == torch.finfo(torch.float32).max
    fresh = _infeasible(max_coefficient=1e300)
    fresh.load_state_dict(problem.state_dict())  # the checkpoint loads
    assert torch.equal(fresh.penalties[0], problem.penalties[0])


def test_a_loaded_coefficient_above_the_cap_is_kept() -> None:
    problem = _infeasible()
    _set_penalty(problem, 5e8)
    problem.step()
    assert float(problem.penalties[0]) == 5e8


def test_penalty_cap_settings_are_checked() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="max_coefficient"):
            gameopt.MultiplicativePenalty(max_coefficient=bad)
    with pytest.raises(ValueError, match="penalty=10 exceeds the cap of its growth"):
        gameopt.LagrangianGame(
            nn.Linear(2, 1),
            lambda: None,
            num_ineq=1,
            penalty=10.0,
            formulation="quadratic_penalty",
            penalty_update=gameopt.MultiplicativePenalty(max_coefficient=5.0),
        )


# ---------------------------------------------------------- item 8: the loss scale
def _scaled(growth_interval: int):
    torch.manual_seed(0)
    x = nn.Parameter(torch.randn(4).half())
    y = nn.Parameter(torch.randn(4).half())
    return gameopt.Game(
        [gameopt.Player([x], name="x"), gameopt.Player([y], name="y")],
        lambda: ((x * y).sum() + (x * x).sum(), -(x * y).sum() + (y * y).sum()),
        algorithm=gameopt.SimGD(1e-3),
        loss_scale=gameopt.DynamicLossScale(init_scale=8.0, growth_interval=growth_interval),
    )


def test_a_loss_scale_checkpoint_saved_with_other_settings_is_refused_and_changes_nothing() -> None:
    game = _scaled(growth_interval=5)
    for _ in range(4):
        game.step()
    saved = game.state_dict()
    assert saved["loss_scale"]["settings"] == {"growth": 2.0, "backoff": 0.5, "growth_interval": 5}
    other = _scaled(growth_interval=3)
    other.step()
    before = other.state_dict()
    with pytest.raises(ValueError, match=r"loss_scale: .*growth_interval: 5 in the checkpoint, 3 here"):
        other.load_state_dict(saved)
    assert _same(before, other.state_dict())
    _scaled(growth_interval=5).load_state_dict(saved)  # the same settings load


def test_a_loss_scale_count_at_or_past_its_interval_grows_at_once() -> None:
    """A checkpoint without settings (an older version's) may carry a count past this
    game's interval: the next good step grows the scale, as a count at the interval would."""
    game = _scaled(growth_interval=5)
    for _ in range(4):
        game.step()
    saved = game.state_dict()
    saved["loss_scale"] = {"scale": 8.0, "good_steps": 4}  # as older versions saved it
    other = _scaled(growth_interval=3)
    other.load_state_dict(saved)
    other.step()
    assert other.loss_scale.scale == 16.0 and other.loss_scale.good_steps == 0
    scale = gameopt.DynamicLossScale(init_scale=8.0, growth_interval=3)
    scale.load_state_dict({"scale": 8.0, "good_steps": 7})
    scale.update(finite=True)
    assert scale.scale == 16.0


# ------------------------------------------------- a refusal that a setting causes
def _half_adam(verdict: str, rule: gameopt.UpdateRule):
    """A float16 player 'y' beside a float32 one, with gradients of 1e-3: Adam's first
    second moment, 1e-3 · (1e-3)², underflows to 0 in float16."""
    x = nn.Parameter(torch.full((8,), 1e-3))
    y = nn.Parameter(torch.full((8,), 1e-3, dtype=torch.float16))
    game = gameopt.Game(
        [gameopt.Player([x], name="x"), gameopt.Player([y], name="y")],
        lambda: ((x * y.float()).sum(), -(x * y.float()).sum()),
        algorithm=gameopt.SimGD(1e-2, update=rule),
        verdict=verdict,
    )
    return game, [x, y]


@pytest.mark.parametrize("verdict", ["host", "device"])
@pytest.mark.parametrize("rule", ["Adam", "RMSProp"])
def test_a_float16_step_refused_for_an_eps_that_float16_loses_says_so(verdict: str, rule: str) -> None:
    """ε = 1e-8 is 0 in float16: the direction divides by 0 where the second moment
    underflows (torch.optim's Adam writes -inf there). The refusal names the player,
    the rule and the setting; the step the advice gives is taken."""
    game, params = _half_adam(verdict, getattr(gameopt, rule)())
    before = [p.detach().clone() for p in params]
    with pytest.raises(gameopt.NonFiniteError, match=rf"player 'y': {rule}'s eps=1e-08 is 0 in float16.*eps >= 1e-4"):
        game.step()
        game.synchronize()
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    game, params = _half_adam(verdict, getattr(gameopt, rule)(eps=1e-4))
    game.step()
    game.synchronize()
    assert all(bool(torch.isfinite(p).all()) and not torch.equal(p, b) for p, b in zip(params, before))


def test_a_refusal_names_non_finite_losses_rather_than_a_setting() -> None:
    """Where a loss is not finite, that is what the message says."""
    game, (x, y) = _half_adam("host", gameopt.Adam())
    game.losses = lambda: ((x * y.float()).sum() * float("nan"), -(x * y.float()).sum())
    with pytest.raises(gameopt.NonFiniteError, match=r"\(non-finite losses: x\); the step was refused") as raised:
        game.step()
    assert "eps" not in str(raised.value)
