"""Game optimization algorithms, one small file per family; :mod:`gameopt.algorithms.api`
is the contract a new one is written against."""

from . import api
from .averaging import Averaging
from .base import Algorithm, Hyper, Wrapper
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
    "Algorithm",
    "AltGD",
    "AnchoredExtragradient",
    "Averaging",
    "CGD",
    "ConsensusOptimization",
    "Extragradient",
    "FollowTheRidge",
    "HamiltonianGD",
    "Hyper",
    "LA",
    "LOLA",
    "Lookahead",
    "Optimistic",
    "PastExtragradient",
    "SGA",
    "SOS",
    "SimGD",
    "Stackelberg",
    "Wrapper",
    "api",
]


def first_order_names() -> str:
    """The first-order algorithms, by name, for error messages: the ones constrained
    players and compiled modules take."""
    classes = [c for c in map(globals().get, sorted(__all__)) if isinstance(c, type) and issubclass(c, Algorithm)]
    plain = [c.__name__ for c in classes if c.first_order is True and c is not Algorithm]
    wrappers = [c.__name__ for c in classes if issubclass(c, Wrapper) and c is not Wrapper]
    return f"{', '.join(plain)}, or {' or '.join(wrappers)} around one"
