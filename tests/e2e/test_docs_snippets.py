"""Every ```python block of every docs page and of the README runs as pasted.

Page by page, the page's python blocks, in order, are one script run by a fresh
interpreter whose working directory is a temporary folder outside the repository,
with only what ``pip install`` provides importable (``gameopt`` and
``gameopt_players``, from this checkout). A block that is a fragment is written as a
```text block, which this test does not run. A failure names the page, the block
and the interpreter's stderr.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

#: what ``pip install`` puts on the path: import name -> folder (pyproject's packages)
INSTALLED = {"gameopt": ROOT / "gameopt", "gameopt_players": ROOT / "players"}

#: pages whose blocks need an optional package (the test extra has it)
NEEDS = {
    "integrations.md": ("lightning",),
    "recipes.md": ("lightning",),
    "sharded.md": ("torch.distributed.fsdp._fully_shard",),  # FSDP2's public home, from torch 2.6
}

_FENCE = re.compile(r"^(?P<fence>```+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.S | re.M)
#: info strings that would be python but are not run: a block is ```python (runs) or not python
_UNRUN_PYTHON = re.compile(r"^(py|python3|ipython|\{code-block\}\s+python|\{code\}\s+python)\b")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python blocks of a page: (line of the opening fence, source)."""
    blocks = []
    for m in _FENCE.finditer(text):
        info = m.group("info").strip()
        assert not _UNRUN_PYTHON.match(info), f"a block opened with ```{info}: write ```python (run) or ```text"
        if info == "python":
            blocks.append((text.count("\n", 0, m.start()) + 1, m.group("body")))
    return blocks


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    for name, folder in INSTALLED.items():
        (site / name).symlink_to(folder, target_is_directory=True)
    return site


def _failing_block(stderr: str, script: Path, starts: list[int]) -> int:
    """The number (from 1) of the block whose line the traceback's last frame in the script is at."""
    lines = [int(n) for n in re.findall(rf'File "{re.escape(str(script))}", line (\d+)', stderr)]
    if not lines:
        return 0
    return sum(1 for start in starts if start <= lines[-1])


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_python_blocks_run_as_pasted(page: Path, tmp_path: Path) -> None:
    blocks = python_blocks(page.read_text())
    if not blocks:
        return  # nothing to run on this page: its code blocks are shell or text
    missing = [name for name in NEEDS.get(page.name, ()) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{page.name}'s blocks need {', '.join(missing)} (in the test extra), not installed")
    work = tmp_path / "work"  # outside the repository, nothing of it on the path
    work.mkdir()
    script = work / "page_snippets.py"
    parts, starts, line = [], [], 1
    for number, (_, source) in enumerate(blocks, 1):
        header = f"# ---- block {number} of {page.name}\n"
        starts.append(line + 1)
        parts.append(header + source)
        line += header.count("\n") + source.count("\n")
    script.write_text("".join(parts))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(_site(tmp_path)), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, script.name], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        k = _failing_block(result.stderr, script, starts)
        where = f"block {k} (the ```python at line {blocks[k - 1][0]})" if k else "no block in the traceback"
        pytest.fail(f"{page.name}: {where} failed, exit {result.returncode}:\n{result.stderr[-4000:]}")


def test_blocks_are_found_where_the_pages_have_them() -> None:
    """The extraction itself: nested and longer fences, the opening line, and a
    python block written with another info string is refused."""
    text = "# t\n\n```python\nx = 1\n```\n\n````text\n```python\nnot run\n```\n````\n\n```python\ny = x\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (13, "y = x\n")]
    with pytest.raises(AssertionError, match="write ```python"):
        python_blocks("```py\nx = 1\n```\n")
    assert sum(len(python_blocks(p.read_text())) for p in PAGES) >= 20  # the pages do have blocks


def test_the_example_players_are_named_as_installed() -> None:
    """The install provides ``gameopt_players`` (the ``players/`` folder): no page tells
    a reader to import ``players``, or that the install provides it by that name."""
    wrong = re.compile(r"^\s*(import players|from players[ .])|installs `gameopt` and `players`", re.M)
    bad = [p.name for p in PAGES if wrong.search(p.read_text())]
    assert not bad, f"pages that name the example players `players`: {bad}"
