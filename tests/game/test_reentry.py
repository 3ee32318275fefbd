"""Calls into a game from inside its own running step (issue 33, items 1-5): the
losses (or code the step runs) call back into the game. A call that would change the
game is refused and changes nothing; a read-only call sees the point the step is
evaluating and leaves the step exactly as it was."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from games import WAIT, assert_same_state, during_second_evaluation
from torch import nn

import gameopt

SECOND_ORDER = [
    lambda: gameopt.ConsensusOptimization(0.1),
    lambda: gameopt.CGD(0.1),
    lambda: gameopt.LOLA(0.1),
    lambda: gameopt.HamiltonianGD(0.1),
    lambda: gameopt.SGA(0.1),
]
SECOND_ORDER_IDS = ["ConsensusOptimization", "CGD", "LOLA", "HamiltonianGD", "SGA"]


def _game(algorithm: gameopt.Algorithm, pause: Callable[[], None] = lambda: None) -> gameopt.Game:
    """Two small modules (float64) coupled through tanh: every second-order term is
    nonzero. ``pause()`` runs inside every evaluation of the losses."""
    torch.manual_seed(0)
    x, y = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
    A = torch.randn(3, 3, dtype=torch.float64)
    inputs = torch.randn(5, 3, dtype=torch.float64)

    def losses():
        pause()
        f = (torch.tanh(x(inputs)) * y(inputs @ A)).sum() + 0.1 * x.weight.square().sum()
        return f, -f + 0.1 * y.weight.square().sum()

    return gameopt.Game([gameopt.Player(x, name="x"), gameopt.Player(y, name="y")], losses, algorithm=algorithm)


def _calling(game: gameopt.Game, call: Callable[[gameopt.Game], Any]) -> list[Any]:
    """Make every evaluation of the game's losses call ``call(game)`` first (not from
    the evaluations that call makes itself); returns the list of what it returned."""
    losses, inside, seen = game.losses, [False], []

    def calling(*args: Any, **kwargs: Any) -> Any:
        if not inside[0]:
            inside[0] = True
            try:
                seen.append(call(game))
            finally:
                inside[0] = False
        return losses(*args, **kwargs)

    game.losses = calling
    return seen


# --------------------------------------------------- changes are refused (items 1-3)
CHANGES = {
    "step": (lambda g: g.step(), r"a step \(game.step\(\), game.optimizer.step\(\)\) was called from inside"),
    "optimizer.step": (lambda g: g.optimizer.step(), r"a step \(game.step\(\), game.optimizer.step\(\)\)"),
    "load_state_dict": (lambda g: g.load_state_dict(g.state_dict()), r"game.load_state_dict\(\) was called from"),
    "algorithm": (
        lambda g: setattr(g, "algorithm", gameopt.SimGD(0.5)),
        r"game.algorithm = \.\.\. was called from inside a running step",
    ),
    "optimizer.load_state_dict": (
        lambda g: g.optimizer.load_state_dict(g.optimizer.state_dict()),
        r"game.optimizer.load_state_dict\(\) was called from inside a running step",
    ),
}


@pytest.mark.parametrize("which", list(CHANGES))
def test_a_call_that_changes_the_game_from_inside_its_step_is_refused_and_changes_nothing(which: str) -> None:
    call, message = CHANGES[which]
    game = _game(gameopt.SimGD(0.1, update=gameopt.Adam()))
    game.step()
    before = game.state_dict()
    algorithm, plain = game.algorithm, game.losses
    _calling(game, call)
    with pytest.raises(RuntimeError, match=message) as err:
        game.step()
    assert "nothing changed" in str(err.value) and "between steps" in str(err.value)
    assert_same_state(game.state_dict(), before)  # parameters and Adam's state (t = 1)
    assert game.algorithm is algorithm and game.optimizer.algorithm is algorithm
    # the game goes on as if the refused step had never been asked for
    ref = _game(gameopt.SimGD(0.1, update=gameopt.Adam()))
    ref.step()
    ref.step()
    game.losses = plain
    game.step()
    assert_same_state(game.state_dict(), ref.state_dict())


# ----------------------------------------- read-only calls leave the step as it was (item 4)
def _xi(game: gameopt.Game) -> tuple:
    return game.vector_field()


def _products(game: gameopt.Game) -> tuple:
    v = game.vector_field()
    return game.jvp(v), game.vjp(v)


def _linearization(game: gameopt.Game) -> tuple:
    lin = game.linearize()
    return lin.xi, lin.jvp(lin.xi), lin.vjp(lin.xi)  # its products inside the step too


def _checkpoint(game: gameopt.Game) -> dict:
    state = game.state_dict()
    game.check_state_dict(state)
    game.optimizer.state_dict()
    return state


READ_ONLY = {"vector_field": _xi, "jvp+vjp": _products, "linearize": _linearization, "state_dict": _checkpoint}


@pytest.mark.parametrize("make", SECOND_ORDER, ids=SECOND_ORDER_IDS)
@pytest.mark.parametrize("which", list(READ_ONLY))
def test_a_read_only_call_from_the_losses_of_a_second_order_step_leaves_the_step_exactly_as_it_was(
    make: Callable[[], gameopt.Algorithm], which: str
) -> None:
    ref = _game(make())
    for _ in range(2):
        ref.step()
    game = _game(make())
    start_xi = game.vector_field()
    start_state = game.state_dict()
    seen = _calling(game, READ_ONLY[which])
    for _ in range(2):
        game.step()
    assert len(seen) >= 2
    assert_same_state(game.state_dict(), ref.state_dict())  # exactly the same steps (float64)
    if which == "vector_field":  # the first evaluation is at the step's point: ξ there
        assert all(torch.equal(a, b) for a, b in zip(seen[0], start_xi))
    if which == "state_dict":  # inside the first step: the game as that step found it
        assert_same_state(seen[0], start_state)


def test_state_dict_from_the_losses_at_an_extrapolated_point_is_the_game_as_the_step_found_it() -> None:
    game = _game(gameopt.Extragradient(0.1, update=gameopt.Adam()))
    game.step()
    before = game.state_dict()
    seen = _calling(game, lambda g: g.state_dict())
    game.step()
    assert len(seen) == 2  # at the point, then at the extrapolated point
    for state in seen:
        assert_same_state(state, before)  # never the extrapolated point with the old state


class _Noisy(nn.Module):
    """Batch norm (running statistics) and dropout (the global generator)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3).double()
        self.bn = nn.BatchNorm1d(3).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.bn(self.lin(x)), 0.3)


def _noisy_game(algorithm: gameopt.Algorithm) -> tuple[gameopt.Game, _Noisy]:
    torch.manual_seed(0)
    g, d = _Noisy(), nn.Linear(3, 1).double()
    inputs = torch.randn(8, 3, dtype=torch.float64)

    def losses():
        f = d(torch.tanh(g(inputs))).mean()
        return f, -f + 0.1 * d.weight.square().sum()

    return gameopt.Game([gameopt.Player(g, name="g"), gameopt.Player(d, name="d")], losses, algorithm=algorithm), g


@pytest.mark.parametrize(
    "make", [lambda: gameopt.SimGD(0.1), lambda: gameopt.Extragradient(0.1), lambda: gameopt.ConsensusOptimization(0.1)]
)
def test_a_read_only_call_from_the_losses_moves_no_module_buffer_and_no_random_number(make) -> None:
    ref, ref_g = _noisy_game(make())
    ref.step()
    ref_rng = torch.get_rng_state()
    game, g = _noisy_game(make())
    _calling(game, lambda game: (game.vector_field(), game.state_dict()))
    game.step()
    assert torch.equal(torch.get_rng_state(), ref_rng)
    assert_same_state(game.state_dict(), ref.state_dict())  # parameters and the running statistics
    assert g.bn.num_batches_tracked.item() == 1


# ------------------------------------------- the optimizer's checkpoint calls (item 5)
def _from_another_thread_during_a_step(game: gameopt.Game, inside, asked, call: Callable[[], Any]) -> Any:
    def other() -> Any:
        assert inside.wait(WAIT)
        asked.set()
        return call()

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(other)
        game.step()
        return done.result(timeout=WAIT)


def test_optimizer_load_state_dict_from_another_thread_waits_for_the_step_and_is_not_overwritten() -> None:
    other = _game(gameopt.Extragradient(0.05, update=gameopt.Adam()))
    for _ in range(3):
        other.step()
    saved = other.optimizer.state_dict()
    inside, asked = threading.Event(), threading.Event()
    game = _game(gameopt.Extragradient(0.05, update=gameopt.Adam()), pause=during_second_evaluation(inside, asked))
    _from_another_thread_during_a_step(game, inside, asked, lambda: game.optimizer.load_state_dict(saved))
    assert_same_state(game.optimizer.state_dict(), saved)  # loaded after the step, not written over by it


def test_optimizer_state_dict_from_another_thread_waits_for_the_step() -> None:
    inside, asked = threading.Event(), threading.Event()
    game = _game(gameopt.Extragradient(0.05, update=gameopt.Adam()), pause=during_second_evaluation(inside, asked))
    seen = _from_another_thread_during_a_step(game, inside, asked, game.optimizer.state_dict)
    after = game.optimizer.state_dict()
    assert after["state"]["rule"]["t"] == 2  # Extra-Adam: two moments' updates per step
    assert_same_state(seen, after)  # the state after the step, never from a step's middle


def test_stepping_says_whether_the_losses_run_inside_a_step() -> None:
    game = _game(gameopt.Extragradient(0.1))
    seen = _calling(game, lambda g: g.stepping)
    game.vector_field()  # between steps: the losses run, not in a step
    game.step()  # two evaluations, both inside the step
    assert seen == [False, True, True] and not game.stepping
