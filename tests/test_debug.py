"""Ownership made visible: a state holding a borrowed vector is refused, and in
debug mode stale borrowed and recycled vectors are NaN, so misuse fails loudly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from games import GAMES

import gameopt
from gameopt.algorithms.base import State


class KeepsXi(gameopt.Algorithm):
    """Wrong: keeps the borrowed ξ in its state."""

    def init_state(self, game):
        return {"prev": game.layout.zeros()}

    def update(self, oracle, state: State):
        xi = oracle.xi()
        return oracle.scaled(xi, [-lr for lr in self.lrs]), {"prev": xi}


class StaleXi(gameopt.Algorithm):
    """Wrong: reads the first ξ after a second evaluation overwrote it."""

    def init_state(self, game):
        return {}

    def update(self, oracle, state: State):
        first = oracle.xi()
        oracle.xi(along=(oracle.layout.zeros(), [0.5] * oracle.num_players))
        return oracle.scaled(first, [-lr for lr in self.lrs]), {}


class HidesAVector(gameopt.Algorithm):
    """Wrong: hides a pool vector outside its state and reads it the next step."""

    def init_state(self, game):
        return {}

    def update(self, oracle, state: State):
        xi = oracle.xi()
        if getattr(self, "hidden", None) is not None:
            xi = xi + self.hidden
        self.hidden = oracle.empty().copy_(xi)
        return oracle.scaled(xi, [-lr for lr in self.lrs]), {}


def _snapshot(tg):
    return [w.clone() for w in tg.params()]


def _refused(algorithm, error, match) -> None:
    """A step of ``algorithm`` raises ``error`` and changes no parameter."""
    tg = GAMES["quadratic"]()
    game = tg.build(algorithm)
    before = _snapshot(tg)
    with pytest.raises(error, match=match):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(before, tg.params()))


def test_a_state_holding_the_borrowed_xi_is_refused_and_nothing_changes() -> None:
    for on in (False, True):
        with gameopt.debug.enabled_in(on):
            _refused(KeepsXi(0.1), RuntimeError, r"holds the result of oracle\.xi\(\), which is borrowed")


def test_a_stale_xi_is_nan_in_debug_mode_and_silently_wrong_without() -> None:
    with gameopt.debug.enabled_in(False):
        tg = GAMES["quadratic"]()
        tg.build(StaleXi(0.1)).step()  # takes the step along the second ξ: wrong, and nothing says so
    with gameopt.debug.enabled_in(True):
        _refused(StaleXi(0.1), gameopt.NonFiniteError, None)


def test_a_hidden_pool_vector_is_nan_after_the_step_in_debug_mode() -> None:
    with gameopt.debug.enabled_in(True):
        tg = GAMES["quadratic"]()
        game = tg.build(HidesAVector(0.1))
        game.step()
        with pytest.raises(gameopt.NonFiniteError):
            game.step()


def test_players_other_parts_are_nan_in_debug_mode() -> None:
    class Peek(gameopt.Algorithm):
        def init_state(self, game):
            return {}

        def update(self, oracle, state):
            xi = oracle.xi(players=[1])
            views = [oracle.layout.player_views(xi, i) for i in range(oracle.num_players)]
            self.seen = [bool(torch.isnan(torch.cat(v)).all()) for v in views]
            return oracle.layout.zeros(), {}

    with gameopt.debug.enabled_in(True):
        tg = GAMES["quadratic"]()
        game = tg.build(Peek(0.1))
        game.step()
        assert game.algorithm.seen == [True, False, True]


@pytest.mark.slow
def test_debug_mode_is_off_by_default_and_on_with_the_environment_variable() -> None:
    code = "import gameopt; print(gameopt.debug.enabled())"
    env = {k: v for k, v in __import__("os").environ.items() if k != "GAMEOPT_DEBUG"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    on = subprocess.run(
        [sys.executable, "-c", code], env={**env, "GAMEOPT_DEBUG": "1"}, capture_output=True, text=True, check=True
    )
    assert (off.stdout.strip(), on.stdout.strip()) == ("False", "True")
    assert gameopt.debug.enabled()  # the tests run with it on (conftest.py)


def test_joint_vectors_in_a_state_must_be_typed_in_debug_mode() -> None:
    """A plain list would be carried through a re-fuse only by guessing from shapes."""

    class Untyped(gameopt.Algorithm):
        def init_state(self, game):
            return {"prev": [torch.zeros_like(t) for t in game.layout.data]}

        def update(self, oracle, state):
            xi = oracle.xi()
            return oracle.scaled(xi, [-lr for lr in self.lrs]), {"prev": [t.clone() for t in xi]}

    with gameopt.debug.enabled_in(True):
        _refused(Untyped(0.1), TypeError, r"must be gameopt\.Vec.*state\['prev'\]")
