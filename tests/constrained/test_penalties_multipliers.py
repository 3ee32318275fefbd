"""Penalty formulations with multiplicative updates and multiplier models: parity with
cooper-optim, state round trips, and bad settings refused with nothing changed."""

from __future__ import annotations

import pytest
import torch
from lagrangian_problems import RATES, SAMPLES, group_rates, grouped
from torch import nn

import gameopt


# ------------------------------------------------------------------ penalties and multiplier models
def _with_equality(model, x, y, group):
    """The rates of `group_rates` and one equality: the mean logit at 0.2."""
    f, soft, hard = group_rates(model, x, y, group)
    return f, soft, hard, (model(x).mean() - 0.2).reshape(1)


def _cooper_penalty(cooper, ineq, n, init, indexed=False):
    cls = (
        cooper.penalty_coefficients.IndexedPenaltyCoefficient
        if indexed
        else cooper.penalty_coefficients.DensePenaltyCoefficient
    )
    return cls(torch.full((n,), init, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["quadratic_penalty", "quadratic_penalty-sampled", "augmented_lagrangian"])
def test_penalty_formulations_with_multiplicative_updates_match_cooper(kind: str) -> None:
    """`formulation="quadratic_penalty"` is cooper's QuadraticPenalty (no multipliers,
    an UnconstrainedOptimizer), the augmented Lagrangian cooper's AugmentedLagrangian;
    `MultiplicativePenalty` is cooper's MultiplicativePenaltyCoefficientUpdater, one
    coefficient per constraint (restart on; off with sampled constraints, where cooper's
    restart does not take indices)."""
    cooper = pytest.importorskip("cooper")
    model, x, y, group = grouped()
    ref = nn.Linear(3, 1).double()
    ref.load_state_dict(model.state_dict())
    sampled, quadratic = kind.endswith("sampled"), kind.startswith("quadratic")
    c0, growth, tol, restart = 0.5, 1.5, 0.02, not sampled
    formulation = cooper.formulations.QuadraticPenalty if quadratic else cooper.formulations.AugmentedLagrangian
    step = {"k": 0}

    def ours():
        f, soft, hard, eq = _with_equality(model, x, y, group)
        if sampled:
            ix = SAMPLES[step["k"] % len(SAMPLES)]
            return f, gameopt.Sampled(gameopt.Proxy(soft[ix], hard[ix]), ix), eq
        return f, gameopt.Proxy(soft, hard), eq

    multipliers = {}
    if not quadratic:
        multipliers = {
            "ineq": cooper.multipliers.DenseMultiplier(RATES, dtype=torch.float64),
            "eq": cooper.multipliers.DenseMultiplier(1, dtype=torch.float64),
        }
    pen_ineq = _cooper_penalty(cooper, True, RATES, c0, indexed=sampled)
    pen_eq = _cooper_penalty(cooper, False, 1, c0)

    class Problem(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.rates = cooper.Constraint(
                cooper.ConstraintType.INEQUALITY,
                formulation,
                multiplier=multipliers.get("ineq"),
                penalty_coefficient=pen_ineq,
            )
            self.mean = cooper.Constraint(
                cooper.ConstraintType.EQUALITY,
                formulation,
                multiplier=multipliers.get("eq"),
                penalty_coefficient=pen_eq,
            )

        def compute_cmp_state(self):
            f, soft, hard, eq = _with_equality(ref, x, y, group)
            if sampled:
                ix = SAMPLES[step["k"] % len(SAMPLES)]
                rates = cooper.ConstraintState(
                    violation=soft[ix], constraint_features=ix, strict_violation=hard[ix], strict_constraint_features=ix
                )
            else:
                rates = cooper.ConstraintState(violation=soft, strict_violation=hard)
            return cooper.CMPState(
                loss=f, observed_constraints={self.rates: rates, self.mean: cooper.ConstraintState(eq)}
            )

    cmp = Problem()
    lrs = [0.3, 0.5]
    primal = torch.optim.SGD(ref.parameters(), lr=lrs[0])
    if quadratic:
        optimizer = cooper.optim.UnconstrainedOptimizer(cmp, primal)
        algorithm = gameopt.SimGD(lrs[0])
    else:
        dual = torch.optim.SGD(cmp.dual_parameters(), lr=lrs[1], maximize=True)
        optimizer = cooper.optim.SimultaneousOptimizer(cmp, primal, dual)
        algorithm = gameopt.SimGD(lrs)
    updater = cooper.penalty_coefficients.MultiplicativePenaltyCoefficientUpdater(growth, tol, restart)
    problem = gameopt.LagrangianGame(
        model,
        ours,
        num_ineq=RATES,
        num_eq=1,
        algorithm=algorithm,
        penalty=c0,
        formulation=kind.split("-")[0],
        penalty_update=gameopt.MultiplicativePenalty(growth, tol, restart),
    )
    worst, grew, restarted = 0.0, False, False
    for k in range(15):
        step["k"] = k
        before = problem.penalties[0]
        problem.step()
        roll = optimizer.roll()
        updater.step(roll.cmp_state.observed_constraints)
        ours_all = [model.weight, model.bias, *problem.penalties]
        theirs = [ref.weight, ref.bias, pen_ineq.value, pen_eq.value]
        if not quadratic:
            ours_all += [m for m in problem.multipliers]
            theirs += [multipliers["ineq"].weight, multipliers["eq"].weight]
        for a, b in zip(ours_all, theirs):  # relative: the coefficients grow geometrically
            a, b = a.detach().reshape(-1), b.detach().reshape(-1)
            worst = max(worst, float(((a - b).abs() / b.abs().clamp_min(1)).max()))
        grew |= bool((problem.penalties[0] > c0).any())
        restarted |= bool(((before > c0) & (problem.penalties[0] == c0)).any())
    print(f"{kind}: max |gameopt − cooper| / max(1, |cooper|) over 15 steps = {worst:.2e}")
    assert worst <= 1e-12
    assert grew and bool((problem.penalties[1] > c0).all())  # the updater acted
    assert restarted == restart  # a satisfied inequality's coefficient went back to c0
    if quadratic:
        assert len(problem.game.players) == 1


class RateMultipliers(nn.Module):
    """A multiplier model: a group's features → its multiplier, non-negative (softplus)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1).double()
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[0.3, -0.2]], dtype=torch.float64))
            self.linear.bias.fill_(-1.0)

    def forward(self, features):
        return nn.functional.softplus(self.linear(features)).reshape(-1)


class Scaled(nn.Module):
    """A multiplier model of one parameter: ``scale · (1 + ‖features‖²)``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(scale, dtype=torch.float64))

    def forward(self, features):
        return self.scale * (1 + features.square().sum(-1))


FEATURES = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5]], dtype=torch.float64)


@pytest.mark.parametrize("method", ["SimGD", "AltGD", "AltGD-dual-first", "augmented"])
def test_multiplier_models_match_cooper_implicit_multipliers(method: str) -> None:
    """`LagrangianGame(multipliers=module)` with `Sampled(values, features)` is cooper's
    ImplicitMultiplier: the model is the multiplier player, ascending through its
    outputs; the equality keeps a dense multiplier beside it."""
    cooper = pytest.importorskip("cooper")
    model, x, y, group = grouped()
    ref = nn.Linear(3, 1).double()
    ref.load_state_dict(model.state_dict())
    ours_model, theirs_model = RateMultipliers(), RateMultipliers()
    step = {"k": 0}
    penalty = 0.7 if method == "augmented" else 0.0

    def ours():
        f, soft, hard, eq = _with_equality(model, x, y, group)
        ix = SAMPLES[step["k"] % len(SAMPLES)]
        return f, gameopt.Sampled(gameopt.Proxy(soft[ix], hard[ix]), FEATURES[ix]), eq

    class Implicit(cooper.multipliers.ImplicitMultiplier):
        expects_constraint_features = True

        def __init__(self) -> None:
            super().__init__()
            self.model = theirs_model

        def forward(self, features):
            return self.model(features)

        def post_step_(self) -> None:
            pass

    formulation = cooper.formulations.AugmentedLagrangian if penalty else cooper.formulations.Lagrangian
    pen = (
        (lambda n: cooper.penalty_coefficients.DensePenaltyCoefficient(torch.tensor(penalty, dtype=torch.float64)))
        if penalty
        else (lambda n: None)
    )
    eq_multiplier = cooper.multipliers.DenseMultiplier(1, dtype=torch.float64)

    class Problem(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.rates = cooper.Constraint(
                cooper.ConstraintType.INEQUALITY, formulation, multiplier=Implicit(), penalty_coefficient=pen(RATES)
            )
            self.mean = cooper.Constraint(
                cooper.ConstraintType.EQUALITY, formulation, multiplier=eq_multiplier, penalty_coefficient=pen(1)
            )

        def compute_cmp_state(self):
            f, soft, hard, eq = _with_equality(ref, x, y, group)
            ix = SAMPLES[step["k"] % len(SAMPLES)]
            rates = cooper.ConstraintState(
                violation=soft[ix],
                constraint_features=FEATURES[ix],
                strict_violation=hard[ix],
                strict_constraint_features=FEATURES[ix],
            )
            return cooper.CMPState(
                loss=f, observed_constraints={self.rates: rates, self.mean: cooper.ConstraintState(eq)}
            )

    cmp = Problem()
    lrs = [0.3, 0.5]
    primal = torch.optim.SGD(ref.parameters(), lr=lrs[0])
    dual = torch.optim.SGD(cmp.dual_parameters(), lr=lrs[1], maximize=True)
    kinds = {
        "SimGD": (cooper.optim.SimultaneousOptimizer, gameopt.SimGD(lrs)),
        "augmented": (cooper.optim.SimultaneousOptimizer, gameopt.SimGD(lrs)),
        "AltGD": (cooper.optim.AlternatingPrimalDualOptimizer, gameopt.AltGD(lrs)),
        "AltGD-dual-first": (cooper.optim.AlternatingDualPrimalOptimizer, gameopt.AltGD(lrs, order=(1, 0))),
    }
    cls, algorithm = kinds[method]
    optimizer = cls(cmp, primal, dual)
    problem = gameopt.LagrangianGame(
        model, ours, num_ineq=RATES, num_eq=1, algorithm=algorithm, penalty=penalty, multipliers={"ineq": ours_model}
    )
    assert problem.multipliers[0] is None
    start = [p.detach().clone() for p in ours_model.parameters()]
    worst = 0.0
    for k in range(12):
        step["k"] = k
        problem.step()
        optimizer.roll()
        pairs = [
            (model.weight, ref.weight),
            (model.bias, ref.bias),
            (ours_model.linear.weight, theirs_model.linear.weight),
            (ours_model.linear.bias, theirs_model.linear.bias),
            (problem.multipliers[1], eq_multiplier.weight),
        ]
        worst = max(worst, max(float((a.detach().reshape(-1) - b.detach().reshape(-1)).abs().max()) for a, b in pairs))
    print(f"{method}: max |gameopt − cooper| over 12 steps = {worst:.2e}")
    assert worst <= 1e-12
    assert not all(torch.equal(a, b) for a, b in zip(start, ours_model.parameters()))  # the model learned


def test_quadratic_penalty_state_round_trips_and_a_refused_load_changes_nothing() -> None:
    model, x, y, group = grouped()

    def fn():
        f, soft, hard, eq = _with_equality(model, x, y, group)
        return f, gameopt.Proxy(soft, hard), eq

    def build():
        return gameopt.LagrangianGame(
            model,
            fn,
            num_ineq=RATES,
            num_eq=1,
            algorithm=gameopt.SimGD(0.2),
            penalty=1.0,
            formulation="quadratic_penalty",
            penalty_update=gameopt.MultiplicativePenalty(2.0, 0.0, False),
        )

    problem = build()
    for _ in range(3):
        problem.step()
    saved = problem.state_dict()
    assert torch.equal(saved["penalties"]["eq"], torch.full((1,), 8.0, dtype=torch.float64))
    with pytest.raises(AttributeError, match="no multipliers"):
        _ = problem.multipliers
    for _ in range(2):
        problem.step()
    after = [t.clone() for t in problem.penalties]
    bad = {**saved, "penalties": {"ineq": -saved["penalties"]["ineq"], "eq": saved["penalties"]["eq"]}}
    weights = model.weight.detach().clone()
    with pytest.raises(ValueError, match="penalties.ineq"):
        problem.load_state_dict(bad)
    assert all(torch.equal(a, b) for a, b in zip(after, problem.penalties)) and torch.equal(weights, model.weight)
    with pytest.raises(ValueError, match="lacks the penalty coefficients"):
        problem.load_state_dict({k: v for k, v in saved.items() if k != "penalties"})
    problem.load_state_dict(saved)
    assert torch.equal(problem.penalties[1], saved["penalties"]["eq"])
    problem.step()
    again = build()
    again.load_state_dict(saved)  # a fresh game resumes bit for bit
    assert torch.equal(again.penalties[1], torch.full((1,), 8.0, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"formulation": "penalty"}, ValueError, "formulation must be one of"),
        ({"formulation": "quadratic_penalty"}, ValueError, "needs a penalty coefficient"),
        ({"formulation": "lagrangian", "penalty": 1.0}, ValueError, "takes no penalty"),
        ({"penalty_update": gameopt.MultiplicativePenalty()}, ValueError, "penalty_update needs a penalty"),
        ({"penalty_update": 1.01, "penalty": 1.0}, TypeError, "MultiplicativePenalty"),
        ({"multipliers": "model"}, TypeError, "nn.Module or a dict"),
        ({"multipliers": {"ineqs": RateMultipliers()}}, ValueError, "unknown kind"),
        ({"multipliers": {"eq": RateMultipliers()}}, ValueError, "no constraint"),
        ({"multipliers": RateMultipliers(), "num_eq": 1}, ValueError, "one model for both"),
        (
            {"multipliers": RateMultipliers(), "penalty": 1.0, "formulation": "quadratic_penalty"},
            ValueError,
            "no multipliers",
        ),
        (
            {"multipliers": RateMultipliers(), "penalty": 1.0, "penalty_update": gameopt.MultiplicativePenalty()},
            ValueError,
            "multiplier model",
        ),
    ],
)
def test_bad_penalty_and_multiplier_settings_are_refused(kwargs, error, match) -> None:
    model, x, y, group = grouped()
    with pytest.raises(error, match=match):
        gameopt.LagrangianGame(model, lambda: None, num_ineq=RATES, **kwargs)


@pytest.mark.parametrize(
    "bounds, match",
    [
        ({"growth": 0.5}, "growth"),
        ({"tolerance": -1.0}, "tolerance"),
        ({"restart": 1}, "restart"),
        ({"growth": float("nan")}, "growth"),
    ],
)
def test_bad_multiplicative_penalties_are_refused(bounds, match) -> None:
    with pytest.raises(ValueError, match=match):
        gameopt.MultiplicativePenalty(**bounds)


@pytest.mark.parametrize(
    "multipliers, g, match",
    [
        (RateMultipliers(), lambda s: s, "must be a gameopt.Sampled"),
        (RateMultipliers(), lambda s: gameopt.Sampled(s[:2], FEATURES[:3]), r"Sampled values must have shape \(3,\)"),
        (RateMultipliers(), lambda s: gameopt.Sampled(s[:2], torch.tensor(1.0)), "features must be a tensor of shape"),
        (Scaled(-1.0), lambda s: gameopt.Sampled(s[:2], FEATURES[:2]), "negative multiplier"),
        (nn.Linear(2, 3).double(), lambda s: gameopt.Sampled(s[:2], FEATURES[:2]), "one multiplier per constraint"),
    ],
)
def test_bad_multiplier_model_evaluations_are_refused_and_change_nothing(multipliers, g, match) -> None:
    model, x, y, group = grouped()
    problem = gameopt.LagrangianGame(
        model,
        lambda: (lambda f, s, h: (f, g(s), None))(*group_rates(model, x, y, group)),
        num_ineq=RATES,
        algorithm=gameopt.SimGD(0.1),
        multipliers=multipliers,
    )
    before = [t.detach().clone() for t in [*model.parameters(), *multipliers.parameters()]]
    with pytest.raises(ValueError, match=match):
        problem.step()
    assert all(torch.equal(a, b) for a, b in zip(before, [*model.parameters(), *multipliers.parameters()]))
