"""Figures and tables of the papers' GAN setups (issue 16) from run folders of
``python -m experiments.mixture_gan --preset ...``.

python figures/papers/make_figures.py /work/paper_runs/out

Expects RUNS/<preset>/<algorithm>_s<seed>/ with config.json, metrics.csv and
samples.json (summary.json once finished). Copies the metrics, configs, summaries
and the figure's snapshots into figures/papers/data/, and writes
figures/papers/<preset>_samples.png (the papers' layout: one row per method, seed 0,
kernel density of the samples at several iterations, the target in red last),
<preset>_curves.png (modes covered and high-quality share over steps, every seed)
and results.md / results.json (last logged values, best, steps reached).
Unfinished runs are used as far as they got and marked so.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

HERE = Path(__file__).resolve().parent
PRESETS = {
    # preset → (methods in row order: folder prefix → label, figure columns (steps), plot box, steps of the run)
    "mescheder2017": (
        {"simgd": "simultaneous RMSProp", "consensus": "consensus optimization (γ = 10)"},
        [0, 5000, 10000, 20000, 50000],
        1.6,
        50_000,
    ),
    "balduzzi2018": (
        {"simgd": "simultaneous RMSProp", "sga": "SGA (λ = 1, n = weight tensors)"},
        [0, 2000, 4000, 6000, 8000, 10000],
        2.0,
        10_001,
    ),
}
TITLES = {
    "mescheder2017": "Mescheder et al. 2017 setup: ring of 8 (radius 1, σ 0.01), 4×16 ReLU nets, TF1 RMSProp lr 1e-4",
    "balduzzi2018": "Balduzzi et al. 2018 setup: 4×4 grid (σ 0.02), 6×384 ReLU nets, TF1 RMSProp lr 1e-4",
}


def read_run(folder: Path) -> dict:
    with open(folder / "metrics.csv", newline="") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    samples = json.loads((folder / "samples.json").read_text()) if (folder / "samples.json").exists() else None
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else None
    return {
        "config": json.loads((folder / "config.json").read_text()),
        "rows": rows,
        "samples": samples,
        "summary": summary,
    }


def kde(ax, pts: np.ndarray, box: float, cmap: str) -> None:
    """The authors' notebooks' plot: a Gaussian KDE of the samples, filled contours."""
    xx, yy = np.mgrid[-box:box:200j, -box:box:200j]
    try:
        density = stats.gaussian_kde(pts.T)(np.vstack([xx.ravel(), yy.ravel()])).reshape(xx.shape)
        ax.contourf(xx, yy, density, cmap=cmap)
    except (np.linalg.LinAlgError, ValueError):  # all samples (nearly) on one point or line
        ax.scatter(pts[:, 0], pts[:, 1], s=1, c="tab:blue")
    ax.set_xlim(-box, box)
    ax.set_ylim(-box, box)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])


def main(root: Path) -> None:
    results: dict = {}
    lines = ["# The papers' GAN experiments in the papers' setups (issue 16)", ""]
    for preset, (methods, columns, box, total) in PRESETS.items():
        runs = {}
        for folder in sorted((root / preset).glob("*_s*")):
            if not (folder / "metrics.csv").exists():
                continue
            method, seed = folder.name.rsplit("_s", 1)
            runs[method, int(seed)] = run = read_run(folder)
            dest = HERE / "data" / preset / folder.name
            dest.mkdir(parents=True, exist_ok=True)
            for name in ("metrics.csv", "config.json", "summary.json"):
                if (folder / name).exists():
                    shutil.copy(folder / name, dest / name)
            if run["samples"]:
                kept = {k: np.round(v, 4).tolist() for k, v in run["samples"]["snapshots"].items() if int(k) in columns}
                (dest / "samples.json").write_text(json.dumps({**run["samples"], "snapshots": kept}))
        if not runs:
            continue

        # samples in the papers' layout, seed 0
        fig, axes = plt.subplots(len(methods), len(columns) + 1, figsize=(2.0 * (len(columns) + 1), 2.2 * len(methods)))
        target = next((r["samples"] for r in runs.values() if r["samples"]), None)
        for i, (method, label) in enumerate(methods.items()):
            run = runs.get((method, 0))
            for j, step in enumerate(columns):
                ax = axes[i][j]
                snap = run and run["samples"] and run["samples"]["snapshots"].get(str(step))
                if snap:
                    kde(ax, np.asarray(snap), box, "Blues")
                else:
                    ax.set_axis_off()
                    ax.text(0.5, 0.5, "not reached", ha="center", va="center", transform=ax.transAxes, fontsize=8)
                if i == 0:
                    ax.set_title(f"iteration {step}", fontsize=9)
            axes[i][0].text(-0.08, 0.5, label, rotation=90, ha="right", va="center", transform=axes[i][0].transAxes,
                            fontsize=8)  # fmt: skip
            if target is not None:  # the target density, in red, as in the papers
                modes, std = np.asarray(target["modes"]), target["std"]
                rng = np.random.default_rng(0)
                pts = modes[np.arange(2000) % len(modes)] + std * rng.standard_normal((2000, 2))
                kde(axes[i][-1], pts, box, "Reds")
            if i == 0:
                axes[i][-1].set_title("target", fontsize=9)
        fig.suptitle(TITLES[preset] + " (seed 0)", fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        fig.savefig(HERE / f"{preset}_samples.png", dpi=90)
        plt.close(fig)

        # modes covered and high-quality share over steps, every seed
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        colors = {m: c for m, c in zip(methods, ("tab:red", "tab:blue"))}
        n_modes = None
        for (method, seed), run in sorted(runs.items()):
            steps = [r["step"] + 1 for r in run["rows"]]
            n_modes = len(run["samples"]["modes"]) if run["samples"] else n_modes
            style = "-" if seed == 0 else "--"
            for ax, key in zip(axes, ("modes", "high_quality")):
                ax.plot(steps, [r[key] for r in run["rows"]], style, color=colors.get(method), lw=1.2,
                        label=f"{methods.get(method, method)}, seed {seed}")  # fmt: skip
        axes[0].set_ylabel(f"modes covered (of {n_modes})")
        axes[1].set_ylabel("high-quality samples (%, within 3σ)")
        for ax in axes:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.set_xlim(0, total)
        axes[1].legend(fontsize=7)
        fig.suptitle(TITLES[preset], fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        fig.savefig(HERE / f"{preset}_curves.png", dpi=90)
        plt.close(fig)

        # table
        lines += [
            f"## {preset}",
            "",
            f"{TITLES[preset]}. Measured every 100 steps on 2500 samples of a fixed noise "
            "(a mode is covered when it holds ≥ 1/4 of its fair share of the high-quality samples).",
            "",
            "| method | seed | steps reached | modes (last) | high quality % (last) | modes (best) | "
            "first step with all modes | high quality % (mean of the last 10 evaluations) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        results[preset] = []
        for (method, seed), run in sorted(runs.items()):
            rows = run["rows"]
            last = rows[-1]
            reached = int(last["step"]) + 1
            all_modes = next((int(r["step"]) + 1 for r in rows if r["modes"] == n_modes), None)
            tail = float(np.mean([r["high_quality"] for r in rows[-10:]]))
            done = run["summary"] is not None
            entry = {
                "method": method,
                "seed": seed,
                "finished": done,
                "steps_reached": reached,
                "modes_last": last["modes"],
                "high_quality_last": last["high_quality"],
                "modes_best": max(r["modes"] for r in rows),
                "first_step_all_modes": all_modes,
                "high_quality_last10_mean": tail,
                "history": {k: [r[k] for r in rows] for k in ("step", "modes", "high_quality")},
            }
            results[preset].append(entry)
            state = f"{reached}" if done else f"{reached} of {total} (unfinished)"
            lines.append(
                f"| {methods.get(method, method)} | {seed} | {state} | {last['modes']:.0f} | "
                f"{last['high_quality']:.1f} | {entry['modes_best']:.0f} | {all_modes or '—'} | {tail:.1f} |"
            )
        lines.append("")
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    (HERE / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/work/paper_runs/out"))
