"""The API reference page, ``docs/api/index.rst``, written from ``gameopt.__all__``:
``conf.py`` writes it at every build, and ``tests/test_front_door.py`` checks that it
documents every public name.

Two tiers: ``gameopt`` for users (every name in ``gameopt.__all__``: its classes and
functions in autosummary lists, its modules with ``automodule``), then what an
algorithm of your own is written against (:mod:`gameopt.algorithms.api`, the
protocols behind it, debug mode and the internals it meets).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from types import ModuleType

import gameopt

#: the users' modules outside ``gameopt.__all__`` that the page documents too
USER_MODULES = ["gameopt.updates", "gameopt.game.verdict"]
#: what an algorithm author reads, after the users' names
AUTHOR_MODULES = ["gameopt.algorithms.api", "gameopt.protocols", "gameopt.debug", "gameopt.direction_bounds"]
#: the internals an algorithm meets, one class each
INTERNALS = [
    "gameopt.autodiff.GeneralLinearization",
    "gameopt.autodiff.ZeroSumLinearization",
    "gameopt.buffer.FlatParameter",
    "gameopt.buffer.FlatBuffer",
    "gameopt.game.StepOracle",
    "gameopt.game.oracle.StepContext",  # what game.step_context returns
]
#: names that a documented module re-exports without a doc comment of its own (type
#: aliases, whose docstring is their value's type's): the page gives each an entry with this text
ALIASES = {
    "gameopt.algorithms.api.MatVec": "A linear operator on joint vectors, ``v ↦ A v``, as "
    ":func:`cg` and :func:`gmres` take it (``gameopt.linalg.MatVec``).",
    "gameopt.algorithms.api.RuleState": "Any update rule's state as the algorithms and checkpoints "
    "see it, a dict (:data:`gameopt.updates.State`).",
    "gameopt.algorithms.api.Step": "What an algorithm's ``update`` returns as its step: a joint "
    "vector (``Vec``), or a :class:`Scaled` step (a direction and one factor per player, which "
    "the game's move applies in its own pass).",
}


def _group(name: str, obj: object) -> str:
    """The section of the page a public class or function is listed in."""
    if isinstance(obj, type) and issubclass(obj, gameopt.Algorithm):
        return "Algorithms"
    if isinstance(obj, type) and issubclass(obj, gameopt.UpdateRule):
        return "Update rules"
    if isinstance(obj, type) and issubclass(obj, BaseException) or name == "StepLosses":
        return "Errors and results"
    if name in ("Game", "Player", "LagrangianGame", "GameOptimizer", "DynamicLossScale"):
        return "Games and players"
    return "Building blocks"


def _section(title: str) -> list[str]:
    return [title, "-" * len(title), ""]


def members(module: ModuleType) -> list[str]:
    """The names that ``automodule`` with ``:members:`` documents in ``module``: its
    ``__all__``, or (a module without one) the public classes and functions defined in it."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    ]


def _modules() -> list[tuple[str, list[str]]]:
    """Each module the page documents with ``automodule``, in page order, with the
    names it excludes because the page documents the same object earlier (the users'
    names under ``gameopt``, a protocol in :mod:`gameopt.protocols` that
    :mod:`gameopt.algorithms.api` re-exports)."""
    users = [getattr(gameopt, n).__name__ for n in gameopt.__all__ if inspect.ismodule(getattr(gameopt, n))]
    seen = {id(getattr(gameopt, n)) for n in gameopt.__all__}
    seen |= {id(_resolve(path)) for path in INTERNALS}
    out = []
    # the authors' contract last: most of what it re-exports is documented where it is defined
    for name in users + USER_MODULES + AUTHOR_MODULES[1:] + AUTHOR_MODULES[:1]:
        module = importlib.import_module(name)
        names = members(module)
        exclude = [m for m in names if id(getattr(module, m)) in seen or f"{name}.{m}" in ALIASES]
        seen |= {id(getattr(module, m)) for m in names}
        out.append((name, exclude))
    order = users + USER_MODULES + AUTHOR_MODULES
    return sorted(out, key=lambda entry: order.index(entry[0]))


def _resolve(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def documented_ids() -> list[str]:
    """The id of every entry the page makes for a name it documents (the HTML anchor
    of each: ``gameopt.Game``, ``gameopt.dice.objective``, ...); the docs build checks
    that the built page has each (``docs/build_checks.py``)."""
    ids = [f"gameopt.{n}" for n in gameopt.__all__ if not inspect.ismodule(getattr(gameopt, n))]
    for module, exclude in _modules():
        ids += [f"{module}.{m}" for m in members(importlib.import_module(module)) if m not in exclude]
    ids += list(ALIASES)
    return ids + INTERNALS


def documented_objects() -> dict[str, object]:
    """Each entry's id (:func:`documented_ids`) with the object it documents."""
    return {i: _resolve(i) for i in documented_ids()}


def _automodule(module: str, exclude: list[str]) -> list[str]:
    lines = _section(f"``{module}``") + [f".. automodule:: {module}", "   :members:"]
    if exclude:
        lines.append(f"   :exclude-members: {', '.join(exclude)}")
    lines.append("")
    for alias, note in ALIASES.items():
        if alias.rpartition(".")[0] == module:
            lines += [f".. py:data:: {alias.rpartition('.')[2]}", f"   :module: {module}", "", f"   {note}", ""]
    return lines


def text() -> str:
    """The page, reStructuredText."""
    titles = ("Games and players", "Algorithms", "Update rules", "Errors and results", "Building blocks")
    groups: dict[str, list[str]] = {title: [] for title in titles}
    for name in gameopt.__all__:
        obj = getattr(gameopt, name)
        if not inspect.ismodule(obj):
            groups[_group(name, obj)].append(name)
    lines = [
        "API reference",
        "=============",
        "",
        "Generated from the docstrings. For users: every name in ``gameopt.__all__`` (its classes",
        "and functions, then its modules), and :mod:`gameopt.updates`. For algorithm authors:",
        ":mod:`gameopt.algorithms.api` (the contract of an algorithm: an algorithm imports only",
        "from it), the protocols behind it (:mod:`gameopt.protocols`), debug mode",
        "(:mod:`gameopt.debug`), the bounds an update rule may give on its direction",
        "(:mod:`gameopt.direction_bounds`), and the pieces of the internals that an algorithm of",
        "your own meets (:mod:`gameopt.autodiff`'s linearizations, the game's oracle).",
        "",
        ".. currentmodule:: gameopt",
        "",
    ]
    for title, names in groups.items():
        if names:
            lines += _section(title) + [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
            lines += [f"   {n}" for n in names] + [""]
    for module, exclude in _modules():
        lines += _automodule(module, exclude)
    lines += _section("Internals an algorithm meets")
    # the internals' modules, and those the docstrings above name (targets of :mod: references)
    named = {"gameopt.evaluation", "gameopt.game.relayout"}
    for module in sorted({cls.rsplit(".", 1)[0] for cls in INTERNALS} | named):
        lines += [f".. py:module:: {module}", ""]
    lines += [line for cls in INTERNALS for line in (f".. autoclass:: {cls}", "")]
    return "\n".join(lines)


def write(out: Path) -> None:
    """Write the page to ``out`` unless it already holds it (a rewrite would make
    Sphinx rebuild every page that links to it)."""
    page = text()
    out.parent.mkdir(exist_ok=True)
    if not out.exists() or out.read_text() != page:
        out.write_text(page)
