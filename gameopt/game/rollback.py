"""What a refused :class:`~gameopt.Game` constructor puts back, so that it changes
nothing it was given: the names of the players, where their parameters live, the
modules it wrapped into players, and the algorithm's binding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..algorithms.base import Algorithm
from ..player import Player


class Rollback:
    """Notes, before a game is built from ``given`` (players or modules) and
    ``algorithm``, what building it may change; :meth:`undo` puts it back."""

    def __init__(self, given: Sequence[Player | nn.Module | Tensor], algorithm: Any) -> None:
        players = [p for p in given if isinstance(p, Player)]
        self._names = [(p, p.name) for p in players]
        # each buffer's storage as it is now (kept alive), for the joint layout moves it
        self._homes = [(b, b.data.detach(), b.grad) for p in players for b in p.buffers]
        self._binding = algorithm._save_binding() if isinstance(algorithm, Algorithm) else None
        self._wrapped: list[Player] = []

    def player(self, p: Player | nn.Module | Tensor) -> Player:
        """``p``, or a new player around the module ``p`` (undone by :meth:`undo`)."""
        if isinstance(p, Player):
            return p
        player = Player(p)
        self._wrapped.append(player)
        return player

    def undo(self) -> None:
        """Put back what the refused constructor changed: the modules it wrapped own
        their parameters again (values and gradients), the given players' buffers are
        back in their own storage, the players have their names, the algorithm its
        binding."""
        for player in self._wrapped:
            player.unfuse()
        for buf, data, grad in self._homes:
            if buf.data.data_ptr() != data.data_ptr() or buf.why_stale() is not None:
                buf.rehome(data, grad)
        for player, name in self._names:
            player.name = name
        if self._binding is not None:
            self._binding()
