"""The author's page (docs/custom-algorithm.md) in the fast tier: its examples run
in this process, under ``GAMEOPT_DEBUG=1`` (stale borrowed vectors are NaN), and
what it says of ``Vec`` is what ``Vec`` has. (tests/e2e/test_docs_snippets.py runs
every page as pasted, in a fresh interpreter.)"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from gameopt import debug
from gameopt.vec import Vec

PAGE = Path(__file__).resolve().parents[2] / "docs" / "custom-algorithm.md"


def _run_page() -> dict:
    text = PAGE.read_text()
    namespace: dict = {"__name__": "custom_algorithm_page"}
    for k, block in enumerate(re.findall(r"^```python\n(.*?)^```", text, re.S | re.M), 1):
        exec(compile(block, f"{PAGE.name}, block {k}", "exec"), namespace)  # noqa: S102
    return namespace


def test_the_stateful_example_runs_and_equals_its_closed_form() -> None:
    assert debug.enabled()
    ns = _run_page()  # raises if the hand-written loop, the resume or check_all disagrees
    algorithm = ns["MomentumExtragradient"]
    game, x, y = ns["bilinear_game"](algorithm([0.1, 0.2], beta=0.3))
    assert set(game.algorithm_state) == set(ns["MomentumExtragradientState"].__annotations__) == {"m"}
    game.step()
    # one step from (1, 1; −1, −1) with m₀ = 0: w − η ξ(w − η ξ(w)), by hand
    A, lrs = ns["A"], [0.1, 0.2]
    w = [torch.ones(2, dtype=torch.float64), -torch.ones(2, dtype=torch.float64)]
    half = [wi - lr * g for wi, lr, g in zip(w, lrs, [A @ w[1], -A.T @ w[0]])]
    want = [wi - lr * g for wi, lr, g in zip(w, lrs, [A @ half[1], -A.T @ half[0]])]
    torch.testing.assert_close(torch.cat([x, y]).detach(), torch.cat(want), rtol=1e-14, atol=1e-14)
    (m,) = game.state_dict()["algorithm"]["state"]["m"]
    torch.testing.assert_close(m, torch.cat([A @ half[1], -A.T @ half[0]]), rtol=1e-14, atol=1e-14)


def test_every_vec_method_the_page_names_exists() -> None:
    section = PAGE.read_text().split("\n## Vectors\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    names = set(re.findall(r"`a\.(\w+)\(", table))
    assert {"add_", "sub_", "mul_", "div_", "lerp_", "copy_", "zero_", "addcmul_", "dot", "norm"} <= names
    missing = sorted(n for n in names if not callable(getattr(Vec, n, None)))
    assert not missing, f"docs/custom-algorithm.md names Vec methods it lacks: {missing}"
