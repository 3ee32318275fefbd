"""The API reference is complete and its one-line summaries are whole sentences
(issue #37, item 5), and the docs build's checks of its HTML can fail (item 3) —
without building the docs: ``docs/api_page.py`` says what the page documents, and
``docs/build_checks.py``'s checks (and ``docs/viewcode_links.py``'s fix of the source
pages' links) run here on small pages.

A summary is what ``sphinx.ext.autosummary`` shows beside a name: the docstring's first
paragraph up to the first period followed by a space, read past the abbreviations it
knows (``e.g.``, ``i.e.``, ``et al.``, ``vs.``). A first paragraph that ends in a colon,
or a period of an abbreviation autosummary does not know (``Sec.``), cuts it mid-sentence.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import gameopt

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: what sphinx.ext.autosummary.extract_summary splits at and reads past (Sphinx 8 and 9)
PERIODS = re.compile(r"\.(?:\s+)")
KNOWN_ABBREVIATIONS = ("et al.", "e.g.", "i.e.", "vs.")
#: a summary that ends so was cut at an abbreviation's period, not at its sentence's end
CUT_AT_ABBREVIATION = re.compile(
    r"(\b(?:e\.g|i\.e|et al|al|vs|cf|etc|resp|approx|Sec|Secs|Eq|Eqs|Fig|Alg|Thm|Prop|Ch|No|Vol|pp?)"
    r"|(?:^|[\s(])[A-Z]|[A-Za-z]\.[A-Za-z]+)\.$"
)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


api_page = _load("api_page")
build_checks = _load("build_checks")
viewcode_links = _load("viewcode_links")


def summary(doc: str) -> tuple[str, str]:
    """(the first paragraph, the summary autosummary makes of it)."""
    paragraph: list[str] = []
    for line in doc.strip().splitlines():
        if not line.strip():
            break
        paragraph.append(line.strip())
    text = " ".join(paragraph)
    sentences = PERIODS.split(text)
    if len(sentences) == 1:
        return text, re.sub(r"::\s*$", ".", text)
    for i in range(len(sentences)):
        cut = ". ".join(sentences[: i + 1]).rstrip(".") + "."
        if not cut.endswith(KNOWN_ABBREVIATIONS):
            break
    return text, cut


def whole_sentence_problem(doc: str | None) -> str | None:
    """Why ``doc``'s summary is not a whole sentence, or None when it is."""
    if not doc or not doc.strip():
        return "no docstring"
    paragraph, cut = summary(doc)
    if cut.rstrip(".") == paragraph.rstrip(".") and not paragraph.endswith((".", ".)")):
        return f"the first paragraph ends with {paragraph[-1]!r}, not with a sentence's period: {paragraph!r}"
    if cut.endswith((":.", ",.", ";.")):
        return f"the summary ends with a colon or comma: {cut!r}"
    if CUT_AT_ABBREVIATION.search(cut):
        return f"the summary is cut at an abbreviation: {cut!r}"
    for left, right in ("()", "[]", "{}"):
        if cut.count(left) != cut.count(right):
            return f"the summary is cut inside {left}{right}: {cut!r}"
    if cut.count('"') % 2 or cut.count("``") % 2:
        return f"the summary is cut inside a quotation: {cut!r}"
    return None


def _documented() -> dict[str, object]:
    """The classes and functions the API page documents, by entry id."""
    objects = api_page.documented_objects()
    return {i: o for i, o in objects.items() if inspect.isclass(o) or inspect.isroutine(o)}


def test_every_summary_on_the_api_page_is_a_whole_sentence() -> None:
    documented = _documented()
    assert len(documented) > 60  # the page's classes and functions, not a few
    problems = {i: whole_sentence_problem(inspect.getdoc(o)) for i, o in documented.items()}
    problems = {i: p for i, p in problems.items() if p is not None}
    assert not problems, "\n".join(f"{i}: {p}" for i, p in problems.items())


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        ("Adam (Kingma & Ba 2015, Algorithm 1):\n\n    m <- b m", "ends with ':'"),
        ("Adaptive CGD for zero-sum games given as (f, -f): CGD with step sizes,\n\n  more", "ends with ','"),
        ('Averaging (Yazici et al. 2019, "The Unusual Effectiveness", Sec. 2.1).', "abbreviation"),
        ("Consensus optimization (Mescheder et al. 2017)::\n\n    x", "ends with ':'"),
        ("A step size, e.g. 0.1", "ends with '1'"),
        ("Optimistic descent (Popov 1980):. Then more.", "colon or comma"),
        ("", "no docstring"),
    ],
)
def test_a_cut_summary_is_caught(doc: str, reason: str) -> None:
    problem = whole_sentence_problem(doc)
    assert problem is not None and reason in problem


@pytest.mark.parametrize(
    "doc",
    [
        "Simultaneous gradient descent: every player steps at once.\n\nMore.",
        "Look-ahead (Zhang & Lesser 2010; Letcher et al. 2019), e.g. for games. Then more.",
        "The plain gradient: out = d (no state).",
    ],
)
def test_a_whole_summary_passes(doc: str) -> None:
    assert whole_sentence_problem(doc) is None


def test_every_name_of_the_documented_modules_has_an_entry() -> None:
    ids = set(api_page.documented_ids())
    page = api_page.text()
    for name in gameopt.__all__:
        obj = getattr(gameopt, name)
        if inspect.ismodule(obj):
            assert f".. automodule:: {obj.__name__}" in page
            for member in api_page.members(obj):
                assert f"{obj.__name__}.{member}" in ids or id(getattr(obj, member)) in {
                    id(getattr(gameopt, n)) for n in gameopt.__all__
                }, f"{obj.__name__}.{member} has no entry"
        else:
            assert f"gameopt.{name}" in ids
    # the authors' contract: every name it exports, here or where the page documents it
    api = importlib.import_module("gameopt.algorithms.api")
    documented = {id(o) for o in api_page.documented_objects().values()}
    for member in api.__all__:
        assert f"gameopt.algorithms.api.{member}" in ids or id(getattr(api, member)) in documented, member
    assert {"gameopt.dice.objective", "gameopt.dice.magic_box"} <= ids


def test_every_documented_function_and_class_has_a_docstring_for_autodoc() -> None:
    """``automodule`` with ``:members:`` leaves out a member without a docstring."""
    missing = [i for i, o in _documented().items() if not (inspect.getdoc(o) or "").strip()]
    assert not missing


# -- the build's checks of its HTML -------------------------------------------------


def test_a_script_or_stylesheet_from_the_network_is_caught() -> None:
    page = """<html><head>
    <script src="_static/mathjax/tex-chtml.js"></script>
    <script src="https://cdn.example.org/mathjax/tex-chtml.js"></script>
    <link rel="stylesheet" href="//fonts.example.org/a.css">
    <link rel="canonical" href="https://example.org/page.html">
    <img src="http://example.org/a.png">
    </head><body><a href="https://arxiv.org/abs/1802.05098">a link is no load</a></body></html>"""
    found = build_checks.network_loads(page)
    assert found == [
        '<script src="https://cdn.example.org/mathjax/tex-chtml.js">',
        '<link href="//fonts.example.org/a.css">',
        '<img src="http://example.org/a.png">',
    ]
    assert build_checks.network_loads('<script src="_static/x.js"></script>') == []
    css = """@import "https://fonts.example.org/a.css"; @font-face { src: url('//example.org/f.woff2') }
    .a { background: url(data:image/png;base64,AAAA) } .b { background: url(../img/x.png) }"""
    assert build_checks.css_network_loads(css) == ["https://fonts.example.org/a.css", "//example.org/f.woff2"]


def test_a_relative_link_to_no_file_or_anchor_is_caught(tmp_path: Path) -> None:
    (tmp_path / "_modules").mkdir()
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "index.html").write_text('<dt id="gameopt.updates.AdamState"></dt>')
    (tmp_path / "_modules" / "gameopt.html").write_text('<span id="x"></span>')
    page = tmp_path / "_modules" / "index.html"
    html = """<h1 id="top"></h1><a href="builtins.html">builtins</a> <a href="gameopt.html#x">ok</a>
    <a href="../api/index.html?v=1">ok</a> <a href="../api/">ok</a> <a href="#top">anchor</a>
    <a href="../api/index.html#gameopt.updates.AdamState">ok</a> <a href="mailto:a@b.c">mail</a>
    <a href="../api/index.html#gameopt.AdamState">no such entry</a> <a href="#bottom">no such anchor</a>
    <img src="../_images/gone.png"> <a href="../../outside.html">out</a>"""
    page.write_text(html)
    (tmp_path.parent / "outside.html").write_text("")
    missing = ["../../outside.html", "../_images/gone.png", "builtins.html"]
    assert build_checks.missing_targets(html, page, tmp_path) == missing  # files only
    missing = sorted([*missing, "#bottom", "../api/index.html#gameopt.AdamState"])
    assert build_checks.problems(tmp_path, []) == [
        f"_modules/index.html: links to {ref}, which names no file or anchor of the build" for ref in missing
    ]


def test_a_source_page_s_link_back_to_the_reference_finds_the_entry() -> None:
    ids = {"gameopt.updates.AdamState": "gameopt.updates.AdamState", "gameopt.Adam": "gameopt.Adam"}
    ids["gameopt.algorithms.api.check_zero_sum"] = "gameopt.algorithms.api.check_zero_sum"
    assert viewcode_links.backlink_anchor("gameopt.Adam", "gameopt.updates", ids) == "gameopt.Adam"
    assert viewcode_links.backlink_anchor("gameopt.AdamState", "gameopt.updates", ids) == "gameopt.updates.AdamState"
    found = viewcode_links.backlink_anchor("gameopt.check_zero_sum", "gameopt.evaluation", ids)
    assert found == "gameopt.algorithms.api.check_zero_sum"
    assert viewcode_links.backlink_anchor("gameopt.Gone", "gameopt.updates", ids) == "gameopt.Gone"


def test_a_missing_api_entry_is_caught(tmp_path: Path) -> None:
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "index.html").write_text('<dt id="gameopt.dice.objective"></dt>')
    found = build_checks.problems(tmp_path, ["gameopt.dice.objective", "gameopt.dice.magic_box"])
    assert found == ["api/: no entry with id 'gameopt.dice.magic_box'"]
