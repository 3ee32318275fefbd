"""Many rate constraints, one per group, observed a minibatch at a time: the
``--constraints per-group`` problem of :mod:`experiments.constrained_learning`.

Data: scikit-learn's handwritten digits (1797 images of 8×8 pixels, standardized),
the task "is the digit 5 or more?", by logistic regression. The 40 groups are the
digit (10) crossed with the quartile of the image's total ink (4). Each group's error
rate must stay at or below ε:

    min_w  CE(w) + (l2/2)‖w‖²    s.t.   err_G(w) ≤ ε   for each of the 40 groups G

The error rate of hard predictions is not differentiable: each constraint is a
``gameopt.Proxy`` whose surrogate is the group's mean probability of the wrong label
and whose strict value is its error rate (the multipliers ascend on the latter).

Three ways to hold the multipliers:
- dense: one multiplier per group, every group observed at every step (full batch);
- sampled: one multiplier per group, a step observes ``GROUPS_PER_STEP`` groups drawn
  at random and the minibatch of their examples (``gameopt.Sampled(values, indices)``);
- model: the same draws, the multipliers predicted from each group's features (its
  digit and its ink quartile, one-hot) by a linear map and a softplus
  (``LagrangianGame(multipliers=module)``, ``gameopt.Sampled(values, features)``).

Each with the multipliers' update plain gradient ascent or nuPI; the model's update
is plain gradient descent.
"""

from __future__ import annotations

import functools
import warnings
from importlib import metadata

import torch
from torch import nn

L2 = 1e-3
BOUND = 0.12  # ε, the largest error rate allowed in a group
INK_BINS = 4
NUM_GROUPS = 10 * INK_BINS
GROUPS_PER_STEP = 10
HOLDERS = ("dense", "sampled", "model")
DUALS = ("sgd", "nupi")


@functools.lru_cache(maxsize=1)
def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X standardized, y ∈ {0, 1}: digit ≥ 5, the group of each example), float64."""
    from sklearn.datasets import load_digits

    data = load_digits()
    pixels = torch.tensor(data.data, dtype=torch.float64)
    x = (pixels - pixels.mean(0)) / pixels.std(0, correction=0).clamp_min(1e-6)
    digit = torch.tensor(data.target)
    ink = pixels.sum(1)
    quartile = torch.bucketize(ink, torch.quantile(ink, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)))
    return x, (digit >= 5).double(), digit * INK_BINS + quartile


def group_features() -> torch.Tensor:
    """Each group's features for the multiplier model: its digit and its ink quartile,
    one-hot, shape (40, 14)."""
    g = torch.arange(NUM_GROUPS)
    return torch.cat(
        [nn.functional.one_hot(g // INK_BINS, 10), nn.functional.one_hot(g % INK_BINS, INK_BINS)], dim=1
    ).double()


def draws(steps: int, seed: int = 0) -> list[torch.Tensor]:
    """The groups each step observes (sorted), the same for every run of a seed."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randperm(NUM_GROUPS, generator=gen)[:GROUPS_PER_STEP].sort().values for _ in range(steps)]


def evaluate(model: nn.Module, groups: torch.Tensor | None = None):
    """(f, soft, hard): the objective on the examples of ``groups`` (None: all), and
    for each of those groups its soft and its hard error rate minus ε."""
    x, y, group = load_data()
    groups = torch.arange(NUM_GROUPS) if groups is None else groups
    member = group.unsqueeze(0) == groups.unsqueeze(1)  # (k, n)
    keep = member.any(0)
    logits = model(x[keep]).squeeze(-1)
    y, member = y[keep], member[:, keep].double()
    f = nn.functional.binary_cross_entropy_with_logits(logits, y)
    f = f + L2 / 2 * sum(p.square().sum() for p in model.parameters())
    wrong_prob = torch.sigmoid(torch.where(y > 0, -logits, logits))
    wrong = ((logits > 0).double() != y).double()
    size = member.sum(1)
    return f, member @ wrong_prob / size - BOUND, (member @ wrong.detach()) / size - BOUND


@torch.no_grad()
def measure(model: nn.Module) -> dict[str, float]:
    """The objective on all the data; the largest and the mean violation (error rate
    above ε) over the groups; how many groups violate; the accuracy."""
    f, _, hard = evaluate(model)
    x, y, _ = load_data()
    accuracy = ((model(x).squeeze(-1) > 0).double() == y).double().mean()
    violation = hard.clamp_min(0)
    return {
        "objective": float(f),
        "violation": float(violation.max()),
        "mean_violation": float(violation.mean()),
        "violated_groups": int((violation > 0).sum()),
        "accuracy": float(accuracy),
    }


def start_model() -> nn.Linear:
    """Logistic regression from zeros."""
    model = nn.Linear(load_data()[0].shape[1], 1).double()
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


class GroupMultipliers(nn.Module):
    """The multiplier model: group features → softplus(linear) ≥ 0."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(10 + INK_BINS, 1).double()
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(self.linear(features)).squeeze(-1)


def dual_rule(dual: str, nupi: tuple[float, float]):
    """The multipliers' update rule: plain gradient ascent or nuPI(K_P, K_I)."""
    import gameopt

    return gameopt.NuPI(kp=nupi[0], ki=nupi[1]) if dual == "nupi" else gameopt.Plain()


def build(holder: str, algorithm, steps: int, seed: int = 0):
    """(model, the LagrangianGame, the step counter) of a run of ``steps`` steps with
    ``algorithm`` (players: model, multipliers); the model starts from zeros, and the
    step counter picks each step's groups (set ``counter[0]`` to the step)."""
    import gameopt

    if holder not in HOLDERS:
        raise ValueError(f"holder must be one of {HOLDERS}, got {holder!r}")
    model = start_model()
    drawn, counter, features = draws(steps, seed), [0], group_features()

    def objective_and_constraints():
        if holder == "dense":
            f, soft, hard = evaluate(model)
            return f, gameopt.Proxy(soft, hard), None
        groups = drawn[counter[0]]
        f, soft, hard = evaluate(model, groups)
        observed = groups if holder == "sampled" else features[groups]
        return f, gameopt.Sampled(gameopt.Proxy(soft, hard), observed), None

    problem = gameopt.LagrangianGame(
        model,
        objective_and_constraints,
        num_ineq=NUM_GROUPS,
        algorithm=algorithm,
        multipliers=GroupMultipliers() if holder == "model" else None,
    )
    return model, problem, counter


def cooper_build(holder: str, dual: str, lr: tuple[float, float], nupi: tuple[float, float], steps: int, seed: int = 0):
    """The same run with cooper-optim (Gallego-Posada et al. 2025): DenseMultiplier,
    IndexedMultiplier or an ImplicitMultiplier holding :class:`GroupMultipliers`; SGD on
    the model, SGD (maximize) or cooper's nuPI on the multipliers, simultaneously.
    Returns (model, roll, counter)."""
    import cooper

    model = start_model()
    drawn, counter, features = draws(steps, seed), [0], group_features()

    class Implicit(cooper.multipliers.ImplicitMultiplier):
        expects_constraint_features = True

        def __init__(self) -> None:
            super().__init__()
            self.model = GroupMultipliers()

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.model(features)

        def post_step_(self) -> None:
            pass

    if holder == "dense":
        multiplier = cooper.multipliers.DenseMultiplier(NUM_GROUPS, dtype=torch.float64)
    elif holder == "sampled":
        multiplier = cooper.multipliers.IndexedMultiplier(NUM_GROUPS, dtype=torch.float64)
    else:
        multiplier = Implicit()

    class PerGroup(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.rates = cooper.Constraint(
                cooper.ConstraintType.INEQUALITY, cooper.formulations.Lagrangian, multiplier=multiplier
            )

        def compute_cmp_state(self) -> cooper.CMPState:
            if holder == "dense":
                f, soft, hard = evaluate(model)
                state = cooper.ConstraintState(violation=soft, strict_violation=hard)
            else:
                groups = drawn[counter[0]]
                f, soft, hard = evaluate(model, groups)
                observed = groups if holder == "sampled" else features[groups]
                state = cooper.ConstraintState(
                    violation=soft,
                    strict_violation=hard,
                    constraint_features=observed,
                    strict_constraint_features=observed,
                )
            return cooper.CMPState(loss=f, observed_constraints={self.rates: state})

    cmp = PerGroup()
    primal = torch.optim.SGD(model.parameters(), lr=lr[0])
    if dual == "nupi":
        dual_opt = cooper.optim.nuPI(cmp.dual_parameters(), lr=lr[1], Kp=nupi[0], Ki=nupi[1], maximize=True)
    else:
        dual_opt = torch.optim.SGD(cmp.dual_parameters(), lr=lr[1], maximize=True)
    optimizer = cooper.optim.SimultaneousOptimizer(cmp, primal, dual_opt)
    return model, optimizer.roll, counter


# ------------------------------------------------------------------ figures
FIGURE_LR = (0.2, 1.0)  # model, multipliers
FIGURE_NUPI = (5.0, 1.0)  # K_P, K_I
FIGURE_STEPS = 1000
TRACKED = ("objective", "violation", "mean_violation")


def trajectory(step, model, counter, steps: int) -> dict:
    """The metrics of :func:`measure` at the start and after each step."""
    out: dict = {k: [] for k in TRACKED}
    for t in range(steps + 1):
        if t:
            counter[0] = t - 1
            step()
        m = measure(model)
        for k in TRACKED:
            out[k].append(m[k])
    out["final"] = m  # after the last step
    return out


def make_figures(quiet: bool = False, steps: int | None = None) -> list[str]:
    """Regenerate figures/constrained_per_group.{png,json}; returns their paths."""
    import json
    import time

    import matplotlib

    import gameopt
    from experiments.common import figures_dir, make_algorithm, one_thread, save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = steps or FIGURE_STEPS
    t0 = time.perf_counter()
    runs, theirs, cooper_note = {}, {}, None
    with one_thread():
        for holder in HOLDERS:
            for dual in DUALS:
                update = [gameopt.Plain(), dual_rule(dual, FIGURE_NUPI)]
                model, problem, counter = build(
                    holder, make_algorithm("simgd", list(FIGURE_LR), {"update": update}), steps
                )
                runs[f"{holder}, {dual}"] = trajectory(problem.step, model, counter, steps)
                try:
                    model, roll, counter = cooper_build(holder, dual, FIGURE_LR, FIGURE_NUPI, steps)
                except ImportError:
                    cooper_note = "cooper-optim is not installed: its numbers are left out (pip install cooper-optim)"
                    continue
                with warnings.catch_warnings():  # torch's note on cooper's sparse nuPI update
                    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
                    theirs[f"{holder}, {dual}"] = trajectory(roll, model, counter, steps)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    colors = {"dense": "tab:blue", "sampled": "tab:orange", "model": "tab:green"}
    for label, tr in runs.items():
        holder, dual = label.split(", ")
        kw = {"color": colors[holder], "ls": "-" if dual == "sgd" else "--", "lw": 1.2, "label": f"gameopt {label}"}
        for ax, key in zip(axes, TRACKED):
            ax.plot(range(steps + 1), _smooth(tr[key]), **kw)
    for label, tr in theirs.items():
        holder, _ = label.split(", ")
        for ax, key in zip(axes, TRACKED):
            ax.plot(range(0, steps + 1, 50), _smooth(tr[key])[::50], "x", color=colors[holder], ms=4)
    axes[0].plot([], [], "kx", label="cooper (same run)")
    axes[0].set_ylabel("objective (all data)")
    axes[1].set_ylabel(f"largest violation: max_G err_G − ε (ε = {BOUND})")
    axes[2].set_ylabel("mean violation over the 40 groups")
    for ax in axes:
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"Digits, 40 group error-rate constraints; sampled/model observe {GROUPS_PER_STEP} groups a step "
        f"(lr {FIGURE_LR[0]} model, {FIGURE_LR[1]} multipliers; nuPI K_P = {FIGURE_NUPI[0]}; "
        "curves: moving average of 25 steps)",
        fontsize=9,
    )
    png = save_figure(fig, "constrained_per_group.png", dpi=110, rect=(0, 0, 1, 0.94))
    differences = {
        label: max(abs(a - b) for a, b in zip(runs[label]["objective"], theirs[label]["objective"])) for label in theirs
    }
    agree = {label: _agreeing(runs[label]["objective"], theirs[label]["objective"]) for label in theirs}
    payload = {
        "problem": {"bound": BOUND, "l2": L2, "groups": NUM_GROUPS, "groups_per_step": GROUPS_PER_STEP},
        "lr": list(FIGURE_LR),
        "nupi": {"kp": FIGURE_NUPI[0], "ki": FIGURE_NUPI[1]},
        "steps": steps,
        "start": measure(start_model()),
        "final": {label: tr["final"] for label, tr in runs.items()},
        "last 100 steps, mean": {label: _tail(tr) for label, tr in runs.items()},
        "cooper final": {label: tr["final"] for label, tr in theirs.items()},
        "cooper last 100 steps, mean": {label: _tail(tr) for label, tr in theirs.items()},
        "max |objective gameopt − cooper| over the run": differences,
        "steps with |objective gameopt − cooper| <= 1e-9 from the start": agree,
        "cooper": cooper_note or "cooper-optim " + metadata.version("cooper-optim"),
        "wall_s": time.perf_counter() - t0,
    }
    js = figures_dir() / "constrained_per_group.json"
    js.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    if not quiet:
        for label in runs:
            ours = payload["last 100 steps, mean"][label]
            line = f"{label:<14} objective {ours['objective']:.4f}  violation {ours['violation']:.3f}"
            line += f"  mean {ours['mean_violation']:.4f}"
            if label in theirs:
                cooper_tail = payload["cooper last 100 steps, mean"][label]
                line += (
                    f"  | cooper: objective {cooper_tail['objective']:.4f}, violation {cooper_tail['violation']:.3f}"
                )
                line += f", equal to 1e-9 for {agree[label]} steps"
            print(line)
        if cooper_note:
            print(cooper_note)
    return [png, str(js)]


def _agreeing(a: list[float], b: list[float], tol: float = 1e-9) -> int:
    """How many steps two runs agree from the start (a hard prediction near its
    threshold flips on the last bit's rounding, and the runs part)."""
    for k, (x, y) in enumerate(zip(a, b)):
        if abs(x - y) > tol:
            return k - 1
    return len(a) - 1


def _smooth(values: list[float], width: int = 25) -> list[float]:
    out, total = [], 0.0
    for k, v in enumerate(values):
        total += v - (values[k - width] if k >= width else 0.0)
        out.append(total / min(k + 1, width))
    return out


def _tail(tr: dict, last: int = 100) -> dict[str, float]:
    return {k: sum(tr[k][-last:]) / len(tr[k][-last:]) for k in TRACKED}
