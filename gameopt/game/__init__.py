"""The game: :class:`Game` (players, losses, an algorithm, the step) and the
:class:`StepOracle` an algorithm queries during a step.

One job per module: ``game.py`` builds the game and steps it; ``oracle.py`` is what
an algorithm may ask, through a narrow view of the game (``StepContext``);
``moves.py`` forms feasible points; ``relayout.py`` follows players that change and
carries the algorithm state by parameter; ``checkpoint.py`` writes, checks and loads
``state_dict``; ``errors.py`` holds :class:`NonFiniteError`.
"""

from .errors import NonFiniteError
from .game import Game
from .oracle import StepOracle

__all__ = ["Game", "NonFiniteError", "StepOracle"]
