"""A small convolutional GAN on scikit-learn's bundled 8x8 digits (no download):
digit classes covered and a Fréchet distance per algorithm.

python -m experiments.digits_gan --algorithm extraadam --lr 2e-4 --steps 1500
python -m experiments.digits_gan --algorithm sga --hp update=adam --hp betas=0.5,0.999
python -m experiments.digits_gan --figures      # regenerate figures/digits_*.png and the metrics table

Generated images are scored by a small conv classifier trained here, deterministically,
on the real digits (1500 random ones for training, the other 297 held out to
report its accuracy): the classes covered (a class counts when it gets at least a quarter
of its fair share of the predictions), the entropy of the predicted classes, the
classifier's mean confidence, and the Fréchet distance between the classifier's
penultimate features of the real digits and of generated ones (FD; a held-out
real-vs-real FD is the floor). Needs scikit-learn (the ``experiments`` extra).
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
    building_game,
    check_args,
    check_positive,
    hyperparameters,
    lr_from_args,
    main_guard,
    parser,
    run_config,
    run_pool,
    save_figure,
    write_results,
)
from experiments.mixture_gan import gan_algorithm
from gameopt_players.gan_conv import (
    ConvDiscriminator,
    ConvGenerator,
    class_metrics,
    frechet_distance,
    gan_losses,
    train_classifier,
)

LATENT = 32
BETAS = (0.5, 0.999)  # default Adam betas here (DCGAN's); (0.5, 0.9) trains worse on these digits
EVAL_SAMPLES = 1000
CLASSIFIER_TRAIN = 1500  # 1500 random digits train the classifier, the other 297 measure it


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 digits as (n, 1, 8, 8) float32 in [-1, 1], and their labels."""
    try:
        from sklearn.datasets import load_digits as sk_load
    except ImportError:
        raise UsageError(
            "scikit-learn is missing: install the experiments extra (pip install -e '.[experiments]')"
        ) from None
    data = sk_load()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    return images, torch.tensor(data.target, dtype=torch.long)


class Scorer:
    """The classifier and the real digits' features, computed once."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
        train, test = perm[:CLASSIFIER_TRAIN], perm[CLASSIFIER_TRAIN:]
        self.net = train_classifier(images[train], labels[train], seed=0)
        with torch.no_grad():
            self.accuracy = float((self.net(images[test]).argmax(1) == labels[test]).float().mean())
            self.real_features = self.net.features(images)
        half = len(images) // 2
        # real-vs-real floor: two disjoint halves of the data
        self.fd_floor = frechet_distance(self.real_features[perm[:half]], self.real_features[perm[half:]])

    def __call__(self, fake: torch.Tensor) -> dict[str, float]:
        with torch.no_grad():
            feats = self.net.features(fake)
            probs = self.net.head(feats).softmax(1)
        covered, entropy, confidence = class_metrics(probs)
        return {
            "classes": covered,
            "class_entropy": entropy,
            "confidence": confidence,
            "fd": frechet_distance(self.real_features, feats),
        }


class Setup:
    def __init__(
        self,
        algorithm: gameopt.Algorithm,
        seed: int,
        images: torch.Tensor,
        width: int = 32,
        batch: int = 64,
    ) -> None:
        self.images, self.batch = images, batch
        torch.manual_seed(seed)
        self.gen, self.disc = ConvGenerator(LATENT, width), ConvDiscriminator(width)
        gen, disc = self.gen, self.disc
        self.game = gameopt.Game(
            [gameopt.Player(gen, name="generator"), gameopt.Player(disc, name="discriminator")],
            lambda x, z: gan_losses(gen, disc, x, z),
            algorithm=algorithm,
            on_nonfinite="skip",
        )
        self.data = torch.Generator().manual_seed(seed)  # every draw of training (saved in checkpoints)
        self.z_eval = torch.randn(EVAL_SAMPLES, LATENT, generator=torch.Generator().manual_seed(10_007 + seed))

    def step(self) -> tuple[float, float]:
        x = self.images[torch.randint(len(self.images), (self.batch,), generator=self.data)]
        z = torch.randn(self.batch, LATENT, generator=self.data)
        g_loss, d_loss = self.game.step(x, z)
        return float(g_loss), float(d_loss)

    def samples(self) -> torch.Tensor:
        with torch.no_grad():
            return self.gen(self.z_eval)

    def params_digest(self) -> str:
        h = hashlib.sha256()
        for p in self.game.players:
            h.update(p.flat_param.detach().numpy().tobytes())
        return h.hexdigest()


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, algorithm="extraadam", lr=2e-4, steps=1500, out="runs/digits_gan")
    p.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--width", type=int, default=32, help="channels of the first conv layers (default 32)")
    p.add_argument("--log-every", type=int, default=100, help="steps between evaluations (default 100)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--figures", action="store_true", help="regenerate the comparison figures in figures/")
    args = p.parse_args(argv)
    images, labels = load_digits()  # fails first, in one line, without scikit-learn
    if args.figures:
        make_figures(args.no_progress)
        return 0
    check_args(args)
    check_positive(args, "batch", "width", "log_every", "threads")
    algorithm = gan_algorithm(args.algorithm, lr_from_args(args), hyperparameters(args), BETAS)
    torch.set_num_threads(args.threads)
    with building_game():
        setup = Setup(algorithm, args.seed, images, args.width, args.batch)
    scorer = Scorer(images, labels)
    config = run_config(args, batch=args.batch, width=args.width, latent=LATENT, log_every=args.log_every)
    run = Run("digits_gan", args, config)
    extra: dict[str, Any] = {"data": setup.data}
    start = run.resume(setup.game, extra)
    for step in run.steps(start):
        g_loss, d_loss = setup.step()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            run.log(step, {**scorer(setup.samples()), "g_loss": g_loss, "d_loss": d_loss})
        run.maybe_checkpoint(step, setup.game, extra)
    final = scorer(setup.samples())
    run.finish(
        {
            **final,
            "fd_real_vs_real": scorer.fd_floor,
            "classifier_accuracy": scorer.accuracy,
            "skipped_steps": setup.game.skipped_steps,
            "params_sha256": setup.params_digest(),
        }
    )
    print(
        f"{args.algorithm}: {final['classes']} of 10 classes, FD {final['fd']:.2f} "
        f"(real vs real {scorer.fd_floor:.2f}), confidence {final['confidence']:.2f} after {args.steps} steps"
    )
    return 0


# ----------------------------------------------------------------------------- figures
# label → (algorithm, lr, hyperparameters)
COMPARED: dict[str, tuple[str, float, dict[str, Any]]] = {
    "Adam": ("adam", 2e-4, {}),
    "Extra-Adam": ("extraadam", 2e-4, {}),
    "Optimistic Adam": ("optimisticadam", 2e-4, {}),
    "Lookahead-Adam (k=5, α=0.5)": ("lookahead-adam", 2e-4, {"k": 5, "alpha_la": 0.5}),
    "Consensus (Adam, γ=0.1)": ("consensus", 2e-4, {"update": "adam", "gamma": 0.1}),
    "SGA (Adam, λ=1)": ("sga", 2e-4, {"update": "adam", "lam": 1.0}),
}
FIG_STEPS = 1500
FIG_SEEDS = (0, 1)
FIG_LOG_EVERY = 150


_SCORER: Scorer | None = None


def _figure_run(task: tuple[str, int]) -> dict[str, Any]:
    global _SCORER
    label, seed = task
    torch.set_num_threads(1)
    images, labels = load_digits()
    if _SCORER is None:
        _SCORER = Scorer(images, labels)
    name, lr, hyper = COMPARED[label]
    setup = Setup(gan_algorithm(name, lr, hyper, BETAS), seed, images)
    history: dict[str, list[float]] = {"step": []}
    t0, c0 = time.perf_counter(), time.process_time()
    for step in range(1, FIG_STEPS + 1):
        setup.step()
        if step % FIG_LOG_EVERY == 0:
            history["step"].append(step)
            for key, value in _SCORER(setup.samples()).items():
                history.setdefault(key, []).append(value)
    samples = setup.samples()
    return {
        "label": label,
        "seed": seed,
        "history": history,
        "final": _SCORER(samples),
        "samples": samples[:50].squeeze(1).tolist(),
        "skipped_steps": setup.game.skipped_steps,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "classifier_accuracy": _SCORER.accuracy,
        "fd_real_vs_real": _SCORER.fd_floor,
    }


def _tile(images, rows: int, cols: int, pad: int = 1):
    """rows x cols 8x8 images in one array, separated by light-grey lines."""
    import numpy as np

    h, w = images.shape[1:]
    out = np.full((rows * (h + pad) - pad, cols * (w + pad) - pad), -0.8)
    for k, img in enumerate(images[: rows * cols]):
        r, c = divmod(k, cols)
        out[r * (h + pad) : r * (h + pad) + h, c * (w + pad) : c * (w + pad) + w] = img
    return out


def make_figures(quiet: bool = False) -> list[str]:
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from experiments import digits_gan  # picklable by module name, also when run as __main__

    t0 = time.perf_counter()
    images, _ = load_digits()
    labels_ = list(COMPARED)
    tasks = [(label, seed) for label in labels_ for seed in FIG_SEEDS]
    cost = {"extraadam": 2, "consensus": 3, "sga": 6.5}  # per step, relative to Adam
    tasks.sort(key=lambda t: -cost.get(COMPARED[t[0]][0], 1))  # longest first

    def describe(res: dict[str, Any]) -> str:
        f = res["final"]
        return (
            f"  {res['label']:<26} seed {res['seed']}: {f['classes']:>2} classes, FD {f['fd']:.2f}, "
            f"confidence {f['confidence']:.2f} ({res['wall_s']:.0f}s)"
        )

    results = run_pool(digits_gan._figure_run, tasks, None if quiet else describe)
    results.sort(key=lambda r: r["seed"])
    by_label = {label: [r for r in results if r["label"] == label] for label in labels_}
    # every worker trained the same classifier (same seed, one thread): one accuracy, one floor
    accuracy, fd_floor = results[0]["classifier_accuracy"], results[0]["fd_real_vs_real"]
    paths = []

    # sample grids: real digits, then each algorithm (seed 0)
    panels = [("real digits", images[:50].squeeze(1).numpy())] + [
        (label, np.asarray(next(r for r in by_label[label] if r["seed"] == FIG_SEEDS[0])["samples"]))
        for label in labels_
    ]
    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, imgs) in zip(axes.flat, panels):
        ax.imshow(_tile(imgs, 5, 10), cmap="gray_r", vmin=-1, vmax=1, interpolation="nearest")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("10 samples per row (8×8 pixels each)", fontsize=8)
        ax.set_ylabel("5 rows", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        f"8×8 digits GAN after {FIG_STEPS} steps (seed {FIG_SEEDS[0]}): real digits and samples from a fixed noise",
        fontsize=11,
    )
    paths.append(save_figure(fig, "digits_samples.png", dpi=110))

    # metrics over training
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    styles = ["-", "--", "-.", ":"]
    for k, label in enumerate(labels_):
        runs = by_label[label]
        x = runs[0]["history"]["step"]
        for ax, key in zip(axes, ("fd", "classes", "confidence")):
            y = np.mean([r["history"][key] for r in runs], axis=0)
            ax.plot(x, y, styles[k % 4], label=label, lw=1.6)
    axes[0].axhline(fd_floor, color="grey", lw=1, ls=":", label="real vs real")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("Fréchet distance (classifier features)")
    axes[1].set_ylabel("digit classes covered (of 10)")
    axes[1].set_ylim(-0.3, 10.3)
    axes[2].set_ylabel("classifier confidence (mean max prob.)")
    axes[2].set_ylim(0, 1)
    for ax, title in zip(axes, ("Fréchet distance (lower is better)", "classes covered", "confidence")):
        ax.set_xlabel("step")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("8×8 digits GAN: sample quality over training", fontsize=11)
    paths.append(save_figure(fig, "digits_metrics.png"))

    def ms(values: list[float], fmt: str) -> str:
        if len(values) == 1:
            return format(values[0], fmt)
        return f"{format(statistics.fmean(values), fmt)} ± {format(statistics.pstdev(values), fmt)}"

    lines = [
        "# 8×8 digits GAN: final metrics",
        "",
        f"{FIG_STEPS} steps, batch 64, seeds {list(FIG_SEEDS)}; {EVAL_SAMPLES} samples from a fixed noise, scored by a "
        f"conv classifier with {accuracy:.1%} held-out accuracy. FD: Fréchet distance between its "
        f"penultimate features of all real digits and of the samples (real vs real: {fd_floor:.2f}). "
        "Regenerate with `python -m experiments.digits_gan --figures`.",
        "",
        "| algorithm | lr | FD ↓ | classes covered (of 10) | class entropy (nats, max 2.30) | confidence "
        "| CPU s / run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    table = {}
    for label in labels_:
        runs = by_label[label]
        cell = {key: [float(r["final"][key]) for r in runs] for key in ("fd", "classes", "class_entropy", "confidence")}
        cell["cpu_s"] = [r["cpu_s"] for r in runs]
        table[label] = cell
        lines.append(
            f"| {label} | {COMPARED[label][1]:g} | {ms(cell['fd'], '.2f')} | {ms(cell['classes'], '.1f')} | "
            f"{ms(cell['class_entropy'], '.2f')} | {ms(cell['confidence'], '.2f')} | "
            f"{statistics.fmean(cell['cpu_s']):.0f} |"
        )
    payload = {
        "steps": FIG_STEPS,
        "seeds": list(FIG_SEEDS),
        "classifier_accuracy": accuracy,
        "fd_real_vs_real": fd_floor,
        "algorithms": {label: {"algorithm": a, "lr": lr, "hp": hp} for label, (a, lr, hp) in COMPARED.items()},
        "results": table,
        # the scores every FIG_LOG_EVERY steps, one history per seed (tests/e2e/test_figures_current.py
        # reruns the first steps)
        "log_every": FIG_LOG_EVERY,
        "histories": {
            label: [r["history"] for r in sorted(by_label[label], key=lambda r: r["seed"])] for label in labels_
        },
    }
    paths += write_results("digits_results", lines, payload, t0, sum(r["cpu_s"] for r in results), quiet)
    if not quiet:
        print("\n".join(f"written {p}" for p in paths))
    return paths


if __name__ == "__main__":
    sys.exit(main())
