"""A GAN on a 2-D mixture of Gaussians (a ring, or a square grid): modes covered
and share of high-quality samples per algorithm.

python -m experiments.mixture_gan --algorithm extraadam --lr 1e-3 --steps 2000
python -m experiments.mixture_gan --dataset grid --algorithm consensus --hp update=adam --hp gamma=0.1
python -m experiments.mixture_gan --preset mescheder2017                     # consensus, γ = 10, TF1 RMSProp
python -m experiments.mixture_gan --preset mescheder2017 --algorithm simgd   # its baseline
python -m experiments.mixture_gan --preset balduzzi2018 --snapshot-every 2000
python -m experiments.mixture_gan --figures      # regenerate figures/mixture_*.png and the results table
torchrun --nproc_per_node=2 -m experiments.mixture_gan --distributed   # data-parallel on CPU (gloo)

A mode is covered when it holds at least a quarter of its fair share of the
high-quality samples; a sample is high quality within 3σ of some mode. Both are
measured on a fixed evaluation noise every --log-every steps. ``--hp update=adam``
(with optional ``betas=0.5,0.9``, ``adam_eps=1e-8``) gives any algorithm that
takes an update rule (consensus, SGA, ...) Adam's per-coordinate scaling;
``--hp update=rmsprop_torch`` or ``update=rmsprop_tf1`` (with optional
``rmsprop_decay``, ``rmsprop_eps``) gives it RMSProp in torch.optim's or TF1's
convention (see gameopt.RMSProp).

Presets are the papers' setups, as in the authors' code (an explicit option
overrides a preset's value; with another --algorithm, the preset's method
hyperparameters (γ, λ, the sign normalizer) are dropped, its update rule kept):

* ``mescheder2017`` (Mescheder et al. 2017, "The Numerics of GANs", notebook
  mog-eigval-dist): ring of 8 at radius 1, σ 0.01, modes balanced in each batch,
  batch 512, latent 16, 4 hidden layers of 16 (ReLU, Xavier-uniform, zero bias),
  TF1 RMSProp (ρ 0.9, ε 1e-10) at lr 1e-4, consensus γ = 10, 50,000 steps;
* ``balduzzi2018`` (Balduzzi et al. 2018, "The Mechanics of n-Player Differentiable
  Games", notebook Symplectic_Gradient_Adjustment): 4x4 grid at ±0.5/±1.5, σ 0.02,
  balanced, batch 256, latent 64, 6 hidden layers of 384 (ReLU, truncated normal
  1/√fan_in, zero bias), TF1 RMSProp at lr 1e-4, SGA λ = 1 with the code's sign
  rule (normalized by the number of weight tensors), 10,001 steps.

``--snapshot-every N`` keeps 1000 generated samples (fixed noise) before training
and every N steps, in samples.json of the run folder (and in its checkpoints).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from typing import Any

import torch

import gameopt
from experiments.common import (
    Run,
    UsageError,
    atomic_write,
    building_game,
    check_args,
    check_positive,
    hyperparameters,
    init_distributed,
    lr_from_args,
    main_guard,
    make_algorithm,
    parser,
    run_config,
    run_pool,
    save_figure,
    write_results,
)
from gameopt_players.gan2d import (
    ACTIVATIONS,
    INITS,
    Discriminator,
    Generator,
    gan_losses,
    grid_modes,
    mode_metrics,
    ring_modes,
    sample_mixture,
)

LATENT, DEPTH, ACT, HIDDEN, BATCH = 16, 3, "tanh", 128, 128
EVAL_SAMPLES = 2500
SNAPSHOT_SAMPLES = 1000


@dataclasses.dataclass(frozen=True)
class Spec:
    """Data and networks of one run: a ring of ``ring_modes`` at ``radius`` or a
    ``grid_size`` × ``grid_size`` grid with ``spacing`` (centred at 0), each mode
    N(centre, std² I); both networks have ``depth`` hidden layers of ``hidden``."""

    dataset: str = "ring"
    ring_modes: int = 8
    radius: float = 2.0
    grid_size: int = 5
    spacing: float = 2.0
    std: float = 0.05
    balanced: bool = False
    batch: int = BATCH
    latent: int = LATENT
    depth: int = DEPTH
    hidden: int = HIDDEN
    activation: str = ACT
    init: str = "default"

    def modes(self) -> torch.Tensor:
        if self.dataset == "ring":
            return ring_modes(self.ring_modes, self.radius)
        return grid_modes(self.grid_size, self.spacing)


# dataset name → its modes and σ in the README's own setup
DATASETS = {"ring": (lambda: Spec("ring").modes(), Spec().std), "grid": (lambda: Spec("grid").modes(), Spec().std)}

# the papers' setups (see the module docstring); "method_hp" applies to "algorithm" only
PRESETS: dict[str, dict[str, Any]] = {
    "mescheder2017": {
        "algorithm": "consensus",
        "method_hp": {"gamma": 10.0},
        "hp": {"update": "rmsprop_tf1"},
        "lr": 1e-4,
        "steps": 50_000,
        "spec": Spec(
            dataset="ring",
            ring_modes=8,
            radius=1.0,
            std=0.01,
            balanced=True,
            batch=512,
            latent=16,
            depth=4,
            hidden=16,
            activation="relu",
            init="xavier",
        ),  # fmt: skip
    },
    "balduzzi2018": {
        "algorithm": "sga",
        "method_hp": {"lam": 1.0, "sign_normalizer": "tensors"},
        "hp": {"update": "rmsprop_tf1"},
        "lr": 1e-4,
        "steps": 10_001,
        "spec": Spec(
            dataset="grid",
            grid_size=4,
            spacing=1.0,
            std=0.02,
            balanced=True,
            batch=256,
            latent=64,
            depth=6,
            hidden=384,
            activation="relu",
            init="trunc_normal",
        ),  # fmt: skip
    },
}

ADAM_NAMES = {"adam", "extraadam", "optimisticadam", "altadam"}
RMSPROP_UPDATES = {"rmsprop_torch": "torch", "rmsprop_tf1": "tf1"}


def _update_rule(update: str, hyper: dict[str, Any], betas: Any) -> gameopt.UpdateRule:
    """``update=adam|rmsprop_torch|rmsprop_tf1`` and its options (popped from ``hyper``)."""
    name = update.lower()
    if name == "adam":
        hyper.pop("betas", None)
        return gameopt.Adam((float(betas[0]), float(betas[1])), float(hyper.pop("adam_eps", 1e-8)))
    if name in RMSPROP_UPDATES:
        decay, eps = hyper.pop("rmsprop_decay", None), hyper.pop("rmsprop_eps", None)
        try:
            return gameopt.RMSProp(decay, eps, convention=RMSPROP_UPDATES[name])
        except ValueError as err:
            raise UsageError(f"RMSProp: {err}") from None
    ambiguous = " is ambiguous (two conventions)" if name == "rmsprop" else ""
    raise UsageError(
        f"update={update!r}{ambiguous}: understood are update=adam, update=rmsprop_torch "
        "(torch.optim.RMSprop) and update=rmsprop_tf1 (TF1's RMSPropOptimizer), or momentum=VALUE"
    )


def gan_algorithm(
    name: str, lr: float | list[float], hyper: dict[str, Any] | None = None, betas: tuple[float, float] = (0.5, 0.9)
) -> gameopt.Algorithm:
    """:func:`~experiments.common.make_algorithm`, plus ``update="adam"`` (with
    ``betas`` and ``adam_eps``) or ``update="rmsprop_torch"|"rmsprop_tf1"`` (with
    ``rmsprop_decay`` and ``rmsprop_eps``) for the algorithms that take an update
    rule (consensus, SGA, ...), and ``betas`` as the default Adam betas of both."""
    hyper = dict(hyper or {})
    given = hyper.get("betas", betas)
    if not (
        isinstance(given, (list, tuple))
        and len(given) == 2
        and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in given)
    ):
        raise UsageError(f"betas must be two numbers in [0, 1), e.g. betas=0.5,0.9; got {given!r}")
    update = hyper.get("update")
    if isinstance(update, str):
        hyper["update"] = _update_rule(update, hyper, given)
    elif name.lower().replace("_", "").removeprefix("lookahead-") in ADAM_NAMES:
        hyper["betas"] = (float(given[0]), float(given[1]))
    return make_algorithm(name, lr, hyper)


class Setup:
    """Networks, game, data and evaluation noise of one run."""

    def __init__(
        self,
        spec: Spec,
        algorithm: gameopt.Algorithm,
        seed: int,
        distributed: tuple[Any, int, int] = (None, 0, 1),
    ) -> None:
        group, self.rank, self.world = distributed
        self.spec, self.std, self.batch = spec, spec.std, spec.batch
        self.modes = spec.modes()
        torch.manual_seed(seed)
        net = {"hidden": spec.hidden, "depth": spec.depth, "act": spec.activation, "init": spec.init}
        self.gen = Generator(latent=spec.latent, **net)
        self.disc = Discriminator(**net)
        gen, disc = self.gen, self.disc
        self.game = gameopt.Game(
            [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
            lambda x, z: gan_losses(gen, disc, x, z),
            algorithm=algorithm,
            on_nonfinite="skip",
            process_group=group,  # data-parallel: ξ and Jacobian products averaged across ranks
        )
        # every random draw of training comes from this generator (saved in checkpoints)
        self.data = torch.Generator().manual_seed(seed)
        self.z_eval = torch.randn(EVAL_SAMPLES, spec.latent, generator=torch.Generator().manual_seed(10_007 + seed))

    def real(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return sample_mixture(self.modes, n, self.std, generator, balanced=self.spec.balanced)

    def step(self) -> tuple[float, float]:
        x = self.real(self.batch, self.data)
        z = torch.randn(self.batch, self.spec.latent, generator=self.data)
        # every rank draws the same batch and keeps its rank-strided shard
        x, z = x[self.rank :: self.world], z[self.rank :: self.world]
        g_loss, d_loss = self.game.step(x, z)
        return float(g_loss), float(d_loss)

    def samples(self) -> torch.Tensor:
        with torch.no_grad():
            return self.gen(self.z_eval)

    def evaluate(self) -> dict[str, float]:
        covered, quality = mode_metrics(self.samples(), self.modes, self.std)
        return {"modes": covered, "high_quality": quality}

    def params_digest(self) -> str:
        h = hashlib.sha256()
        for p in self.game.players:
            h.update(p.flat_param.detach().numpy().tobytes())
        return h.hexdigest()


def _add_setup_options(p: argparse.ArgumentParser) -> None:
    """The options a preset sets (default None: the preset's value, else the built-in one)."""
    d = Spec()
    p.add_argument("--preset", choices=sorted(PRESETS), help="a paper's setup (see above); explicit options override")
    p.add_argument("--dataset", choices=["grid", "ring"], help="ring or square grid of Gaussians (default ring)")
    p.add_argument("--ring-modes", type=int, help=f"number of modes on the ring (default {d.ring_modes})")
    p.add_argument("--radius", type=float, help=f"radius of the ring (default {d.radius:g})")
    p.add_argument("--grid-size", type=int, help=f"modes per side of the grid (default {d.grid_size})")
    p.add_argument("--spacing", type=float, help=f"distance between neighbouring grid modes (default {d.spacing:g})")
    p.add_argument("--std", type=float, help=f"σ of each mode (default {d.std:g})")
    p.add_argument(
        "--balanced",
        action=argparse.BooleanOptionalAction,
        help="every batch holds each mode equally often (default: modes drawn at random)",
    )
    p.add_argument("--batch", type=int, help=f"batch size (default {d.batch})")
    p.add_argument("--latent", type=int, help=f"latent dimension (default {d.latent})")
    p.add_argument("--depth", type=int, help=f"hidden layers of both networks (default {d.depth})")
    p.add_argument("--hidden", type=int, help=f"hidden width of both networks (default {d.hidden})")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), help=f"hidden activation (default {d.activation})")
    p.add_argument(
        "--init",
        choices=list(INITS),
        help="weight init: PyTorch's default, xavier (uniform, zero bias) or trunc_normal "
        "(std 1/sqrt(fan_in) before truncation at 2 std, zero bias) (default: default)",
    )


def _explicit(p: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The destinations given on the command line (not left at their defaults)."""
    saved = [(a, a.default) for a in p._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        return set(vars(p.parse_args(argv))) - set(p._defaults)
    finally:
        for action, default in saved:
            action.default = default


def apply_preset(args: argparse.Namespace, given: set[str]) -> Spec:
    """Fill ``args`` with the preset's values where an option was not given (the
    algorithm, lr, steps and --hp too, so the run's config shows the effective
    values) and return the data and network :class:`Spec`."""
    preset = PRESETS[args.preset] if args.preset else {}
    spec = preset.get("spec", Spec())
    if preset:
        if "algorithm" not in given:
            args.algorithm = preset["algorithm"]
        if "lr" not in given:
            args.lr = [preset["lr"]]
        if "steps" not in given:
            args.steps = preset["steps"]
        hp = dict(preset["hp"])
        if args.algorithm.lower() == preset["algorithm"]:
            hp.update(preset["method_hp"])
        user = {item.split("=", 1)[0].strip() for item in args.hp if "=" in item}
        args.hp = [f"{k}={v}" for k, v in hp.items() if k not in user] + list(args.hp)
    fields = {f.name for f in dataclasses.fields(Spec)}
    return dataclasses.replace(spec, **{k: getattr(args, k) for k in fields if getattr(args, k) is not None})


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="extraadam", lr=1e-3, steps=2000, out="runs/mixture_gan", distributed=True)
    _add_setup_options(p)
    p.add_argument("--log-every", type=int, default=100, help="steps between evaluations (default 100)")
    p.add_argument("--snapshot-every", type=int, default=0, help="steps between kept samples (default 0: none)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: fastest for these nets)")
    p.add_argument("--figures", action="store_true", help="regenerate the comparison figures in figures/")
    args = p.parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    spec = apply_preset(args, _explicit(p, argv))
    check_args(args)
    for name in ("batch", "latent", "depth", "hidden", "ring_modes", "grid_size", "std", "radius", "spacing"):
        value = getattr(spec, name)
        if not (value > 0 and value < float("inf")):
            raise UsageError(f"--{name.replace('_', '-')} must be positive and finite, got {value}")
    check_positive(args, "log_every", "threads")
    if args.snapshot_every < 0:
        raise UsageError(f"--snapshot-every must be non-negative, got {args.snapshot_every}")
    algorithm = gan_algorithm(args.algorithm, lr_from_args(args), hyperparameters(args))
    torch.set_num_threads(args.threads)
    distributed = init_distributed(args)
    with building_game():  # bad per-player hyperparameters: a usage error
        setup = Setup(spec, algorithm, args.seed, distributed)
    config = run_config(
        args,
        preset=args.preset,
        **dataclasses.asdict(spec),
        log_every=args.log_every,
        snapshot_every=args.snapshot_every,
        world_size=distributed[2],
    )
    run = Run("mixture_gan", args, config)
    extra: dict[str, Any] = {"data": setup.data, "snapshots": {}}
    start = run.resume(setup.game, extra)

    def snapshot(done: int) -> None:
        if not args.snapshot_every or done % args.snapshot_every:
            return
        extra["snapshots"][done] = setup.samples()[:SNAPSHOT_SAMPLES].clone()
        if setup.rank == 0:
            kept = {k: v.tolist() for k, v in extra["snapshots"].items()}
            text = json.dumps({"modes": setup.modes.tolist(), "std": spec.std, "snapshots": kept})
            atomic_write(args.out / "samples.json", text.encode())

    if start == 0:
        snapshot(0)
    for step in run.steps(start):
        g_loss, d_loss = setup.step()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            run.log(step, {**setup.evaluate(), "g_loss": g_loss, "d_loss": d_loss})
        snapshot(step + 1)
        run.maybe_checkpoint(step, setup.game, extra)
    final = setup.evaluate()
    run.finish({**final, "skipped_steps": setup.game.skipped_steps, "params_sha256": setup.params_digest()})
    if setup.rank == 0:
        print(
            f"{args.algorithm} on {spec.dataset}: {final['modes']} of {len(setup.modes)} modes, "
            f"{final['high_quality']:.1f}% high-quality samples after {args.steps} steps"
        )
    return 0


# ----------------------------------------------------------------------------- figures
# label → (algorithm, lr, hyperparameters)
COMPARED: dict[str, tuple[str, float, dict[str, Any]]] = {
    "SimGD (SGD)": ("simgd", 0.05, {}),
    "Consensus (SGD, γ=0.1)": ("consensus", 0.05, {"gamma": 0.1}),
    "Adam": ("adam", 1e-3, {}),
    "Extra-Adam": ("extraadam", 1e-3, {}),
    "Optimistic Adam": ("optimisticadam", 1e-3, {}),
    "Lookahead-Adam (k=5, α=0.5)": ("lookahead-adam", 1e-3, {"k": 5, "alpha_la": 0.5}),
    "Consensus (Adam, γ=0.1)": ("consensus", 1e-3, {"update": "adam", "gamma": 0.1}),
    "SGA (Adam, λ=1)": ("sga", 1e-3, {"update": "adam", "lam": 1.0}),
}
FIG_STEPS = {"ring": 2000, "grid": 3500}
FIG_SEEDS = {"ring": (0, 1, 2), "grid": (0, 1)}
SNAPSHOTS = 4  # scatter plots over training, seed 0
FIG_LOG_EVERY = 100


def _figure_run(task: tuple[str, str, int]) -> dict[str, Any]:
    label, dataset, seed = task
    torch.set_num_threads(1)
    name, lr, hyper = COMPARED[label]
    steps = FIG_STEPS[dataset]
    setup = Setup(Spec(dataset), gan_algorithm(name, lr, hyper), seed)
    snap_at = {steps * (k + 1) // SNAPSHOTS for k in range(SNAPSHOTS)} if seed == 0 else set()
    history: dict[str, list[float]] = {"step": [], "modes": [], "high_quality": []}
    snapshots: dict[int, list[list[float]]] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(1, steps + 1):
        setup.step()
        if step % FIG_LOG_EVERY == 0:
            m = setup.evaluate()
            history["step"].append(step)
            history["modes"].append(m["modes"])
            history["high_quality"].append(m["high_quality"])
        if step in snap_at:
            snapshots[step] = setup.samples()[:1000].tolist()
    return {
        "label": label,
        "dataset": dataset,
        "seed": seed,
        "history": history,
        "snapshots": snapshots,
        "final": setup.evaluate(),
        "skipped_steps": setup.game.skipped_steps,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def run_comparison(
    labels: list[str] | None = None, datasets: tuple[str, ...] = ("ring", "grid"), quiet: bool = False, workers: int = 2
) -> list[dict[str, Any]]:
    """Every (algorithm, dataset, seed) of the figures, in ``workers`` processes."""
    labels = list(COMPARED) if labels is None else labels
    tasks = [(label, ds, seed) for ds in datasets for label in labels for seed in FIG_SEEDS[ds]]
    cost = {"extraadam": 2, "consensus": 3, "sga": 9}  # per step, relative to Adam
    tasks.sort(key=lambda t: -cost.get(COMPARED[t[0]][0], 1) * FIG_STEPS[t[1]])  # longest first
    from experiments import mixture_gan  # picklable by module name, also when run as __main__

    def describe(res: dict[str, Any]) -> str:
        f = res["final"]
        return (
            f"  {res['label']:<26} {res['dataset']:<5} seed {res['seed']}: {f['modes']:>2} modes, "
            f"{f['high_quality']:5.1f}% high quality ({res['wall_s']:.0f}s)"
        )

    results = run_pool(mixture_gan._figure_run, tasks, None if quiet else describe, workers)
    order = {
        t: i for i, t in enumerate((label, ds, seed) for ds in datasets for label in labels for seed in FIG_SEEDS[ds])
    }
    results.sort(key=lambda r: order[(r["label"], r["dataset"], r["seed"])])
    return results


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """label → dataset → mean/std of the final modes and high-quality share over seeds."""
    import statistics

    table: dict[str, dict[str, dict[str, Any]]] = {}
    for res in results:
        table.setdefault(res["label"], {}).setdefault(res["dataset"], {"runs": []})["runs"].append(res)
    for per_ds in table.values():
        for cell in per_ds.values():
            runs = cell.pop("runs")
            for key in ("modes", "high_quality"):
                values = [float(r["final"][key]) for r in runs]
                cell[key] = values
                cell[f"{key}_mean"] = statistics.fmean(values)
                cell[f"{key}_std"] = statistics.pstdev(values)
            cell["seeds"] = [r["seed"] for r in runs]
            cell["cpu_s_per_run"] = statistics.fmean(r["cpu_s"] for r in runs)
    return table


def make_figures(quiet: bool = False) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    t0 = time.perf_counter()
    datasets = tuple(FIG_STEPS)
    results = run_comparison(quiet=quiet)
    table = summarize(results)
    labels = list(COMPARED)
    paths = []

    # samples over training, seed 0
    for ds in datasets:
        modes = DATASETS[ds][0]()
        runs = {r["label"]: r for r in results if r["dataset"] == ds and r["seed"] == 0}
        steps = sorted(next(iter(runs.values()))["snapshots"], key=int)
        fig, axes = plt.subplots(
            len(labels), len(steps), figsize=(2.1 * len(steps) + 1.2, 2.0 * len(labels)), squeeze=False
        )
        lim = float(modes.abs().max()) + 1.0
        for i, label in enumerate(labels):
            for j, step in enumerate(steps):
                ax = axes[i][j]
                pts = np.asarray(runs[label]["snapshots"][step])
                ax.scatter(pts[:, 0], pts[:, 1], s=1.5, alpha=0.35, c="tab:blue", label="generated", rasterized=True)
                ax.scatter(modes[:, 0], modes[:, 1], s=14, c="red", marker="x", lw=0.8, label="mode centres")
                ax.set_xlim(-lim, lim)
                ax.set_ylim(-lim, lim)
                ax.set_aspect("equal")
                ax.tick_params(labelsize=6)
                if i == 0:
                    ax.set_title(f"step {step}", fontsize=9)
                if j == 0:
                    ax.set_ylabel(f"{label}\nx₂", fontsize=8)
                if i == len(labels) - 1:
                    ax.set_xlabel("x₁", fontsize=8)
        handles, names = axes[0][0].get_legend_handles_labels()
        legend = fig.legend(handles, names, loc="upper right", fontsize=8)
        for handle in legend.legend_handles:
            handle.set_sizes([20])
            handle.set_alpha(1)
        n_modes = len(modes)
        fig.suptitle(
            f"GAN on a {'ring of 8' if ds == 'ring' else '5×5 grid of 25'} Gaussians: samples over training "
            f"(seed 0, {n_modes} modes, σ={DATASETS[ds][1]})",
            fontsize=10,
        )
        paths.append(save_figure(fig, f"mixture_{ds}_samples.png", rect=(0, 0, 1, 0.97)))

    # modes covered and high-quality share over training (mean ± std over seeds)
    fig, axes = plt.subplots(2, len(datasets), figsize=(5.2 * len(datasets), 7), squeeze=False)
    styles = ["-", "--", "-.", ":"]
    for j, ds in enumerate(datasets):
        for k, label in enumerate(labels):
            runs = [r for r in results if r["dataset"] == ds and r["label"] == label]
            x = np.asarray(runs[0]["history"]["step"])
            for i, key in enumerate(("modes", "high_quality")):
                y = np.asarray([r["history"][key] for r in runs], dtype=float)
                mean, std = y.mean(0), y.std(0)
                axes[i][j].plot(x, mean, styles[k % 4], label=label, lw=1.5)
                axes[i][j].fill_between(x, mean - std, mean + std, alpha=0.12)
        n_modes = len(DATASETS[ds][0]())
        axes[0][j].set_title(f"{ds}: modes covered (of {n_modes}), mean ± std over {len(FIG_SEEDS[ds])} seeds")
        axes[0][j].set_ylabel("modes covered")
        axes[0][j].set_ylim(-0.5, n_modes + 0.5)
        axes[1][j].set_title(f"{ds}: high-quality samples (within 3σ of a mode)")
        axes[1][j].set_ylabel("high-quality samples (%)")
        axes[1][j].set_ylim(0, 100)
        for i in range(2):
            axes[i][j].set_xlabel("step")
            axes[i][j].grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    paths.append(save_figure(fig, "mixture_curves.png"))

    # results table
    lines = [
        "# Mixture-of-Gaussians GAN: final modes covered and high-quality samples",
        "",
        "Mean ± std over seeds ("
        + "; ".join(f"{ds}: seeds {list(FIG_SEEDS[ds])}, {FIG_STEPS[ds]} steps" for ds in datasets)
        + f"), measured on {EVAL_SAMPLES} samples from a fixed noise. "
        f"Generator and discriminator: {DEPTH}-hidden-layer {ACT} MLPs of width {HIDDEN}, latent {LATENT}, "
        f"batch {BATCH}. "
        "Regenerate with `python -m experiments.mixture_gan --figures`.",
        "",
        "| algorithm | lr | "
        + " | ".join(f"{ds}: modes (of {len(DATASETS[ds][0]())}) | {ds}: high quality %" for ds in datasets)
        + " | CPU s / run ("
        + " / ".join(datasets)
        + ") |",
        "| --- | --- | " + " | ".join("--- | ---" for _ in datasets) + " | --- |",
    ]
    for label in labels:
        cells = []
        for ds in datasets:
            c = table[label][ds]
            cells += [
                f"{c['modes_mean']:.1f} ± {c['modes_std']:.1f}",
                f"{c['high_quality_mean']:.1f} ± {c['high_quality_std']:.1f}",
            ]
        cpu = " / ".join(f"{table[label][ds]['cpu_s_per_run']:.0f}" for ds in datasets)
        lines.append(f"| {label} | {COMPARED[label][1]:g} | " + " | ".join(cells) + f" | {cpu} |")
    payload = {
        "steps": FIG_STEPS,
        "seeds": {k: list(v) for k, v in FIG_SEEDS.items()},
        "algorithms": {label: {"algorithm": a, "lr": lr, "hp": hp} for label, (a, lr, hp) in COMPARED.items()},
        "results": table,
        # modes and high-quality % every FIG_LOG_EVERY steps: label → dataset → one history per seed
        # (tests/e2e/test_figures_current.py reruns the first steps)
        "log_every": FIG_LOG_EVERY,
        "histories": {
            label: {
                ds: [
                    r["history"]
                    for r in sorted(results, key=lambda r: r["seed"])
                    if r["label"] == label and r["dataset"] == ds
                ]
                for ds in datasets
            }
            for label in labels
        },
    }
    paths += write_results("mixture_results", lines, payload, t0, sum(r["cpu_s"] for r in results), quiet)
    if not quiet:
        print("\n".join(f"written {p}" for p in paths))
    return paths


if __name__ == "__main__":
    sys.exit(main())
