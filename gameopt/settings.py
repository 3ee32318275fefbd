"""Settings checked whenever they are set: the constructor arguments of algorithms and
update rules that are not scheduled through param groups (``Lookahead.k``,
``Adam.eps``, ``CGD.maxiter``), and the update rules' schedulable ones
(``Adam.betas``). The schedulable hyperparameters of algorithms are
:class:`~gameopt.algorithms.base.Hyper` descriptors, checked on set the same way.

A :class:`Setting` is declared on the class (``k = Setting.number(low=1,
integer=True)``); each assignment, in the constructor or after it, is checked: a
bad value raises ``ValueError`` naming the setting (``k must be an integer in [1,
inf), got 0``) and the attribute keeps its value. The value lives in the instance's
``__dict__`` under the setting's name, so reading it is a plain attribute read (the
descriptor has no getter: no cost in a step) and ``vars(rule)`` holds it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checks import check_bool, check_number, check_per_player

__all__ = ["Setting"]

#: ``check(owner, name, value)``: the value to keep, or a ``ValueError`` naming ``name``
Check = Callable[[Any, str, Any], Any]


class Setting:
    """A setting of an algorithm or update rule, checked by ``check`` whenever it is
    set (see the module). Build one with ``Setting.number``, ``Setting.flag``, ``Setting.choice``
    or ``Setting.schedulable``, or with a ``check`` of its own.

    Raises:
        ValueError: (on assignment) a value ``check`` refuses; nothing changes.
    """

    def __init__(self, check: Check) -> None:
        self.check = check
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = self.check(obj, self.name, value)

    @classmethod
    def number(cls, optional: bool = False, **bounds: Any) -> Setting:
        """A finite number in a range (``check_number``'s ``bounds``); ``None`` too with ``optional``."""

        def check(obj: Any, name: str, value: Any) -> Any:
            return None if optional and value is None else check_number(name, value, **bounds)

        return cls(check)

    @classmethod
    def per_player(cls, optional: bool = False, **bounds: Any) -> Setting:
        """One number, or one per player (``check_per_player``); ``None`` too with
        ``optional``. Once the owner is bound to a game (``owner.game``), a list must
        have one number per player."""

        def check(obj: Any, name: str, value: Any) -> Any:
            if optional and value is None:
                return None
            value = check_per_player(name, value, **bounds)
            game = getattr(obj, "game", None)
            if isinstance(value, list) and game is not None and len(value) != len(game.players):
                raise ValueError(
                    f"{name} has {len(value)} values for {len(game.players)} players: "
                    "give one per player, or one value for all"
                )
            return value

        return cls(check)

    @classmethod
    def flag(cls) -> Setting:
        """True or False."""
        return cls(lambda obj, name, value: check_bool(name, value))

    @classmethod
    def choice(cls, *options: str) -> Setting:
        """One of the strings ``options``."""

        def check(obj: Any, name: str, value: Any) -> str:
            if not isinstance(value, str) or value not in options:
                raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")
            return value

        return cls(check)

    @classmethod
    def schedulable(cls) -> Setting:
        """An update rule's schedulable setting, checked by the rule's own ``check``."""
        return cls(lambda rule, name, value: rule.check(name, value))
