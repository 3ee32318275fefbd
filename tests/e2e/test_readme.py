"""The README stays a front page: its commands come first and the docs line builds strictly."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_a_front_page_with_its_commands_first():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert block[0].endswith("# run the demo")
    assert block[1].endswith("# run the tests") and len(block) == 2  # exactly two commands open it
    docs = [line for line in text.splitlines() if line.rstrip().endswith("# build the docs")]
    assert len(docs) == 1
    # strict: warnings are errors, unresolved references are reported, and the install is included
    assert "'.[docs]'" in docs[0] and "-W" in docs[0] and " -n " in docs[0]


def test_demo_writes_outside_tracked_figures():
    from experiments import demo

    source = Path(demo.__file__).read_text()
    assert 'default=Path("runs/demo")' in source
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_custom_algorithm_example_imports_only_the_api():
    """docs/examples/plot_07_custom_algorithm.py builds its algorithm from
    gameopt.algorithms.api alone (gameopt itself only for games and built-ins)."""
    import ast

    path = ROOT / "docs" / "examples" / "plot_07_custom_algorithm.py"
    tree = ast.parse(path.read_text())
    froms = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    gameopt_froms = [m for m in froms if m and m.split(".")[0] == "gameopt"]
    assert gameopt_froms == ["gameopt.algorithms.api"]
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    names = {node.id for node in ast.walk(cls) if isinstance(node, ast.Name)}
    assert "gameopt" not in names  # the class itself uses only names imported from the api
    assert "gameopt.algorithms.api" in (ROOT / "docs" / "custom-algorithm.md").read_text()
    assert "gameopt.algorithms.api" in (ROOT / "README.md").read_text()
