"""Packaging: what an installed gameopt offers outside the repository.

Each check runs in a fresh interpreter whose working directory is a temporary
folder, without ``PYTHONPATH``, so nothing of the repository is importable except
what ``pip install`` put on the path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "error"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _check(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_import_gameopt_loads_neither_scipy_nor_matplotlib(tmp_path) -> None:
    out = _check(
        _run(
            textwrap.dedent(
                """
                import sys
                import gameopt
                heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("scipy", "matplotlib"))
                assert not heavy, heavy
                # the diagnostics stay one attribute away, and import SciPy when used
                assert callable(gameopt.diagnostics.eigenvalues)
                print("ok")
                """
            ),
            tmp_path,
        )
    )
    assert out.strip() == "ok"


@pytest.mark.slow
def test_players_package_is_installed_with_gameopt(tmp_path) -> None:
    out = _check(
        _run(
            "import pathlib, gameopt_players.gan2d, gameopt_players.matrix_games, gameopt_players.quadratic\n"
            "import gameopt_players.ipd, gameopt\n"
            "print(pathlib.Path(gameopt_players.gan2d.__file__).resolve())",
            tmp_path,
        )
    )
    assert Path(out.strip()).name == "gan2d.py"


def test_pyproject_packages_every_package_and_the_players_under_their_own_name() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gameopt").rglob("__init__.py"))
    assert sorted(config["packages"]) == sorted([*on_disk, "gameopt_players"])
    assert config["package-dir"] == {"gameopt_players": "players"}  # no top-level 'players' in site-packages


@pytest.mark.slow
def test_the_wheel_ships_the_type_hints_marker(tmp_path) -> None:
    """PEP 561: a type checker reads gameopt's hints only if ``py.typed`` is installed with it.
    Built from a copy of what the wheel is made of (the build writes beside its sources)."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("gameopt", "players"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("gameopt-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "gameopt/py.typed" in names
    assert "gameopt/algorithms/api.py" in names


def _readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
def test_readme_first_snippet_runs_from_any_folder(tmp_path) -> None:
    """The quick start runs as pasted (its own data), here with 2 of its 200 steps."""
    snippet = _readme_python_blocks()[0]
    assert "from gameopt_players.gan2d import" in snippet and "range(200)" in snippet
    out = _check(_run(snippet.replace("range(200)", "range(2)"), tmp_path))
    assert out.startswith("generator loss ")


def _relative_imports(path: Path, module: str) -> set[str]:
    """The gameopt modules that ``path`` imports, at the top, inside functions or
    under ``TYPE_CHECKING`` alike."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    deps = set()
    for dots, name, names in re.findall(r"^\s*from (\.+)([\w.]*) import ([^\n]+)", path.read_text(), re.M):
        up = package[: len(package) - (len(dots) - 1)]
        targets = [name] if name else re.findall(r"\w+", names)
        deps.update(".".join([*up, t]) for t in targets)
    return deps - {module, "gameopt"}


def test_gameopt_has_no_import_cycle() -> None:
    """Not even through imports for type checking or inside functions: each module
    depends only on the ones below it (see the README's Layout)."""
    root = Path(__file__).resolve().parents[2] / "gameopt"
    graph = {}
    for path in root.rglob("*.py"):
        module = ".".join(("gameopt", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        graph[module] = _relative_imports(path, module)

    def reaches(a: str, b: str) -> bool:
        seen, stack = set(), [a]
        while stack:
            for d in graph.get(stack.pop(), ()):
                if d == b:
                    return True
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return False

    modules = sorted(m for m in graph if m != "gameopt")
    cycles = [(a, b) for i, a in enumerate(modules) for b in modules[i + 1 :] if reaches(a, b) and reaches(b, a)]
    assert "gameopt.autodiff" in graph and "gameopt.game" in graph["gameopt.constrained.game"]
    assert cycles == []


def test_the_public_api_is_sorted_and_holds_no_internals() -> None:
    import gameopt

    names = gameopt.__all__
    assert names == sorted(names, key=lambda n: (n[0].islower(), n)) and len(set(names)) == len(names)
    assert all(hasattr(gameopt, n) for n in names)
    for public in ("Wrapper", "constraints", "diagnostics", "Proxy", "Sampled", "NuPI"):
        assert public in names
    for internal in ("Oracle", "FlatBuffer"):
        assert internal not in names and not hasattr(gameopt, internal)


#: the game-only lifecycle of an algorithm (torch.optim keeps its ``_init_group`` so):
#: private to users and authors, called by gameopt/game/ and the algorithms' base modules
ALGORITHM_LIFECYCLE = {
    "_bind",
    "_carry_state",
    "_check_groups",
    "_check_state_dict",
    "_loadable",
    "_refresh_params",
    "_rules",
    "_save_binding",
    "_sync_rule",
}


def _private_uses(root: Path) -> list[str]:
    """Each place a gameopt module touches a private name it does not define: a
    ``from .x import _name``, or ``obj._name`` where the module defines no ``_name``
    (the modules' own privates through ``self``/``cls`` or another instance of a class
    of the module are fine; torch's privates go through ``_torch_compat``)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "_torch_compat.py":
            continue
        tree = ast.parse(path.read_text())
        own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        own |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        own |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        own |= {n.target.id for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        where = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    # a package's private module lends its privates to that package alone
                    same_package = node.level == 1 and (node.module or "").startswith("_")
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and alias.name != "_torch_compat" and not same_package:
                        found.append(f"{where}:{node.lineno}: imports {alias.name}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if node.attr not in own and node.attr not in ALGORITHM_LIFECYCLE:
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reaches_into_another_modules_private_names() -> None:
    """Modules talk through public names; every private use of torch lives in
    gameopt/_torch_compat.py (see tests/test_torch_compat.py)."""
    assert _private_uses(Path(__file__).resolve().parents[2] / "gameopt") == []
