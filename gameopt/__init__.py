"""gameopt: optimization of differentiable multi-player games in PyTorch.

Two tiers. ``gameopt`` is for users: the names in ``__all__`` (games, players,
algorithms, update rules, errors and the modules ``constraints``, ``diagnostics``
and ``dice``). :mod:`gameopt.algorithms.api` is for algorithm authors: the one
module a new algorithm imports from. The modules behind it (``gameopt.protocols``,
``gameopt.debug``, ...) stay importable, outside ``__all__``.
"""

from importlib.metadata import PackageNotFoundError, version

# debug and protocols are authors' modules: importable, outside __all__
from . import constraints, debug, diagnostics, dice, protocols  # noqa: F401
from .algorithms import (
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
    Hyper,
    Lookahead,
    Optimistic,
    PastExtragradient,
    SimGD,
    Stackelberg,
    Wrapper,
)
from .constrained import LagrangianGame, MultiplicativePenalty, NuPI, Proxy, Sampled
from .evaluation import LossError, StepLosses
from .game import Game, NonFiniteError
from .layout import JointLayout
from .loss_scale import DynamicLossScale
from .normal_form import nash_conv
from .optim import GameOptimizer
from .player import Player
from .updates import Adam, Momentum, Plain, RMSProp, UpdateRule
from .vec import Vec

__all__ = [
    "ACGD",
    "Adam",
    "Algorithm",
    "AltGD",
    "AnchoredExtragradient",
    "Averaging",
    "CGD",
    "ConsensusOptimization",
    "DynamicLossScale",
    "Extragradient",
    "FollowTheRidge",
    "Game",
    "GameOptimizer",
    "HamiltonianGD",
    "Hyper",
    "JointLayout",
    "LA",
    "LOLA",
    "LagrangianGame",
    "Lookahead",
    "LossError",
    "Momentum",
    "MultiplicativePenalty",
    "NonFiniteError",
    "NuPI",
    "Optimistic",
    "PastExtragradient",
    "Plain",
    "Player",
    "Proxy",
    "RMSProp",
    "SGA",
    "SOS",
    "Sampled",
    "SimGD",
    "Stackelberg",
    "StepLosses",
    "UpdateRule",
    "Vec",
    "Wrapper",
    "constraints",
    "diagnostics",
    "dice",
    "nash_conv",
]

try:
    __version__ = version("gameopt")  # the installed distribution's, from pyproject.toml
except PackageNotFoundError:  # a source tree imported without installing it: no version to read
    __version__ = "0+unknown"
