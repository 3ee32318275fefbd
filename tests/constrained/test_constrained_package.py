"""gameopt.constrained as a package: one file per job, the formulation chosen from
the user's string in one place, with the same messages for bad input; NuPI with it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import gameopt
import gameopt.constrained
import gameopt.updates
from gameopt.constrained.formulations import AugmentedLagrangian, Lagrangian, QuadraticPenalty

PACKAGE = Path(gameopt.constrained.__file__).parent
NAMES = ("lagrangian", "augmented_lagrangian", "quadratic_penalty")


def _game(**kwargs) -> gameopt.LagrangianGame:
    model = nn.Linear(2, 1)
    return gameopt.LagrangianGame(model, lambda: (model.weight.sum(), model.bias, None), num_ineq=1, **kwargs)


def _named_formulations(path: Path) -> list[str]:
    """Where a module spells a formulation's name as a string of its own."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in NAMES
    ]


def test_only_the_formulations_module_reads_the_formulation_string() -> None:
    others = sorted(p for p in PACKAGE.glob("*.py") if p.name != "formulations.py")
    found = [hit for path in others for hit in _named_formulations(path)]
    assert found == [], "branch on a Formulation's attributes, not on its name"


@pytest.mark.parametrize(
    "kwargs, cls, players",
    [
        ({}, Lagrangian, 2),
        ({"penalty": 2.0}, AugmentedLagrangian, 2),
        ({"formulation": "lagrangian"}, Lagrangian, 2),
        ({"formulation": "augmented_lagrangian", "penalty": 2.0}, AugmentedLagrangian, 2),
        ({"formulation": "quadratic_penalty", "penalty": 2.0}, QuadraticPenalty, 1),
    ],
)
def test_the_string_and_the_penalty_choose_one_formulation_class(kwargs, cls, players) -> None:
    problem = _game(**kwargs)
    assert type(problem.formulation) is cls and len(problem.game.players) == players
    problem.step()


ONE_OF = "formulation must be one of ('lagrangian', 'augmented_lagrangian', 'quadratic_penalty'), got "


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"formulation": "penalty"}, ONE_OF + "'penalty'"),
        ({"formulation": ["lagrangian"]}, ONE_OF + "['lagrangian']"),  # not hashable: still this message
        ({"formulation": 1}, ONE_OF + "1"),
        (
            {"formulation": "lagrangian", "penalty": 1.0},
            "formulation='lagrangian' takes no penalty (penalty > 0 is the augmented Lagrangian)",
        ),
        (
            {"formulation": "augmented_lagrangian"},
            "formulation='augmented_lagrangian' needs a penalty coefficient c > 0 (penalty=c)",
        ),
        (
            {"formulation": "quadratic_penalty"},
            "formulation='quadratic_penalty' needs a penalty coefficient c > 0 (penalty=c)",
        ),
        (
            {"formulation": "quadratic_penalty", "penalty": 1.0, "multipliers": nn.Linear(1, 1)},
            "formulation='quadratic_penalty' has no multipliers; drop multipliers=",
        ),
        (
            {"penalty_update": gameopt.MultiplicativePenalty()},
            "penalty_update needs a penalty: formulation='augmented_lagrangian' or 'quadratic_penalty'",
        ),
    ],
)
def test_a_bad_formulation_is_refused_with_the_same_message_as_before(kwargs, message) -> None:
    with pytest.raises(ValueError) as refused:
        _game(**kwargs)
    assert str(refused.value) == message


def test_the_public_names_live_in_the_package_and_nupi_left_the_general_rules() -> None:
    for name in gameopt.constrained.__all__:
        assert getattr(gameopt, name) is getattr(gameopt.constrained, name)
        assert getattr(gameopt, name).__module__.startswith("gameopt.constrained.")
    assert not hasattr(gameopt.updates, "NuPI") and isinstance(gameopt.NuPI(), gameopt.UpdateRule)


def test_a_formulation_s_losses_are_its_own() -> None:
    """The quadratic penalty has no multipliers' loss; the augmented Lagrangian at λ = 0
    adds c/2·max(0, g)² to f."""
    f, g = torch.tensor(1.0), torch.tensor([2.0])
    problem = _game(penalty=3.0)
    observed = gameopt.constrained.observations.Observed(g, g, None)
    empty = gameopt.constrained.observations.Observed(g.new_zeros(0), g.new_zeros(0), None)
    primal, dual = problem.formulation.losses(f, observed, empty, problem.multiplier_module, 3.0, 3.0)
    assert float(primal.detach()) == 1.0 + 3.0 / 2 * 4.0 and float(dual.detach()) == 0.0
    assert len(QuadraticPenalty().losses(f, observed, empty, None, 3.0, 3.0)) == 1
