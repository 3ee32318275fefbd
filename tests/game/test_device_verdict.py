"""``Game(verdict="device")`` (issue #35, item 2): a step's verdict stays on the device,
a refused step is undone there, and its NonFiniteError surfaces by the end of the next
step or at ``game.synchronize()``. On the CPU, as on a GPU: the same code path, with
the host's reads counted (gameopt.testing.traffic)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

import gameopt
from benchmarks import traffic
from gameopt.game.verdict import Pending
from gameopt.state import tensors_in
from gameopt.testing import ALGORITHMS, learning_rates
from gameopt.testing.traffic import count

F64 = torch.float64

#: every first-order algorithm of the shared table, and RMSProp
TABLE = {a.name: a.make for a in ALGORITHMS} | {"SimGD-RMSProp": lambda lr: gameopt.SimGD(lr, update=gameopt.RMSProp())}


class Switch:
    """Losses that turn NaN while ``on``."""

    def __init__(self) -> None:
        self.on = False


def three_players(verdict: str, make, dtype: torch.dtype = F64, switch: Switch | None = None):
    """A general-sum game of three players (quadratic and a tanh coupling), its
    parameters, and a switch that makes its losses NaN."""
    torch.manual_seed(0)
    ws = [nn.Parameter(torch.randn(4, dtype=dtype)) for _ in range(3)]
    a = torch.randn(4, 4, dtype=dtype)
    switch = switch or Switch()

    def losses() -> tuple[Tensor, ...]:
        x, y, z = ws
        nan = float("nan") if switch.on else 1.0
        return (
            (x @ a @ y + 0.1 * (x * x).sum()) * nan,
            -(x @ a @ y) + torch.tanh(y @ z) + 0.1 * (y * y).sum(),
            (z - x).pow(2).sum() * 0.5,
        )

    players = [gameopt.Player([w], name=n) for w, n in zip(ws, "xyz")]
    return gameopt.Game(players, losses, algorithm=make(learning_rates(3)), verdict=verdict), ws, switch


def refused_step(game: gameopt.Game, switch: Switch) -> dict:
    """One good step, read; then one refused on the device (its verdict unread).
    Returns the game's state_dict between the two."""
    game.step()
    game.synchronize()
    before = copy.deepcopy(game.state_dict())
    switch.on = True
    game.step()
    switch.on = False
    return before


def same(a, b) -> bool:
    """Equal nested state dicts, tensors bit for bit."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Tensor):
        return isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", list(TABLE))
def test_the_device_verdict_takes_the_host_verdicts_steps_bit_for_bit(name: str, dtype: torch.dtype) -> None:
    host, hw, _ = three_players("host", TABLE[name], dtype)
    device, dw, _ = three_players("device", TABLE[name], dtype)
    for _ in range(6):
        host.step()
        device.step()
    device.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(hw, dw))
    assert same(host.state_dict(), device.state_dict())


@pytest.mark.parametrize("name", ["OptimisticAdam", "Extragradient", "Lookahead"])
def test_a_refused_step_changes_nothing_and_raises_at_the_end_of_the_next_step(name: str) -> None:
    game, ws, switch = three_players("device", TABLE[name])
    for _ in range(3):
        game.step()
    game.synchronize()
    before = copy.deepcopy(game.state_dict())
    points = [w.detach().clone() for w in ws]
    switch.on = True
    game.step()  # refused on the device: nothing read, nothing raised yet
    assert all(torch.equal(w, p) for w, p in zip(ws, points))  # the point never moved
    switch.on = False
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 4 .*not finite.*the step after it was refused with it"):
        game.step()  # a good step, refused with the one before it
    assert all(torch.equal(w, p) for w, p in zip(ws, points))
    assert same(game.state_dict(), before)
    game.step()  # and on it goes, from where step 4 began
    game.synchronize()
    reference, rws, _ = three_players("host", TABLE[name])
    for _ in range(4):
        reference.step()
    assert all(torch.equal(a, b) for a, b in zip(ws, rws))


def test_synchronize_raises_the_last_steps_refusal_once() -> None:
    game, ws, switch = three_players("device", TABLE["SimGD-momentum"])
    game.step()
    before = copy.deepcopy(game.state_dict())
    switch.on = True
    game.step()
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 \(its verdict read now.*non-finite losses: x\)"):
        game.synchronize()
    assert same(game.state_dict(), before)
    game.synchronize()  # read once: nothing more to raise
    switch.on = False
    game.step()
    game.synchronize()


def test_a_call_that_reads_the_game_first_reads_the_verdict_and_the_next_step_raises_it() -> None:
    """``state_dict`` after a refused step, not yet read, is the state the step started
    from (the verdict read first); the refusal is raised by the next step, which then
    does nothing."""
    game, ws, switch = three_players("device", TABLE["AltGD-Adam"])
    before = refused_step(game, switch)
    assert same(game.state_dict(), before)
    points = [w.detach().clone() for w in ws]
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.step()
    assert all(torch.equal(w, p) for w, p in zip(ws, points))
    assert same(game.state_dict(), before)


def test_a_refused_step_puts_back_the_module_buffers_it_and_the_next_step_moved() -> None:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)).double()
    disc = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1)).double()
    switch = Switch()

    def losses() -> tuple[Tensor, Tensor]:
        real, fake = disc(torch.randn(16, 2, dtype=F64)), disc(gen(torch.randn(16, 2, dtype=F64)))
        g = nn.functional.softplus(-fake).mean()
        return g * (float("nan") if switch.on else 1.0), (
            nn.functional.softplus(-real).mean() + nn.functional.softplus(fake).mean()
        )

    game = gameopt.Game([gen, disc], losses, algorithm=gameopt.Extragradient(0.05), verdict="device")
    game.step()
    game.synchronize()
    before = copy.deepcopy(game.state_dict())
    stats = [b.clone() for b in (*gen.buffers(), *disc.buffers())]
    switch.on = True
    game.step()
    switch.on = False
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(stats, (*gen.buffers(), *disc.buffers())))
    assert same(game.state_dict(), before)


def test_a_new_point_that_may_overflow_is_refused_on_the_device() -> None:
    w = nn.Parameter(torch.full((3,), 3e38))
    v = nn.Parameter(torch.ones(3))
    game = gameopt.Game(
        [gameopt.Player([w], name="w"), gameopt.Player([v], name="v")],
        lambda: (-(w * 1e37).sum() / 1e37, (v * v).sum()),
        algorithm=gameopt.SimGD(1e38),
        verdict="device",
    )
    game.step()
    with pytest.raises(gameopt.NonFiniteError, match=r"new point of 'w', 'v' may overflow float32"):
        game.synchronize()
    assert torch.equal(w.detach(), torch.full((3,), 3e38)) and torch.equal(v.detach(), torch.ones(3))


def test_a_point_written_outside_the_game_is_read_again_and_refused_if_not_finite() -> None:
    game, ws, _ = three_players("device", TABLE["SimGD"])
    game.step()
    game.synchronize()
    with torch.no_grad():
        ws[1][0] = float("inf")  # an in-place write: the version counter moves
    game.step()
    with pytest.raises(gameopt.NonFiniteError, match=r"not finite"):
        game.synchronize()


def test_an_extrapolated_point_that_is_not_finite_refuses_the_step() -> None:
    """Extragradient's point w − η ξ overflows float32 while ξ is finite: the host
    verdict refuses it before evaluating there; the device verdict evaluates there,
    and refuses the step for it (its first failed check)."""
    w = nn.Parameter(torch.full((2,), 3e38))
    v = nn.Parameter(torch.zeros(2))
    players = [gameopt.Player([w], name="w"), gameopt.Player([v], name="v")]
    game = gameopt.Game(
        players, lambda: (-(w * 1e38).sum(), (v * v).sum()), algorithm=gameopt.Extragradient(1.0), verdict="device"
    )
    game.step()
    with pytest.raises(gameopt.NonFiniteError, match="a point to evaluate at is not finite"):
        game.synchronize()
    assert torch.equal(w.detach(), torch.full((2,), 3e38))
    host = gameopt.Game(
        [gameopt.Player([w], name="w"), gameopt.Player([v], name="v")],
        lambda: (-(w * 1e38).sum(), (v * v).sum()),
        algorithm=gameopt.Extragradient(1.0),
    )
    with pytest.raises(gameopt.NonFiniteError, match="a point to evaluate at is not finite"):
        host.step()


def test_the_move_bumps_the_version_counter_as_an_in_place_add() -> None:
    """A graph that saved a parameter before the step sees that it moved (autograd's
    error, not a silently wrong gradient): ``_fused_sgd_`` moves no counter itself."""
    game, ws, _ = three_players("device", TABLE["SimGD"])
    stale = (ws[0] * ws[0]).sum()
    game.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.backward()


@pytest.mark.parametrize(
    "kwargs, what",
    [
        ({"on_nonfinite": "skip"}, "on_nonfinite='skip'"),
        ({"loss_scale": gameopt.DynamicLossScale()}, "a loss scale"),
    ],
)
def test_what_the_device_verdict_does_not_cover_is_refused_when_the_game_is_built(kwargs, what) -> None:
    x = nn.Parameter(torch.ones(2))
    y = nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=f"verdict='device' does not cover {what}"):
        gameopt.Game([x, y], lambda: ((x * y).sum(), -(x * y).sum()), verdict="device", **kwargs)


def test_feasible_sets_and_complex_players_are_refused_under_the_device_verdict() -> None:
    x = nn.Parameter(torch.ones(2))
    y = nn.Parameter(torch.ones(2))
    player = gameopt.Player([x], constraint=gameopt.constraints.Box(-1.0, 1.0))
    with pytest.raises(ValueError, match=r"does not cover feasible sets"):
        gameopt.Game([player, y], lambda: ((x * y).sum(), -(x * y).sum()), verdict="device")
    z = nn.Parameter(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"does not cover complex players"):
        gameopt.Game([z, y], lambda: ((z.abs() ** 2).sum() * y.sum(), -(y * y).sum()), verdict="device")
    with pytest.raises(ValueError, match="verdict must be 'host' or 'device'"):
        gameopt.Game([x, y], lambda: ((x * y).sum(), -(x * y).sum()), verdict="gpu")


@pytest.mark.parametrize("name", ["SimGD", "Extragradient", "SimGD + Adam", "SimGD + Momentum"])
def test_a_step_under_the_device_verdict_reads_nothing_but_the_verdict_of_the_step_before(name: str) -> None:
    """No host read inside the step: its first step reads nothing, each later one only
    the step before's verdict (on a GPU, from pinned memory, after an event)."""
    make, _ = traffic.ROWS[name]
    x, y, losses = traffic.bilinear(1 << 12)
    game = gameopt.Game([gameopt.Player([x]), gameopt.Player([y])], losses, algorithm=make(), verdict="device")
    with gameopt.debug.enabled_in(False):
        first = count(game.step, 1 << 12, warmup=0)
        later = count(game.step, 1 << 12, warmup=1)
    assert first.syncs == 0, first.names
    assert later.syncs == 1 and later.names.get("_local_scalar_dense") == 1, later.names
    host_x, host_y, host_losses = traffic.bilinear(1 << 12)
    host = gameopt.Game([gameopt.Player([host_x]), gameopt.Player([host_y])], host_losses, algorithm=make())
    with gameopt.debug.enabled_in(False):
        host.step()
        mine = count(host.step, 1 << 12)
    # the same passes over memory: the verdict's read (a norm for the host's dot), the
    # move (one fused add for the host's add_)
    assert later.touched == mine.touched, (later.names, mine.names)


# ------------------------------------- the host verdict's overflow case, on the device
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rule", [None, gameopt.Adam])
def test_a_finite_step_whose_new_point_overflows_is_refused_on_the_device(dtype, rule) -> None:
    """tests/game/test_commit_loadable.py's overflow case: 'gen' ascends its sum from
    a point near its dtype's largest value."""
    big, lr = {torch.float16: (65000.0, 1000.0), torch.bfloat16: (3e38, 1e38), torch.float32: (3e38, 1e38)}[dtype]
    x = nn.Parameter(torch.zeros(3, dtype=dtype))
    y = nn.Parameter(torch.ones(2, dtype=dtype))
    algorithm = gameopt.SimGD(lr) if rule is None else gameopt.SimGD(lr, update=rule())
    game = gameopt.Game(
        [gameopt.Player([x], name="gen"), gameopt.Player([y], name="disc")],
        lambda: (-x.sum(), (y.float() ** 2).sum().to(dtype)),
        algorithm=algorithm,
        verdict="device",
    )
    with torch.no_grad():
        x[1] = big
    before, state = copy.deepcopy(game.state_dict()), game.algorithm_state
    game.step()
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(gameopt.NonFiniteError, match=rf"the new point of 'gen', 'disc' may overflow {name}"):
        game.synchronize()
    assert game.algorithm_state is state  # put back: the state the step started from
    assert same(game.state_dict(), before)


# ------------------------------------------------------------ a review's findings (each failed before)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["SimGD", "ExtraAdam", "SimGD-momentum"])
def test_half_precision_players_move_as_under_the_host_verdict(name: str, dtype: torch.dtype) -> None:
    """torch's CPU ``_fused_sgd_`` writes wrong values in half precision (16 elements
    or more): the move takes ``torch.where`` there."""
    results = []
    for verdict in ("host", "device"):
        torch.manual_seed(0)
        x = nn.Parameter(torch.randn(37, dtype=dtype))
        y = nn.Parameter(torch.randn(37, dtype=dtype))
        players = [gameopt.Player([x], name="x"), gameopt.Player([y], name="y")]
        losses = lambda: ((x.float() * y.float()).sum().to(dtype), -(x.float() * y.float()).sum().to(dtype))  # noqa: E731
        game = gameopt.Game(players, losses, algorithm=TABLE[name]([0.05, 0.05]), verdict=verdict)
        start = x.detach().clone()
        for _ in range(3):
            game.step()
        game.synchronize()
        assert not torch.equal(x.detach(), start)
        results.append((x.detach().clone(), y.detach().clone()))
    assert all(torch.equal(a, b) for a, b in zip(*results))


class Scalar(nn.Module):
    def __init__(self, w: Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w)


def test_a_refused_step_is_undone_in_the_layout_it_ran_in_when_a_module_was_converted_since() -> None:
    """A Jacobian product re-lays out the game (a module converted): the verdict is
    read first, the state put back in the layout it belongs to, and the game steps on."""
    torch.manual_seed(0)
    m0, m1 = Scalar(torch.randn(3)), Scalar(torch.randn(3))
    switch = Switch()

    def losses() -> tuple[Tensor, Tensor]:
        x, y = m0.w.double(), m1.w.double()
        bad = float("nan") if switch.on else 1.0
        return (x * y).sum() * bad + 0.1 * (x * x).sum(), -(x * y).sum() + 0.1 * (y * y).sum()

    game = gameopt.Game([m0, m1], losses, algorithm=gameopt.SimGD(0.1, update=gameopt.Adam()), verdict="device")
    game.step()
    switch.on = True
    game.step()
    switch.on = False
    m0.double()
    game.jvp([torch.ones(3, dtype=F64), torch.ones(3)])
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.step()
    game.step()
    game.synchronize()
    assert all(torch.isfinite(t).all() for t in tensors_in(game.algorithm_state))


def test_a_refused_steps_batch_norm_statistics_go_back_into_a_module_converted_since() -> None:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    disc = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
    switch = Switch()

    def losses() -> tuple[Tensor, Tensor]:
        fake = disc(gen(torch.randn(8, 2, dtype=gen[0].weight.dtype)).float())
        g = nn.functional.softplus(-fake).mean()
        return g * (float("nan") if switch.on else 1.0), nn.functional.softplus(fake).mean()

    game = gameopt.Game([gen, disc], losses, algorithm=gameopt.SimGD(0.05), verdict="device")
    game.step()
    game.synchronize()
    before = gen[1].running_mean.clone()
    switch.on = True
    game.step()
    switch.on = False
    gen.double()
    with pytest.raises(gameopt.NonFiniteError):
        game.synchronize()
    assert torch.equal(gen[1].running_mean, before.double())


def test_the_optimizer_and_the_algorithm_state_read_the_verdict_first() -> None:
    """``game.optimizer.state_dict()``, ``game.algorithm_state`` (and so
    ``Averaging.average()``) see the game as it is: a refused step undone."""
    game, _, switch = three_players("device", lambda lr: gameopt.Averaging(gameopt.SimGD(lr, update=gameopt.Adam())))
    game.step()
    game.synchronize()
    before = copy.deepcopy(game.optimizer.state_dict())
    average = [t.clone() for t in game.algorithm.average()]
    switch.on = True
    game.step()
    switch.on = False
    assert same(game.optimizer.state_dict(), before)
    assert all(torch.equal(a, b) for a, b in zip(game.algorithm.average(), average))
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.synchronize()


def test_a_state_dict_taken_inside_the_step_after_a_refused_one_is_where_the_refused_step_began() -> None:
    game, ws, switch = three_players("device", TABLE["AltGD-Adam"])
    before = refused_step(game, switch)
    taken = {}
    losses = game.losses

    def saving() -> object:
        taken.setdefault("sd", copy.deepcopy(game.state_dict()))
        return losses()

    game.losses = saving
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.step()
    game.losses = losses
    assert same(taken["sd"], before)


def test_a_ctrl_c_while_the_verdict_is_read_leaves_it_to_be_read_again(monkeypatch) -> None:
    game, _, switch = three_players("device", TABLE["SimGD"])
    before = refused_step(game, switch)
    read = Pending.read

    def interrupted(self: Pending) -> str | None:
        monkeypatch.setattr(Pending, "read", read)
        raise KeyboardInterrupt

    monkeypatch.setattr(Pending, "read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        game.synchronize()
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.synchronize()
    assert same(game.state_dict(), before)


def test_a_setting_the_device_verdict_does_not_cover_is_refused_at_the_next_step() -> None:
    game, ws, _ = three_players("device", TABLE["SimGD"])
    game.step()
    game.on_nonfinite = "skip"
    points = [w.detach().clone() for w in ws]
    with pytest.raises(ValueError, match=r"does not cover on_nonfinite='skip'"):
        game.step()
    assert all(torch.equal(w, p) for w, p in zip(ws, points))
    with pytest.raises(ValueError, match=r"does not cover on_nonfinite='skip'"):
        game.verdict = "device"
    game.verdict = "host"
    game.step()
    game.on_nonfinite = "raise"
    game.verdict = "device"
    game.step()
    game.synchronize()


def test_a_load_or_a_new_algorithm_raises_a_refusal_read_before_it_and_a_copy_has_none() -> None:
    game, _, switch = three_players("device", TABLE["SimGD"])
    game.step()
    saved = copy.deepcopy(game.state_dict())
    switch.on = True
    game.step()
    switch.on = False
    twin = copy.deepcopy(game)  # reads the verdict: the refusal is this game's to raise
    twin.step()
    twin.synchronize()
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.load_state_dict(saved)
    game.load_state_dict(saved)
    switch.on = True
    game.step()
    switch.on = False
    game.state_dict()
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.algorithm = gameopt.SimGD(0.05)
    game.algorithm = gameopt.SimGD(0.05)
    game.step()
    game.synchronize()


# ------------------------------------------------------- a second review's findings (each failed before)
@pytest.mark.parametrize("first, second", [("host", "device"), ("device", "host")])
def test_a_game_that_changes_verdicts_reads_its_bound_on_the_point_again(first: str, second: str) -> None:
    """Each verdict keeps its own bound on max|w|: switching back must not trust the
    bound left from before, or a step that overflows to inf is taken."""
    w = nn.Parameter(torch.tensor([1.0]))
    v = nn.Parameter(torch.tensor([0.0]))
    players = [gameopt.Player([w], name="w"), gameopt.Player([v], name="v")]
    game = gameopt.Game(players, lambda: (-w.sum(), (v * v).sum()), algorithm=gameopt.SimGD(1.0), verdict=first)
    game.step()
    game.verdict = second
    game.algorithm.param_groups[0]["lr"] = 1e38
    for _ in range(3):
        game.step()
    game.synchronize()
    game.verdict = first
    with pytest.raises(gameopt.NonFiniteError, match="overflow"):
        game.step()
        game.synchronize()
    assert torch.isfinite(w).all()


def test_the_algorithm_state_read_on_another_thread_waits_for_the_running_step() -> None:
    """Read during the step after a refused one (from its losses, another thread
    reads it), the state must not be put back under the running step."""
    import threading

    game, ws, switch = three_players("device", TABLE["SimGD-momentum"])
    before = refused_step(game, switch)
    losses, seen = game.losses, []

    def reading() -> object:
        if not seen:
            thread = threading.Thread(target=lambda: seen.append(game.algorithm_state))
            thread.start()
            thread.join(timeout=0.2)  # it waits for the step (the game's lock)
            seen.append(thread)
        return losses()

    game.losses = reading
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.step()
    seen[0].join()
    game.losses = losses
    assert same(game.state_dict(), before)
    game.step()
    game.synchronize()


def test_the_optimizers_load_raises_a_refusal_read_before_it() -> None:
    game, _, switch = three_players("device", TABLE["SimGD"])
    game.step()
    saved = copy.deepcopy(game.optimizer.state_dict())
    switch.on = True
    game.step()
    switch.on = False
    game.state_dict()  # reads the refusal: kept
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.optimizer.load_state_dict(saved)
    game.optimizer.load_state_dict(saved)
    game.step()
    game.synchronize()


def test_a_buffer_the_step_after_a_refused_one_began_with_is_put_back_too() -> None:
    """A buffer that gets a tensor between the refused step and the next, which moves
    it: both steps are undone, so it goes back to its value between them."""

    class WithStat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))
            self.register_buffer("stat", None)

    m, v = WithStat(), nn.Parameter(torch.zeros(2))
    switch = Switch()

    def losses() -> tuple[Tensor, Tensor]:
        if m.stat is not None:
            m.stat.add_(1.0)  # a running statistic, moved by each evaluation
        f = (m.w * v).sum()
        return f * (float("nan") if switch.on else 1.0), -f

    game = gameopt.Game([m, gameopt.Player([v], name="v")], losses, algorithm=gameopt.SimGD(0.1), verdict="device")
    refused_step(game, switch)
    m.stat = torch.zeros(1)
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.step()
    assert m.stat.item() == 0.0


# -------------------------------------------------------- a third review's findings (each failed before)
def test_a_ctrl_c_during_the_step_after_a_refused_one_keeps_the_refusal(monkeypatch) -> None:
    """The Ctrl-C that the commit deferred is raised when the commit ends; the refusal
    it read (both steps undone) is kept for the next call, not lost."""
    import gameopt.game.game as game_module

    game, _, switch = three_players("device", TABLE["SimGD"])
    before = refused_step(game, switch)
    resume = game_module.resume

    def interrupted(held: object) -> None:
        resume(held)
        raise KeyboardInterrupt

    monkeypatch.setattr(game_module, "resume", interrupted)
    with pytest.raises(KeyboardInterrupt):
        game.step()
    monkeypatch.setattr(game_module, "resume", resume)
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 .*the step after it was refused with it"):
        game.synchronize()
    assert same(game.state_dict(), before)


def test_a_lagrangian_games_penalties_grow_only_after_a_step_the_verdict_takes() -> None:
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    switch = Switch()

    def objective_and_constraints() -> tuple[Tensor, None, Tensor]:
        x = model.weight.sum() + model.bias.sum()
        return x * x * (float("nan") if switch.on else 1.0), None, (x - 1.0).reshape(1)

    lg = gameopt.LagrangianGame(
        model,
        objective_and_constraints,
        num_eq=1,
        penalty=1.0,
        formulation="quadratic_penalty",
        penalty_update=gameopt.MultiplicativePenalty(),
        algorithm=gameopt.SimGD(0.01),
    )
    lg.game.verdict = "device"
    lg.step()
    grown = lg.penalties[1].clone()
    switch.on = True
    with pytest.raises(gameopt.NonFiniteError):
        lg.step()
    assert torch.equal(lg.penalties[1], grown)


def test_a_games_vectors_are_its_states_alone_once_the_verdict_is_read() -> None:
    from gameopt.testing import held_storages

    game, _, _ = three_players("device", TABLE["ExtraAdam"])
    for _ in range(3):
        game.step()
    game.synchronize()
    host, _, _ = three_players("host", TABLE["ExtraAdam"])
    for _ in range(3):
        host.step()
    assert len(held_storages(game)) == len(held_storages(host))


def test_replacing_the_algorithm_state_raises_a_refusal_read_before_it_as_a_load_does() -> None:
    game, _, switch = three_players("device", TABLE["SimGD-momentum"])
    refused_step(game, switch)
    state = game.algorithm_state  # reads the verdict: the refusal is kept
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 2 "):
        game.algorithm_state = state
    game.algorithm_state = state
    game.step()
    game.synchronize()


# ------------------------------------------------------- a fourth review's findings (each failed before)
class Stats(nn.Module):
    """Buffers a, b moved by each forward (a += 1, b += 2), and ``cache``, registered as
    None, given a value by the first forward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, dtype=F64))
        self.register_buffer("cache", None)
        self.register_buffer("a", torch.zeros(4, dtype=F64))
        self.register_buffer("b", torch.full((4,), 10.0, dtype=F64))

    def forward(self) -> Tensor:
        self.a.add_(1.0)
        self.b.add_(2.0)
        if self.cache is None:
            self.cache = torch.full((4,), -5.0, dtype=F64)
        return self.w


@pytest.mark.parametrize("read", ["synchronize", "the next step"])
def test_a_buffer_that_appears_in_a_refused_step_does_not_shift_the_others(read: str) -> None:
    m, v = Stats(), nn.Parameter(torch.ones(4, dtype=F64))
    switch = Switch()
    switch.on = True

    def losses() -> tuple[Tensor, Tensor]:
        f = (m() * v).sum()
        return f * (float("nan") if switch.on else 1.0), -f

    game = gameopt.Game([m, gameopt.Player([v], name="v")], losses, algorithm=gameopt.SimGD(0.1), verdict="device")
    game.step()
    switch.on = False
    with pytest.raises(gameopt.NonFiniteError, match=r"^step 1 "):
        game.synchronize() if read == "synchronize" else game.step()
    assert m.a.tolist() == [0.0] * 4 and m.b.tolist() == [10.0] * 4  # each its own, as it began


@pytest.mark.parametrize("bad", ["the step before", "the step after", "neither"])
def test_a_verdict_that_cannot_be_read_stays_pending_with_the_step_after_it(monkeypatch, bad: str) -> None:
    """Reading the step before's verdict raises (a device error, say) during the next
    step's commit: both stay pending, in order, and each is read later as it was: the
    game ends where the host verdict's run of the good steps does."""
    game, _, switch = three_players("device", TABLE["AltGD-Adam"])
    game.step()
    switch.on = bad == "the step before"
    game.step()
    switch.on = bad == "the step after"
    read = Pending.read

    def failing(self: Pending) -> str | None:
        monkeypatch.setattr(Pending, "read", read)
        raise RuntimeError("the device failed")

    monkeypatch.setattr(Pending, "read", failing)
    with pytest.raises(RuntimeError, match="the device failed"):
        game.step()
    switch.on = False
    if bad == "neither":
        game.synchronize()
    else:
        with pytest.raises(gameopt.NonFiniteError, match=r"^step [23] "):
            game.synchronize()
    host, _, _ = three_players("host", TABLE["AltGD-Adam"])
    for _ in range({"the step before": 1, "the step after": 2, "neither": 3}[bad]):
        host.step()
    assert same(game.state_dict(), host.state_dict())


def test_reading_the_verdict_leaves_alone_the_vectors_a_test_oracle_lent_in_debug_mode() -> None:
    from gameopt import testing

    with gameopt.debug.enabled_in(True):
        game, _, _ = three_players("device", TABLE["AltGD-Adam"])
        game.step()
        game.step()
        oracle = testing.oracle(game)
        xi, v = oracle.xi(), oracle.empty().zero_()
        game.state_dict()  # reads the verdict
        assert not torch.isnan(xi[0]).any() and not torch.isnan(v[0]).any()


def test_the_algorithm_state_assigned_from_the_losses_is_set_as_under_the_host_verdict() -> None:
    game, _, _ = three_players("device", TABLE["SimGD-momentum"])
    game.step()
    losses = game.losses

    def assigning() -> object:
        game.algorithm_state = game.algorithm_state  # (inside the step: no verdict read, no error)
        return losses()

    game.losses = assigning
    game.step()
    game.losses = losses
    game.synchronize()
