"""What a contributor's tests plug into: the table of algorithms, small reference
games with known ξ and J, their closed-form updates, and the generic checks.

A new algorithm gets the checks by one row of the table (docs/custom-algorithm.md,
"Testing your algorithm")::

    from gameopt.testing import AlgoInfo, check_all

    check_all([AlgoInfo("MyAlgo", lambda lrs: MyAlgo(lrs), ref=my_closed_form)])

* :mod:`.games`: :class:`ReferenceGame` (``build(algorithm)`` gives a fresh
  :class:`~gameopt.Game`), :func:`bilinear` (2 players, zero-sum),
  :func:`quadratic` (n players), :func:`nonquadratic` (3 players), :data:`GAMES`, and
  :func:`regularized_bilinear` (2 players, for two-player methods);
* :mod:`.references`: the closed forms (:func:`ref_trajectory`, :class:`RefRule`, a
  :data:`Reference` of your own);
* :mod:`.table`: :class:`AlgoInfo` and the built-in rows (:data:`ALGORITHMS`,
  :data:`SECOND_ORDER`, :data:`GENERIC`, :data:`TWO_PLAYERS`);
* :mod:`.checks`: :func:`check_closed_form`, :func:`check_resume`,
  :func:`check_float32_tracks_float64`, :func:`check_all_or_nothing` (each raises
  ``AssertionError`` naming what differs), and the tools they use: :func:`oracle`
  (the oracle a step hands its algorithm), :func:`held_storages`,
  :func:`assert_same_state`, :func:`straight_and_resumed`.
* :mod:`.traffic`: a step's launches, copies, host syncs and memory traffic,
  counted exactly (:func:`~gameopt.testing.traffic.count`), as
  ``tests/game/test_step_traffic.py`` and ``benchmarks/traffic.py`` use them.

Run your tests with ``GAMEOPT_DEBUG=1`` (:mod:`gameopt.debug`): misuse of borrowed
vectors then fails loudly.
"""

from .checks import (
    InjectedFailure,
    Resumed,
    assert_same_state,
    check_all,
    check_all_or_nothing,
    check_closed_form,
    check_float32_tracks_float64,
    check_resume,
    checks_for,
    held_storages,
    oracle,
    saved_and_loaded,
    straight_and_resumed,
)
from .games import GAMES, ReferenceGame, VecModule, bilinear, nonquadratic, quadratic, regularized_bilinear
from .references import Reference, RefRule, ref_trajectory
from .table import ALGORITHMS, GENERIC, SECOND_ORDER, TWO_PLAYERS, AlgoInfo, learning_rates

__all__ = [
    "ALGORITHMS",
    "GAMES",
    "GENERIC",
    "SECOND_ORDER",
    "TWO_PLAYERS",
    "AlgoInfo",
    "InjectedFailure",
    "RefRule",
    "Reference",
    "ReferenceGame",
    "Resumed",
    "VecModule",
    "assert_same_state",
    "bilinear",
    "check_all",
    "check_all_or_nothing",
    "check_closed_form",
    "check_float32_tracks_float64",
    "check_resume",
    "checks_for",
    "held_storages",
    "learning_rates",
    "nonquadratic",
    "oracle",
    "quadratic",
    "ref_trajectory",
    "regularized_bilinear",
    "saved_and_loaded",
    "straight_and_resumed",
]
