"""Constrained learning: logistic regression under a rate-parity constraint, solved
as a Lagrangian game (gameopt.LagrangianGame).

Data: scikit-learn's breast-cancer set (569 samples, 30 features, standardized);
two groups, 'mean texture' above / below its median. With r_G(w) the mean
predicted probability of the positive class over group G (a differentiable
positive rate):

    min_w  CE(w) + (l2/2)‖w‖²    s.t.   r_A(w) − r_B(w) ≤ ε,   r_B(w) − r_A(w) ≤ ε

(CE: the mean cross-entropy; w: the weights and the bias). Each run starts from the
unconstrained optimum (rate gap −0.45, far outside |gap| ≤ ε = 0.05), with zero
multipliers. Metrics after every step: the objective, the violation
max(0, |gap| − ε), the gap and the multipliers.

With ``--constraints per-group``: 40 error-rate constraints, one per group of
scikit-learn's digits, observed a minibatch at a time, with dense, sampled or model
multipliers (``--multipliers``) and plain or nuPI dual steps (``--dual``); see
:mod:`experiments.per_group`.

python -m experiments.constrained_learning --algorithm extragradient --lr 0.5 2.0 --steps 2000
python -m experiments.constrained_learning --figures   # figures/constrained_learning.{png,json}
python -m experiments.constrained_learning --constraints per-group --multipliers model --dual nupi --lr 0.2 1.0
python -m experiments.constrained_learning --constraints per-group --figures   # figures/constrained_per_group.*
"""

from __future__ import annotations

import functools
import json
import sys
import time
from importlib import metadata

import torch
from torch import nn

import gameopt
from experiments import per_group
from experiments.common import (
    Run,
    UsageError,
    algorithm_from_args,
    building_game,
    check_args,
    figures_dir,
    hyperparameters,
    lr_from_args,
    main_guard,
    make_algorithm,
    one_thread,
    parser,
    run_config,
    save_figure,
)

L2 = 1e-2  # makes the problem strongly convex (the data are almost separable)
BOUND = 0.05  # ε
GROUP_FEATURE = "mean texture"


@functools.lru_cache(maxsize=1)
def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X standardized, y ∈ {0, 1}, group mask), float64."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float64)
    x = (x - x.mean(0)) / x.std(0, correction=0)
    y = torch.tensor(data.target, dtype=torch.float64)
    column = x[:, list(data.feature_names).index(GROUP_FEATURE)]
    return x, y, column > column.median()


def objective_and_constraints(model: nn.Module, bound: float) -> tuple[torch.Tensor, torch.Tensor, None]:
    """(f, g, h) of the problem: g = (gap − ε, −gap − ε), no equality."""
    x, y, group = load_data()
    logits = model(x).squeeze(-1)
    f = nn.functional.binary_cross_entropy_with_logits(logits, y)
    f = f + L2 / 2 * sum(p.square().sum() for p in model.parameters())
    rate = torch.sigmoid(logits)
    gap = rate[group].mean() - rate[~group].mean()
    return f, torch.stack([gap - bound, -gap - bound]), None


@functools.lru_cache(maxsize=1)
def _unconstrained_state() -> dict[str, torch.Tensor]:
    model = nn.Linear(load_data()[0].shape[1], 1).double()
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    opt = torch.optim.LBFGS(
        model.parameters(), max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        f = objective_and_constraints(model, BOUND)[0]
        f.backward()
        return f

    opt.step(closure)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def start_model() -> nn.Linear:
    """A fresh model at the unconstrained optimum (deterministic: L-BFGS from zeros)."""
    model = nn.Linear(load_data()[0].shape[1], 1).double()
    model.load_state_dict(_unconstrained_state())
    return model


def build(algorithm, bound: float = BOUND, penalty: float = 0.0):
    import gameopt

    model = start_model()
    problem = gameopt.LagrangianGame(
        model, lambda: objective_and_constraints(model, bound), num_ineq=2, algorithm=algorithm, penalty=penalty
    )
    return model, problem


@torch.no_grad()
def measure(model: nn.Module, bound: float = BOUND) -> dict[str, float]:
    """Objective, violation, the (soft) rate gap; the accuracy and the gap of the
    thresholded predictions."""
    x, y, group = load_data()
    f, g, _ = objective_and_constraints(model, bound)
    logits = model(x).squeeze(-1)
    positive = (logits > 0).double()
    return {
        "objective": float(f),
        "violation": float(g.clamp_min(0).max()),
        "gap": float(g[0] + bound),
        "accuracy": float((positive == y).double().mean()),
        "hard_gap": float(positive[group].mean() - positive[~group].mean()),
    }


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="extragradient", lr=0.5, steps=2000, out="runs/constrained_learning")
    p.add_argument("--constraints", choices=("parity", "per-group"), default="parity", help="the problem")
    p.add_argument("--bound", type=float, default=BOUND, help=f"ε, the largest rate gap allowed (default {BOUND})")
    p.add_argument("--penalty", type=float, default=0.0, help="c of the augmented Lagrangian (default 0: plain)")
    p.add_argument("--multipliers", choices=per_group.HOLDERS, default="sampled", help="per-group: how they are held")
    p.add_argument("--dual", choices=per_group.DUALS, default="sgd", help="per-group: the multipliers' update")
    p.add_argument("--nupi", type=float, nargs=2, default=per_group.FIGURE_NUPI, metavar=("KP", "KI"))
    p.add_argument("--figures", action="store_true", help="regenerate the problem's figure and results in figures/")
    args = p.parse_args(argv)
    per_group_run = args.constraints == "per-group"
    if args.figures:
        (per_group.make_figures if per_group_run else make_figures)(args.no_progress)
        return 0
    check_args(args)
    if not 0 < args.bound < 1:
        raise UsageError(f"--bound must be in (0, 1), got {args.bound}")
    if per_group_run:
        return _per_group(args)
    with building_game():
        model, problem = build(algorithm_from_args(args), args.bound, args.penalty)
    run = Run("constrained_learning", args, run_config(args, bound=args.bound, penalty=args.penalty, l2=L2))
    extra: dict = {}
    start = run.resume(problem.game, extra)
    with one_thread():
        for step in run.steps(start):
            problem.step()
            lam = problem.multipliers[0]
            m = measure(model, args.bound)
            row = {k: m[k] for k in ("objective", "violation", "gap")}
            run.log(step, {**row, "lambda_0": float(lam[0]), "lambda_1": float(lam[1])})
            run.maybe_checkpoint(step, problem.game, extra)
    final = measure(model, args.bound)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    run.finish({**final, "multipliers": problem.multipliers[0].tolist(), "params": params})
    print(
        f"{args.algorithm}: objective {final['objective']:.6f}, violation {final['violation']:.2e}, "
        f"gap {final['gap']:+.4f} (ε = {args.bound}), accuracy {final['accuracy']:.3f}"
    )
    return 0


def _per_group(args) -> int:
    """A ``--constraints per-group`` run: metrics after every step, checkpoints, resume."""
    update = [gameopt.Plain(), per_group.dual_rule(args.dual, tuple(args.nupi))]
    with building_game():
        algorithm = make_algorithm(args.algorithm, lr_from_args(args), {**hyperparameters(args), "update": update})
        model, problem, counter = per_group.build(args.multipliers, algorithm, args.steps, args.seed)
    config = run_config(args, constraints="per-group", multipliers=args.multipliers, dual=args.dual, nupi=args.nupi)
    run = Run("constrained_learning", args, config)
    start = run.resume(problem.game, {})
    with one_thread():
        for step in run.steps(start):
            counter[0] = step
            problem.step()
            m = per_group.measure(model)
            run.log(step, {k: m[k] for k in ("objective", "violation", "mean_violation", "violated_groups")})
            run.maybe_checkpoint(step, problem.game, {})
    final = per_group.measure(model)
    run.finish(final)
    print(
        f"{args.multipliers} multipliers, {args.dual}: objective {final['objective']:.6f}, largest violation "
        f"{final['violation']:.3f} (ε = {per_group.BOUND}), {final['violated_groups']} of {per_group.NUM_GROUPS} "
        f"groups above ε, accuracy {final['accuracy']:.3f}"
    )
    return 0


# ------------------------------------------------------------------ figures
FIGURE_LR = (0.5, 2.0)  # primal, multipliers
FIGURE_STEPS = 2000
METHODS = {"GDA (SimGD)": "simgd", "Extragradient": "extragradient", "Optimistic": "optimistic"}


def _trajectory(step, model, lam_of, steps: int) -> dict:
    """Objective, violation and λ₁ (the multiplier of gap ≥ −ε, the constraint active
    at the solution) at the start and after each step."""
    out: dict = {"objective": [], "violation": [], "lambda": []}
    for t in range(steps + 1):
        if t:
            step()
        m = measure(model)
        out["objective"].append(m["objective"])
        out["violation"].append(m["violation"])
        out["lambda"].append(float(lam_of()[1]))
    out["final"] = {**m, "multipliers": lam_of().tolist()}  # m: after the last step
    return out


def gameopt_trajectory(name: str, steps: int) -> dict:
    model, problem = build(make_algorithm(name, list(FIGURE_LR)))
    return _trajectory(problem.step, model, lambda: problem.multipliers[0], steps)


def cooper_trajectory(method: str, steps: int) -> dict:
    """The same problem with cooper-optim (Gallego-Posada et al. 2025): its
    SimultaneousOptimizer (SGD primal, SGD dual with maximize=True) or its
    ExtrapolationConstrainedOptimizer (ExtraSGD both)."""
    import cooper

    model = start_model()

    class Parity(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            multiplier = cooper.multipliers.DenseMultiplier(2, dtype=torch.float64)
            self.parity = cooper.Constraint(
                cooper.ConstraintType.INEQUALITY, cooper.formulations.Lagrangian, multiplier=multiplier
            )

        def compute_cmp_state(self) -> cooper.CMPState:
            f, g, _ = objective_and_constraints(model, BOUND)
            return cooper.CMPState(loss=f, observed_constraints={self.parity: cooper.ConstraintState(violation=g)})

    cmp = Parity()
    if method == "simgd":
        primal = torch.optim.SGD(model.parameters(), lr=FIGURE_LR[0])
        dual = torch.optim.SGD(cmp.dual_parameters(), lr=FIGURE_LR[1], maximize=True)
        optimizer = cooper.optim.SimultaneousOptimizer(cmp, primal, dual)
    else:
        primal = cooper.optim.ExtraSGD(model.parameters(), lr=FIGURE_LR[0])
        dual = cooper.optim.ExtraSGD(cmp.dual_parameters(), lr=FIGURE_LR[1], maximize=True)
        optimizer = cooper.optim.ExtrapolationConstrainedOptimizer(cmp, primal, dual)
    return _trajectory(optimizer.roll, model, lambda: cmp.parity.multiplier.weight.detach().clone(), steps)


def reference() -> dict[str, float]:
    """The KKT point by scipy's SLSQP (float64, tight tolerance)."""
    import numpy as np
    from scipy.optimize import minimize

    model = start_model()
    params = list(model.parameters())
    sizes = [p.numel() for p in params]

    def set_(w: np.ndarray) -> None:
        with torch.no_grad():
            for p, chunk in zip(params, torch.split(torch.from_numpy(w), sizes)):
                p.copy_(chunk.reshape(p.shape))

    def value_and_grad(w: np.ndarray, which: int, k: int = 0) -> tuple[float, np.ndarray]:
        set_(w)
        out = objective_and_constraints(model, BOUND)[which]
        out = out if which == 0 else -out[k]  # SLSQP's inequalities are fun(w) ≥ 0
        grads = torch.autograd.grad(out, params)
        return float(out.detach()), torch.cat([gr.reshape(-1) for gr in grads]).numpy()

    w0 = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    cons = [
        {"type": "ineq", "fun": _part(value_and_grad, 1, k, 0), "jac": _part(value_and_grad, 1, k, 1)} for k in range(2)
    ]
    res = minimize(
        lambda w: value_and_grad(w, 0)[0],
        w0,
        jac=lambda w: value_and_grad(w, 0)[1],
        method="SLSQP",
        constraints=cons,
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    set_(res.x)
    return {**measure(model), "multipliers": list(map(float, np.atleast_1d(res.multipliers))), "success": res.success}


def _part(fn, which: int, k: int, index: int):
    return lambda w: fn(w, which, k)[index]


def make_figures(quiet: bool = False) -> list[str]:
    """Regenerate figures/constrained_learning.{png,json}; returns their paths."""
    with one_thread():
        return _make_figures(quiet)


def _make_figures(quiet: bool) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    ref = reference()
    runs = {label: gameopt_trajectory(name, FIGURE_STEPS) for label, name in METHODS.items()}
    cooper_note = None
    try:
        runs["cooper GDA"] = cooper_trajectory("simgd", FIGURE_STEPS)
        runs["cooper extrapolation"] = cooper_trajectory("extragradient", FIGURE_STEPS)
    except ImportError:
        cooper_note = "cooper-optim is not installed: its curves are left out (pip install cooper-optim)"
    start = measure(start_model())

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    styles = {
        "GDA (SimGD)": ("tab:red", "-", None, 0.6),
        "Extragradient": ("tab:blue", "-", None, 1.6),
        "Optimistic": ("tab:green", "--", None, 1.6),
        "cooper GDA": ("black", "none", "x", 0),
        "cooper extrapolation": ("tab:purple", "none", "o", 0),
    }
    for label, tr in runs.items():
        color, ls, marker, lw = styles[label]
        steps = range(len(tr["objective"]))
        kw = {"color": color, "ls": ls, "lw": lw, "marker": marker, "markevery": 125, "mfc": "none", "label": label}
        gaps = [max(abs(f - ref["objective"]), 1e-16) for f in tr["objective"]]
        axes[0].semilogy(steps, gaps, **kw)
        axes[1].plot(steps, tr["violation"], **kw)
        axes[2].plot(steps, tr["lambda"], **kw)
    axes[0].set_ylabel("|f(w_t) − f*|  (f*: SLSQP)")
    axes[1].set_ylabel("violation max(0, |gap| − ε)")
    axes[2].axhline(ref["multipliers"][1], color="gray", ls=":", lw=1.5, label="λ₁* (SLSQP)")
    axes[2].set_ylabel("λ₁ (of gap ≥ −ε)")
    axes[2].set_ylim(0, 4)
    for ax in axes:
        ax.set_xlabel("step")
    axes[2].legend(fontsize=8)
    fig.suptitle(
        f"Logistic regression with rate parity |r_A − r_B| ≤ {BOUND} (breast cancer; lr = {FIGURE_LR[0]} primal, "
        f"{FIGURE_LR[1]} multipliers)",
        fontsize=10,
    )
    png = save_figure(fig, "constrained_learning.png", dpi=110, rect=(0, 0, 1, 0.95))

    payload = {
        "problem": {"bound": BOUND, "l2": L2, "group_feature": GROUP_FEATURE, "lr": list(FIGURE_LR)},
        "steps": FIGURE_STEPS,
        "start (unconstrained optimum)": start,
        "reference (SLSQP)": ref,
        "final": {label: tr["final"] for label, tr in runs.items()},
        "cooper": cooper_note or "cooper-optim " + metadata.version("cooper-optim"),
        "wall_s": time.perf_counter() - t0,
    }
    js = figures_dir() / "constrained_learning.json"
    js.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    if not quiet:
        print(f"SLSQP: objective {ref['objective']:.8f}, multipliers {ref['multipliers']}")
        for label, tr in runs.items():
            fin = tr["final"]
            print(
                f"{label:<22} objective {fin['objective']:.8f}  violation {fin['violation']:.1e}  "
                f"gap {fin['gap']:+.5f}  accuracy {fin['accuracy']:.3f}  λ {fin['multipliers']}"
            )
        if cooper_note:
            print(cooper_note)
    return [png, str(js)]


if __name__ == "__main__":
    sys.exit(main())
