"""A GAN on a 2-D mixture of Gaussians (a ring of 8, or a 5x5 grid of 25): modes
covered and share of high-quality samples per algorithm.

python -m experiments.mixture_gan --algorithm extraadam --lr 1e-3 --steps 2000
python -m experiments.mixture_gan --dataset grid --algorithm consensus --hp update=adam --hp gamma=0.1
python -m experiments.mixture_gan --figures      # regenerate figures/mixture_*.png and the results table
torchrun --nproc_per_node=2 -m experiments.mixture_gan --distributed   # data-parallel on CPU (gloo)

A mode is covered when it holds at least a quarter of its fair share of the
high-quality samples; a sample is high quality within 3σ of some mode. Both are
measured on a fixed evaluation noise every --log-every steps. ``--hp update=adam``
(with optional ``betas=0.5,0.9``, ``adam_eps=1e-8``) gives any algorithm that
takes an update rule (consensus, SGA, ...) Adam's per-coordinate scaling.
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Any

import torch

import gameopt
from experiments.common import (
    Run,
    UsageError,
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
from players.gan2d import Discriminator, Generator, gan_losses, grid_modes, mode_metrics, ring_modes, sample_mixture

# dataset name → (modes, standard deviation of each mode)
DATASETS = {"ring": (lambda: ring_modes(8, 2.0), 0.05), "grid": (lambda: grid_modes(5, 2.0), 0.05)}
LATENT, DEPTH, ACT, HIDDEN, BATCH = 16, 3, "tanh", 128, 128
EVAL_SAMPLES = 2500


ADAM_NAMES = {"adam", "extraadam", "optimisticadam", "altadam"}


def gan_algorithm(
    name: str, lr: float | list[float], hyper: dict[str, Any] | None = None, betas: tuple[float, float] = (0.5, 0.9)
) -> gameopt.Algorithm:
    """:func:`~experiments.common.make_algorithm`, plus ``update="adam"`` (with
    ``betas`` and ``adam_eps``) for the algorithms that take an update rule
    (consensus, SGA, ...), and ``betas`` as the default Adam betas of both."""
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
        if update.lower() != "adam":
            raise UsageError(f"update={update!r}: only update=adam is understood (or momentum=VALUE)")
        hyper.pop("betas", None)
        hyper["update"] = gameopt.Adam((float(given[0]), float(given[1])), float(hyper.pop("adam_eps", 1e-8)))
    elif name.lower().replace("_", "").removeprefix("lookahead-") in ADAM_NAMES:
        hyper["betas"] = (float(given[0]), float(given[1]))
    return make_algorithm(name, lr, hyper)


class Setup:
    """Networks, game, data and evaluation noise of one run."""

    def __init__(
        self,
        dataset: str,
        algorithm: gameopt.Algorithm,
        seed: int,
        hidden: int = HIDDEN,
        batch: int = BATCH,
        distributed: tuple[Any, int, int] = (None, 0, 1),
    ) -> None:
        group, self.rank, self.world = distributed
        make_modes, self.std = DATASETS[dataset]
        self.modes, self.batch = make_modes(), batch
        torch.manual_seed(seed)
        self.gen = Generator(latent=LATENT, hidden=hidden, depth=DEPTH, act=ACT)
        self.disc = Discriminator(hidden=hidden, depth=DEPTH, act=ACT)
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
        self.z_eval = torch.randn(EVAL_SAMPLES, LATENT, generator=torch.Generator().manual_seed(10_007 + seed))

    def step(self) -> tuple[float, float]:
        x = sample_mixture(self.modes, self.batch, self.std, self.data)
        z = torch.randn(self.batch, LATENT, generator=self.data)
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
            h.update(p.params.detach().numpy().tobytes())
        return h.hexdigest()


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="extraadam", lr=1e-3, steps=2000, out="runs/mixture_gan", distributed=True)
    p.add_argument("--dataset", choices=sorted(DATASETS), default="ring", help="ring of 8 or 5x5 grid (default ring)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"batch size (default {BATCH})")
    p.add_argument("--hidden", type=int, default=HIDDEN, help=f"hidden width of both networks (default {HIDDEN})")
    p.add_argument("--log-every", type=int, default=100, help="steps between evaluations (default 100)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: fastest for these nets)")
    p.add_argument("--figures", action="store_true", help="regenerate the comparison figures in figures/")
    args = p.parse_args(argv)
    if args.figures:
        make_figures(args.no_progress)
        return 0
    check_args(args)
    check_positive(args, "batch", "hidden", "log_every", "threads")
    algorithm = gan_algorithm(args.algorithm, lr_from_args(args), hyperparameters(args))
    torch.set_num_threads(args.threads)
    distributed = init_distributed(args)
    setup = Setup(args.dataset, algorithm, args.seed, args.hidden, args.batch, distributed)
    config = run_config(
        args,
        dataset=args.dataset,
        std=setup.std,
        batch=args.batch,
        hidden=args.hidden,
        depth=DEPTH,
        latent=LATENT,
        activation=ACT,
        log_every=args.log_every,
        world_size=distributed[2],
    )
    run = Run("mixture_gan", args, config)
    extra: dict[str, Any] = {"data": setup.data}
    start = run.resume(setup.game, extra)
    for step in run.steps(start):
        g_loss, d_loss = setup.step()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            run.log(step, {**setup.evaluate(), "g_loss": g_loss, "d_loss": d_loss})
        run.maybe_checkpoint(step, setup.game, extra)
    final = setup.evaluate()
    run.finish({**final, "skipped_steps": setup.game.skipped_steps, "params_sha256": setup.params_digest()})
    if setup.rank == 0:
        print(
            f"{args.algorithm} on {args.dataset}: {final['modes']} of {len(setup.modes)} modes, "
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
    setup = Setup(dataset, gan_algorithm(name, lr, hyper), seed)
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
    }
    paths += write_results("mixture_results", lines, payload, t0, sum(r["cpu_s"] for r in results), quiet)
    if not quiet:
        print("\n".join(f"written {p}" for p in paths))
    return paths


if __name__ == "__main__":
    sys.exit(main())
