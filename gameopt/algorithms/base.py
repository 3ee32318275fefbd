"""What every algorithm shares: per-player hyperparameters in param groups (the
ones the game's :class:`~gameopt.optim.GameOptimizer` shows to torch.optim),
explicit state, and the (step, new state) contract."""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from ..checks import check_bool, check_number, check_per_player
from ..settings import Setting
from ..state import Carry, check_loaded, clone_state, moved_like, retyped, tensors_in
from ..updates import PerPlayer, Plain, State, UpdateRule, apply, rule_from
from ..vec import Vec

if TYPE_CHECKING:
    from ..layout import Vec
    from ..protocols import GameView, OracleInterface


__all__ = ["Algorithm", "Hyper", "Setting", "Wrapper", "check_bool", "check_number", "check_per_player"]

#: an algorithm's state: a dict, typed per algorithm (a ``TypedDict`` of :mod:`gameopt.algorithms.api`)
S = TypeVar("S")


#: how a bind's length error names each per-player argument, and its single form
_PER_PLAYER = {"lr": ("learning rates", "float"), "update": ("rules", "rule (not a list)")}


def _check_lr(lr: float | Sequence[float]) -> float | list[float]:
    return check_per_player("lr", lr, low=0.0)


@functools.cache
def _hypers_of(cls: type) -> dict[str, Hyper]:
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


def _plain(value: Any) -> Any:
    """A setting as a checkpoint keeps it (numbers, strings, bools, None, lists)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return type(value).__name__


def _difference(saved: Any, mine: Any, path: str) -> str:
    """The first place where a checkpoint's identity differs from this game's ('' if none)."""
    if isinstance(saved, dict) and isinstance(mine, dict):
        for key in sorted(set(saved) | set(mine), key=lambda k: (k != "type", str(k))):  # the type first
            where = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in mine:
                return f"{where}: {saved.get(key, '(absent)')!r} in the checkpoint, {mine.get(key, '(absent)')!r} here"
            found = _difference(saved[key], mine[key], where)
            if found:
                return found
        return ""
    if isinstance(saved, (list, tuple)) and isinstance(mine, (list, tuple)) and len(saved) == len(mine):
        for k, (a, b) in enumerate(zip(saved, mine)):
            found = _difference(a, b, f"{path}[{k}]")
            if found:
                return found
        return ""
    return "" if saved == mine else f"{path}: {saved!r} in the checkpoint, {mine!r} here"


#: what binding to a game sets (:meth:`Algorithm.bind`), left out of copies
_BINDING = ("game", "param_groups", "defaults", "_checked")


def _chain(algorithm: Algorithm | None) -> Iterator[Algorithm]:
    """``algorithm``, its base, the base's base (:class:`Wrapper`), ..."""
    while algorithm is not None:
        yield algorithm
        algorithm = algorithm.base if isinstance(algorithm, Wrapper) else None


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
    :meth:`Algorithm.per_player` for per-player values).

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


class Algorithm(Generic[S]):
    """Base class of gameopt algorithms, generic in the type of their state ``S`` (a
    ``TypedDict`` such as :class:`~gameopt.algorithms.api.DescentState`; at run time
    the state is a plain dict, so checkpoints hold plain dicts).

    An algorithm holds its settings: one param group per player (a dict with that
    player's ``'lr'`` and the schedulable hyperparameters), its update rule and the
    rest of its constructor's arguments. It holds no run state: the game does
    (``game.algorithm_state``), and every method that reads or writes a state takes
    it as an argument (:meth:`init_state` makes one, :meth:`update` steps one,
    :meth:`state_dict`, :meth:`check_state_dict` and :meth:`load_state_dict` write,
    check and read one). It is bound to a game by :class:`~gameopt.Game`. Each step
    it queries the game's oracle and returns ``(delta, new_state)``; the game applies
    ``w ← w + delta`` and commits ``new_state`` as ``game.algorithm_state`` only if
    both are finite.

    An algorithm is not a ``torch.optim.Optimizer``: the game's
    :class:`~gameopt.optim.GameOptimizer` (``game.optimizer``) is, and shares these
    param groups, so schedulers and Lightning drive the game through it.

    Subclasses implement :meth:`init_state` and :meth:`update`. Names: :class:`Hyper`
    declares a schedulable hyperparameter on the class; :meth:`schedulable_hypers`
    lists those; a ``Setting`` declares a fixed one (``k =
    Setting.number(low=1, integer=True)``); both check every assignment, in the
    constructor or after it (``ValueError``, nothing changed); :attr:`settings`
    holds every constructor setting by name.
    """

    #: the list of rules given as ``update=[...]`` (one per player; None: one rule for all)
    _rules_given: list[UpdateRule] | None = None

    #: Whether only ξ is used (no Jacobian products); such an algorithm has a
    #: projected or mirror version on feasible sets (see :mod:`gameopt.constraints`).
    first_order = True

    #: Whether :meth:`update` evaluates the losses once per step, at the current point
    #: (one ``oracle.xi()``): its steps then keep no copy of the random-number state
    #: for later evaluations to share (:mod:`gameopt.evaluation`), and a second
    #: evaluation in a step is refused (``RuntimeError``, nothing changed).
    evaluates_once = False

    #: The step counts of this algorithm's own state, each with the joint vector whose
    #: elements it counts (as ``Optimistic`` and ``ACGD`` declare theirs): a parameter that joins a
    #: running game starts its own count from 0, the count then one per element
    #: (``next_count`` and ``stepped`` take either form). The update rule's state
    #: (under ``"rule"``) is the rule's to carry and check.
    counts: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self, lr: float | Sequence[float], update: UpdateRule | Sequence[UpdateRule] | None = None, **settings: Any
    ) -> None:
        """``update``: one update rule, or one per player (see :class:`~gameopt.updates.PerPlayer`).
        ``settings``: the algorithm's other arguments; each becomes an attribute,
        checked by its descriptor (a :class:`Hyper` of the class goes to the param
        groups, a ``Setting`` checks it) or already checked."""
        self._lr: float | list[float] | None = _check_lr(lr)
        self._setup(rule_from(update), settings)
        if isinstance(update, (list, tuple)):  # one rule per player: its length is checked when bound
            self._rules_given = list(update)

    def _setup(self, rule: UpdateRule, settings: dict[str, Any]) -> None:
        """What every constructor sets beside the learning rates (a :class:`Wrapper`
        has none of its own)."""
        self.rule = rule
        self._defaults: dict[str, float] = {}  # the Hyper values before binding
        self._settings = list(settings)
        for name, value in settings.items():
            setattr(self, name, value)
        self.game: GameView | None = None
        self.param_groups: list[dict[str, Any]] = []  # one per player, once bound
        self.defaults: dict[str, Any] = {}  # torch.optim's defaults: the first player's values
        # the rules, keys and values that check_groups last found valid (when all immutable)
        self._checked: tuple[list[UpdateRule], list[list[str]], list[Any]] | None = None

    @classmethod
    def schedulable_hypers(cls) -> dict[str, Hyper]:
        """The schedulable hyperparameters (the class's :class:`Hyper` descriptors), by name."""
        return _hypers_of(cls)

    def check_settings(self) -> None:
        """Raise ``TypeError`` naming each :class:`Hyper` of the class that has no
        value (an algorithm's constructor passes each to ``super().__init__``, or its
        ``bind`` sets it before ``super().bind``). :meth:`bind` checks first."""
        unset = [name for name in self.schedulable_hypers() if name not in self._defaults]
        if unset:
            given = ", ".join(f"{n}=..." for n in unset)
            raise TypeError(
                f"{type(self).__name__} has no value for {', '.join(map(repr, unset))}: construct it as "
                f"{type(self).__name__}(lr, {given}) (a constructor of its own passes {given} to super().__init__)"
            )

    @property
    def settings(self) -> dict[str, Any]:
        """Every setting given to the constructor, by name (for display)."""
        return {k: getattr(self, k) for k in self._settings}

    def per_player(self, name: str) -> list[float]:
        """A schedulable hyperparameter's value for each player (checked)."""
        hyper = self.schedulable_hypers()[name]
        groups = self.param_groups
        if not groups:
            return [self._defaults[name]]
        return [hyper.check(g[name], f"param_groups[{k}].{name}") for k, g in enumerate(groups)]

    # --------------------------------------------------------------- binding
    def bind(self, game: GameView) -> None:
        """Attach to a game: one param group per player (its lr and the schedulable
        hyperparameters). Refuses (changing nothing) a :class:`Hyper` without a
        value, and an algorithm that another game still uses (``ValueError``; bind
        ``copy.deepcopy(algorithm)`` instead). The game then makes the fresh state
        (:meth:`~gameopt.Algorithm.init_state`) and holds it."""
        self.check_unbound(game)
        self.check_settings()
        n = len(game.players)
        lrs = [self._lr] * n if isinstance(self._lr, float) else self._lr
        per_player = {"lr": lrs, **{k: v for k, v in self.settings.items() if isinstance(v, list)}}
        if self._rules_given is not None:
            per_player["update"] = self._rules_given
        for key, values in per_player.items():
            if len(values) != n:
                what, one = _PER_PLAYER.get(key, (f"values of {key}", "value"))
                raise ValueError(
                    f"{type(self).__name__} got {len(values)} {what} for {n} players: "
                    f"give one per player, or one {one} for all"
                )
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

    def check_unbound(self, game: GameView) -> None:
        """Raise ``ValueError`` if another game still uses this algorithm (as its
        algorithm, or inside it as the base of a :class:`Wrapper`): param groups,
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

    def save_binding(self) -> Callable[[], None]:
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
        views = _rule_views(self.rule)
        if views is not None:  # the per-player rule's views of the game's layout stay behind
            rule = state["rule"] = copy.copy(self.rule)
            rule._views = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.game, self.param_groups, self.defaults, self._checked = None, [], {}, None

    def refresh_params(self, game: GameView) -> None:
        """After the game re-laid its storage, point the param groups at it."""
        for group, p in zip(self.param_groups, game.players):
            group["params"] = [b.data for b in p.buffers]
        if isinstance(self.rule, PerPlayer):
            self.rule.bind(game.layout.player_views, len(game.players))

    @property
    def lrs(self) -> list[float]:
        """The current learning rate of each player."""
        return [float(g["lr"]) for g in self.param_groups]

    def sync_rule(self) -> None:
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

    def check_groups(self) -> None:
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

    # ------------------------------------------------------------ interface
    def init_state(self, game: GameView) -> S:
        """The state before the first step (by default a
        :class:`~gameopt.algorithms.api.DescentState`: the update rule's state)."""
        return cast(S, {"rule": self.rule.init(game.layout.data)})

    def update(self, oracle: OracleInterface, state: S) -> tuple[Vec, S]:
        """One step: return ``delta`` (w ← w + delta) and the new state, a new dict
        with the keys of ``state``.

        Must not modify ``state`` or the parameters in place.
        """
        raise NotImplementedError

    # --------------------------------------------------------------- helpers
    def descend(
        self, oracle: OracleInterface, d: Vec, rule_state: State, scratch: bool = False, own_state: bool = False
    ) -> tuple[Vec, State]:
        """−η · rule(d), per player, and the rule's new state. ``scratch``: ``d`` may be
        overwritten (the gradient buffer or a temporary); the step is then written into
        it, taking no vector. ``own_state``: ``rule_state`` is a temporary of this step
        (not the committed state), updated in place (see :mod:`gameopt.updates`)."""
        out, new_rule_state = apply(self.rule, d, rule_state, oracle.empty, scratch=scratch, own_state=own_state)
        factors = [-float(g["lr"]) for g in self.param_groups]
        state_tensors = tensors_in(new_rule_state) if new_rule_state else []
        # the rule keeps its result (momentum): leave it intact
        if state_tensors and not set(map(id, out)).isdisjoint(map(id, state_tensors)):
            step = oracle.layout.scale_(out, factors, out=d) if scratch else oracle.scaled(out, factors)
            return step, new_rule_state
        if out is d and not scratch:
            return oracle.scaled(out, factors), new_rule_state  # keep ``d`` intact
        return oracle.layout.scale_(out, factors), new_rule_state

    # ---------------------------------------------------------- checkpoints
    def identity(self) -> dict[str, Any]:
        """What a checkpoint records to know the run that saved it, beside the state:
        the algorithm's type, its settings that are not scheduled (those live in the
        param groups), its update rule's :meth:`~gameopt.UpdateRule.identity` and, for a
        :class:`~gameopt.algorithms.base.Wrapper`, its base's identity."""
        hypers = self.schedulable_hypers()
        settings = {k: _plain(getattr(self, k)) for k in self._settings if k not in hypers and k != "base"}
        return {"type": type(self).__name__, "settings": settings, "rule": self.rule.identity()}

    def state_dict(self, state: S) -> dict[str, Any]:
        """A snapshot: the type's name, what identifies the run (:meth:`identity`), the
        param groups (without ``params``) and a copy of ``state`` (the state the game
        holds)."""
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        # a snapshot: the live state's tensors are reused by later steps
        return {
            "type": type(self).__name__,
            "identity": self.identity(),
            "param_groups": groups,
            "state": clone_state(state),
        }

    def _check_state_dict(self, state_dict: Any, state: S, path: str = "algorithm") -> None:
        """Raise ``ValueError`` (naming what is wrong) unless ``state_dict`` fits this
        algorithm: its type, one settings dict per player, and a state of the same
        structure, shapes and dtypes as ``state`` (the state the game holds). Changes
        nothing."""
        self._loadable(state_dict, state, path)

    def _loadable(self, state_dict: Any, state: S, path: str) -> S:
        """:meth:`check_state_dict`, returning what the checkpoint's state loads as
        (see :meth:`_check_loaded`)."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"{path}: expected a dict, got {type(state_dict).__name__}")
        if state_dict.get("type") != type(self).__name__:
            raise ValueError(f"checkpoint is for {state_dict.get('type')!r}, this game runs {type(self).__name__!r}")
        if "identity" not in state_dict:
            raise ValueError(
                f"{path}: the checkpoint does not record the run that saved it ('identity'): it was written by a "
                f"development version of gameopt before 0.1, whose checkpoints do not load; nothing changed"
            )
        difference = _difference(state_dict["identity"], self.identity(), "")
        if difference:
            raise ValueError(f"checkpoint is from another run: {difference}")
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            got = len(groups) if isinstance(groups, list) else type(groups).__name__
            raise ValueError(f"{path}.param_groups: expected {len(self.param_groups)} players' settings, got {got}")
        for k, group in enumerate(groups):
            if not isinstance(group, dict) or "lr" not in group:
                raise ValueError(f"{path}.param_groups[{k}]: expected a dict with 'lr', got {group!r}")
            check_number(f"{path}.param_groups[{k}].lr", group["lr"], low=0.0)
            for name, hyper in self.schedulable_hypers().items():  # absent in older checkpoints: kept as they are
                if name in group:
                    hyper.check(group[name], f"{path}.param_groups[{k}].{name}")
            for rule in (r.for_player(k) for r in self._rules()):
                for name in rule.schedulable:
                    if name in group:
                        rule.check(name, group[name], f"{path}.param_groups[{k}].{name}")
        return self._check_loaded(state, state_dict.get("state"), f"{path}.state")

    def load_state_dict(self, state_dict: dict[str, Any], state: S) -> S:
        """Restore a :meth:`state_dict`: its param groups into this algorithm's, and its
        state returned, shaped as ``state`` (the state the game holds, left unchanged)
        for the game to hold in its place. A state dict that does not fit raises
        ``ValueError`` and changes nothing."""
        like = self._loadable(state_dict, state, "algorithm")
        for mine, theirs in zip(self.param_groups, state_dict["param_groups"]):
            mine.update({k: v for k, v in theirs.items() if k != "params"})
        # each tensor to the device of the one it replaces, as torch.optim does
        return cast(S, retyped(like, moved_like(like, state_dict["state"])))

    def _check_loaded(self, live: S, saved: Any, path: str) -> S:
        """Raise ``ValueError`` naming what is wrong unless ``saved`` (a checkpoint's
        state) fits ``live`` (the state the game holds); returns what ``saved`` loads
        as (``live`` with each step count in ``saved``'s form). The update rule checks
        its own state (:meth:`~gameopt.UpdateRule.check_loaded`)."""
        like = check_loaded(live, saved, path, self.counts, skip=("rule",))
        if isinstance(live, dict) and "rule" in live:
            like["rule"] = self.rule.check_loaded(live["rule"], saved["rule"], f"{path}.rule")
        return cast(S, like)

    def _carry_state(self, old: S, fresh: S, carry: Carry) -> S:
        """The state after the players' layout changed: ``fresh`` (:meth:`init_state`
        for the new layout) with each surviving parameter's values of ``old`` (the
        state before, its joint vectors taken apart by parameter) and the step counts
        of :attr:`counts`; the update rule carries its own (:meth:`~gameopt.UpdateRule.carry`)."""
        out = carry.state(old, fresh, self.counts, skip=("rule",))
        if isinstance(old, dict) and "rule" in old:
            out["rule"] = self.rule.carry(old["rule"], fresh["rule"], carry)
        return cast(S, out)

    def __repr__(self) -> str:
        lr = self.lrs if self.game is not None else self._lr
        extra = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        rule = "" if isinstance(self.rule, Plain) else f", update={self.rule!r}"
        return f"{type(self).__name__}(lr={lr!r}{extra}{rule})"


class Wrapper(Algorithm[S]):
    """An algorithm around a ``base`` algorithm that moves the iterates: it shares
    the base's param groups (so its learning rates and schedulers) and its
    first-order nature; subclasses add state around the base's (the base's own
    under the key ``"base"``, within the one state the game holds).

    It takes no learning rate of its own: ``__init__(base, **settings)``, the
    settings as :class:`Algorithm` takes them."""

    def __init__(self, base: Algorithm, **settings: Any) -> None:
        if not isinstance(base, Algorithm):
            raise TypeError(f"base must be a gameopt Algorithm, got {type(base).__name__}")
        self._lr = None  # the base's learning rates are the ones in use
        self._setup(rule_from(None), settings)
        self.base = base

    @property
    def first_order(self) -> bool:  # type: ignore[override]
        return self.base.first_order

    @property
    def evaluates_once(self) -> bool:  # type: ignore[override]
        return self.base.evaluates_once

    def bind(self, game: GameView) -> None:
        self.check_unbound(game)
        self.check_settings()  # this one's own; the base's own bind checks the base's
        self.base.bind(game)
        self.param_groups, self.defaults = self.base.param_groups, self.base.defaults
        self.game = game

    def refresh_params(self, game: GameView) -> None:
        self.base.refresh_params(game)

    def sync_rule(self) -> None:
        self.base.sync_rule()

    def _rules(self) -> list[UpdateRule]:
        return self.base._rules()

    def check_groups(self) -> None:
        self.base.check_groups()
        super().check_groups()

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "base": self.base.identity()}

    def _check_loaded(self, live: S, saved: Any, path: str) -> S:
        """:meth:`Algorithm._check_loaded`, the base's state (under ``"base"``) checked by the base."""
        like = check_loaded(live, saved, path, self.counts, skip=("base",))
        like["base"] = self.base._check_loaded(live["base"], saved["base"], f"{path}.base")  # type: ignore[index]
        return cast(S, like)

    def _carry_state(self, old: S, fresh: S, carry: Carry) -> S:
        """:meth:`Algorithm._carry_state`, the base's state (under ``"base"``) carried by the base."""
        out = carry.state(old, fresh, self.counts, skip=("base",))
        out["base"] = self.base._carry_state(old["base"], fresh["base"], carry)  # type: ignore[index]
        return cast(S, out)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        return f"{type(self).__name__}({self.base!r}{extra})"
