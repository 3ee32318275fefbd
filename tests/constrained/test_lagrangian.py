"""LagrangianGame: iterate-for-iterate parity with cooper-optim, convergence to the
KKT point of small quadratic programs, and clear errors for bad input (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
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
def _qp(with_equality: bool):
    """min ½‖w − a‖² s.t. bᵀw ≤ c (active at the solution) [and dᵀw = e]."""
    a = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64)
    b = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    c = 1.0
    d = torch.tensor([0.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    e = 0.5
    if not with_equality:
        return a, b[None], torch.tensor([c], dtype=torch.float64)
    return a, torch.stack([b, d]), torch.tensor([c, e], dtype=torch.float64)


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
    a, B, rhs = _qp(with_equality)
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
    a, B, rhs = _qp(True)
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
    a, B, rhs = _qp(True)
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


# ------------------------------------------------------------------ proxy and sampled constraints
RATES = 4  # groups, one rate constraint each


def _grouped():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 3, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * torch.randn(64, generator=g, dtype=torch.float64) > 0).double()
    group = torch.arange(64) % RATES
    model = nn.Linear(3, 1).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, 3, generator=g, dtype=torch.float64))
        model.bias.fill_(0.8)
    return model, x, y, group


def _rates(model, x, y, group):
    """f: the logistic loss; per group, the positive rate minus 0.4: soft (sigmoid) and
    strict (hard predictions, not differentiable)."""
    logits = model(x).squeeze(-1)
    f = nn.functional.binary_cross_entropy_with_logits(logits, y)
    soft = torch.stack([torch.sigmoid(logits[group == k]).mean() - 0.4 for k in range(RATES)])
    hard = torch.stack([(logits[group == k] > 0).double().mean() - 0.4 for k in range(RATES)])
    return f, soft, hard


SAMPLES = [torch.tensor(ix) for ix in ([0, 2], [1, 3], [3, 0], [2], [1, 2, 3], [0, 1])]


@pytest.mark.parametrize("kind", ["proxy", "sampled", "sampled-proxy"])
def test_proxy_and_sampled_constraints_match_cooper(kind: str) -> None:
    """Proxy: cooper's ConstraintState(violation=surrogate, strict_violation=strict);
    Sampled: cooper's IndexedMultiplier with the indices as constraint features (its
    multipliers get sparse gradients: only the observed ones move)."""
    cooper = pytest.importorskip("cooper")
    model, x, y, group = _grouped()
    ref = nn.Linear(3, 1).double()
    ref.load_state_dict(model.state_dict())
    sampled = kind.startswith("sampled")
    proxy = kind.endswith("proxy")
    step = {"k": 0}

    def ours():
        f, soft, hard = _rates(model, x, y, group)
        if not sampled:
            return f, gameopt.Proxy(soft, hard), None
        ix = SAMPLES[step["k"] % len(SAMPLES)]
        values = gameopt.Proxy(soft[ix], hard[ix]) if proxy else soft[ix]
        return f, gameopt.Sampled(values, ix), None

    multiplier = (cooper.multipliers.IndexedMultiplier if sampled else cooper.multipliers.DenseMultiplier)(
        RATES, dtype=torch.float64
    )

    class Problem(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.rates = cooper.Constraint(
                cooper.ConstraintType.INEQUALITY, cooper.formulations.Lagrangian, multiplier=multiplier
            )

        def compute_cmp_state(self):
            f, soft, hard = _rates(ref, x, y, group)
            if sampled:
                ix = SAMPLES[step["k"] % len(SAMPLES)]
                strict = hard[ix] if proxy else None
                state = cooper.ConstraintState(
                    violation=soft[ix],
                    constraint_features=ix,
                    strict_violation=strict,
                    strict_constraint_features=ix if proxy else None,
                )
            else:
                state = cooper.ConstraintState(violation=soft, strict_violation=hard)
            return cooper.CMPState(loss=f, observed_constraints={self.rates: state})

    cmp = Problem()
    lrs = [0.3, 0.5]
    optimizer = cooper.optim.SimultaneousOptimizer(
        cmp,
        torch.optim.SGD(ref.parameters(), lr=lrs[0]),
        torch.optim.SGD(cmp.dual_parameters(), lr=lrs[1], maximize=True),
    )
    problem = gameopt.LagrangianGame(model, ours, num_ineq=RATES, algorithm=gameopt.SimGD(lrs))
    worst, unobserved_still = 0.0, True
    for k in range(12):
        step["k"] = k
        before = problem.multipliers[0]
        problem.step()
        optimizer.roll()
        lam = problem.multipliers[0]
        if sampled:
            rest = torch.ones(RATES, dtype=torch.bool)
            rest[SAMPLES[k % len(SAMPLES)]] = False
            unobserved_still &= bool(torch.equal(lam[rest], before[rest]))
        theirs_lam = multiplier.weight.detach().reshape(-1)
        ours_all = torch.cat([model.weight.detach().reshape(-1), model.bias.detach(), lam])
        theirs = torch.cat([ref.weight.detach().reshape(-1), ref.bias.detach(), theirs_lam])
        worst = max(worst, float((ours_all - theirs).abs().max()))
    print(f"{kind}: max |gameopt − cooper| over 12 steps = {worst:.2e}")
    assert worst <= 1e-12
    assert unobserved_still and bool((problem.multipliers[0] > 0).any())


def test_a_proxy_constraint_moves_the_multipliers_by_its_strict_values() -> None:
    """The multipliers ascend on the strict values, the model descends the surrogate."""
    model, x, y, group = _grouped()
    with torch.no_grad():
        f, soft, hard = _rates(model, x, y, group)
    assert not torch.equal(soft, hard)  # the two differ here
    problem = gameopt.LagrangianGame(
        model,
        lambda: (lambda f, s, h: (f, gameopt.Proxy(s, h), None))(*_rates(model, x, y, group)),
        num_ineq=RATES,
        algorithm=gameopt.SimGD([0.0, 1.0]),
    )
    problem.step()
    torch.testing.assert_close(problem.multipliers[0], hard.clamp_min(0))


@pytest.mark.parametrize(
    "g, match",
    [
        (lambda s, h: gameopt.Sampled(s[:2], torch.tensor([0, 4])), r"indices must lie in 0\.\.3"),
        (lambda s, h: gameopt.Sampled(s[:2], torch.tensor([0.0, 1.0])), "non-empty long tensor"),
        (lambda s, h: gameopt.Sampled(s[:2], torch.tensor([0, 1, 2])), r"Sampled values must have shape \(3,\)"),
        (lambda s, h: gameopt.Proxy(s, h[:2]), r"Proxy strict values must have shape \(4,\)"),
        (lambda s, h: gameopt.Sampled(s[:0], torch.tensor([], dtype=torch.long)), "non-empty"),
    ],
)
def test_bad_proxy_and_sampled_constraints_are_refused_and_change_nothing(g, match) -> None:
    model, x, y, group = _grouped()
    problem = gameopt.LagrangianGame(
        model,
        lambda: (lambda f, s, h: (f, g(s, h), None))(*_rates(model, x, y, group)),
        num_ineq=RATES,
        algorithm=gameopt.SimGD(0.1),
    )
    before = problem.state_dict()
    with pytest.raises(ValueError, match=match):
        problem.step()
    after = problem.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(after["players"][0]["params"], before["players"][0]["params"]))


# ------------------------------------------------------------------ penalties and multiplier models
def _with_equality(model, x, y, group):
    """The rates of `_rates` and one equality: the mean logit at 0.2."""
    f, soft, hard = _rates(model, x, y, group)
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
    model, x, y, group = _grouped()
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
    model, x, y, group = _grouped()
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
    model, x, y, group = _grouped()

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
    model, x, y, group = _grouped()
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
    model, x, y, group = _grouped()
    problem = gameopt.LagrangianGame(
        model,
        lambda: (lambda f, s, h: (f, g(s), None))(*_rates(model, x, y, group)),
        num_ineq=RATES,
        algorithm=gameopt.SimGD(0.1),
        multipliers=multipliers,
    )
    before = [t.detach().clone() for t in [*model.parameters(), *multipliers.parameters()]]
    with pytest.raises(ValueError, match=match):
        problem.step()
    assert all(torch.equal(a, b) for a, b in zip(before, [*model.parameters(), *multipliers.parameters()]))
