"""Issue #33, the smaller misuses: NashConv on integer payoffs and non-probability
strategies; Follow-the-Ridge and Stackelberg on a singular follower (CG's
breakdown, the damping setting); a checkpoint or a step inside
``Averaging.averaged()``; losses that are None, integer or boolean; fixed
settings assigned after construction; one update rule for two players; DiCE's
degenerate inputs."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
from games import assert_same_state
from torch import nn

import gameopt
import gameopt.dice
import gameopt.updates
from gameopt.linalg import BreakdownError, cg
from gameopt.settings import Setting

F64 = torch.float64
RPS = [[0, -1, 1], [1, 0, -1], [-1, 1, 0]]


def _params(game: gameopt.Game) -> list[torch.Tensor]:
    """Each player's parameters (one flat tensor each: one dtype here), copied."""
    return [t.detach().clone() for t in game.layout.per_player(game.layout.data)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------- NashConv (17)
def test_nash_conv_of_integer_payoffs_is_computed_in_floating_point() -> None:
    rps = torch.tensor(RPS)  # int64
    x, y = torch.tensor([0.5, 0.5, 0.0], dtype=F64), torch.full((3,), 1 / 3, dtype=F64)
    got = gameopt.nash_conv([rps, -rps], [x, y])
    assert got.dtype == F64
    assert float(got) == pytest.approx(0.5, rel=1e-14)
    assert torch.equal(got, gameopt.nash_conv([rps.to(F64), -rps.to(F64)], [x, y]))
    # integer payoffs and pure (one-hot integer) strategies: torch's default dtype
    pure = gameopt.nash_conv([rps, -rps], [torch.tensor([1, 0, 0]), torch.tensor([0, 1, 0])])
    assert pure.dtype == torch.get_default_dtype() and float(pure) == 2.0


def test_nash_conv_takes_strategies_that_require_grad_without_a_warning() -> None:
    """Strategies being learned (leaves that require grad): the probability check reads
    them outside the graph (the suite turns warnings into errors), and NashConv stays
    differentiable in them."""
    rps = torch.tensor(RPS, dtype=F64)
    x = torch.tensor([0.5, 0.5, 0.0], dtype=F64, requires_grad=True)
    y = torch.full((3,), 1 / 3, dtype=F64, requires_grad=True)
    got = gameopt.nash_conv([rps, -rps], [x, y])
    assert float(got.detach()) == pytest.approx(0.5, rel=1e-14)
    got.backward()
    assert x.grad is not None and y.grad is not None


@pytest.mark.parametrize(
    "strategy, match",
    [
        (torch.tensor([float("nan"), 0.5, 0.5], dtype=F64), "is not a probability vector"),
        (torch.tensor([0.5, float("nan"), 0.5], dtype=F64), "is not a probability vector"),
        (torch.tensor([-0.5, 1.0, 0.5], dtype=F64), "is not a probability vector"),
        (torch.tensor([0.5, 0.6, 0.0], dtype=F64), "is not a probability vector"),
        (torch.tensor([float("inf"), 0.0, 0.0], dtype=F64), "is not a probability vector"),
        (torch.tensor([[0.5, 0.5, 0.0]], dtype=F64), r"must be a real vector \(a 1-D tensor\), got shape \(1, 3\)"),
        (torch.tensor([1, 1, -1]), "is not a probability vector"),
        ([0.5, 0.5, 0.0], "must be a real vector .* got list"),
    ],
)
def test_nash_conv_refuses_what_is_not_a_probability_vector(strategy, match) -> None:
    rps = torch.tensor(RPS, dtype=F64)
    with pytest.raises(ValueError, match=r"^strategies\[0\] " + match):
        gameopt.nash_conv([rps, -rps], [strategy, torch.full((3,), 1 / 3, dtype=F64)])


# -------------------------------------------- Follow-the-Ridge, Stackelberg (18)
def _bilinear(algorithm: gameopt.Algorithm) -> gameopt.Game:
    """f(x, y) = x·y, losses (f, −f): the follower's Hessian ∇²_yy is 0."""
    x = nn.Parameter(torch.tensor([1.0, -2.0], dtype=F64))
    y = nn.Parameter(torch.tensor([0.5, 3.0], dtype=F64))
    players = [gameopt.Player([x], name="x"), gameopt.Player([y], name="y")]
    return gameopt.Game(players, lambda: ((x * y).sum(), -(x * y).sum()), algorithm=algorithm)


@pytest.mark.parametrize(
    "make, block",
    [
        (gameopt.FollowTheRidge, "the Hessian ∇²_yy f of player 'y'"),
        (gameopt.Stackelberg, "the follower's Hessian ∇²_yy f_2 of player 'y'"),
    ],
)
def test_a_singular_follower_is_refused_naming_the_block_and_nothing_changes(make, block) -> None:
    game = _bilinear(make(0.1))
    before = _params(game)
    with pytest.raises(BreakdownError, match=rf"^{make.__name__}: {block} is singular .* damping=") as info:
        game.step()
    assert isinstance(info.value, ArithmeticError) and not isinstance(info.value, ZeroDivisionError)
    assert _same(before, _params(game)) and game.algorithm_state == {}


@pytest.mark.parametrize("damping", [0.5, 2.0])
def test_a_damped_follower_takes_the_closed_form_step(damping) -> None:
    lx, ly = 0.1, 0.2
    for make in (gameopt.FollowTheRidge, gameopt.Stackelberg):
        game = _bilinear(make([lx, ly], damping=damping))
        x, y = _params(game)
        game.step()
        if make is gameopt.FollowTheRidge:  # z = (−H_yy + λI)⁻¹ H_yx ∇_x f = y/λ
            want = [x - lx * y, y + ly * x - lx * y / damping]
        else:  # x − η_x(∇_x f₁ − ∇²_xy f₂ (∇²_yy f₂ + λI)⁻¹ ∇_y f₁) = x − η_x(y + x/λ)
            want = [x - lx * (y + x / damping), y + ly * x]
        for got, ref in zip(_params(game), want):
            torch.testing.assert_close(got, ref, rtol=1e-15, atol=1e-15)


def test_damping_is_a_checked_setting_and_zero_keeps_the_identity_of_older_checkpoints() -> None:
    for make in (gameopt.FollowTheRidge, gameopt.Stackelberg):
        for bad in (-1.0, float("nan"), "1e-3", None):
            with pytest.raises(ValueError, match=r"^damping must be"):
                make(0.1, damping=bad)
        assert "damping" not in make(0.1).identity()["settings"]  # checkpoints from before the setting load
        assert make(0.1, damping=0.5).identity()["settings"]["damping"] == 0.5


@pytest.mark.parametrize("check_every", [1, 2])
def test_cg_raises_a_breakdown_on_a_singular_operator(check_every) -> None:
    """A zero curvature pᵀAp = 0 before convergence (the second direction of this
    system, exactly (0, 2)): a BreakdownError, from either path (no ZeroDivisionError,
    no non-finite x)."""
    m = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    b = [torch.tensor([1.0, 1.0], dtype=F64)]  # not in m's range
    with pytest.raises(BreakdownError, match=r"pᵀAp = 0"):
        cg(lambda v: [m @ v[0]], b, check_every=check_every)
    with pytest.raises(BreakdownError):
        cg(lambda v: [0 * v[0]], b, check_every=check_every)
    x, _ = cg(lambda v: [m @ v[0]], [torch.tensor([3.0, 0.0], dtype=F64)], check_every=check_every)
    assert torch.equal(x[0], torch.tensor([3.0, 0.0], dtype=F64))  # b in the range: solved


# ------------------------------------------------ inside Averaging.averaged() (a)
def _averaged_game(outer: bool = True):
    """A bilinear game under Averaging (outermost, or the base of a Lookahead) after
    three steps: the iterate and the average differ."""
    x = nn.Parameter(torch.tensor([1.0, -2.0], dtype=F64))
    y = nn.Parameter(torch.tensor([0.5, 3.0], dtype=F64))
    avg = gameopt.Averaging(gameopt.SimGD(0.1, update=gameopt.Adam()))
    algo = avg if outer else gameopt.Lookahead(avg, k=2)
    game = gameopt.Game([x, y], lambda: ((x * y).sum(), -(x * y).sum()), algorithm=algo)
    for _ in range(3):
        game.step()
    return game, avg


@pytest.mark.parametrize("outer", [True, False], ids=["outermost", "base-of-lookahead"])
def test_a_checkpoint_inside_averaged_is_refused_and_one_after_it_resumes(outer) -> None:
    game, avg = _averaged_game(outer)
    iterate = _params(game)
    good = game.state_dict()
    with avg.averaged():
        assert not _same(iterate, _params(game))  # w̄ is in the parameters
        for call in (game.state_dict, game.optimizer.state_dict, lambda: game.load_state_dict(good)):
            with pytest.raises(RuntimeError, match=r"^a checkpoint .* inside Averaging.averaged\(\) is refused"):
                call()
        with pytest.raises(RuntimeError, match=r"^a step inside Averaging.averaged\(\) is refused"):
            game.step()
        with pytest.raises(RuntimeError, match=r"^a step inside Averaging.averaged\(\) is refused"):
            game.optimizer.step(game.losses)
        game.vector_field()  # evaluating at w̄ is what the block is for
    assert _same(iterate, _params(game))
    with pytest.raises(KeyError, match="body"), avg.averaged(), avg.averaged(players=[1]):  # nested, and raising
        raise KeyError("body")
    after = game.state_dict()  # the iterate, and a resume matches the run
    assert_same_state(after, good)  # the refused calls changed nothing
    twin, _ = _averaged_game(outer)
    twin.load_state_dict(after)
    for _ in range(2):
        game.step()
        twin.step()
    assert _same(_params(game), _params(twin))


# ----------------------------------------------------------------- losses (b)
def _loss_game(losses, algorithm: gameopt.Algorithm):
    x = nn.Parameter(torch.tensor([1.0, -2.0], dtype=F64))
    y = nn.Parameter(torch.tensor([0.5, 3.0], dtype=F64))
    players = [gameopt.Player([x], name="gen"), gameopt.Player([y], name="disc")]
    return gameopt.Game(players, lambda: losses(x, y), algorithm=algorithm)


_INT = r"the loss of player 'gen' is an integer tensor \(torch.int64\): losses must be real floating-point scalars"
_BAD_LOSSES = {
    "None": (lambda x, y: None, r"losses returned None: .* one scalar loss per player \(did it forget `return`\?\)"),
    "int": (lambda x, y: (torch.tensor(1), (x * y).sum()), _INT),
    "int-vector": (lambda x, y: torch.tensor([1, 2]), _INT),
    "argmax": (lambda x, y: ((x * y).argmax(), (x * y).sum()), _INT),
    "bool": (
        lambda x, y: ((x * y).sum() > 0, (x * y).sum()),
        r"the loss of player 'gen' is a boolean tensor \(torch.bool\): losses must be real floating-point",
    ),
    "complex": (
        lambda x, y: ((x * y).sum() * 1j, (x * y).sum()),
        r"the loss of player 'gen' is a complex tensor \(torch.complex128\)",
    ),
    "a float": (lambda x, y: 3.0, r"losses returned a float: .* one scalar loss per player"),
}


@pytest.mark.parametrize("name", list(_BAD_LOSSES))
@pytest.mark.parametrize("make", [lambda: gameopt.SimGD(0.1), lambda: gameopt.CGD(0.1)], ids=["SimGD", "CGD"])
def test_losses_that_are_none_integer_or_boolean_get_a_loss_error_naming_it(name, make) -> None:
    losses, match = _BAD_LOSSES[name]
    game = _loss_game(losses, make())
    before, state = _params(game), game.state_dict()
    with pytest.raises(gameopt.LossError, match=rf"^{match}"):
        game.step()
    assert _same(before, _params(game))
    assert_same_state(game.state_dict(), state)


# ------------------------------------------------------ one rule per player (d)
@pytest.mark.parametrize(
    "algorithm, message",
    [
        (lambda: gameopt.SimGD(0.1, update=[gameopt.Adam()]), "SimGD got 1 rules for 2 players"),
        (lambda: gameopt.SimGD(0.1, update=(gameopt.Adam(),)), "SimGD got 1 rules for 2 players"),
        (lambda: gameopt.SimGD(0.1, update=[gameopt.Adam()] * 3), "SimGD got 3 rules for 2 players"),
        (lambda: gameopt.SimGD([0.1]), "SimGD got 1 learning rates for 2 players"),
        (lambda: gameopt.Lookahead(gameopt.Optimistic(0.1, update=[gameopt.Momentum()])), "Optimistic got 1 rules"),
    ],
)
def test_an_update_list_of_the_wrong_length_is_refused_as_an_lr_list_is(algorithm, message) -> None:
    with pytest.raises(ValueError, match=rf"^{message}.*: give one per player, or one .* for all"):
        _loss_game(lambda x, y: ((x * y).sum(), -(x * y).sum()), algorithm())
    game = _loss_game(lambda x, y: ((x * y).sum(), -(x * y).sum()), gameopt.SimGD(0.1))
    before, state = _params(game), game.state_dict()
    with pytest.raises(ValueError, match=rf"^{message}"):
        game.algorithm = algorithm()
    assert type(game.algorithm) is gameopt.SimGD and _same(before, _params(game))
    assert_same_state(game.state_dict(), state)
    # one rule for all, as a rule or as a full list
    _loss_game(lambda x, y: ((x * y).sum(), -(x * y).sum()), gameopt.SimGD(0.1, update=[gameopt.Adam()] * 2)).step()


# ------------------------------------------------------------------- DiCE (e)
def _dice_inputs(t: int = 3, b: int = 4):
    g = torch.Generator().manual_seed(0)
    logps = [torch.randn(t, b, generator=g, dtype=F64).requires_grad_() for _ in range(2)]
    return logps, torch.randn(t, b, generator=g, dtype=F64)


@pytest.mark.parametrize(
    "t, b, match",
    [(3, 0, r"rewards has shape \(3, 0\): no episodes \(B = 0\)"), (0, 4, r"rewards has shape \(0, 4\): no steps")],
)
def test_dice_refuses_zero_episodes_or_steps(t, b, match) -> None:
    logps, rewards = _dice_inputs(t, b)
    with pytest.raises(ValueError, match=rf"^{match}"):
        gameopt.dice.objective(logps, rewards, 0.9)


@pytest.mark.parametrize("discount", ["0.9", None, True, torch.tensor(1), [0.9], 1j])
def test_dice_refuses_a_discount_that_is_not_a_number(discount) -> None:
    logps, rewards = _dice_inputs()
    with pytest.raises(ValueError, match=r"^discount must be a number in \[0, 1\], got"):
        gameopt.dice.objective(logps, rewards, discount)


@pytest.mark.parametrize("where", ["logps[1]", "rewards", "baseline"])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_dice_refuses_non_finite_inputs_naming_them(where, bad) -> None:
    logps, rewards = _dice_inputs()
    baseline = torch.zeros_like(rewards)
    target = {"logps[1]": logps[1], "rewards": rewards, "baseline": baseline}[where]
    with torch.no_grad():
        target[1, 2] = bad
    with pytest.raises(ValueError, match=rf"^{re.escape(where)} holds 1 non-finite value"):
        gameopt.dice.objective(logps, rewards, 0.9, baseline=baseline)


def test_dice_numbers_that_are_not_floats_still_count_as_discounts() -> None:
    logps, rewards = _dice_inputs()
    want = gameopt.dice.objective(logps, rewards, 0.5)
    for same in (np.float32(0.5), torch.tensor(0.5), 0.5):
        assert torch.equal(gameopt.dice.objective(logps, rewards, same), want)
    assert torch.equal(gameopt.dice.objective(logps, rewards, 1), gameopt.dice.objective(logps, rewards, 1.0))


# ------------------------------------------------ settings set after construction (c)
def _library_classes(root: type) -> list[type]:
    """Every public class of gameopt below ``root`` (a new algorithm or rule joins the table)."""
    out, todo = [], [root]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("gameopt.") and not cls.__name__.startswith("_"):
            out.append(cls)
    return sorted(set(out) - {gameopt.Algorithm, gameopt.Wrapper, gameopt.UpdateRule}, key=lambda c: c.__name__)


_NOT_SETTINGS = {"self", "lr", "update", "base"}
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_CONTAINERS = {gameopt.updates.PerPlayer}  # its argument is the rules, not a setting


def _declared(cls: type, name: str):
    for c in cls.__mro__:
        if name in vars(c):
            return vars(c)[name]
    return None


def _settings_table() -> list[tuple[type, str]]:
    rows = []
    for cls in _library_classes(gameopt.Algorithm) + _library_classes(gameopt.UpdateRule):
        if cls not in _CONTAINERS:
            params = inspect.signature(cls.__init__).parameters.values()
            rows += [(cls, p.name) for p in params if p.kind in _NAMED and p.name not in _NOT_SETTINGS]
    return rows


def _make(cls: type):
    return cls(gameopt.SimGD(0.1)) if issubclass(cls, gameopt.Wrapper) else cls()


def _curved_game(algorithm: gameopt.Algorithm) -> gameopt.Game:
    """f = x·y + ½‖x‖² − ½‖y‖², losses (f, −f): every algorithm of the table steps on it."""
    x = nn.Parameter(torch.tensor([1.0, -2.0], dtype=F64))
    y = nn.Parameter(torch.tensor([0.5, 3.0], dtype=F64))

    def losses():
        f = (x * y).sum() + 0.5 * (x * x).sum() - 0.5 * (y * y).sum()
        return f, -f

    return gameopt.Game([x, y], losses, algorithm=algorithm)


def _groups(algo: gameopt.Algorithm | None) -> list[dict] | None:
    """The settings in an algorithm's param groups (copies, without the parameters)."""
    return None if algo is None else [{k: v for k, v in g.items() if k != "params"} for g in algo.param_groups]


@pytest.mark.parametrize("bound", [False, True], ids=["unbound", "in-a-game"])
@pytest.mark.parametrize("cls, name", _settings_table(), ids=lambda v: getattr(v, "__name__", v))
def test_every_setting_is_checked_when_assigned_and_a_refusal_changes_nothing(cls, name, bound) -> None:
    assert isinstance(_declared(cls, name), (Setting, gameopt.Hyper)), (
        f"{cls.__name__}.{name}: declare it as a Setting (or a Hyper) so that assignments are checked"
    )
    obj = _make(cls)
    game = None
    if bound:
        game = _curved_game(gameopt.SimGD(0.1, update=obj) if isinstance(obj, gameopt.UpdateRule) else obj)
    algo = game.algorithm if game is not None else obj if isinstance(obj, gameopt.Algorithm) else None
    before = (getattr(obj, name), obj.identity(), _groups(algo))
    errors = (ValueError, TypeError) if name == "order" else ValueError  # AltGD keeps TypeError for non-indices
    with pytest.raises(errors, match=rf"^{name}\b"):
        setattr(obj, name, float("nan"))  # no setting takes NaN (the issue's own examples: the test below)
    after = (getattr(obj, name), obj.identity(), _groups(algo))
    assert repr(after[0]) == repr(before[0]) and after[1:] == before[1:]
    if game is not None:
        setattr(obj, name, before[0])  # a good value is taken
        game.step()


@pytest.mark.parametrize(
    "make, name, bad, message",
    [
        (lambda: gameopt.Lookahead(gameopt.SimGD(0.1)), "k", 0, r"k must be an integer in \[1, inf\), got 0"),
        (lambda: gameopt.Adam(), "eps", -1, r"eps must be a finite number in \[0, inf\), got -1"),
        (lambda: gameopt.CGD(), "maxiter", 0, r"maxiter must be an integer in \[1, inf\), got 0"),
        (lambda: gameopt.Averaging(gameopt.SimGD(0.1)), "kind", "median", r"kind must be one of \['uniform', 'ema'\]"),
        (lambda: gameopt.Momentum(), "nesterov", "no", r"nesterov must be True or False, got 'no'"),
        (lambda: gameopt.NuPI(kp=0.0, ki=1.0), "ki", 0.0, r"ki must be > 0 while kp is 0"),
        (lambda: gameopt.Extragradient(0.1), "extrapolation_lr", [-1.0], r"extrapolation_lr\[0\] must be"),
    ],
)
def test_the_issues_settings_assigned_after_construction_are_refused(make, name, bad, message) -> None:
    obj = make()
    before = getattr(obj, name)
    with pytest.raises(ValueError, match=rf"^{message}"):
        setattr(obj, name, bad)
    assert getattr(obj, name) == before


def test_settings_that_depend_on_the_game_are_checked_once_bound() -> None:
    eg = gameopt.Extragradient(0.1, extrapolation_lr=[0.1, 0.2])
    game = _curved_game(eg)
    with pytest.raises(ValueError, match=r"^extrapolation_lr has 3 values for 2 players"):
        eg.extrapolation_lr = [0.1, 0.2, 0.3]
    assert eg.extrapolation_lr == [0.1, 0.2]
    alt = gameopt.AltGD(0.1)
    game = _curved_game(alt)
    with pytest.raises(ValueError, match=r"^order must be a permutation of the players' indices 0..1, got \(0, 0\)"):
        alt.order = (0, 0)
    alt.order = [1, 0]
    assert alt.order == (1, 0)
    game.step()
