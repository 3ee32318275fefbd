"""LagrangianGame: iterate-for-iterate parity with cooper-optim, and convergence to the KKT
point of small quadratic programs (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lagrangian_problems import qp
from models import VecModule
from torch import nn

import gameopt


# ------------------------------------------------------------------ cooper parity
def _classifier() -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(3, 1).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 3, generator=g, dtype=torch.float64))
        model.bias.fill_(0.5)
    x = torch.randn(32, 3, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * torch.randn(32, generator=g, dtype=torch.float64) > 0).double()
    return model, x, y


def _logistic(model: nn.Linear, x: torch.Tensor, y: torch.Tensor):
    """Logistic regression; g₀: positive rate ≤ 0.3 (violated at the start, λ₀ > 0),
    g₁: ‖weight‖² ≤ 20 (satisfied: λ₁ is clamped at 0 every step); h: Σ weight = 0.5."""
    logits = model(x).squeeze(-1)
    f = nn.functional.binary_cross_entropy_with_logits(logits, y)
    g = torch.stack([torch.sigmoid(logits).mean() - 0.3, model.weight.square().sum() - 20.0])
    h = (model.weight.sum() - 0.5).reshape(1)
    return f, g, h


def _cooper_problem(model, x, y, penalty: float):
    cooper = pytest.importorskip("cooper")

    def constraint(kind, n):
        if penalty == 0:
            return cooper.Constraint(
                kind, cooper.formulations.Lagrangian, multiplier=cooper.multipliers.DenseMultiplier(n, dtype=x.dtype)
            )
        coefficient = cooper.penalty_coefficients.DensePenaltyCoefficient(torch.tensor(penalty, dtype=x.dtype))
        return cooper.Constraint(
            kind,
            cooper.formulations.AugmentedLagrangian,
            multiplier=cooper.multipliers.DenseMultiplier(n, dtype=x.dtype),
            penalty_coefficient=coefficient,
        )

    class Problem(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.ineq = constraint(cooper.ConstraintType.INEQUALITY, 2)
            self.eq = constraint(cooper.ConstraintType.EQUALITY, 1)

        def compute_cmp_state(self):
            f, g, h = _logistic(model, x, y)
            observed = {self.ineq: cooper.ConstraintState(violation=g), self.eq: cooper.ConstraintState(violation=h)}
            return cooper.CMPState(loss=f, observed_constraints=observed)

    return Problem()


@pytest.mark.parametrize("penalty", [0.0, 2.0], ids=["lagrangian", "augmented"])
@pytest.mark.parametrize(
    "method",
    ["gda", "extragradient", "alternating-primal-dual", "alternating-dual-primal", "adam-primal-sgd-dual", "nupi-dual"],
)
def test_matches_cooper_iterate_for_iterate(method: str, penalty: float) -> None:
    """gameopt's Lagrangian game against cooper-optim 1.0 on the same problem.

    Conventions checked against cooper's source (they agree with gameopt's):

    * cooper's primal Lagrangian is ``f + λ.detach()ᵀg + μ.detach()ᵀh`` (plus, for
      ``AugmentedLagrangian``, ``(1/2c)Σ(relu(λ + c g)² − λ²) + (c/2)‖h‖²``); its dual
      Lagrangian is ``λᵀg.detach() + μᵀh.detach()``, maximized (dual optimizers with
      ``maximize=True``): the same vector field as the game's losses ``L_c`` and
      ``−(λᵀg + μᵀh)``.
    * GDA (``SimultaneousOptimizer``): both players step from (w_t, λ_t), then
      ``multiplier.post_step_()`` clamps λ at 0: λ ← [λ + η g(w_t)]₊, gameopt's
      projected step P(λ + δ).
    * Extrapolation (``ExtrapolationConstrainedOptimizer`` with ``ExtraSGD``): the
      extrapolated multipliers are clamped too (``post_step_`` after
      ``extrapolation()``), and the step restarts from the saved (feasible) λ_t:
      λ_{t+½} = [λ_t + η g(w_t)]₊, λ_{t+1} = [λ_t + η g(w_{t+½})]₊, as gameopt's
      Extragradient does with a projected player.
    """
    model, x, y = _classifier()
    ref = nn.Linear(3, 1).double()
    ref.load_state_dict(model.state_dict())
    lrs = [0.2, 0.3]
    cooper = pytest.importorskip("cooper")
    cmp = _cooper_problem(ref, x, y, penalty)
    if method == "gda":
        algorithm = gameopt.SimGD(lrs)
        primal = torch.optim.SGD(ref.parameters(), lr=lrs[0])
        dual = torch.optim.SGD(cmp.dual_parameters(), lr=lrs[1], maximize=True)
        optimizer = cooper.optim.SimultaneousOptimizer(cmp, primal, dual)
    elif method == "adam-primal-sgd-dual":
        # one update rule per player; eps = 0 because torch adds ε to the bias-corrected root, gameopt to the raw one
        algorithm = gameopt.SimGD(lrs, update=[gameopt.Adam((0.9, 0.999), eps=0.0), gameopt.Plain()])
        primal = torch.optim.Adam(ref.parameters(), lr=lrs[0], betas=(0.9, 0.999), eps=0.0)
        dual = torch.optim.SGD(cmp.dual_parameters(), lr=lrs[1], maximize=True)
        optimizer = cooper.optim.SimultaneousOptimizer(cmp, primal, dual)
    elif method == "nupi-dual":
        # cooper's gains are tensors: float64 ones, so that both sides use the same numbers
        kp, ki, nu = 0.7, 0.6, 0.3
        algorithm = gameopt.SimGD(lrs, update=[gameopt.Plain(), gameopt.NuPI(kp=kp, ki=ki, ema=nu)])
        primal = torch.optim.SGD(ref.parameters(), lr=lrs[0])
        gain = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        dual = cooper.optim.nuPI(cmp.dual_parameters(), lr=lrs[1], Kp=gain(kp), Ki=gain(ki), ema_nu=nu, maximize=True)
        optimizer = cooper.optim.SimultaneousOptimizer(cmp, primal, dual)
    elif method.startswith("alternating"):
        # cooper's AlternatingPrimalDualOptimizer: x_{t+1} from (x_t, λ_t), then λ_{t+1} from (x_{t+1}, λ_t);
        # AlternatingDualPrimalOptimizer the other way round: AltGD in list order, or order=(1, 0)
        dual_first = method == "alternating-dual-primal"
        algorithm = gameopt.AltGD(lrs, order=(1, 0) if dual_first else None)
        primal = torch.optim.SGD(ref.parameters(), lr=lrs[0])
        dual = torch.optim.SGD(cmp.dual_parameters(), lr=lrs[1], maximize=True)
        alternating = cooper.optim.constrained_optimizers
        kind = alternating.AlternatingDualPrimalOptimizer if dual_first else alternating.AlternatingPrimalDualOptimizer
        optimizer = kind(cmp, primal, dual)
    else:
        algorithm = gameopt.Extragradient(lrs)
        primal = cooper.optim.ExtraSGD(ref.parameters(), lr=lrs[0])
        dual = cooper.optim.ExtraSGD(cmp.dual_parameters(), lr=lrs[1], maximize=True)
        optimizer = cooper.optim.ExtrapolationConstrainedOptimizer(cmp, primal, dual)
    problem = gameopt.LagrangianGame(
        model, lambda: _logistic(model, x, y), num_ineq=2, num_eq=1, algorithm=algorithm, penalty=penalty
    )
    worst, positive = 0.0, False
    for _ in range(20):
        problem.step()
        optimizer.roll()
        lam, mu = problem.multipliers
        ours = torch.cat([model.weight.detach().reshape(-1), model.bias.detach(), lam, mu])
        theirs = torch.cat(
            [ref.weight.detach().reshape(-1), ref.bias.detach(), cmp.ineq.multiplier.weight, cmp.eq.multiplier.weight]
        ).detach()
        worst = max(worst, float((ours - theirs).abs().max()))
        positive |= bool(lam[0] > 0)
        assert lam[1] == 0  # the satisfied constraint's multiplier is clamped at 0
    print(f"{method}, penalty {penalty}: max |gameopt − cooper| over 20 steps = {worst:.2e}")
    assert worst <= 1e-10
    assert positive and problem.multipliers[1].abs().max() > 0  # the multipliers took part


# ------------------------------------------------------------------ KKT points


def _kkt(a, B, rhs):
    """Both constraints active: w* = a − Bᵀν, B w* = rhs, ν = (BBᵀ)⁻¹(Ba − rhs)."""
    nu = torch.linalg.solve(B @ B.T, B @ a - rhs)
    return a - B.T @ nu, nu


def _slsqp(a, B, rhs, with_equality: bool):
    from scipy.optimize import minimize

    A, Bn, r = a.numpy(), B.numpy(), rhs.numpy()
    cons = [{"type": "ineq", "fun": lambda w: r[0] - Bn[0] @ w, "jac": lambda w: -Bn[0]}]
    if with_equality:
        cons.append({"type": "eq", "fun": lambda w: r[1] - Bn[1] @ w, "jac": lambda w: -Bn[1]})  # sign: as ν
    res = minimize(
        lambda w: 0.5 * np.sum((w - A) ** 2),
        np.zeros_like(A),
        jac=lambda w: w - A,
        method="SLSQP",
        constraints=cons,
        options={"ftol": 1e-14, "maxiter": 200},
    )
    assert res.success
    multipliers = np.atleast_1d(res.multipliers)  # SLSQP lists the equalities first
    return res.x, np.roll(multipliers, -1) if with_equality else multipliers


@pytest.mark.parametrize("with_equality", [False, True], ids=["inequality", "inequality+equality"])
@pytest.mark.parametrize("name", ["extragradient", "optimistic"])
def test_converges_to_the_kkt_point(name: str, with_equality: bool) -> None:
    a, B, rhs = qp(with_equality)
    w_star, nu_star = _kkt(a, B, rhs)
    assert nu_star[0] > 0.1  # the inequality is active with a positive multiplier
    x_slsqp, mult_slsqp = _slsqp(a, B, rhs, with_equality)
    # SLSQP reports multipliers of its own constraint functions: the same ν here
    np.testing.assert_allclose(x_slsqp, w_star.numpy(), atol=1e-7)
    np.testing.assert_allclose(mult_slsqp, nu_star.numpy(), atol=1e-7)

    model = VecModule(torch.zeros(4, dtype=torch.float64))

    def objective_and_constraints():
        w = model.w
        f = 0.5 * (w - a).square().sum()
        g = B[0] @ w - rhs[0]  # a 0-d tensor for the one inequality
        h = (B[1:] @ w - rhs[1:]) if with_equality else None
        return f, g, h

    algorithm = gameopt.Extragradient([0.3, 0.3]) if name == "extragradient" else gameopt.Optimistic([0.2, 0.2])
    problem = gameopt.LagrangianGame(
        model, objective_and_constraints, num_ineq=1, num_eq=int(with_equality), algorithm=algorithm
    )
    for _ in range(400):  # linear convergence: at 1e-16 after about 300 steps
        out = problem.step()
    lam, mu = problem.multipliers
    w, mult = model.w.detach(), torch.cat([lam, mu])
    w_err, mult_err = float((w - w_star).abs().max()), float((mult - nu_star).abs().max())
    slsqp_err = max(np.abs(w.numpy() - x_slsqp).max(), np.abs(mult.numpy() - mult_slsqp).max())
    print(f"{name}, equality={with_equality}: |w − w*| {w_err:.1e}, |ν − ν*| {mult_err:.1e}, vs SLSQP {slsqp_err:.1e}")
    assert w_err < 1e-9 and mult_err < 1e-9
    assert slsqp_err < 1e-6
    assert float(out.metrics["violation"]) < 1e-9


def test_penalty_converges_and_state_dict_round_trips() -> None:
    """The augmented Lagrangian reaches the same KKT point; the multipliers travel
    in the game's state_dict, and a resumed problem continues bit for bit."""
    a, B, rhs = qp(True)
    w_star, nu_star = _kkt(a, B, rhs)

    def make():
        model = VecModule(torch.zeros(4, dtype=torch.float64))

        def fn():
            return 0.5 * (model.w - a).square().sum(), B[:1] @ model.w - rhs[:1], B[1:] @ model.w - rhs[1:]

        algorithm = gameopt.Extragradient([0.2, 0.5])
        return model, gameopt.LagrangianGame(model, fn, num_ineq=1, num_eq=1, algorithm=algorithm, penalty=1.0)

    model, problem = make()
    for _ in range(50):
        problem.step()
    state = problem.state_dict()
    twin_model, twin = make()
    twin.load_state_dict(state)
    assert torch.equal(torch.cat(twin.multipliers), torch.cat(problem.multipliers))
    for _ in range(300):
        problem.step()
        twin.step()
    assert torch.equal(model.w, twin_model.w)
    assert torch.equal(torch.cat(twin.multipliers), torch.cat(problem.multipliers))
    assert float((model.w.detach() - w_star).abs().max()) < 1e-9
    assert float((torch.cat(problem.multipliers) - nu_star).abs().max()) < 1e-9
