"""An algorithm's checkpoints and state, the part the game drives: how a checkpoint
is checked against the algorithm (the run it identifies, its param groups) and
against the state the game holds, what that state loads as, and how the state is
carried into a new layout when the players change.

``_Checkpoints`` is this part of :class:`~gameopt.Algorithm` (and
``_WrapperCheckpoints`` of :class:`~gameopt.Wrapper`): the private methods the game
calls. What an author reads or overrides (``identity``, ``state_dict``,
``load_state_dict``, ``counts``) is on the algorithm itself, in
:mod:`gameopt.algorithms.base`. The algorithm owns its state's meaning: it declares
its step counts (``counts``), and its update rule checks and carries the rule's own
state (:meth:`gameopt.UpdateRule.check_loaded`, :meth:`gameopt.UpdateRule.carry`);
nothing here reads a key of either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from ..checks import check_number
from ..state import Carry, check_loaded
from ..updates import UpdateRule

if TYPE_CHECKING:
    from ._param_groups import Hyper

#: an algorithm's state: a dict, typed per algorithm (a ``TypedDict`` of :mod:`gameopt.algorithms.api`)
S = TypeVar("S")


def plain(value: Any) -> Any:
    """A setting as a checkpoint keeps it (numbers, strings, bools, None, lists)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
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


class _Checkpoints(Generic[S]):
    """The checkpoints of an algorithm (see the module)."""

    if TYPE_CHECKING:  # the algorithm's (gameopt.algorithms.base, _param_groups)
        rule: UpdateRule
        param_groups: list[dict[str, Any]]
        counts: ClassVar[Mapping[str, str]]

        def schedulable_hypers(self) -> dict[str, Hyper]: ...

        def _rules(self) -> list[UpdateRule]: ...

        def identity(self) -> dict[str, Any]: ...

    def _check_state_dict(self, state_dict: Any, state: S, path: str = "algorithm") -> None:
        """Raise ``ValueError`` (naming what is wrong) unless ``state_dict`` fits this
        algorithm: its type, the run it identifies, one settings dict per player, and
        a state of the same structure, shapes and dtypes as ``state`` (the state the
        game holds). Changes nothing."""
        self._loadable(state_dict, state, path)

    def _loadable(self, state_dict: Any, state: S, path: str) -> S:
        """``_check_state_dict``, returning what the checkpoint's state loads as
        (see ``_check_loaded``)."""
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
        self._check_groups_of(state_dict.get("param_groups"), path)
        return self._check_loaded(state, state_dict.get("state"), f"{path}.state")

    def _check_groups_of(self, groups: Any, path: str) -> None:
        """Raise ``ValueError`` unless a checkpoint's ``groups`` are one settings dict per
        player, each value in its range (a scheduled key a group lacks keeps its value)."""
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            got = len(groups) if isinstance(groups, list) else type(groups).__name__
            raise ValueError(f"{path}.param_groups: expected {len(self.param_groups)} players' settings, got {got}")
        for k, group in enumerate(groups):
            if not isinstance(group, dict) or "lr" not in group:
                raise ValueError(f"{path}.param_groups[{k}]: expected a dict with 'lr', got {group!r}")
            check_number(f"{path}.param_groups[{k}].lr", group["lr"], low=0.0)
            for name, hyper in self.schedulable_hypers().items():
                if name in group:
                    hyper.check(group[name], f"{path}.param_groups[{k}].{name}")
            for rule in (r.for_player(k) for r in self._rules()):
                for name in rule.schedulable:
                    if name in group:
                        rule.check(name, group[name], f"{path}.param_groups[{k}].{name}")

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
        """The state after the players' layout changed: ``fresh`` (``init_state`` for
        the new layout) with each surviving parameter's values of ``old`` (the state
        before, its joint vectors taken apart by parameter) and the step counts of
        ``counts``; the update rule carries its own (:meth:`~gameopt.UpdateRule.carry`)."""
        out = carry.state(old, fresh, self.counts, skip=("rule",))
        if isinstance(old, dict) and "rule" in old:
            out["rule"] = self.rule.carry(old["rule"], cast(dict, fresh)["rule"], carry)
        return cast(S, out)


class _WrapperCheckpoints(_Checkpoints[S]):
    """A wrapper's checkpoints: its base's state (under ``"base"``) checked and
    carried by the base."""

    if TYPE_CHECKING:
        base: _Checkpoints[Any]

    def _check_loaded(self, live: S, saved: Any, path: str) -> S:
        like = check_loaded(live, saved, path, self.counts, skip=("base",))
        like["base"] = self.base._check_loaded(live["base"], saved["base"], f"{path}.base")  # type: ignore[index]
        return cast(S, like)

    def _carry_state(self, old: S, fresh: S, carry: Carry) -> S:
        out = carry.state(old, fresh, self.counts, skip=("base",))
        out["base"] = self.base._carry_state(old["base"], fresh["base"], carry)  # type: ignore[index]
        return cast(S, out)
