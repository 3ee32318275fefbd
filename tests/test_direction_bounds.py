"""Bounds on a rule's direction known without reading it (gameopt.direction_bounds):
they hold for the directions the rules' own kernels compute, over magnitudes from
below the smallest normal number to near overflow, in every dtype they are given for;
a step whose bound is not known reads its direction, and what the game then refuses
it still refuses (nothing changed)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gameopt
from gameopt import direction_bounds as db
from gameopt.testing import oracle
from gameopt.vec import Scaled, Vec

DTYPES = [torch.float32, torch.float64, torch.complex64]
N = db.WORTH_FROM  # elements: a bound is sought from here on


def _gradients(dtype: torch.dtype, steps: int, seed: int) -> list[torch.Tensor]:
    """Gradients whose magnitudes jump by many orders per element and per step (down
    to subnormal numbers and up to ~1e18), with zeros for runs of steps."""
    g = torch.Generator().manual_seed(seed)
    real = torch.float64 if dtype == torch.float64 else torch.float32
    out = []
    for _ in range(steps):
        scale = 10.0 ** torch.randint(-44 if real == torch.float32 else -320, 18, (N,), generator=g).double()
        d = (torch.randn(N, generator=g, dtype=torch.float64) * scale).to(real)
        d[torch.rand(N, generator=g) < 0.3] = 0.0
        out.append(torch.complex(d, d.flip(0)) if dtype.is_complex else d)
    return out


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _max_abs(t: torch.Tensor) -> float:
    return _real(t).abs().max().item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.0, 0.99), (0.5, 0.5), (0.99, 0.9)])
@pytest.mark.parametrize("eps", [1e-8, 1e-3])
def test_adams_bound_holds_for_its_directions_over_many_steps(dtype, betas, eps) -> None:
    """Each step's bound (from the last state's ratio, not from reading the direction)
    is at least the direction's largest value, and each state's ratio at least its
    max|m| / (√v + ε) in float64; with β₁² > β₂ the ratio grows until none is known."""
    rule = gameopt.Adam(betas=betas, eps=eps)
    state = rule.init(Vec([torch.zeros(N, dtype=dtype)]))
    known = 0
    for d in _gradients(dtype, 40, seed=1):
        out, state = rule.apply(Vec([d.clone()]), state, scratch=True)
        if not torch.isfinite(_real(state["v"][0])).all():
            continue  # the step's check refuses it (v is read)
        (bound,) = rule.direction_bounds(state, out)
        if bound is None:
            continue
        known += 1
        assert _max_abs(out[0]) <= bound
        m, v = (_real(t).double() for t in (state["m"][0], state["v"][0]))
        assert (m.abs() / (v.sqrt() + eps)).max().item() <= bound / rule._correction(state["t"])
    assert known >= 10


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("convention", ["torch", "tf1"])
@pytest.mark.parametrize("decay", [0.0, 0.9, 0.99])
def test_rmsprops_bound_holds_for_its_directions(dtype, convention, decay) -> None:
    """|d| / (√v₁ + ε) <= 1 / √(1 − ρ) (with room for rounding), whatever v₀ held."""
    rule = gameopt.RMSProp(decay=decay, convention=convention)
    state = rule.init(Vec([torch.zeros(N, dtype=dtype)]))
    tight = 0.0
    for d in _gradients(dtype, 30, seed=2):
        out, state = rule.apply(Vec([d.clone()]), state, scratch=True)
        (bound,) = rule.direction_bounds(state, out)
        assert bound is not None
        assert _max_abs(out[0]) <= bound
        tight = max(tight, _max_abs(out[0]) / bound)
    assert tight > 0.99  # the bound is reached (up to its margin): it is not loose


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_no_bound_is_known_below_float32s_precision(dtype) -> None:
    d = Vec([torch.ones(N, dtype=dtype)])
    for rule in (gameopt.Adam(), gameopt.RMSProp()):
        out, state = rule.apply(d.clone(), rule.init(d))
        assert rule.direction_bounds(state, out) == [None]


@pytest.mark.parametrize("rule", [gameopt.Adam(eps=0.0), gameopt.Adam(eps=1e-30), gameopt.RMSProp(eps=0.0)])
def test_no_bound_is_known_where_eps_cannot_take_an_underflow(rule) -> None:
    """ε = 0 (0/0 where d and v are 0), or below √tiny / u in float32."""
    d = Vec([torch.ones(N)])
    out, state = rule.apply(d.clone(), rule.init(d))
    assert rule.direction_bounds(state, out) == [None]


def test_a_state_with_no_ratio_kept_has_it_read_once() -> None:
    """A state from elsewhere (a checkpoint's) has its ratio read when its step is
    checked; the steps after follow from it."""
    rule = gameopt.Adam()
    m, v = Vec([torch.full((N,), 2.0)]), Vec([torch.full((N,), 1.0)])
    out, state = rule.apply(Vec([torch.ones(N)]), {"m": m, "v": v, "t": 3})
    (bound,) = rule.direction_bounds(state, out)
    assert _max_abs(out[0]) <= bound
    ratio = (state["m"][0].abs() / (state["v"][0].sqrt() + 1e-8)).max().item()
    assert bound == pytest.approx(rule._correction(4) * ratio, rel=1e-5)


def test_a_ratio_kept_for_another_eps_is_read_again() -> None:
    """The ratio depends on ε: after ``rule.eps`` is lowered, a ratio kept for the old ε
    would bound m/(√v + ε) far too low where v is 0."""
    rule = gameopt.Adam(eps=1e-3)
    zero = Vec([torch.zeros(N)])
    state = {"m": Vec([torch.ones(N)]), "v": Vec([torch.zeros(N)]), "t": 3}
    out, state = rule.apply(zero.clone(), state)
    assert rule.direction_bounds(state, out) is not None  # read, and kept for ε = 1e-3
    rule.eps = 1e-8
    out, state = rule.apply(zero.clone(), state)
    (bound,) = rule.direction_bounds(state, out)
    assert _max_abs(out[0]) <= bound and _max_abs(out[0]) > 1e6


def _game(update: gameopt.UpdateRule, big: float = 0.0):
    x = nn.Parameter(torch.ones(N // 2))
    y = nn.Parameter(torch.ones(N // 2))

    def losses():
        return (x * y).sum() + big * x.sum(), -(x * y).sum()

    players = [gameopt.Player([x]), gameopt.Player([y])]
    return gameopt.Game(players, losses, algorithm=gameopt.SimGD(0.1, update=update)), (x, y)


@pytest.mark.parametrize("update", [gameopt.Adam(), gameopt.RMSProp()])
def test_the_step_carries_its_bounds_and_a_subclass_formula_does_not_inherit_them(update) -> None:
    game, _ = _game(update)
    game.step()
    step, _ = game.algorithm.update(oracle(game), game.algorithm_state)
    assert isinstance(step, Scaled) and step.bounds is not None and None not in step.bounds

    class OwnFormula(type(update)):  # type: ignore[misc]
        def _direction(self, m1, v1, t, den, out):
            out.copy_(m1)

    class OwnApply(type(update)):  # type: ignore[misc]
        def apply(self, d, state, empty=None, scratch=False, own_state=False):
            return super().apply(d, state, empty, scratch=scratch, own_state=own_state)

    assert OwnApply.direction_bounds is gameopt.UpdateRule.direction_bounds
    if isinstance(update, gameopt.Adam):
        assert OwnFormula.direction_bounds is gameopt.UpdateRule.direction_bounds


def test_a_state_written_in_place_has_its_ratio_read_again_and_an_overflow_is_refused() -> None:
    """The ratio kept beside a state goes stale when the state is written (its version
    counters move): m set to 3e38 with v = 0 makes the direction overflow, and the
    step is refused, nothing changed."""
    game, params = _game(gameopt.Adam())
    for _ in range(3):
        game.step()
    state = game.algorithm_state["rule"]
    state["m"][0].fill_(3e38)
    state["v"][0].zero_()
    m, v, t = state["m"][0].clone(), state["v"][0].clone(), state["t"]
    points = [p.detach().clone() for p in params]
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
    state = game.algorithm_state["rule"]
    assert torch.equal(state["m"][0], m) and torch.equal(state["v"][0], v) and state["t"] == t
    assert all(torch.equal(p.detach(), q) for p, q in zip(params, points))


def test_a_loaded_checkpoint_whose_direction_overflows_is_refused() -> None:
    """A checkpoint's state (finite, so it loads) has no ratio kept: it is read, and a
    direction that overflows is refused as before."""
    game, _ = _game(gameopt.Adam())
    game.step()
    saved = game.state_dict()
    rule_state = saved["algorithm"]["state"]["rule"]
    rule_state["m"][0].fill_(3e38)
    rule_state["v"][0].zero_()
    game.load_state_dict(saved)
    with pytest.raises(gameopt.NonFiniteError):
        game.step()


def test_no_bound_is_sought_for_small_vectors() -> None:
    """Below WORTH_FROM elements the direction is read: cheaper than the bookkeeping."""
    for rule in (gameopt.Adam(), gameopt.RMSProp()):
        d = Vec([torch.ones(N - 1)])
        out, state = rule.apply(d.clone(), rule.init(d))
        assert rule.direction_bounds(state, out) is None


def test_the_chunked_read_of_a_ratio_is_the_ratio() -> None:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(3 * (1 << 16) + 5, generator=g)
    v = torch.rand(m.numel(), generator=g)
    (r,) = db.read_ratios(Vec([m]), Vec([v]), 1e-8)
    exact = (m.double().abs() / (v.double().sqrt() + 1e-8)).max().item()
    assert exact <= r <= exact * (1 + 1e-5)
    assert db.read_ratios(Vec([m.half()]), Vec([v.half()]), 1e-8) == [math.inf]


# ---------------------------------------- cases a review found (each broke the bounds)
@pytest.fixture
def flushed():
    """Denormals flushed to zero, on one thread (torch sets the flag for the calling
    thread only), restored after (to torch's defaults: it has no getter for the flag)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU cannot flush denormals")
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _two_steps(rule, m0, v0, d1=None):
    """A state set by hand (its ratio read at the first step), then a step of the
    ratio's recursion: each step's bound against its direction."""
    state = {"m": Vec([m0]), "v": Vec([v0]), "t": 0}
    seen = []
    for d in (d1 if d1 is not None else torch.zeros_like(m0), torch.zeros_like(m0)):
        out, state = rule.apply(Vec([d]), state, scratch=True)
        (bound,) = rule.direction_bounds(state, out)
        seen.append((bound, _max_abs(out[0])))
    return seen


def test_a_read_ratio_bounds_no_direction_whose_numerator_overflows() -> None:
    """addcdiv forms c·m₁ first: with c ≈ 7 (β₂ = 0.5) and m₁ near float32's largest,
    it overflows though m₁ and v₁ are finite."""
    m0, v0 = torch.zeros(N), torch.zeros(N)
    m0[0] = v0[0] = 3e38
    rule = gameopt.Adam(betas=(0.9, 0.5))
    out, state = rule.apply(Vec([torch.zeros(N)]), {"m": Vec([m0]), "v": Vec([v0]), "t": 0}, scratch=True)
    assert not torch.isfinite(out[0]).all() and rule.direction_bounds(state, out) == [None]


def test_the_recursion_takes_lerps_weight_as_float32_rounds_it() -> None:
    """β₁ = 2⁻¹⁰ + 1.01·2⁻²⁵: float32's 1 − β₁ rounds down, so lerp weighs m₀ by a β₁
    3e-5 larger than the Python number."""
    m0 = torch.zeros(N)
    m0[0] = 1e10
    rule = gameopt.Adam(betas=(2**-10 + 1.01 * 2**-25, 1 - 1e-5))
    for bound, actual in _two_steps(rule, m0, torch.zeros(N)):
        assert bound is not None and actual <= bound


def _subnormal_beta2() -> tuple[float | None, float]:
    m0, d1 = torch.zeros(N), torch.zeros(N)
    m0[0], d1[0] = 1e33, 1e18
    (_, _), (bound, actual) = _two_steps(gameopt.Adam(betas=(0.5, 1.49 * 2.0**-149)), m0, torch.zeros(N), d1)
    return bound, actual


def test_no_bound_is_known_where_beta2_falls_below_the_smallest_normal() -> None:
    """mul(v₀, β₂) takes β₂ in float32: 1.49·2⁻¹⁴⁹ rounds to 2⁻¹⁴⁹ (and flushed to zero,
    a subnormal β₂ is 0); the recursion divides by √β₂."""
    bound, actual = _subnormal_beta2()
    assert bound is None or actual <= bound


def test_no_bound_is_known_where_beta2_is_flushed_to_zero(flushed) -> None:
    bound, actual = _subnormal_beta2()
    assert bound is None or actual <= bound


def test_a_ratio_read_with_a_huge_eps_and_denormals_flushed_bounds_the_direction(flushed) -> None:
    """1/(√v + ε) is subnormal for ε = 1e38: flushed to zero, a reciprocal made the read
    ratio 0."""
    rule = gameopt.Adam(eps=1e38)
    m0 = torch.full((N,), -3e38)
    out, state = rule.apply(Vec([torch.zeros(N)]), {"m": Vec([m0]), "v": Vec([torch.zeros(N)]), "t": 0})
    (bound,) = rule.direction_bounds(state, out)
    assert bound is None or _max_abs(out[0]) <= bound


@pytest.mark.parametrize("v0", [-1.0, -1.0 + 2.0**-23])
@pytest.mark.parametrize(
    "update", [lambda: gameopt.RMSProp(decay=0.5), lambda: gameopt.Adam(betas=(0.0, 0.5))], ids=["RMSProp", "Adam"]
)
def test_a_second_moment_written_negative_in_place_is_not_trusted(v0, update) -> None:
    """RMSProp's bound needs v₀ >= 0: a state written in place (its version counter
    moves) is read again. v₀ = −1 makes v₁ negative (a NaN direction); v₀ = −1 + 2⁻²³
    makes v₁ = 2⁻²⁴, a direction of ~4096 against a bound of √2, which at lr 1e35
    overflows the point. Both steps are refused, nothing changed (so is Adam's)."""
    game, (x, y) = _game(update())
    game.algorithm.param_groups[0]["lr"] = game.algorithm.param_groups[1]["lr"] = 0.0
    game.step()
    for group in game.algorithm.param_groups:
        group["lr"] = 1e35
    game.algorithm_state["rule"]["v"][0].fill_(v0)
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
    assert torch.equal(x.detach(), torch.ones(N // 2)) and torch.equal(y.detach(), torch.ones(N // 2))


def test_rmsprop_reads_the_sign_of_a_state_from_elsewhere_once() -> None:
    """A state set by hand: no bound at its first step (its v₁ >= 0 is read then), a
    bound from the next on."""
    rule = gameopt.RMSProp()
    state = {"v": Vec([torch.ones(N)])}
    out, state = rule.apply(Vec([torch.ones(N)]), state)
    assert rule.direction_bounds(state, out) is None
    out, state = rule.apply(Vec([torch.ones(N)]), state)
    assert rule.direction_bounds(state, out) is not None
