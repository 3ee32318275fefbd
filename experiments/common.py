"""What every experiment shares: the command line, algorithms by name, a progress
bar, metrics written as they come, atomic checkpoints and bit-exact resume.

An experiment builds its parser with :func:`parser`, turns the arguments into an
algorithm with :func:`algorithm_from_args`, and runs its loop inside a
:class:`Run`, which owns the output folder::

    run = Run("bilinear", args, config)
    state = run.resume(game, extra)        # the step to start from (0 when fresh)
    for step in run.steps(state):
        ...
        run.log(step, {"distance": d})
        run.maybe_checkpoint(step, game, extra)
    run.finish()

Bad command-line values end with a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import gameopt

# algorithms by lower-case name; the extra names are first-order ones with an update rule
_ALIASES: dict[str, Callable[..., gameopt.Algorithm]] = {
    "simgd": gameopt.SimGD,
    "altgd": gameopt.AltGD,
    "extragradient": gameopt.Extragradient,
    "eg": gameopt.Extragradient,
    "optimistic": gameopt.Optimistic,
    "ogd": gameopt.Optimistic,
    "hamiltoniangd": gameopt.HamiltonianGD,
    "hgd": gameopt.HamiltonianGD,
    "consensus": gameopt.ConsensusOptimization,
    "consensusoptimization": gameopt.ConsensusOptimization,
    "sga": gameopt.SGA,
    "cgd": gameopt.CGD,
    "acgd": gameopt.ACGD,
    "la": gameopt.LA,
    "lola": gameopt.LOLA,
    "sos": gameopt.SOS,
}
_WITH_ADAM = {"adam": "simgd", "extraadam": "extragradient", "optimisticadam": "optimistic", "altadam": "altgd"}
ALGORITHM_NAMES = sorted(set(_ALIASES) | set(_WITH_ADAM) | {"lookahead-<name>"})


class UsageError(Exception):
    """A bad command-line value; reported in one line, exit code 2."""


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if "," in text:
        return [_parse_value(t) for t in text.split(",")]
    return text


def make_algorithm(name: str, lr: float | list[float], hyper: dict[str, Any] | None = None) -> gameopt.Algorithm:
    """Any gameopt algorithm by (case-insensitive) name, e.g. ``sga``,
    ``extraadam``, ``lookahead-extragradient``, with hyperparameters by keyword."""
    hyper = dict(hyper or {})
    key = name.lower().replace("_", "")
    if key.startswith("lookahead-"):
        k, alpha = hyper.pop("k", 5), hyper.pop("alpha_la", 0.5)
        return gameopt.Lookahead(make_algorithm(key[len("lookahead-") :], lr, hyper), k=k, alpha=alpha)
    if key in _WITH_ADAM:
        betas = hyper.pop("betas", (0.5, 0.9))
        try:
            hyper["update"] = gameopt.Adam(tuple(betas), hyper.pop("eps", 1e-8))
        except (ValueError, TypeError) as err:
            raise UsageError(f"Adam: bad betas/eps ({err})") from None
        key = _WITH_ADAM[key]
    if key not in _ALIASES:
        raise UsageError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHM_NAMES)}")
    cls = _ALIASES[key]
    momentum = hyper.pop("momentum", None)
    if momentum is not None:
        try:
            hyper["update"] = gameopt.Momentum(float(momentum))
        except (ValueError, TypeError) as err:
            raise UsageError(f"momentum: {err}") from None
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "lr"}
    unknown = set(hyper) - accepted
    if unknown:
        raise UsageError(f"{cls.__name__} has no hyperparameter {sorted(unknown)}; it takes {sorted(accepted)}")
    try:
        return cls(lr, **hyper)
    except (ValueError, TypeError) as err:
        raise UsageError(f"{cls.__name__}: {err}") from None


def parser(
    description: str, *, algorithm: str, lr: float, steps: int, out: str = "runs", distributed: bool = False
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--algorithm",
        default=algorithm,
        help=f"algorithm name (default {algorithm}); one of {', '.join(ALGORITHM_NAMES)}",
    )
    p.add_argument("--lr", type=float, nargs="+", default=[lr], help="learning rate, or one per player")
    p.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="algorithm hyperparameter, e.g. gamma=0.5 (repeatable)",
    )
    p.add_argument("--steps", type=int, default=steps, help=f"number of steps (default {steps})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(out), help="folder for metrics and checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: about 20 per run)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    if distributed:
        p.add_argument(
            "--distributed",
            action="store_true",
            help="data-parallel over the ranks started by torchrun (gloo, CPU)",
        )
    p.set_defaults(default_out=Path(out), distributed=False)
    return p


def init_distributed(args: argparse.Namespace) -> tuple[Any, int, int]:
    """With ``--distributed`` (under torchrun): join a gloo process group and return
    (group, rank, world size); otherwise (None, 0, 1)."""
    if not args.distributed:
        return None, 0, 1
    import torch.distributed as dist

    if "RANK" not in os.environ:
        raise UsageError(
            "--distributed needs torchrun, e.g. torchrun --nproc_per_node=2 -m experiments.mixture_gan --distributed"
        )
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # the experiments' tensors live on the CPU
    return dist.group.WORLD, dist.get_rank(), dist.get_world_size()


def _is_writer() -> bool:
    """Only rank 0 of a distributed run writes files."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def check_args(args: argparse.Namespace) -> None:
    if args.steps <= 0:
        raise UsageError(f"--steps must be positive, got {args.steps}")
    if any(not lr > 0 for lr in args.lr):
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must be non-negative")
    if args.resume and not args.out.is_dir():
        raise UsageError(f"--resume: no run folder {str(args.out)!r}")
    if args.out == args.default_out:
        args.out.mkdir(parents=True, exist_ok=True)
    parent = args.out.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"--out: the folder {str(parent)!r} does not exist")


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Options that must be positive: a one-line usage error otherwise."""
    for name in names:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")


def lr_from_args(args: argparse.Namespace) -> float | list[float]:
    """``--lr``: one float, or one per player."""
    return args.lr[0] if len(args.lr) == 1 else list(args.lr)


def run_config(args: argparse.Namespace, **more: Any) -> dict[str, Any]:
    """A run's config (its checkpoint fingerprint): the common options and ``more``."""
    return {"algorithm": args.algorithm, "lr": args.lr, "hp": args.hp, "seed": args.seed, **more}


def hyperparameters(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for item in args.hp:
        if "=" not in item:
            raise UsageError(f"--hp takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = _parse_value(value.strip())
    return out


def algorithm_from_args(args: argparse.Namespace) -> gameopt.Algorithm:
    return make_algorithm(args.algorithm, lr_from_args(args), hyperparameters(args))


def main_guard(run: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap an experiment's main: usage errors print one line and return 2."""

    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return run(argv)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except CheckpointError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    return wrapped


class CheckpointError(Exception):
    """A checkpoint that is missing, damaged, or from another run."""


class Progress:
    """A small progress bar on stderr (no dependency)."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True, label: str = "") -> None:
        self.total, self.n, self.enabled, self.label = total, start, enabled and total > 0, label
        self.t0, self.last = time.perf_counter(), 0.0
        self.postfix = ""

    def update(self, n: int, postfix: str = "") -> None:
        self.n, self.postfix = n, postfix or self.postfix
        now = time.perf_counter()
        if self.enabled and (now - self.last > 0.2 or n >= self.total):
            self.last = now
            frac = n / self.total
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {n}/{self.total} {now - self.t0:5.1f}s {self.postfix}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename: the
    previous file is never replaced by a partial one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Run:
    """The output folder of one run: metrics.csv (as it goes), summary.json,
    checkpoint.pt (atomic), and config.json."""

    def __init__(self, experiment: str, args: argparse.Namespace, config: dict[str, Any]) -> None:
        self.experiment = experiment
        self.args = args
        self.out: Path = args.out
        self.config = {"experiment": experiment, **config}
        self.fingerprint = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode()).hexdigest()[
            :16
        ]
        self.writer = _is_writer()
        if self.writer:
            self.out.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out / "metrics.csv"
        self.ckpt_path = self.out / "checkpoint.pt"
        self.every = args.checkpoint_every or max(1, args.steps // 20)
        self.rows: list[dict[str, Any]] = []
        self.progress: Progress | None = None

    def resume(self, game: gameopt.Game, extra: dict[str, Any]) -> int:
        """Fresh run: write config and return 0. With --resume: load the checkpoint
        into ``game`` and ``extra`` (tensors updated in place / dict entries
        replaced) and return the step to continue from."""
        if not self.args.resume:
            if self.writer:
                (self.out / "config.json").write_text(json.dumps(self.config, indent=2, default=str))
                if self.metrics_path.exists():
                    self.metrics_path.unlink()
            return 0
        if not self.ckpt_path.exists():
            raise CheckpointError(f"--resume: no checkpoint in {str(self.out)!r}")
        try:
            ckpt = torch.load(self.ckpt_path, weights_only=True)
        except Exception as err:  # truncated, corrupted or not a checkpoint at all
            raise CheckpointError(
                f"checkpoint {str(self.ckpt_path)!r} is damaged or not a gameopt checkpoint ({type(err).__name__})"
            ) from None
        if not isinstance(ckpt, dict) or ckpt.get("experiment") != self.experiment:
            other = ckpt.get("experiment") if isinstance(ckpt, dict) else None
            raise CheckpointError(f"checkpoint is from experiment {other!r}, not {self.experiment!r}")
        if ckpt.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                "checkpoint was written with another configuration (algorithm, lr, seed or settings differ)"
            )
        try:
            game.load_state_dict(ckpt["game"])
        except (ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint does not fit this game: {err}") from None
        for key, value in ckpt["extra"].items():
            if key == "torch_rng":
                torch.set_rng_state(value)
            elif isinstance(extra.get(key), torch.Generator):
                extra[key].set_state(value)
            else:
                extra[key] = value
        self.rows = list(ckpt["rows"])
        if self.writer:
            self._rewrite_metrics()
        return int(ckpt["step"])

    def steps(self, start: int) -> Iterator[int]:
        show = not self.args.no_progress and self.writer
        self.progress = Progress(self.args.steps, start, show, self.experiment)
        for step in range(start, self.args.steps):
            yield step
            self.progress.update(step + 1)
        self.progress.close()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.rows.append(row)
        if not self.writer:
            return
        new_file = not self.metrics_path.exists()
        with open(self.metrics_path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new_file:
                writer.writeheader()
            writer.writerow(row)
        if self.progress is not None:
            shown = ", ".join(f"{k}={v:.3g}" for k, v in list(metrics.items())[:2])
            self.progress.postfix = shown

    def _rewrite_metrics(self) -> None:
        if not self.rows:
            if self.metrics_path.exists():
                self.metrics_path.unlink()
            return
        tmp = self.metrics_path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.metrics_path)

    def maybe_checkpoint(self, step: int, game: gameopt.Game, extra: dict[str, Any], force: bool = False) -> None:
        """After finishing ``step``: write a checkpoint every ``--checkpoint-every`` steps."""
        done = step + 1
        if not self.writer or (not force and done % self.every and done != self.args.steps):
            return
        saved = {}
        for key, value in extra.items():
            saved[key] = value.get_state() if isinstance(value, torch.Generator) else value
        saved["torch_rng"] = torch.get_rng_state()
        atomic_save(
            {
                "experiment": self.experiment,
                "fingerprint": self.fingerprint,
                "step": done,
                "game": game.state_dict(),
                "extra": saved,
                "rows": self.rows,
            },
            self.ckpt_path,
        )

    def finish(self, summary: dict[str, Any]) -> None:
        if not self.writer:
            return
        atomic_json = self.out / "summary.json"
        tmp = atomic_json.with_suffix(".tmp")
        tmp.write_text(json.dumps({"config": self.config, **summary}, indent=2, default=float))
        os.replace(tmp, atomic_json)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread is many times faster than two (far more so
    when the cores are busy); the caller's setting is put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def figures_dir() -> Path:
    """The repository's figures/ folder."""
    path = Path(__file__).resolve().parent.parent / "figures"
    path.mkdir(exist_ok=True)
    return path


def save_figure(fig: Any, name: str, dpi: int = 100, rect: tuple[float, ...] | None = None) -> str:
    """Lay out (``tight_layout(rect=rect)``), write ``figures/<name>`` and close a
    matplotlib figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=rect)
    path = figures_dir() / name
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path)


def run_pool(
    fn: Callable[[Any], dict[str, Any]],
    tasks: list[Any],
    describe: Callable[[dict[str, Any]], str] | None = None,
    workers: int = 2,
) -> list[dict[str, Any]]:
    """``fn`` over ``tasks`` in ``workers`` spawned processes (give the longest tasks
    first); prints ``describe(result)`` as each one finishes. ``fn`` must be importable
    by module name (``experiments.<name>.<fn>``), also when run as ``__main__``."""
    import multiprocessing

    results = []
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for res in pool.imap_unordered(fn, tasks):
            results.append(res)
            if describe is not None:
                print(describe(res), flush=True)
    return results


def write_results(
    stem: str, lines: list[str], payload: dict[str, Any], t0: float, cpu_s: float, quiet: bool
) -> list[str]:
    """Finish a comparison: a timing line under ``lines``, then ``figures/<stem>.md``
    and ``.json`` (``payload`` plus the timings); returns their paths."""
    elapsed = time.perf_counter() - t0
    lines = lines + [
        "",
        f"Whole comparison: {elapsed:.0f} s wall on this machine, two worker processes of one thread; "
        f"the runs' CPU time adds up to {cpu_s:.0f} s (about {cpu_s / 2 + 10:.0f} s wall on 2 idle cores).",
    ]
    md, js = figures_dir() / f"{stem}.md", figures_dir() / f"{stem}.json"
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps({**payload, "wall_s": elapsed, "cpu_s": cpu_s}, indent=2))
    if not quiet:
        print("\n".join(lines))
    return [str(md), str(js)]
