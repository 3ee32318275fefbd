"""The front door (issue #34, item 10): ``gameopt.__all__`` is the users' tier, sorted,
importable and documented in the API reference; the authors' modules stay importable
outside it; ``gameopt.__version__`` is the installed distribution's; the type of
``game.layout`` is exported."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import torch

import gameopt
import gameopt.algorithms

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api_page.py"


def _api_reference() -> str:
    """docs/api/index.rst as the docs build writes it (docs/conf.py calls api_page.write)."""
    spec = importlib.util.spec_from_file_location("api_page", API_PAGE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.text()


def _documented(page: str) -> tuple[set[str], set[str]]:
    """The names in the page's autosummary lists, and the modules it documents with automodule."""
    listed: set[str] = set()
    for block in re.findall(r"\.\. autosummary::\n((?:   .*\n|\n)+)", page + "\n"):
        listed |= {line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith(":")}
    return listed, set(re.findall(r"^\.\. automodule:: (\S+)$", page, flags=re.M))


def test_the_public_names_are_sorted_and_unique() -> None:
    for names in (gameopt.__all__, gameopt.algorithms.__all__):
        assert names == sorted(set(names))
    assert "Wrapper" in gameopt.algorithms.__all__ and gameopt.algorithms.Wrapper is gameopt.Wrapper


def test_every_public_name_imports() -> None:
    namespace: dict[str, object] = {}
    exec("from gameopt import *", namespace)  # noqa: S102
    assert set(gameopt.__all__) <= set(namespace)
    namespace = {}
    exec("from gameopt.algorithms import *", namespace)  # noqa: S102
    assert set(gameopt.algorithms.__all__) <= set(namespace)


def test_every_public_name_is_documented_in_the_api_reference() -> None:
    listed, modules = _documented(_api_reference())
    for name in gameopt.__all__:
        obj = getattr(gameopt, name)
        if isinstance(obj, type(gameopt)):
            assert obj.__name__ in modules, f"module gameopt.{name} has no automodule in the API reference"
        else:
            assert name in listed, f"gameopt.{name} is in no autosummary list of the API reference"


def test_the_authors_modules_are_importable_documented_and_outside_the_users_names() -> None:
    _, modules = _documented(_api_reference())
    for name in ("protocols", "debug"):
        assert name not in gameopt.__all__
        assert importlib.import_module(f"gameopt.{name}") is getattr(gameopt, name)
        assert f"gameopt.{name}" in modules
    assert "gameopt.algorithms.api" in modules


def test_the_version_is_the_installed_distribution_s() -> None:
    assert gameopt.__version__ == importlib.metadata.version("gameopt")


def test_the_type_of_game_layout_is_exported() -> None:
    x, y = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    game = gameopt.Game([gameopt.Player([x]), gameopt.Player([y])], lambda: ((x * x).sum(), (y * y).sum()))
    kind = type(game.layout)
    assert kind.__name__ in gameopt.__all__ and getattr(gameopt, kind.__name__) is kind
