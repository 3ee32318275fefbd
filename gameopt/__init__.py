"""gameopt: optimization of differentiable multi-player games in PyTorch."""

from . import debug, diagnostics, dice
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
)
from .buffer import FlatBuffer
from .evaluation import DynamicLossScale, LossError, StepLosses
from .game import Game, NonFiniteError, Oracle
from .lagrangian import LagrangianGame, Proxy, Sampled
from .normal_form import nash_conv
from .optim import GameOptimizer
from .player import Player
from .updates import Adam, Momentum, NuPI, Plain, RMSProp, UpdateRule
from .vec import Vec

__all__ = [
    "debug",
    "diagnostics",
    "dice",
    "ACGD",
    "CGD",
    "LA",
    "LOLA",
    "SGA",
    "SOS",
    "ConsensusOptimization",
    "DynamicLossScale",
    "LossError",
    "StepLosses",
    "HamiltonianGD",
    "Hyper",
    "Adam",
    "Algorithm",
    "AltGD",
    "Averaging",
    "Extragradient",
    "FlatBuffer",
    "Game",
    "GameOptimizer",
    "LagrangianGame",
    "Lookahead",
    "Momentum",
    "NuPI",
    "NonFiniteError",
    "Optimistic",
    "Oracle",
    "Plain",
    "RMSProp",
    "Player",
    "Proxy",
    "Sampled",
    "SimGD",
    "UpdateRule",
    "Vec",
    "AnchoredExtragradient",
    "PastExtragradient",
    "FollowTheRidge",
    "Stackelberg",
    "nash_conv",
]
__version__ = "0.1.0"
