"""The table of algorithms: one :class:`AlgoInfo` row per algorithm (and per
interesting configuration of one), which drives the generic checks of
:mod:`gameopt.testing.checks`. A new algorithm joins them with one row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..algorithms import (
    ACGD,
    CGD,
    LA,
    LOLA,
    SGA,
    SOS,
    Algorithm,
    AltGD,
    AnchoredExtragradient,
    Averaging,
    ConsensusOptimization,
    Extragradient,
    FollowTheRidge,
    HamiltonianGD,
    Lookahead,
    Optimistic,
    PastExtragradient,
    SimGD,
    Stackelberg,
)
from ..updates import Adam, Momentum
from .references import Reference, RefRule


@dataclass(frozen=True)
class AlgoInfo:
    """One row of the table of algorithms.

    Attributes:
        name: the row's name (a test id).
        make: a fresh algorithm from per-player learning rates (a list of floats).
        ref: its closed form: a built-in reference update by name (see
            :func:`~gameopt.testing.references.ref_trajectory`) or a
            :data:`~gameopt.testing.references.Reference` of your own; ``""`` when it
            has none here (second-order methods: their closed forms are checked in
            the repository's ``tests/algorithms/test_second_order.py``).
        ref_kw: the reference's keyword arguments (``{"extrapolation": 0.5}``: the
            extrapolation learning rates are this fraction of the learning rates).
        rule: a fresh closed-form update rule for the reference (plain by default).
        players: the number of players it needs (2: a two-player method, checked on
            the bilinear game), or ``None`` for any number.
    """

    name: str
    make: Callable[[list[float]], Algorithm]
    ref: str | Reference = ""
    ref_kw: dict[str, Any] = field(default_factory=dict)
    rule: Callable[[], RefRule] = RefRule
    players: int | None = None


def learning_rates(n: int) -> list[float]:
    """Per-player learning rates for ``n`` players, all different (0.05, 0.07, …)."""
    return [0.05 + 0.02 * i for i in range(n)]


def _adam(betas: tuple[float, float] = (0.9, 0.999)) -> Callable[[], RefRule]:
    return lambda: RefRule("adam", betas=betas)


def _momentum(mu: float) -> Callable[[], RefRule]:
    return lambda: RefRule("momentum", momentum=mu)


#: first-order algorithms, each checked against its closed form
ALGORITHMS = [
    AlgoInfo("SimGD", lambda lr: SimGD(lr), "simgd"),
    AlgoInfo("AltGD", lambda lr: AltGD(lr), "altgd"),
    AlgoInfo("Extragradient", lambda lr: Extragradient(lr), "eg"),
    AlgoInfo(
        "Extragradient-eta'",
        lambda lr: Extragradient(lr, extrapolation_lr=[x / 2 for x in lr]),
        "eg",
        {"extrapolation": 0.5},
    ),
    AlgoInfo("Optimistic", lambda lr: Optimistic(lr), "optimistic"),
    AlgoInfo("SimGD-momentum", lambda lr: SimGD(lr, update=Momentum(0.5)), "simgd", rule=_momentum(0.5)),
    AlgoInfo("SimGD-negative-momentum", lambda lr: SimGD(lr, update=Momentum(-0.3)), "simgd", rule=_momentum(-0.3)),
    AlgoInfo("AltGD-Adam", lambda lr: AltGD(lr, update=Adam()), "altgd", rule=_adam()),
    AlgoInfo("ExtraAdam", lambda lr: Extragradient(lr, update=Adam((0.5, 0.9))), "eg", rule=_adam((0.5, 0.9))),
    AlgoInfo("OptimisticAdam", lambda lr: Optimistic(lr, update=Adam()), "optimistic", rule=_adam()),
    AlgoInfo("Lookahead", lambda lr: Lookahead(SimGD(lr), k=3, alpha=0.5), "lookahead", {"k": 3, "alpha": 0.5}),
    # averaging leaves the iterates alone: the base's closed form applies
    # (the average: tests/algorithms/test_averaging.py)
    AlgoInfo("Averaging-SimGD", lambda lr: Averaging(SimGD(lr), start=2), "simgd"),
    AlgoInfo(
        "Averaging-EMA-ExtraAdam",
        lambda lr: Averaging(Extragradient(lr, update=Adam((0.5, 0.9))), kind="ema", decay=0.9),
        "eg",
        rule=_adam((0.5, 0.9)),
    ),
    AlgoInfo(
        "Averaging-Lookahead",
        lambda lr: Averaging(Lookahead(SimGD(lr), k=3, alpha=0.5), kind="ema", decay=0.5),
        "lookahead",
        {"k": 3, "alpha": 0.5},
    ),
    AlgoInfo("PastExtragradient", lambda lr: PastExtragradient(lr), "peg"),
    AlgoInfo("PastExtraAdam", lambda lr: PastExtragradient(lr, update=Adam((0.5, 0.9))), "peg", rule=_adam((0.5, 0.9))),
    AlgoInfo(
        "PastExtragradient-momentum", lambda lr: PastExtragradient(lr, update=Momentum(0.5)), "peg", rule=_momentum(0.5)
    ),
    AlgoInfo("AnchoredExtragradient", lambda lr: AnchoredExtragradient(lr), "eag"),
]

#: second-order methods on any number of players (no closed form here)
SECOND_ORDER = [
    AlgoInfo("HamiltonianGD", lambda lr: HamiltonianGD(lr)),
    AlgoInfo("Consensus-Adam", lambda lr: ConsensusOptimization(lr, 0.5, update=Adam())),
    AlgoInfo("SGA", lambda lr: SGA(lr)),
    AlgoInfo("CGD", lambda lr: CGD(lr, tol=1e-6)),
    AlgoInfo("LA", lambda lr: LA(lr, alpha=0.3)),
    AlgoInfo("LOLA", lambda lr: LOLA(lr, alpha=0.3, update=Momentum(0.5))),
    AlgoInfo("SOS", lambda lr: SOS(lr, alpha=0.3)),
    AlgoInfo("Lookahead-CGD", lambda lr: Lookahead(CGD(lr, tol=1e-6), k=2)),
    AlgoInfo("Averaging-EMA-CGD", lambda lr: Averaging(CGD(lr, tol=1e-6), kind="ema", decay=0.5)),
]

#: every algorithm on any number of players: the generic checks (resume, dtypes, all or nothing) run on each
GENERIC = [*ALGORITHMS, *SECOND_ORDER]

#: two-player methods (zero-sum, or leader and follower)
TWO_PLAYERS = [
    AlgoInfo("ACGD", lambda lr: ACGD(lr), players=2),
    AlgoInfo("FollowTheRidge", lambda lr: FollowTheRidge(lr), players=2),
    AlgoInfo("Stackelberg", lambda lr: Stackelberg(lr), players=2),
    AlgoInfo("CGD-zero-sum", lambda lr: CGD(lr, zero_sum=True), players=2),
]
