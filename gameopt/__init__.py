"""gameopt: optimization of differentiable multi-player games in PyTorch."""

from . import diagnostics
from .algorithms import (
    ACGD,
    CGD,
    LA,
    LOLA,
    SGA,
    SOS,
    Algorithm,
    AltGD,
    ConsensusOptimization,
    Extragradient,
    HamiltonianGD,
    Lookahead,
    Optimistic,
    SimGD,
)
from .buffer import FlatBuffer
from .game import Game, NonFiniteError, Oracle
from .player import Player
from .updates import Adam, Momentum, Plain, UpdateRule

__all__ = [
    "diagnostics",
    "ACGD",
    "CGD",
    "LA",
    "LOLA",
    "SGA",
    "SOS",
    "ConsensusOptimization",
    "HamiltonianGD",
    "Adam",
    "Algorithm",
    "AltGD",
    "Extragradient",
    "FlatBuffer",
    "Game",
    "Lookahead",
    "Momentum",
    "NonFiniteError",
    "Optimistic",
    "Oracle",
    "Plain",
    "Player",
    "SimGD",
    "UpdateRule",
]
__version__ = "0.1.0"
