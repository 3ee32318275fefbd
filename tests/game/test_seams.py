"""The seams a contributor's tests use: no test or benchmark reads a private attribute
of a ``Game`` (they go through ``gameopt.testing`` and the game's public accessors);
the end-to-end tests are marked ``slow``, so the fast tier runs alone; the
generic checks of ``gameopt.testing`` catch what they claim to; and the example of
docs/custom-algorithm.md's "Testing your algorithm" runs."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import gameopt
from gameopt import testing
from gameopt.algorithms.api import Algorithm, DescentState, Oracle, Vec

ROOT = Path(__file__).resolve().parents[2]

#: an attribute with a leading underscore read on a name that says it is a game (game, twin_game, games[0]...)
ON_A_GAME = re.compile(r"\b(\w*game\w*)(?:\[[^\]]*\])?\._[a-z]\w*")


def _game_private_names() -> set[str]:
    """The private attributes and methods of a built game (not the dunders)."""
    game = testing.bilinear().build(gameopt.SimGD(0.1))
    names = {n for n in [*vars(game), *dir(type(game))] if n.startswith("_") and not n.startswith("__")}
    return names


def _code(source: str) -> str:
    """``source`` with its comments and strings (docstrings included) blanked out: code only."""
    lines = source.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tokenize.tok_name[tok.type] in ("COMMENT", "STRING", "FSTRING_MIDDLE"):
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                line = lines[r - 1]
                start, end = (c0 if r == r0 else 0), (c1 if r == r1 else len(line.rstrip("\n")))
                lines[r - 1] = line[:start] + " " * (end - start) + line[end:]
    return "".join(lines)


def _imported_names(source: str) -> set[str]:
    """Names a module binds by imports (modules, classes, functions: never a game)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def private_game_reads(source: str, private: set[str]) -> list[str]:
    """Each read of a ``Game``'s private attribute in ``source``: ``x._name`` on a
    name that says it is a game (``game``, ``twin_game``; not an imported module such
    as ``gameopt``), and ``._name`` on any other name for the private attribute names
    a ``Game`` has (``twin._parallel``), ``self`` aside."""
    code, imported = _code(source), _imported_names(source)
    found = [m.group(0) for m in ON_A_GAME.finditer(code) if m.group(1) not in imported]
    names = "|".join(sorted(map(re.escape, private)))
    for m in re.finditer(rf"\b(\w+)\s*\.\s*({names})\b", code):
        if m.group(1) not in imported and m.group(1) != "self" and not ON_A_GAME.fullmatch(m.group(0)):
            found.append(m.group(0))
    return found


def _sources() -> list[Path]:
    return sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


def test_no_test_or_benchmark_reads_a_private_attribute_of_a_game() -> None:
    """Tests and benchmarks reach a game through its public names, ``gameopt.testing``
    (``oracle(game)``, ``held_storages(game)``) and the read-only accessors
    ``game.step_context`` and ``game.scratch_vectors``."""
    private = _game_private_names()
    found = {
        str(path.relative_to(ROOT)): reads
        for path in _sources()
        if path.name != "test_seams.py" and (reads := private_game_reads(path.read_text(), private))
    }
    assert found == {}


def test_the_scan_finds_private_reads() -> None:
    source = """
import gameopt
from gameopt.game import game as game_module

def f(game, twin, games):
    game._step_context          # on a game
    games[0]._moves.backup      # on one of several
    twin._parallel              # a Game's private attribute, another name
    game_module._check_update   # a module's private function: not a game's
    gameopt._torch_compat       # a module: not a game's
    self._steps = 1             # a class's own
    return "game._problem"      # a string: not code
"""
    reads = private_game_reads(source, _game_private_names())
    assert reads == ["game._step_context", "games[0]._moves", "twin._parallel"]


# ------------------------------------------------------------ the slow tier
def _launches(f: ast.FunctionDef) -> bool:
    """Whether ``f`` launches a process: a subprocess, the interpreter again, spawned
    ranks (``mp.spawn``, or ``spawn`` of tests/ranks.py)."""
    for n in ast.walk(f):
        if isinstance(n, ast.Name) and n.id in ("subprocess", "multiprocessing", "spawn"):
            return True
        if isinstance(n, ast.Attribute) and ast.unparse(n) in ("sys.executable", "mp.spawn"):
            return True
    return False


def _is_slow(node: ast.FunctionDef) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in node.decorator_list)


def _module_slow(tree: ast.Module) -> bool:
    """The module marks every test slow (``pytestmark``, a mark or a list of them)."""
    return any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)
        and "mark.slow" in ast.unparse(n.value)
        for n in tree.body
    )


def unmarked_launchers(source: str) -> list[str]:
    """The test functions of ``source`` that launch processes (themselves or through a
    helper of the module that does) without ``@pytest.mark.slow``."""
    tree = ast.parse(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {
        name: {c.func.id for c in ast.walk(f) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        for name, f in functions.items()
    }
    launchers = {name for name, f in functions.items() if _launches(f)}
    while grown := {name for name in functions if calls[name] & launchers} - launchers:  # helpers' callers
        launchers |= grown
    if _module_slow(tree):
        return []
    return [n for n in sorted(launchers) if n.startswith("test_") and not _is_slow(functions[n])]


def test_end_to_end_tests_are_marked_slow() -> None:
    found = {
        path.name: names
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if (names := unmarked_launchers(path.read_text()))
    }
    assert found == {}


def test_the_slow_scan_finds_an_unmarked_launch() -> None:
    source = """
import subprocess, sys, pytest

def _run(*args):
    return subprocess.run([sys.executable, *args])

def test_direct():
    subprocess.run(["true"])

def test_through_a_helper():
    _run("-c", "pass")

@pytest.mark.slow
def test_marked():
    _run("-c", "pass")

def test_in_process():
    assert True
"""
    assert unmarked_launchers(source) == ["test_direct", "test_through_a_helper"]
    ranks = "from ranks import spawn\n\ndef test_ranks(tmp_path):\n    spawn(print, 2, tmp_path)\n"
    assert unmarked_launchers(ranks) == ["test_ranks"]
    assert unmarked_launchers("import pytest\npytestmark = [pytest.mark.slow]\n" + ranks) == []


def test_the_testing_seam_is_library_code_without_pytest() -> None:
    for path in (ROOT / "gameopt" / "testing").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.split(".")[0] == "pytest" for m in modules), path.name


# ------------------------------------------------- the checks catch what they claim
class _Forgetful(Algorithm[DescentState]):
    """SimGD whose step grows with a count it keeps on itself, outside its state."""

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Vec, DescentState]:
        self.count = getattr(self, "count", 0) + 1
        delta, rule_state = self.descend(oracle, oracle.xi(), state["rule"], scratch=True)
        delta *= 1.0 + 0.1 * self.count
        return delta, {"rule": rule_state}


class _Careless(Algorithm[DescentState]):
    """SimGD that writes the point in place before it evaluates (the contract forbids it)."""

    def update(self, oracle: Oracle, state: DescentState) -> tuple[Vec, DescentState]:
        for t in oracle.params:
            t.mul_(0.5)
        delta, rule_state = self.descend(oracle, oracle.xi(), state["rule"], scratch=True)
        return delta, {"rule": rule_state}


def test_the_closed_form_check_catches_another_update() -> None:
    row = testing.AlgoInfo("SimGD-as-eg", lambda lrs: gameopt.SimGD(lrs), "eg")
    with pytest.raises(AssertionError, match="SimGD-as-eg on quadratic, step 0, player 0"):
        testing.check_closed_form(row)
    testing.check_closed_form(testing.AlgoInfo("SimGD", lambda lrs: gameopt.SimGD(lrs), "simgd"))


def test_the_resume_check_catches_state_kept_outside_the_state() -> None:
    with pytest.raises(AssertionError, match="forgetful: resumed after 4 of 8 steps vs straight, player 0"):
        testing.check_resume(testing.AlgoInfo("forgetful", lambda lrs: _Forgetful(lrs)))


def test_the_all_or_nothing_check_catches_a_write_before_a_failed_evaluation() -> None:
    row = testing.AlgoInfo("careless", lambda lrs: _Careless(lrs))
    with pytest.raises(
        AssertionError, match=r"careless: the step failing at evaluation 1 \(nan\) moved the parameters"
    ):
        testing.check_all_or_nothing(row)


def test_the_all_or_nothing_check_catches_a_failure_that_does_not_surface(monkeypatch) -> None:
    """A game that skipped the failed step (``on_nonfinite="skip"``) refuses nothing."""
    build = testing.ReferenceGame.build

    def skipping(self, *args, **kwargs):
        game = build(self, *args, **kwargs)
        game.on_nonfinite = "skip"
        return game

    monkeypatch.setattr(testing.ReferenceGame, "build", skipping)
    with pytest.raises(AssertionError, match=r"SimGD: the step failing at evaluation 1 \(nan\) was not refused"):
        testing.check_all_or_nothing(testing.AlgoInfo("SimGD", lambda lrs: gameopt.SimGD(lrs)))


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_testing_section_of_the_custom_algorithm_page_runs() -> None:
    """docs/custom-algorithm.md, "Testing your algorithm": its code blocks, run in order,
    pass every check; the pytest example collects one test per check."""
    section = _section((ROOT / "docs" / "custom-algorithm.md").read_text(), "Testing your algorithm")
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    exec(compile(blocks[0], "custom-algorithm.md", "exec"), namespace)  # check_all([row]) passes
    exec(compile(blocks[1], "custom-algorithm.md", "exec"), namespace)
    marks = namespace["test_decayed_gd"].pytestmark
    (checks,) = [m.args[1] for m in marks if m.name == "parametrize"]
    assert [c.func.__name__ for c in checks] == [
        "check_closed_form",
        "check_resume",
        "check_resume",
        "check_float32_tracks_float64",
        "check_all_or_nothing",
    ]
