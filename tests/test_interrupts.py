"""A Ctrl-C (SIGINT) that lands anywhere in a step, a load or a change of algorithm
(issue 33, item 9): the game is left as it was, or with the change made whole, never
torn; and it goes on stepping as if the interrupted call had not been made (or had
run to its end).

Each scenario runs once per line the game's own modules execute in it: SIGINT is
raised (``signal.raise_signal``: delivered to this thread at once, so Python's
handler runs right there) when the run reaches that line, from a ``sys.settrace``
hook. Nothing depends on timing."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from games import assert_same_state
from torch import nn

import gameopt
from gameopt.interrupts import deferred_interrupts

PACKAGE = Path(gameopt.__file__).parent
#: the modules whose every line gets its interrupt: the game, its commit and checkpoint,
#: the deferral itself, the torch.optim surface, and what puts a point or a module back
TRACED = {
    str(PACKAGE / "game" / name) for name in ("game.py", "moves.py", "checkpoint.py", "oracle.py", "reentry.py")
} | {
    str(PACKAGE / name)
    for name in ("interrupts.py", "optim.py", "evaluation.py", "loss_scale.py", "autodiff/substitution.py")
}


@pytest.fixture(autouse=True)
def _python_sigint_handler():
    """Python's own SIGINT handler (raises KeyboardInterrupt), as in a plain script."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


# ---------------------------------------------------------------- the deferral
def test_a_sigint_within_a_deferred_block_raises_keyboard_interrupt_when_the_block_ends() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
            done.append("after the signal")  # not interrupted
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_deferred_block_runs_the_programs_own_handler_once_afterwards() -> None:
    calls = []
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    with deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert calls == []
    assert calls == [signal.SIGINT]


def test_a_deferred_block_leaves_an_ignored_sigint_alone() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with deferred_interrupts():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)


def test_a_deferred_block_off_the_main_thread_changes_no_handler() -> None:
    seen = []

    def block() -> None:
        with deferred_interrupts():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_nested_deferred_blocks_raise_once_when_the_outer_one_ends() -> None:
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            with deferred_interrupts():
                signal.raise_signal(signal.SIGINT)
            reached = True
    assert reached


# ------------------------------------------------------- an interrupt at each line
def _traced(on_line: Callable[[Any], None], run: Callable[[], Any], traced: set[str] = TRACED) -> None:
    """``run()`` with ``on_line(frame)`` called at each line event in the ``traced`` modules."""

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            on_line(frame)
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename in traced else None

    before = sys.gettrace()
    sys.settrace(calls)
    try:
        run()
    finally:
        sys.settrace(before)


def _lines(run: Callable[[], Any], traced: set[str]) -> list[str]:
    """The lines (``file:line``) the ``traced`` modules run in ``run()``, in order."""
    seen: list[str] = []
    _traced(lambda frame: seen.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"), run, traced)
    return seen


def _interrupted_at(k: int, run: Callable[[], Any], traced: set[str]) -> bool:
    """``run()`` with SIGINT raised at its ``k``-th traced line; whether it raised KeyboardInterrupt."""
    count = [0]

    def on_line(frame: Any) -> None:
        count[0] += 1
        if count[0] == k:
            signal.raise_signal(signal.SIGINT)

    try:
        _traced(on_line, run, traced)
    except KeyboardInterrupt:
        return True
    return False


def _same(a: Any, b: Any) -> bool:
    try:
        assert_same_state(a, b)
    except AssertionError:
        return False
    return True


@dataclass
class Scenario:
    """``act(game)`` on a ``fresh()`` game; ``look(game)``: what must be either as
    before or as after ``act``, whole; ``go_on(game)`` (default: ``act`` again):
    what the game must then do as an uninterrupted one would."""

    fresh: Callable[[], gameopt.Game]
    act: Callable[[gameopt.Game], Any]
    look: Callable[[gameopt.Game], Any] = lambda game: game.state_dict()
    go_on: Callable[[gameopt.Game], Any] | None = None
    also: tuple[str, ...] = ()  # more modules to trace (paths within the package)


def _outcome(s: Scenario, game: gameopt.Game) -> tuple[Any, Any]:
    """What ``look`` sees, and then after ``go_on``."""
    now = s.look(game)
    (s.go_on or s.act)(game)
    return now, s.look(game)


def _check_every_line(s: Scenario) -> None:
    """For every traced line of ``act``: interrupted there, the game is as before or as
    after ``act`` (whole), and goes on as the uninterrupted one does from there."""
    before = _outcome(s, s.fresh())
    ref = s.fresh()
    s.act(ref)
    after = _outcome(s, ref)
    traced = TRACED | {str(PACKAGE / name) for name in s.also}
    game = s.fresh()
    lines = _lines(lambda: s.act(game), traced)
    torn, interrupted = [], 0
    for k in range(1, len(lines) + 1):
        game = s.fresh()
        interrupted += _interrupted_at(k, lambda: s.act(game), traced)
        if not torch.is_grad_enabled():  # a no_grad block's exit cut short, and left so
            torch.set_grad_enabled(True)
            torn.append(f"{lines[k - 1]} (gradients left off)")
        try:
            seen = _outcome(s, game)
        except Exception as err:  # a torn game may fail to go on
            seen = err
        if not (_same(seen, before) or _same(seen, after)):
            torn.append(lines[k - 1])
    assert interrupted == len(lines)  # every line's interrupt came out, before or after the change
    assert not torn, f"torn by an interrupt at {torn}"


class _Normed(nn.Module):
    """A float32 player with module buffers (batch-norm statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.lin(x))


def _two_groups(make: Callable[[], gameopt.Algorithm], loss_scale: bool = False) -> Callable[[], gameopt.Game]:
    """A game whose joint storage has two groups (a float32 player with batch norm, a
    float64 one): a move writes them one after the other."""

    def fresh() -> gameopt.Game:
        torch.manual_seed(0)
        a, b = _Normed(), nn.Linear(3, 1).double()
        x = torch.randn(6, 3)

        def losses():
            f = b(torch.tanh(a(x.to(a.lin.weight.dtype))).double()).mean()
            return f, -f + 0.1 * b.weight.square().sum()

        scale = gameopt.DynamicLossScale(init_scale=4.0, growth_interval=1) if loss_scale else None
        players = [gameopt.Player(a, name="a"), gameopt.Player(b, name="b")]
        return gameopt.Game(players, losses, algorithm=make(), loss_scale=scale)

    return fresh


def _modules(make: Callable[[], gameopt.Algorithm]) -> Callable[[], gameopt.Game]:
    """Two float64 modules, for the algorithms that evaluate away from the point or
    substitute aliases for the parameters (Jacobian products)."""

    def fresh() -> gameopt.Game:
        torch.manual_seed(0)
        a, b = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
        x = torch.randn(5, 3, dtype=torch.float64)

        def losses():
            f = (torch.tanh(a(x)) * b(x)).sum()
            return f, -f + 0.1 * b.weight.square().sum()

        return gameopt.Game([gameopt.Player(a, name="a"), gameopt.Player(b, name="b")], losses, algorithm=make())

    return fresh


STEPS = {
    "SimGD, one group (its commit is one write)": _modules(lambda: gameopt.SimGD(0.1)),
    "SimGD+Adam, two dtype groups, batch norm, a loss scale": _two_groups(
        lambda: gameopt.SimGD(0.1, update=gameopt.Adam()), loss_scale=True
    ),
    "Extragradient+Momentum (evaluates away from its point)": _modules(
        lambda: gameopt.Extragradient(0.1, update=gameopt.Momentum(0.5))
    ),
    "ConsensusOptimization (aliases in the modules)": _modules(lambda: gameopt.ConsensusOptimization(0.1)),
}


def _registered_and_saved(game: gameopt.Game) -> tuple[bool, dict]:
    """Whether every module registers its own parameters (no alias the step put in
    their place), seen before ``state_dict`` (which follows the players); the state."""
    registered = all(isinstance(t, nn.Parameter) for p in game.players for t in p.module.parameters())
    return registered, game.state_dict()


@pytest.mark.parametrize("fresh", list(STEPS.values()), ids=list(STEPS))
def test_an_interrupt_at_any_line_of_a_step_leaves_it_undone_or_whole(fresh) -> None:
    _check_every_line(Scenario(fresh, lambda game: game.step(), look=_registered_and_saved))


def _stepped(fresh: Callable[[], gameopt.Game], steps: int) -> gameopt.Game:
    game = fresh()
    for _ in range(steps):
        game.step()
    return game


def test_an_interrupt_at_any_line_of_a_load_leaves_it_undone_or_whole() -> None:
    fresh = _two_groups(lambda: gameopt.SimGD(0.1, update=gameopt.Adam()), loss_scale=True)
    saved = _stepped(fresh, 2).state_dict()
    _check_every_line(Scenario(fresh, lambda game: game.load_state_dict(saved)))


def test_an_interrupt_at_any_line_of_the_optimizers_load_leaves_it_undone_or_whole() -> None:
    fresh = _two_groups(lambda: gameopt.SimGD(0.1, update=gameopt.Adam()))
    game = _stepped(fresh, 2)
    game.algorithm.param_groups[0]["lr"] = 0.05  # the param groups are loaded too
    saved = game.optimizer.state_dict()
    # the algorithm writes its param groups, then makes the state the game keeps
    _check_every_line(Scenario(fresh, lambda game: game.optimizer.load_state_dict(saved), also=("algorithms/base.py",)))


def test_an_interrupt_at_any_line_of_a_change_of_algorithm_leaves_it_undone_or_whole() -> None:
    def act(game: gameopt.Game) -> None:
        game.algorithm = gameopt.SimGD(0.2, update=gameopt.Momentum(0.5))

    def look(game: gameopt.Game) -> Any:
        return type(game.algorithm).__name__, game.optimizer.algorithm is game.algorithm, game.state_dict()

    fresh = _two_groups(lambda: gameopt.SimGD(0.1, update=gameopt.Adam()))
    # then a step: with the state the game holds for the algorithm it runs
    _check_every_line(Scenario(fresh, act, look, go_on=lambda game: game.step()))


def test_an_interrupt_at_any_line_of_a_relayout_leaves_the_game_stepping_as_without_it() -> None:
    """A player converted to float64 between steps: the next step re-fuses the players,
    rebuilds the joint storage and carries the algorithm state."""
    two = _two_groups(lambda: gameopt.SimGD(0.1, update=gameopt.Adam()))

    def fresh() -> gameopt.Game:
        game = _stepped(two, 1)
        game.players[0].module.double()
        return game

    _check_every_line(Scenario(fresh, lambda game: game.step()))
