"""One step at a time (issue 22): threads stepping, saving and loading one game see every step
whole."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from games import WAIT, assert_same_state, during_second_evaluation
from torch import nn

import gameopt

# ------------------------------------------------ one step at a time (issue 22)


def _thread_game(pause: Callable[[], None] = lambda: None, make=None):
    """A small deterministic two-player game (tanh couplings, float64), Extra-Adam by
    default; ``pause()`` runs inside every evaluation of the losses."""
    torch.manual_seed(0)
    x, y = nn.Parameter(torch.randn(4, dtype=torch.float64)), nn.Parameter(torch.randn(4, dtype=torch.float64))
    A = torch.randn(4, 4, dtype=torch.float64)

    def losses():
        pause()
        f = torch.tanh(x) @ A @ torch.tanh(y) + 0.1 * x.square().sum()
        return f, -f + 0.1 * y.square().sum()

    algorithm = make() if make else gameopt.Extragradient(0.05, update=gameopt.Adam())
    game = gameopt.Game([gameopt.Player([x], name="x"), gameopt.Player([y], name="y")], losses, algorithm=algorithm)
    return game, x, y


def test_two_threads_stepping_one_game_apply_every_step_whole() -> None:
    steps = 12
    ref, *_ = _thread_game()
    for _ in range(2 * steps):
        ref.step()
    game, *_ = _thread_game(pause=lambda: time.sleep(0.0005))  # hands the interpreter to the other thread
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(lambda: [game.step() for _ in range(steps)]) for _ in range(2)]
        for run in runs:
            run.result(timeout=60)
    assert_same_state(game.state_dict(), ref.state_dict())  # every step applied whole: 2N steps in some order


def test_state_dict_from_another_thread_during_a_step_is_the_state_before_or_after_it() -> None:
    inside, asked = threading.Event(), threading.Event()
    game, *_ = _thread_game(pause=during_second_evaluation(inside, asked))
    before = game.state_dict()

    def read():
        assert inside.wait(WAIT)
        asked.set()
        return game.state_dict()

    with ThreadPoolExecutor(1) as pool:
        seen = pool.submit(read)
        game.step()
        seen = seen.result(timeout=WAIT)
    after = game.state_dict()
    assert not torch.equal(after["players"][0]["params"][0], before["players"][0]["params"][0])
    assert_same_state(seen, after)  # the call waited for the step (never the extrapolated point)


def test_load_state_dict_from_another_thread_during_a_step_waits_for_it_and_is_not_overwritten() -> None:
    inside, asked = threading.Event(), threading.Event()
    game, *_ = _thread_game(pause=during_second_evaluation(inside, asked))
    other, *_ = _thread_game()
    for _ in range(3):
        other.step()
    saved = other.state_dict()

    def load():
        assert inside.wait(WAIT)
        asked.set()
        game.load_state_dict(saved)

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(load)
        game.step()
        done.result(timeout=WAIT)
    assert_same_state(game.state_dict(), saved)  # loaded after the step, not written over by it


def test_a_step_may_call_into_its_own_game_from_its_thread() -> None:
    seen = []
    game, x, y = _thread_game()

    def losses():
        seen.append(game.state_dict()["players"][0]["params"][0])  # re-entrant: no deadlock
        f = torch.tanh(x).sum() * torch.tanh(y).sum()
        return f, -f

    game.losses = losses
    start = x.detach().clone()
    game.optimizer.step()  # the torch.optim path: optimizer.step -> step_closure
    after_one = x.detach().clone()
    game.step()
    # two evaluations per step (the second at the extrapolated point, which the closure's own thread sees)
    assert len(seen) == 4 and torch.equal(seen[0], start) and torch.equal(seen[2], after_one)
    assert not torch.equal(start, after_one)


def test_a_step_from_another_thread_waits_for_an_averaged_block() -> None:
    avg = gameopt.Averaging(gameopt.SimGD(0.1))
    game, x, y = _thread_game(make=lambda: avg)
    game.step()
    game.step()
    ref, rx, _ = _thread_game(make=lambda: gameopt.Averaging(gameopt.SimGD(0.1)))
    for _ in range(3):
        ref.step()
    started = threading.Event()

    def step():
        started.set()
        game.step()

    with ThreadPoolExecutor(1) as pool:
        with avg.averaged():
            at_average = x.detach().clone()
            run = pool.submit(step)
            assert started.wait(WAIT)
            time.sleep(0.05)
            assert not run.done()  # it waits for the block
            assert torch.equal(x.detach(), at_average)
            game.vector_field()  # the block's own thread may use the game
        run.result(timeout=WAIT)
    assert torch.equal(x.detach(), rx.detach())  # the step was taken from the restored point, and kept
