"""Game optimization algorithms, one small file per family."""

from .base import Algorithm
from .extragradient import Extragradient, Optimistic
from .gradient_play import AltGD, SimGD
from .lookahead import Lookahead

__all__ = ["Algorithm", "AltGD", "Extragradient", "Lookahead", "Optimistic", "SimGD"]
