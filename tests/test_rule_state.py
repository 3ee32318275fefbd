"""Each update rule owns its state: a contributor's rule with its own step count
follows a parameter that joins a running game, survives a checkpoint, and has a
loaded state checked, with nothing in the engine naming its keys."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import TypedDict

import pytest
import torch
from games import assert_same_state
from torch import Tensor

import gameopt
from gameopt.algorithms.api import UpdateRule, Vec, next_count

ROOT = Path(__file__).resolve().parent.parent / "gameopt"


class EMAState(TypedDict):
    mu: Vec
    k: int | Vec


class BiasCorrectedEMA(UpdateRule[EMAState]):
    """A contributor's rule: μ ← β μ + (1 − β) d, k ← k + 1, out = μ / (1 − βᵏ)
    (Adam's first moment alone). Its step count is ``k``, beside ``mu``."""

    counts = {"k": "mu"}

    def __init__(self, beta: float = 0.8) -> None:
        self.beta = beta

    def init(self, like: list[Tensor]) -> EMAState:
        return {"mu": Vec(torch.zeros_like(t) for t in like), "k": 0}

    def apply(self, d: list[Tensor], state: EMAState, empty=None) -> tuple[list[Tensor], EMAState]:
        k = next_count(state["k"])
        mu = (Vec(state["mu"]) * self.beta).add(Vec(d), alpha=1 - self.beta)
        correction = 1 - self.beta**k if isinstance(k, int) else Vec(1 - self.beta**c for c in k)
        return mu / correction, {"mu": mu, "k": k}


class _Growing(torch.nn.Module):
    def __init__(self, with_w2: bool = False) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
        if with_w2:
            self.grow()

    def grow(self) -> None:
        self.w2 = torch.nn.Parameter(torch.tensor([2.0, 0.1], dtype=torch.float64))

    def loss(self) -> Tensor:
        out = ((self.w1 - 0.3) ** 2).sum()
        if hasattr(self, "w2"):
            out = out + ((self.w2 + 0.7) ** 4).sum() + self.w1.sum() * self.w2.sum()
        return out


LR, BETA = 0.05, 0.8


def _game(rule: UpdateRule, with_w2: bool = False) -> tuple[gameopt.Game, list[_Growing]]:
    mods = [_Growing(with_w2), _Growing(with_w2)]
    players = [gameopt.Player(m, name=n) for m, n in zip(mods, "ab")]
    return gameopt.Game(
        players, lambda: (mods[0].loss(), mods[1].loss()), algorithm=gameopt.SimGD(LR, update=rule)
    ), mods


class _Reference:
    """The closed form, parameter by parameter: each with its own μ and k, from the
    step it joined."""

    def __init__(self, mods: list[_Growing]) -> None:
        self.mods = mods
        self.state: dict[int, tuple[Tensor, int]] = {}

    def step(self) -> None:
        for m in self.mods:
            params = list(m.parameters())
            grads = torch.autograd.grad(m.loss(), params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    mu, k = self.state.get(id(p), (torch.zeros_like(p), 0))
                    mu, k = BETA * mu + (1 - BETA) * g, k + 1
                    self.state[id(p)] = (mu, k)
                    p -= LR * mu / (1 - BETA**k)


def test_a_contributors_rule_counts_steps_per_parameter_after_one_joins() -> None:
    """The parameter that joins at step 5 starts its own count (its first step is a
    fresh rule's), the others keep theirs: declared by the rule (``counts``), carried
    by its default ``carry`` hook, with no engine code naming ``k``."""
    game, mods = _game(BiasCorrectedEMA(BETA))
    ref = _Reference([copy.deepcopy(m) for m in mods])
    for step in range(12):
        if step == 5:
            for m in [*mods, *ref.mods]:
                m.grow()
        game.step()
        ref.step()
    for m, r in zip(mods, ref.mods):
        for p, q in zip(m.parameters(), r.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-13, atol=1e-15)
    k = game.algorithm_state["rule"]["k"]
    assert isinstance(k, Vec)  # one count per element since w2 joined
    counts = {int(c) for c in torch.cat([t.detach() for t in k]).tolist()}
    assert {12, 7} <= counts <= {0, 12, 7}  # (0: padding between the parameters, if any)


@pytest.mark.parametrize("joined", [False, True], ids=["one-count", "counts-per-element"])
def test_a_contributors_rule_resumes_bit_for_bit_from_a_checkpoint(joined) -> None:
    game, mods = _game(BiasCorrectedEMA(BETA))
    for step in range(6):
        if joined and step == 3:
            for m in mods:
                m.grow()
        game.step()
    saved = game.state_dict()
    assert isinstance(saved["algorithm"]["state"]["rule"]["k"], list if joined else int)
    other, _ = _game(BiasCorrectedEMA(BETA), with_w2=joined)
    other.load_state_dict(saved)
    for _ in range(3):
        game.step()
        other.step()
    assert_same_state(game.state_dict(), other.state_dict())


def test_a_loaded_count_is_checked_by_the_rules_declaration_and_a_refusal_changes_nothing() -> None:
    game, mods = _game(BiasCorrectedEMA(BETA))
    for step in range(4):
        if step == 2:
            for m in mods:
                m.grow()
        game.step()
    saved = game.state_dict()
    other, _ = _game(BiasCorrectedEMA(BETA), with_w2=True)
    other.step()
    before = other.state_dict()
    saved["algorithm"]["state"]["rule"]["k"][0][0] = -1.0
    with pytest.raises(ValueError, match=r"algorithm\.state\.rule\.k\[0\]: step counts, must be >= 0"):
        other.load_state_dict(saved)
    saved["algorithm"]["state"]["rule"]["k"] = -2
    with pytest.raises(ValueError, match=r"algorithm\.state\.rule\.k: a count, must be >= 0"):
        other.load_state_dict(saved)
    assert_same_state(before, other.state_dict())


class _Restarting(BiasCorrectedEMA):
    """A rule whose hooks are its own: it restarts when the players change, and
    refuses a loaded average larger than 10."""

    def carry(self, old, fresh, carry):
        return fresh

    def check_loaded(self, live, saved, path):
        like = super().check_loaded(live, saved, path)
        if any(bool((t.abs() > 10).any()) for t in saved["mu"]):
            raise ValueError(f"{path}.mu: an average above 10")
        return like


def test_a_rule_s_own_hooks_carry_and_check_its_state() -> None:
    game, mods = _game(_Restarting(BETA))
    for _ in range(3):
        game.step()
    for m in mods:
        m.grow()
    game.step()  # carried by the rule's hook (a fresh start), then one step
    assert game.algorithm_state["rule"]["k"] == 1
    saved = game.state_dict()
    saved["algorithm"]["state"]["rule"]["mu"][0][0] = 11.0
    before = game.state_dict()
    with pytest.raises(ValueError, match=r"algorithm\.state\.rule\.mu: an average above 10"):
        game.load_state_dict(saved)
    assert_same_state(before, game.state_dict())


def test_one_rule_per_player_carries_each_players_state_with_its_rule() -> None:
    """``update=[...]``: each player's rule carries and checks its own state."""
    game, mods = _game([BiasCorrectedEMA(BETA), gameopt.Adam()])
    for step in range(4):
        if step == 2:
            for m in mods:
                m.grow()
        game.step()
    players = game.algorithm_state["rule"]["players"]
    assert isinstance(players[0]["k"], Vec) and isinstance(players[1]["t"], Vec)
    other, _ = _game([BiasCorrectedEMA(BETA), gameopt.Adam()], with_w2=True)
    other.load_state_dict(game.state_dict())
    game.step()
    other.step()
    assert_same_state(game.state_dict(), other.state_dict())


# ------------------------------------------------------------------ the engine names no rule's key
#: the engine: code that carries, checks or loads any algorithm's or rule's state
ENGINE = ["algorithms/base.py", "game/relayout.py", "game/checkpoint.py", "state.py"]
ENGINE += [p.relative_to(ROOT).as_posix() for p in (ROOT / "algorithms").glob("_*.py") if p.name != "__init__.py"]
#: in updates.py, the generic code (the rules below it own their keys)
GENERIC = {"UpdateRule", "PerPlayer", "apply", "next_count", "stepped", "rule_from", "_empty_like", "_real"}


def _keys_of_rules() -> set[str]:
    like = [torch.zeros(3)]
    rules = [gameopt.Plain(), gameopt.Momentum(), gameopt.Adam(), gameopt.RMSProp(), gameopt.NuPI()]
    return {k for r in rules for k in r.init(like)}


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """The string constants of ``tree`` that are not docstrings."""
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def _named_keys(path: Path, only: set[str] | None = None) -> list[str]:
    tree = ast.parse(path.read_text())
    parts = [n for n in tree.body if only is None or getattr(n, "name", None) in only]
    keys = _keys_of_rules()
    return [f"{path.name}:{line} {s!r}" for part in parts for line, s in _strings(part) if s in keys]


def test_no_engine_code_names_a_rules_state_keys() -> None:
    assert _keys_of_rules() >= {"m", "v", "t", "buf", "e"}
    offenders = [use for name in ENGINE for use in _named_keys(ROOT / name)]
    offenders += _named_keys(ROOT / "updates.py", GENERIC)
    assert offenders == []


def test_the_key_scan_sees_a_named_key(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""Adam\'s "t"."""\n\ndef f(state):\n    """the "m"."""\n    return state["t"], state.get("m")\n')
    assert _named_keys(bad) == ["bad.py:5 't'", "bad.py:5 'm'"]
