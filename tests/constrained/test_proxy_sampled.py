"""Proxy and sampled constraints: parity with cooper-optim, the multipliers moved by the strict
values, and bad input refused with nothing changed."""

from __future__ import annotations

import pytest
import torch
from lagrangian_problems import RATES, SAMPLES, group_rates, grouped
from torch import nn

import gameopt

# ------------------------------------------------------------------ proxy and sampled constraints


@pytest.mark.parametrize("kind", ["proxy", "sampled", "sampled-proxy"])
def test_proxy_and_sampled_constraints_match_cooper(kind: str) -> None:
    """Proxy: cooper's ConstraintState(violation=surrogate, strict_violation=strict);
    Sampled: cooper's IndexedMultiplier with the indices as constraint features (its
    multipliers get sparse gradients: only the observed ones move)."""
    cooper = pytest.importorskip("cooper")
    model, x, y, group = grouped()
    ref = nn.Linear(3, 1).double()
    ref.load_state_dict(model.state_dict())
    sampled = kind.startswith("sampled")
    proxy = kind.endswith("proxy")
    step = {"k": 0}

    def ours():
        f, soft, hard = group_rates(model, x, y, group)
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
            f, soft, hard = group_rates(ref, x, y, group)
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
    model, x, y, group = grouped()
    with torch.no_grad():
        f, soft, hard = group_rates(model, x, y, group)
    assert not torch.equal(soft, hard)  # the two differ here
    problem = gameopt.LagrangianGame(
        model,
        lambda: (lambda f, s, h: (f, gameopt.Proxy(s, h), None))(*group_rates(model, x, y, group)),
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
    model, x, y, group = grouped()
    problem = gameopt.LagrangianGame(
        model,
        lambda: (lambda f, s, h: (f, g(s, h), None))(*group_rates(model, x, y, group)),
        num_ineq=RATES,
        algorithm=gameopt.SimGD(0.1),
    )
    before = problem.state_dict()
    with pytest.raises(ValueError, match=match):
        problem.step()
    after = problem.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(after["players"][0]["params"], before["players"][0]["params"]))
