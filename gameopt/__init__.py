"""gameopt: optimization of differentiable multi-player games in PyTorch."""

from . import constraints, debug, diagnostics, dice, protocols
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
from .algorithms.base import Wrapper
from .evaluation import LossError, StepLosses
from .game import Game, NonFiniteError
from .lagrangian import LagrangianGame, MultiplicativePenalty, Proxy, Sampled
from .loss_scale import DynamicLossScale
from .normal_form import nash_conv
from .optim import GameOptimizer
from .player import Player
from .updates import Adam, Momentum, NuPI, Plain, RMSProp, UpdateRule
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
    "debug",
    "diagnostics",
    "dice",
    "nash_conv",
    "protocols",
]
__version__ = "0.1.0"
