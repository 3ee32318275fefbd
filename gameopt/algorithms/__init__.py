"""Game optimization algorithms, one small file per family."""

from .averaging import Averaging
from .base import Algorithm, Hyper
from .cgd import ACGD, CGD
from .extragradient import Extragradient, Optimistic
from .gradient_play import AltGD, SimGD
from .hamiltonian import ConsensusOptimization, HamiltonianGD
from .last_iterate import AnchoredExtragradient, PastExtragradient
from .lookahead import Lookahead
from .sequential import FollowTheRidge, Stackelberg
from .sga import SGA
from .shaping import LA, LOLA, SOS

__all__ = [
    "ACGD",
    "CGD",
    "LA",
    "LOLA",
    "SGA",
    "SOS",
    "Algorithm",
    "AltGD",
    "Averaging",
    "ConsensusOptimization",
    "Extragradient",
    "HamiltonianGD",
    "Hyper",
    "Lookahead",
    "Optimistic",
    "SimGD",
    "AnchoredExtragradient",
    "PastExtragradient",
    "FollowTheRidge",
    "Stackelberg",
]
