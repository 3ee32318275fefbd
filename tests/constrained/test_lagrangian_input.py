"""LagrangianGame: clear errors for bad settings and evaluations with nothing changed, every
first-order algorithm keeping the multipliers feasible, and the docs' example as pasted."""

from __future__ import annotations

import pytest
import torch
from lagrangian_problems import qp
from models import VecModule

import gameopt


# ------------------------------------------------------------------ bad input
def _fn_returning(*out):
    return lambda: out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_ineq": 0, "num_eq": 0}, "both 0"),
        ({"num_ineq": -1}, r"num_ineq must be an integer in \[0, inf\), got -1"),
        ({"num_ineq": 1.0}, "num_ineq must be an integer"),
        ({"num_ineq": True}, "num_ineq must be an integer"),
        ({"num_eq": "2"}, "num_eq must be an integer"),
        ({"num_ineq": 1, "penalty": -1.0}, r"penalty must be a finite number in \[0, inf\), got -1.0"),
        ({"num_ineq": 1, "penalty": float("nan")}, "penalty must be a finite number"),
    ],
)
def test_bad_settings_are_refused(kwargs, message) -> None:
    model = VecModule(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=message):
        gameopt.LagrangianGame(model, _fn_returning(model.w.sum(), None, None), **kwargs)


@pytest.mark.parametrize(
    "counts, out, message",
    [
        ((1, 0), "f", r"must return \(f, g, h\), got Tensor"),
        ((1, 0), ("f", "g"), r"must return \(f, g, h\), got 2 values"),
        ((1, 0), ("w", "g", None), r"objective f must be a scalar tensor, got \(2,\)"),
        ((2, 0), ("f", "g", None), r"g must have shape \(2,\) \(num_ineq=2\), got \(\)"),
        ((1, 0), ("f", None, None), r"g must be a tensor of shape \(1,\) \(num_ineq=1\), got NoneType"),
        ((1, 1), ("f", "g", "g2"), r"h must have shape \(1,\) \(num_eq=1\), got \(2,\)"),
        ((1, 0), ("f", "g", "g"), r"h must have shape \(0,\) \(num_eq=0\), got \(\)"),
        ((0, 2), ("f", None, [0.0, 1.0]), r"h must be a tensor of shape \(2,\) \(num_eq=2\), got list"),
    ],
)
def test_bad_evaluations_are_refused_and_change_nothing(counts, out, message) -> None:
    model = VecModule(torch.ones(2, dtype=torch.float64))

    def value(v):
        made = {"f": lambda: model.w.sum(), "g": lambda: model.w.sum() - 1, "g2": lambda: model.w - 1}
        return made.get(v, lambda: model.w)() if isinstance(v, str) else v

    def fn():
        return value(out) if isinstance(out, str) else tuple(value(v) for v in out)

    problem = gameopt.LagrangianGame(model, fn, num_ineq=counts[0], num_eq=counts[1], algorithm=gameopt.SimGD(0.1))
    with pytest.raises(ValueError, match=message):
        problem.step()
    assert torch.equal(model.w.detach(), torch.ones(2, dtype=torch.float64))


def test_every_first_order_algorithm_runs_and_multipliers_stay_feasible() -> None:
    a, B, rhs = qp(True)
    for algorithm in [
        gameopt.SimGD(0.1),
        gameopt.AltGD(0.1),
        gameopt.Extragradient(0.1, update=gameopt.Adam((0.5, 0.9))),
        gameopt.Optimistic(0.1, update=gameopt.Momentum(0.3)),
        gameopt.Lookahead(gameopt.Extragradient(0.1), k=5, alpha=0.5),
    ]:
        model = VecModule(torch.zeros(4, dtype=torch.float64))
        # the inequality starts satisfied (λ stays clamped at 0 at first): w = 0 gives bᵀw − c = −1
        problem = gameopt.LagrangianGame(
            model,
            lambda m=model: (0.5 * (m.w - a).square().sum(), B[:1] @ m.w - rhs[:1], B[1:] @ m.w - rhs[1:]),
            num_ineq=1,
            num_eq=1,
            algorithm=algorithm,
        )
        for _ in range(30):
            problem.step()
            assert problem.multipliers[0].min() >= 0, type(algorithm).__name__


def test_the_docs_lagrangian_example_runs_as_pasted(capsys) -> None:
    """docs/constrained.md's code blocks, run one after the other as a user pastes
    them: the first example's constraint ends satisfied with a positive multiplier."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "constrained.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 8
    state = torch.get_rng_state()
    try:
        scope: dict = {"__name__": "example"}
        exec(compile(blocks[0], "docs/constrained.md", "exec"), scope)
        assert scope["out"].metrics["violation"] <= 1e-6 and float(scope["lam"][0]) > 0
        for block in blocks[1:]:
            exec(compile(block, "docs/constrained.md", "exec"), scope)
            assert all(torch.isfinite(p).all() for p in scope["model"].parameters())
    finally:
        torch.set_rng_state(state)
    printed = capsys.readouterr().out
    assert "objective" in printed
    c_ineq, c_eq = scope["c_ineq"], scope["c_eq"]  # the quadratic penalty's coefficients grew
    assert f"penalties {float(c_ineq[0]):.2f}, {float(c_eq[0]):.2f}" in printed and float(c_eq[0]) > 1.0
