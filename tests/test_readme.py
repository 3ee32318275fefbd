"""The README stays a front page: its commands come first and the docs line builds strictly."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
