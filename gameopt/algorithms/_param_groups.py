"""An algorithm's param groups: one per player, with its ``lr``, the schedulable
hyperparameters (:class:`Hyper`) and its update rule's schedulable settings, shared
with the game's :class:`~gameopt.optim.GameOptimizer` for torch.optim's schedulers;
binding to a game, and the checks each step makes of the groups.

``_ParamGroups`` is this part of :class:`~gameopt.Algorithm` (and
``_WrapperParamGroups`` of :class:`~gameopt.Wrapper`): the private methods the game
calls. What an author reads or overrides (``lrs``, ``per_player``,
``schedulable_hypers``, ``bind``) is on the algorithm itself, in
:mod:`gameopt.algorithms.base`; this part reads what the algorithm's constructor sets
(``rule``, ``_lr``, ``_defaults``, ``settings``).
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..checks import check_number, check_per_player
from ..settings import Setting
from ..updates import PerPlayer, UpdateRule

if TYPE_CHECKING:
    from ..protocols import GameView


#: how a bind's length error names each per-player argument, and its single form
_PER_PLAYER = {"lr": ("learning rates", "float"), "update": ("rules", "rule (not a list)")}

#: what binding to a game sets (``_ParamGroups._bind``), left out of copies
_BINDING = ("game", "param_groups", "defaults", "_checked")


def check_lr(lr: float | Sequence[float]) -> float | list[float]:
    """Learning rates as an algorithm takes them: one float, or one per player (each ≥ 0)."""
    return check_per_player("lr", lr, low=0.0)


@functools.cache
def hypers_of(cls: type) -> dict[str, Hyper]:
    """The :class:`Hyper` descriptors of an algorithm's class, by name."""
    return {k: v for c in reversed(cls.__mro__) for k, v in vars(c).items() if isinstance(v, Hyper)}


def _immutable(value: Any) -> bool:
    """A setting that cannot change without being replaced: a number, a string, None,
    or a tuple of them (``betas``). A list may change in place."""
    if type(value) is tuple:
        return all(map(_immutable, value))
    return value is None or type(value) in (float, int, str, bool)


def _renew(rule: UpdateRule, name: str, value: Any) -> None:
    """Give ``rule`` a value of a schedulable setting that ``rule.check`` just checked:
    past its ``Setting``, whose check is that one (not twice
    per step)."""
    if isinstance(getattr(type(rule), name, None), Setting):
        rule.__dict__[name] = value
    else:
        setattr(rule, name, value)


def _shared(owner: str, name: str, values: list[Any]) -> Any:
    """The one value all players' param groups hold for ``name``."""
    if any(v != values[0] for v in values):
        raise ValueError(f"{owner} uses one {name} for all players, the param groups hold {values}")
    return values[0]


def _chain(algorithm: Any) -> Iterator[_ParamGroups]:
    """``algorithm``, its base, the base's base (a :class:`~gameopt.Wrapper`), ..."""
    while isinstance(algorithm, _ParamGroups):
        yield algorithm
        algorithm = vars(algorithm).get("base")


def _rule_views(rule: UpdateRule) -> Any:
    """The layout views a per-player rule was bound to (``None`` for any other rule)."""
    return rule._views if isinstance(rule, PerPlayer) else None


class Hyper:
    """A hyperparameter that users may schedule, declared on the algorithm's class
    (``gamma = Hyper(low=0.0)``). Once the algorithm is in a game it lives in every
    param group beside ``'lr'``, one value per player, where torch.optim schedulers
    and users reach it (``for g in algo.param_groups: g["gamma"] *= 0.5``) and
    checkpoints carry it. ``algo.gamma`` is its value, checked when read: the value
    shared by all players (a ``ValueError`` if the groups were set apart; see
    :meth:`~gameopt.Algorithm.per_player` for per-player values).

    Args:
        bounds: the range a value must lie in, as ``gameopt.checks.check_number``
            takes it (``low``, ``high``, ``low_open``, ``high_open``, ``integer``).

    Raises:
        ValueError: (when a value is set or read) a value outside the range.
    """

    def __init__(self, **bounds: Any) -> None:
        self.bounds = bounds
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def check(self, value: Any, path: str | None = None) -> float:
        return check_number(path or self.name, value, **self.bounds)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return _shared(type(obj).__name__, self.name, obj.per_player(self.name))

    def __set__(self, obj: Any, value: Any) -> None:
        value = self.check(value)
        obj._defaults[self.name] = value
        for group in obj.__dict__.get("param_groups", ()):
            group[self.name] = value


class _ParamGroups:
    """The param groups of an algorithm (see the module), and its binding to a game."""

    #: the rules, keys and values that ``_check_groups`` last found valid (when all immutable)
    _checked: tuple[list[UpdateRule], list[list[str]], list[Any]] | None = None
    #: the list of rules given as ``update=[...]`` (one per player; None: one rule for all)
    _rules_given: list[UpdateRule] | None = None

    if TYPE_CHECKING:  # set by the algorithm's constructor (gameopt.algorithms.base)
        rule: UpdateRule

        @property
        def settings(self) -> dict[str, Any]: ...

        _lr: float | list[float] | None
        _defaults: dict[str, float]
        game: GameView | None
        param_groups: list[dict[str, Any]]
        defaults: dict[str, Any]

        def schedulable_hypers(self) -> dict[str, Hyper]: ...

        def bind(self, game: GameView) -> None: ...

    # --------------------------------------------------------------- binding
    def _bind(self, game: GameView) -> None:
        """Attach to a game: one param group per player (its lr and the schedulable
        hyperparameters). Refuses (changing nothing) a :class:`Hyper` without a
        value, and an algorithm that another game still uses (``ValueError``; bind
        ``copy.deepcopy(algorithm)`` instead). The game then makes the fresh state
        (``init_state``) and holds it."""
        self._check_unbound(game)
        self.bind(game)
        self._check_settings()
        n = len(game.players)
        assert self._lr is not None, "a Wrapper binds through its base"
        lrs = [self._lr] * n if isinstance(self._lr, float) else self._lr
        self._check_lengths(n, {"lr": lrs, **{k: v for k, v in self.settings.items() if isinstance(v, list)}})
        if isinstance(self.rule, PerPlayer):
            self.rule.bind(game.layout.player_views, n)
        scheduled = [
            {**self._defaults, **{name: getattr(rule, name) for name in rule.schedulable}}
            for rule in map(self.rule.for_player, range(n))
        ]
        groups = [
            {"params": [b.data for b in p.buffers], "lr": lr, "player": p.name, **values}
            for p, lr, values in zip(game.players, lrs, scheduled)
        ]
        common = {k: v for k, v in scheduled[0].items() if all(k in values for values in scheduled)}
        self.param_groups, self.defaults = groups, {"lr": lrs[0], **common}
        self.game = game

    def _check_lengths(self, n: int, per_player: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless every per-player argument has one value per player."""
        if self._rules_given is not None:
            per_player["update"] = self._rules_given
        for key, values in per_player.items():
            if len(values) != n:
                what, one = _PER_PLAYER.get(key, (f"values of {key}", "value"))
                raise ValueError(
                    f"{type(self).__name__} got {len(values)} {what} for {n} players: "
                    f"give one per player, or one {one} for all"
                )

    def _check_settings(self) -> None:
        """Raise ``TypeError`` naming each :class:`Hyper` of the class that has no
        value (an algorithm's constructor passes each to ``super().__init__``, or its
        ``bind`` sets it before ``super().bind``). Binding checks it."""
        unset = [name for name in self.schedulable_hypers() if name not in self._defaults]
        if unset:
            given = ", ".join(f"{n}=..." for n in unset)
            raise TypeError(
                f"{type(self).__name__} has no value for {', '.join(map(repr, unset))}: construct it as "
                f"{type(self).__name__}(lr, {given}) (a constructor of its own passes {given} to super().__init__)"
            )

    def _check_unbound(self, game: GameView) -> None:
        """Raise ``ValueError`` if another game still uses this algorithm (as its
        algorithm, or inside it as the base of a :class:`~gameopt.Wrapper`): param groups,
        learning rates and per-player rule views belong to one game. Binding to the
        same game again, or to a new one after the old one replaced it, is fine."""
        bound = self.game
        if bound is None or bound is game or not any(a is self for a in _chain(getattr(bound, "algorithm", None))):
            return
        name = type(self).__name__
        players = ", ".join(p.name for p in bound.players)
        raise ValueError(
            f"this {name} is already bound to another game (players {players}), as its algorithm or inside it: its "
            f"param groups (learning rates, scheduled values, per-player update rules) belong to that game, and two "
            f"games would step with each other's. Give each game its own: copy.deepcopy(algorithm) (an unbound copy "
            f"with the same settings) or a new {name}(...)"
        )

    def _save_binding(self) -> Callable[[], None]:
        """A function that puts back this algorithm's binding as it is now (its game,
        param groups and torch.optim defaults, and those of its base): a game whose
        construction is refused after binding calls it, so that nothing changed."""
        saved = [(a, {k: vars(a)[k] for k in _BINDING}, _rule_views(a.rule)) for a in _chain(self)]

        def restore() -> None:
            for algorithm, binding, views in saved:
                vars(algorithm).update(binding)
                if isinstance(algorithm.rule, PerPlayer):
                    algorithm.rule._views = views

        return restore

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle keeps: every setting, not the binding (the game, its
        param groups), so ``copy.deepcopy(algorithm)`` is an unbound algorithm with the
        same settings, ready for another game (a copy of the whole game binds its own)."""
        state = {k: v for k, v in vars(self).items() if k not in _BINDING}
        if isinstance(self.rule, PerPlayer):  # its views of the game's layout stay behind
            rule = state["rule"] = copy.copy(self.rule)
            rule._views = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.game, self.param_groups, self.defaults, self._checked = None, [], {}, None

    def _refresh_params(self, game: GameView) -> None:
        """After the game re-laid its storage, point the param groups at it."""
        for group, p in zip(self.param_groups, game.players):
            group["params"] = [b.data for b in p.buffers]
        if isinstance(self.rule, PerPlayer):
            self.rule.bind(game.layout.player_views, len(game.players))

    # ------------------------------------------------------------ each step
    def _sync_rule(self) -> None:
        """Give the update rule the param groups' values of its schedulable settings
        (Adam's ``betas``, ``momentum``, RMSProp's ``decay``: a scheduler may have
        changed them). They are checked, and must agree across players. The game
        calls this before each step."""
        rule = self.rule
        if isinstance(rule, PerPlayer):  # each player's rule reads its own group
            for k, (own, g) in enumerate(zip(rule.rules, self.param_groups)):
                for name in own.schedulable:
                    _renew(own, name, own.check(name, g[name], f"param_groups[{k}].{name}"))
            return
        for name in rule.schedulable:
            values = [rule.check(name, g[name], f"param_groups[{k}].{name}") for k, g in enumerate(self.param_groups)]
            _renew(rule, name, _shared(type(rule).__name__, name, values))

    def _rules(self) -> list[UpdateRule]:
        """The update rules whose settings live in the param groups."""
        return [self.rule]

    def _check_groups(self) -> None:
        """Check every value of the param groups a step reads (``lr``, the schedulable
        hyperparameters and the update rule's settings), whoever set it: a value that
        is negative where it must not be, not finite, a string or None raises
        ``ValueError`` naming the group and the key (``param_groups[1].lr``). The game calls this
        at the start of each step, before anything changes."""
        groups, rules, checked = self.param_groups, self._rules(), self._checked
        if checked is not None and all(map(operator.is_, rules, checked[0])):
            read = [group.get(key) for group, keys in zip(groups, checked[1]) for key in keys]
            if all(map(operator.is_, read, checked[2])):
                return  # the very values checked before (numbers: immutable)
        self._checked = None
        hypers = self.schedulable_hypers()
        keys = []  # per group, the keys a step reads
        for k, group in enumerate(groups):
            check_number(f"param_groups[{k}].lr", group.get("lr"), low=0.0)
            for name, hyper in hypers.items():
                hyper.check(group.get(name), f"param_groups[{k}].{name}")
            for rule in (r.for_player(k) for r in rules):
                for name in rule.schedulable:
                    rule.check(name, group.get(name), f"param_groups[{k}].{name}")
            keys.append(["lr", *hypers, *(name for r in rules for name in r.for_player(k).schedulable)])
        read = [group.get(key) for group, ks in zip(groups, keys) for key in ks]
        if all(map(_immutable, read)):
            self._checked = (rules, keys, read)


class _WrapperParamGroups(_ParamGroups):
    """A wrapper's param groups: its base's (so its learning rates and schedulers),
    with its own :class:`Hyper` values added."""

    if TYPE_CHECKING:
        base: _ParamGroups

    def _bind(self, game: GameView) -> None:
        self._check_unbound(game)
        self.bind(game)
        self._check_settings()  # this one's own; the base's own binding checks the base's
        self.base._bind(game)
        self.param_groups, self.defaults = self.base.param_groups, self.base.defaults
        self.game = game

    def _refresh_params(self, game: GameView) -> None:
        self.base._refresh_params(game)

    def _sync_rule(self) -> None:
        self.base._sync_rule()

    def _rules(self) -> list[UpdateRule]:
        return self.base._rules()

    def _check_groups(self) -> None:
        self.base._check_groups()
        super()._check_groups()
