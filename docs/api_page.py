"""The API reference page, ``docs/api/index.rst``, written from ``gameopt.__all__``:
``conf.py`` writes it at every build, and ``tests/test_front_door.py`` checks that it
documents every public name.

Two tiers: ``gameopt`` for users (every name in ``gameopt.__all__``: its classes and
functions in autosummary lists, its modules with ``automodule``), then what an
algorithm of your own is written against (:mod:`gameopt.algorithms.api`, the
protocols behind it, debug mode and the internals it meets).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import gameopt

#: the users' modules outside ``gameopt.__all__`` that the page documents too
USER_MODULES = ["gameopt.updates"]
#: what an algorithm author reads, after the users' names
AUTHOR_MODULES = ["gameopt.algorithms.api", "gameopt.protocols", "gameopt.debug"]
#: the internals an algorithm meets, one class each
INTERNALS = [
    "gameopt.autodiff.GeneralLinearization",
    "gameopt.autodiff.ZeroSumLinearization",
    "gameopt.buffer.FlatParameter",
    "gameopt.buffer.FlatBuffer",
    "gameopt.game.StepOracle",
    "gameopt.game.oracle.StepContext",  # what game.step_context returns
]


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


def _automodule(module: str, exclude: list[str]) -> list[str]:
    lines = _section(f"``{module}``") + [f".. automodule:: {module}", "   :members:"]
    if module == "gameopt.algorithms.api":
        lines.append("   :ignore-module-all:")
    if exclude:
        lines.append(f"   :exclude-members: {', '.join(exclude)}")
    return lines + [""]


def text() -> str:
    """The page, reStructuredText."""
    titles = ("Games and players", "Algorithms", "Update rules", "Errors and results", "Building blocks")
    groups: dict[str, list[str]] = {title: [] for title in titles}
    modules = []
    for name in gameopt.__all__:
        obj = getattr(gameopt, name)
        if inspect.ismodule(obj):
            modules.append(obj.__name__)
        else:
            groups[_group(name, obj)].append(name)
    lines = [
        "API reference",
        "=============",
        "",
        "Generated from the docstrings. For users: every name in ``gameopt.__all__`` (its classes",
        "and functions, then its modules), and :mod:`gameopt.updates`. For algorithm authors:",
        ":mod:`gameopt.algorithms.api` (the contract of an algorithm: an algorithm imports only",
        "from it), the protocols behind it (:mod:`gameopt.protocols`), debug mode",
        "(:mod:`gameopt.debug`), and the pieces of the internals that an algorithm of your own",
        "meets (:mod:`gameopt.autodiff`'s linearizations, the game's oracle).",
        "",
        ".. currentmodule:: gameopt",
        "",
    ]
    for title, names in groups.items():
        if names:
            lines += _section(title) + [".. autosummary::", "   :toctree: generated", "   :nosignatures:", ""]
            lines += [f"   {n}" for n in names] + [""]
    in_all = [n for n in gameopt.__all__ if hasattr(gameopt.updates, n)]  # documented above already
    for module in modules + USER_MODULES + AUTHOR_MODULES:
        lines += _automodule(module, in_all if module == "gameopt.updates" else [])
    lines += _section("Internals an algorithm meets")
    for module in sorted({cls.rsplit(".", 1)[0] for cls in INTERNALS} | {"gameopt.evaluation"}):
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
