"""The reference games and closed forms the tests share, from :mod:`gameopt.testing`
(where a contributor's tests find them too), and the tests' own threaded pause.

Each game has players that are tiny modules holding one parameter vector, losses
written with torch ops, and ``xi_ref(ws)``: the vector field written by hand
(no autograd), so algorithms can be checked iterate for iterate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gameopt.testing import (
    GAMES,
    RefRule,
    Resumed,
    assert_same_state,
    bilinear,
    nonquadratic,
    quadratic,
    ref_trajectory,
    saved_and_loaded,
    straight_and_resumed,
)
from gameopt.testing import ReferenceGame as TestGame

__all__ = [
    "GAMES",
    "WAIT",
    "RefRule",
    "Resumed",
    "TestGame",
    "assert_same_state",
    "bilinear",
    "during_second_evaluation",
    "nonquadratic",
    "quadratic",
    "ref_trajectory",
    "saved_and_loaded",
    "straight_and_resumed",
]


WAIT = 10.0  # seconds: only reached if something is broken (the events are set at once)


def during_second_evaluation(inside: threading.Event, asked: threading.Event) -> Callable[[], None]:
    """A ``pause`` for the losses of a threaded test: at the second evaluation (Extra-Adam's
    extrapolated point), let the other thread call in, then wait a moment."""
    calls = [0]

    def pause() -> None:
        calls[0] += 1
        if calls[0] == 2:
            inside.set()
            assert asked.wait(WAIT)
            time.sleep(0.05)  # the other thread's call would run here, were it not made to wait

    return pause
