"""What every experiment shares: the command line, algorithms by name, a progress
bar, metrics written as they come, checked atomic checkpoints and bit-exact resume.

An experiment builds its parser with :func:`parser`, turns the arguments into an
algorithm with :func:`algorithm_from_args`, builds its game inside
:func:`building_game` and runs its loop inside a :class:`Run`, which owns the
output folder::

    with building_game():                  # bad hyperparameters: a usage error
        game = ...
    run = Run("bilinear", args, config)
    state = run.resume(game, extra)        # the step to start from (0 when fresh)
    for step in run.steps(state):
        ...
        run.log(step, {"distance": d})
        run.maybe_checkpoint(step, game, extra)
    run.finish(summary)

The run folder (``--out``) holds config.json, metrics.csv, summary.json, the
latest checkpoint ``checkpoint.pt`` and the one before it ``checkpoint.prev.pt``:

* one run at a time: a run holds an exclusive lock (``run.lock``) on its folder
  until it ends; a second run on the folder exits with code 2. The kernel
  releases the lock of a killed run, so ``--resume`` after a crash just works;
* a fresh run refuses a folder that holds another run's files: pass ``--resume``
  to continue that run or ``--overwrite`` to delete its files and start over;
* every checkpoint carries the sha256 of its payload, checked on ``--resume``.
  A damaged checkpoint is refused; the message says whether the previous one is
  intact. To continue from it, rename ``checkpoint.prev.pt`` to
  ``checkpoint.pt`` and run again with ``--resume``;
* a checkpoint is written to a uniquely named temporary file, synced, then
  renamed: a run stopped by a full disk (or a file-size limit) ends with a
  one-line error, the last good checkpoint intact and no temporary file left;
* ``--resume`` with a checkpoint past ``--steps`` is refused (equal: nothing to do).

Bad command-line values and unusable run folders (a file in the way, a read-only
folder, no permission: any ``OSError`` on ``--out``) end with a one-line message
and exit code 2, with nothing written. With ``--distributed``, a rank that waits longer than ``--timeout``
seconds for the others gives up with a one-line message and exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import inspect
import io
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
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
    "pastextragradient": gameopt.PastExtragradient,
    "popov": gameopt.PastExtragradient,
    "anchoredextragradient": gameopt.AnchoredExtragradient,
    "eag": gameopt.AnchoredExtragradient,
    "followtheridge": gameopt.FollowTheRidge,
    "ftr": gameopt.FollowTheRidge,
    "stackelberg": gameopt.Stackelberg,
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
        inner = make_algorithm(key[len("lookahead-") :], lr, hyper)
        try:
            return gameopt.Lookahead(inner, k=k, alpha=alpha)
        except (ValueError, TypeError) as err:
            raise UsageError(f"Lookahead: {err}") from None
    if "update" in hyper and (key in _WITH_ADAM or "momentum" in hyper):
        what = "momentum" if "momentum" in hyper else name
        raise UsageError(f"{what} sets the update rule, which this run sets itself: leave it out")
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


DEFAULT_TIMEOUT = 600.0  # seconds; torch's own default is 30 minutes


def parser(
    description: str, *, algorithm: str, lr: float, steps: int, out: str = "runs", distributed: bool = False
) -> argparse.ArgumentParser:
    epilog = (
        "--out holds one run at a time: a second run on it refuses to start; --resume continues the run\n"
        "from its last checkpoint, --overwrite deletes it and starts over. A damaged checkpoint.pt is\n"
        "refused: rename checkpoint.prev.pt (the one before) to checkpoint.pt to continue from there."
    )
    p = argparse.ArgumentParser(
        description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete the run in --out (if any) and start over")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    if distributed:
        p.add_argument(
            "--distributed",
            action="store_true",
            help="data-parallel over the ranks started by torchrun (gloo, CPU), e.g. "
            "torchrun --nproc_per_node=2 -m experiments.<name> --distributed --timeout 60",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            metavar="SECONDS",
            help="with --distributed: how long a rank waits for the others in a collective before it "
            f"gives up with an error, e.g. when a rank hangs or was stopped (default {DEFAULT_TIMEOUT:g})",
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
    global _distributed_timeout
    if not dist.is_initialized():  # the experiments' tensors live on the CPU
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    _distributed_timeout = args.timeout
    return dist.group.WORLD, dist.get_rank(), dist.get_world_size()


_distributed_timeout: float | None = None  # set by init_distributed, read by main_guard
_run_folder: Path | None = None  # --out, set by check_args, read by main_guard


def _on_run_folder(err: OSError) -> bool:
    """``err`` is about the run folder (``--out``) or a path in it or above it."""
    if _run_folder is None:
        return False
    folder = os.path.abspath(_run_folder)
    for name in (err.filename, err.filename2):
        if isinstance(name, (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(name))
            if path == folder or path.startswith(folder + os.sep) or folder.startswith(path + os.sep):
                return True
    return False


def _is_writer() -> bool:
    """Only rank 0 of a distributed run writes files."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def check_args(args: argparse.Namespace) -> None:
    global _run_folder
    _run_folder = args.out
    if args.steps <= 0:
        raise UsageError(f"--steps must be positive, got {args.steps}")
    if any(not (lr > 0 and math.isfinite(lr)) for lr in args.lr):
        raise UsageError(f"--lr must be positive and finite, got {args.lr}")
    if args.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must be non-negative")
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run in --out, --overwrite deletes it: pass one of them")
    if args.distributed and not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UsageError(f"--timeout must be positive and finite, got {args.timeout}")
    if args.resume and not args.out.is_dir():
        raise UsageError(f"--resume: no run folder {str(args.out)!r}")
    if args.out == args.default_out:
        args.out.mkdir(parents=True, exist_ok=True)
    parent = args.out.resolve().parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise UsageError(f"--out: {str(parent)!r} {what}")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out: {str(args.out)!r} is a file, not a folder")


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
    """Wrap an experiment's main: usage errors and unusable run folders (any
    ``OSError`` on ``--out``: a file in the way, a read-only folder, no permission)
    print one line and return 2; a distributed run whose collective fails (another rank
    stopped answering within ``--timeout``, or left) prints one line and returns 1."""

    def wrapped(argv: list[str] | None = None) -> int:
        global _distributed_timeout, _run_folder
        try:
            return run(argv)
        except (UsageError, RunError) as err:
            _error(str(err))
            return 2
        except OSError as err:  # the run folder cannot be made, locked or written (nothing written)
            if not _on_run_folder(err):
                raise
            where = f"{os.fsdecode(err.filename)!r}" if err.filename is not None else "it"
            _error(f"--out {str(_run_folder)!r} cannot be used: {err.strerror or err} ({where})")
            return 2
        except RuntimeError as err:
            timeout = _distributed_timeout
            if timeout is None or not _is_collective_failure(err):
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            _error(
                f"rank {os.environ.get('RANK', '?')}: a collective failed: another rank did not answer within "
                f"--timeout {timeout:g} s or left the group ({first[:200]})"
            )
            return 1
        finally:
            _distributed_timeout = _run_folder = None
            _release_locks()

    return wrapped


def _error(message: str) -> None:
    if Progress.unfinished:  # end the progress bar's line first
        sys.stderr.write("\n")
        Progress.unfinished = False
    print(f"error: {message}", file=sys.stderr)


def _is_collective_failure(err: RuntimeError) -> bool:
    import torch.distributed as dist

    text = str(err).lower()
    return isinstance(err, dist.DistError) or any(w in text for w in ("gloo", "timed out", "connection closed"))


@contextlib.contextmanager
def building_game() -> Iterator[None]:
    """Around building an experiment's game (and nothing else): the library's
    ValueError/TypeError for bad hyperparameters, e.g. three learning rates for
    two players, become a one-line usage error."""
    try:
        yield
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None


class RunError(Exception):
    """A run folder that cannot be used or written; reported in one line, exit code 2."""


class CheckpointError(RunError):
    """A checkpoint that is missing, damaged, or from another run."""


class Progress:
    """A small progress bar on stderr (no dependency)."""

    unfinished = False  # a bar's line is not finished (an error message starts a new one)

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
            Progress.unfinished = True

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            Progress.unfinished = False


# ------------------------------------------------------------------ files
def atomic_write(path: Path, data: bytes, keep_previous: Path | None = None) -> None:
    """Write ``data`` to a uniquely named temporary file in ``path``'s folder, fsync,
    then rename it to ``path``: ``path`` is never a partial file. With
    ``keep_previous``, the old ``path`` becomes that file first (a hard link, so
    ``path`` exists all along). On failure the temporary files are removed and
    the error raised."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    link = None
    f = open(tmp, "xb")  # a new file, with the usual permissions
    try:
        with f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and path.exists():
            link = keep_previous.with_name(f".{keep_previous.name}.{secrets.token_hex(6)}.tmp")
            try:
                os.link(path, link)
                os.replace(link, keep_previous)
            except OSError:  # no hard links on this file system
                os.replace(path, keep_previous)
        os.replace(tmp, path)
    except BaseException:
        for name in (tmp, link):
            if name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(name)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)  # the renames themselves survive a power cut
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save via :func:`atomic_write`: the previous file is never replaced by a partial one."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write(path, buf.getvalue())


CHECKPOINT_FORMAT = "gameopt-run-checkpoint/1"


def checkpoint_bytes(payload: dict[str, Any]) -> bytes:
    """A checkpoint file's bytes: ``payload`` (torch.save'd) as a uint8 tensor with
    its sha256, itself loadable with ``torch.load(weights_only=True)``."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    wrapper = {
        "format": CHECKPOINT_FORMAT,
        "sha256": hashlib.sha256(data).hexdigest(),
        "payload": torch.frombuffer(bytearray(data), dtype=torch.uint8),
    }
    out = io.BytesIO()
    torch.save(wrapper, out)
    return out.getvalue()


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The payload of a checkpoint written by :class:`Run`, after checking its
    sha256; :class:`CheckpointError` if it is damaged or not such a checkpoint."""
    try:
        wrapper = torch.load(path, weights_only=True)
        data = wrapper["payload"].numpy().tobytes()
        intact = wrapper["format"] == CHECKPOINT_FORMAT and hashlib.sha256(data).hexdigest() == wrapper["sha256"]
    except Exception as err:  # truncated, garbled or not a checkpoint at all
        raise CheckpointError(
            f"checkpoint {str(path)!r} is damaged or not a gameopt checkpoint ({type(err).__name__})"
        ) from None
    if not intact:
        raise CheckpointError(f"checkpoint {str(path)!r} is damaged (its sha256 does not match its contents)")
    try:
        payload = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a gameopt checkpoint ({type(err).__name__})") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a gameopt checkpoint")
    return payload


LOCK_FILE = "run.lock"
# a run's files (what --overwrite deletes); samples.json: mixture_gan's --snapshot-every
RUN_FILES = ("config.json", "metrics.csv", "summary.json", "checkpoint.pt", "checkpoint.prev.pt", "samples.json")
_held_locks: list[int] = []  # file descriptors of the run folders' locks this process holds


def lock_folder(folder: Path) -> None:
    """Hold an exclusive lock on ``folder`` until :func:`main_guard` returns or the
    process ends (also when it is killed); a usage error if another run holds it."""
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(
            f"{str(folder)!r} is in use by another run (it holds {LOCK_FILE}); wait for it or choose another --out"
        ) from None
    _held_locks.append(fd)
    for name in RUN_FILES:  # temporary files of a killed run: nobody else writes here now
        for stale in folder.glob(f".{name}.*.tmp"):
            stale.unlink()


def _release_locks() -> None:
    while _held_locks:
        os.close(_held_locks.pop())


class Run:
    """The output folder of one run (see the module docstring): metrics.csv (as
    it goes), summary.json, config.json and checked checkpoints, under a lock."""

    def __init__(self, experiment: str, args: argparse.Namespace, config: dict[str, Any]) -> None:
        self.experiment = experiment
        self.args = args
        self.out: Path = args.out
        self.config = {"experiment": experiment, **config}
        self.fingerprint = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode()).hexdigest()[
            :16
        ]
        self.writer = _is_writer()
        self.metrics_path = self.out / "metrics.csv"
        self.ckpt_path = self.out / "checkpoint.pt"
        self.prev_path = self.out / "checkpoint.prev.pt"
        self.every = args.checkpoint_every or max(1, args.steps // 20)
        self.rows: list[dict[str, Any]] = []
        self.progress: Progress | None = None
        self.saved_step: int | None = None  # the step of the last good checkpoint
        if self.writer:
            self.out.mkdir(parents=True, exist_ok=True)
            lock_folder(self.out)
            if not args.resume:
                self._clear_or_refuse()

    def _clear_or_refuse(self) -> None:
        found = [name for name in RUN_FILES if (self.out / name).exists()]
        if found and not self.args.overwrite:
            raise UsageError(
                f"{str(self.out)!r} already holds a run ({', '.join(found)}): "
                "pass --resume to continue it or --overwrite to start over"
            )
        for name in found:
            (self.out / name).unlink()

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """A failed write (disk full, file-size limit) ends the run in one line."""
        try:
            yield
        except OSError as err:
            if self.saved_step is None:
                kept = "no checkpoint was written yet"
            else:
                kept = f"the last good checkpoint (step {self.saved_step}) is intact: free some space, then --resume"
            raise RunError(f"could not write {what} in {str(self.out)!r} ({err.strerror or err}); {kept}") from None

    def resume(self, game: gameopt.Game, extra: dict[str, Any]) -> int:
        """Fresh run: write config and return 0. With --resume: load the checkpoint
        into ``game`` and ``extra`` (tensors updated in place / dict entries
        replaced) and return the step to continue from."""
        if not self.args.resume:
            self.write_file("config.json", json.dumps(self.config, indent=2, default=str).encode())
            return 0
        if not self.ckpt_path.exists():
            raise CheckpointError(f"--resume: no checkpoint in {str(self.out)!r}{self._fallback()}")
        try:
            ckpt = read_checkpoint(self.ckpt_path)
        except CheckpointError as err:
            raise CheckpointError(f"{err}{self._fallback()}") from None
        if ckpt.get("experiment") != self.experiment:
            raise CheckpointError(f"checkpoint is from experiment {ckpt.get('experiment')!r}, not {self.experiment!r}")
        if ckpt.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                "checkpoint was written with another configuration (algorithm, lr, seed or settings differ)"
            )
        step = int(ckpt["step"])
        if step > self.args.steps:
            raise UsageError(
                f"the checkpoint in {str(self.out)!r} is at step {step}, past --steps {self.args.steps}: "
                f"pass --steps {step} or more"
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
        self.saved_step = step
        if self.writer:
            self._rewrite_metrics()
        return step

    def _fallback(self) -> str:
        """What to say about checkpoint.prev.pt when checkpoint.pt cannot be used."""
        if not self.prev_path.exists():
            return " (start over with --overwrite)"
        try:
            step = read_checkpoint(self.prev_path)["step"]
        except (CheckpointError, KeyError):
            return f"; the previous checkpoint {self.prev_path.name} is damaged too (start over with --overwrite)"
        return (
            f"; the previous checkpoint {self.prev_path.name} (step {step}) is intact: to continue from it, "
            f"rename it to {self.ckpt_path.name} and run again with --resume"
        )

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
        with self._writing("metrics.csv"), open(self.metrics_path, "a", newline="") as f:
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
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=list(self.rows[0]))
        writer.writeheader()
        writer.writerows(self.rows)
        with self._writing("metrics.csv"):
            atomic_write(self.metrics_path, text.getvalue().encode())

    def maybe_checkpoint(self, step: int, game: gameopt.Game, extra: dict[str, Any], force: bool = False) -> None:
        """After finishing ``step``: write a checkpoint every ``--checkpoint-every`` steps
        (the one it replaces becomes checkpoint.prev.pt)."""
        done = step + 1
        if not self.writer or (not force and done % self.every and done != self.args.steps):
            return
        saved = {}
        for key, value in extra.items():
            saved[key] = value.get_state() if isinstance(value, torch.Generator) else value
        saved["torch_rng"] = torch.get_rng_state()
        payload = {
            "experiment": self.experiment,
            "fingerprint": self.fingerprint,
            "step": done,
            "game": game.state_dict(),
            "extra": saved,
            "rows": self.rows,
        }
        with self._writing(f"the checkpoint of step {done}"):
            atomic_write(self.ckpt_path, checkpoint_bytes(payload), keep_previous=self.prev_path)
        self.saved_step = done

    def write_file(self, name: str, data: bytes) -> None:
        """Write one more file of the run (one of RUN_FILES) atomically, on rank 0
        only; a failed write ends the run in one line."""
        if self.writer:
            with self._writing(name):
                atomic_write(self.out / name, data)

    def finish(self, summary: dict[str, Any]) -> None:
        text = json.dumps({"config": self.config, **summary}, indent=2, default=float)
        self.write_file("summary.json", text.encode())


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
