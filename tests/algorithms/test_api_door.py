"""gameopt.algorithms.api is the only door: every built-in algorithm imports
gameopt's names from it alone, as a contributor's algorithm would."""

from __future__ import annotations

import ast
from pathlib import Path

ALGORITHMS = Path(__file__).resolve().parents[2] / "gameopt" / "algorithms"

#: the modules behind the door: the contract itself, the package's front, and the
#: implementation of the base classes it re-exports
BEHIND = {"api.py", "__init__.py", "base.py"}


def _gameopt_imports(path: Path) -> list[str]:
    """Every import of a gameopt name in ``path`` that is not from ``.api`` (also
    under ``if TYPE_CHECKING:``, also inside functions), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            inside = node.level > 0 or module.split(".")[0] == "gameopt"
            door = (node.level == 1 and module == "api") or module == "gameopt.algorithms.api"
            if inside and not door:
                found.append(f"{path.name}:{node.lineno} from {'.' * node.level}{module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.name}:{node.lineno} import {a.name}" for a in node.names if a.name.split(".")[0] == "gameopt"
            ]
    return found


def _algorithm_modules() -> list[Path]:
    return [p for p in sorted(ALGORITHMS.glob("*.py")) if p.name not in BEHIND and not p.name.startswith("_")]


def test_every_built_in_algorithm_imports_gameopt_only_through_the_api() -> None:
    modules = _algorithm_modules()
    assert len(modules) >= 10, [p.name for p in modules]  # the scan sees the algorithms
    offenders = [use for path in modules for use in _gameopt_imports(path)]
    assert offenders == [], "import these through gameopt.algorithms.api (add what is missing there)"


def test_the_door_scan_finds_every_other_import(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nimport torch\nfrom .api import Vec\n"
        "from gameopt.algorithms.api import Oracle\n"
        "from .base import Algorithm\nfrom .. import _torch_compat as tc\nfrom ..linalg import cg\n"
        "import gameopt.updates\nfrom gameopt.vec import Vec\nfrom .sga import SGA\n"
        "if TYPE_CHECKING:\n    from ..layout import Vec\n"
        "def f():\n    from ..evaluation import check_zero_sum\n"
    )
    assert [use.split()[0] for use in _gameopt_imports(bad)] == [f"bad.py:{k}" for k in (5, 6, 7, 8, 9, 10, 12, 14)]
