"""
Lagrangian fairness: a rate constraint as a game
================================================

Logistic regression on synthetic data with two groups, under the constraint that
the predicted positive rates of the groups differ by at most 0.05:
:math:`|r_A - r_B| \\le 0.05`, written as two inequalities
:math:`g(w) \\le 0`. :class:`gameopt.LagrangianGame` makes this a two-player
game: the model minimizes the Lagrangian :math:`f(w) + \\lambda^\\top g(w)`, a
multiplier player :math:`\\lambda \\ge 0` ascends on :math:`\\lambda^\\top g(w)`.
At these step sizes on standardized features both projected gradient
descent-ascent (``SimGD``) and extragradient reach a feasible point with the same
objective and multiplier, and GDA oscillates around it for longer; the
:doc:`results </results>` show a larger problem where GDA does not settle and the
extrapolation methods do. Learning rates are per player, ``[model, multipliers]``;
see :doc:`/recipes` for choosing them.
"""

import matplotlib.pyplot as plt
import torch

import gameopt

torch.manual_seed(0)
n, d = 2000, 5
group = torch.rand(n) < 0.5  # (2000,) bool: membership of group A
X = torch.randn(n, d)
X[:, 0] += 1.5 * group  # feature 0 is shifted in group A, so the rates differ
y = (X @ torch.tensor([1.0, -1.0, 0.5, 0.0, 0.3]) + 0.3 * torch.randn(n) > 0).float()  # (2000,) labels
X = (X - X.mean(0)) / X.std(0)  # standardized features: step sizes below assume this


def make_problem(algorithm):
    torch.manual_seed(1)
    model = torch.nn.Linear(d, 1)

    def objective_and_constraints(x, y):  # -> f (scalar), g (2,), h (None: no equalities)
        logits = model(x).squeeze(-1)
        f = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        p = torch.sigmoid(logits)
        gap = p[group].mean() - p[~group].mean()
        return f, torch.stack([gap - 0.05, -gap - 0.05]), None

    problem = gameopt.LagrangianGame(model, objective_and_constraints, num_ineq=2, algorithm=algorithm)
    return problem


fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for name, algorithm in {
    "projected GDA (SimGD)": gameopt.SimGD([0.2, 1.0]),
    "Extragradient": gameopt.Extragradient([0.2, 1.0]),
}.items():
    problem = make_problem(algorithm)
    objective, violation = [], []
    for _ in range(600):
        out = problem.step(X, y)
        objective.append(float(out.metrics["objective"]))
        violation.append(float(out.metrics["violation"]))
    lam, _ = problem.multipliers
    axes[0].plot(objective, label=name)
    axes[1].plot(violation, label=name)
    print(f"{name:>22}: objective {objective[-1]:.4f}, violation {violation[-1]:.1e}, λ = {lam.numpy().round(3)}")
axes[0].set(xlabel="step", ylabel="cross-entropy f(w)", title="objective")
axes[1].set(xlabel="step", ylabel="max(0, g(w))", title="constraint violation", yscale="symlog")
axes[1].set_yscale("symlog", linthresh=1e-4)
axes[0].legend()
fig.tight_layout()
plt.show()
