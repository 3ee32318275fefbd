"""Settings checked whenever they are set: the constructor arguments of algorithms and
update rules that are not scheduled through param groups (``Lookahead.k``,
``Adam.eps``, ``CGD.maxiter``), and the update rules' schedulable ones
(``Adam.betas``). The schedulable hyperparameters of algorithms are
:class:`~gameopt.algorithms.base.Hyper` descriptors, checked on set the same way.

A :class:`Setting` is declared on the class (``k = Setting.integer(low=1)``); each
assignment, in the constructor or after it, is checked: a bad value raises
``ValueError`` naming the setting (``k must be an integer in [1, inf), got 0``) and
the attribute keeps its value. The value lives in the instance's ``__dict__`` under
the setting's name, so reading it is a plain attribute read (the descriptor has no
getter at run time: no cost in a step) and ``vars(rule)`` holds it. For the type
checker a ``Setting[T]`` reads as a ``T`` on an instance."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from .checks import check_bool, check_number, check_per_player

__all__ = ["Setting"]

T = TypeVar("T")

#: ``check(owner, name, value)``: the value to keep, or a ``ValueError`` naming ``name``
Check = Callable[[Any, str, Any], T]


class Setting(Generic[T]):
    """A setting of an algorithm or update rule, checked by ``check`` whenever it is
    set (see the module). Build one with ``Setting.number``, ``Setting.flag``, ``Setting.choice``
    or ``Setting.schedulable``, or with a ``check`` of its own.

    Raises:
        ValueError: (on assignment) a value ``check`` refuses; nothing changes.
    """

    def __init__(self, check: Check[T]) -> None:
        self.check = check
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = self.check(obj, self.name, value)

    if TYPE_CHECKING:  # read as a plain attribute at run time (see the module)

        @overload
        def __get__(self, obj: None, owner: type) -> Setting[T]: ...
        @overload
        def __get__(self, obj: object, owner: type) -> T: ...
        def __get__(self, obj: object, owner: type) -> Setting[T] | T: ...

    @staticmethod
    def number(**bounds: Any) -> Setting[float]:
        """A finite number in a range (``check_number``'s ``bounds``)."""
        return Setting(lambda obj, name, value: check_number(name, value, **bounds))

    @overload
    @staticmethod
    def integer(*, optional: Literal[False] = False, **bounds: Any) -> Setting[int]: ...
    @overload
    @staticmethod
    def integer(*, optional: Literal[True], **bounds: Any) -> Setting[int | None]: ...
    @staticmethod
    def integer(*, optional: bool = False, **bounds: Any) -> Setting[Any]:
        """An integer in a range (``check_number``'s ``bounds``); ``None`` too with ``optional``."""

        def check(obj: Any, name: str, value: Any) -> int | None:
            if optional and value is None:
                return None
            return check_number(name, value, integer=True, **bounds)

        return Setting(check)

    @overload
    @staticmethod
    def per_player(optional: Literal[False] = False, **bounds: Any) -> Setting[float | list[float]]: ...
    @overload
    @staticmethod
    def per_player(optional: Literal[True], **bounds: Any) -> Setting[float | list[float] | None]: ...
    @staticmethod
    def per_player(optional: bool = False, **bounds: Any) -> Setting[Any]:
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

        return Setting(check)

    @staticmethod
    def flag() -> Setting[bool]:
        """True or False."""
        return Setting(lambda obj, name, value: check_bool(name, value))

    @staticmethod
    def choice(*options: str) -> Setting[str]:
        """One of the strings ``options``."""

        def check(obj: Any, name: str, value: Any) -> str:
            if not isinstance(value, str) or value not in options:
                raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")
            return value

        return Setting(check)

    @staticmethod
    def schedulable() -> Setting[T]:
        """An update rule's schedulable setting, checked by the rule's own ``check``;
        its type comes from the declaration (``betas: Setting[tuple[float, float]]``)."""
        return Setting(lambda rule, name, value: rule.check(name, value))
