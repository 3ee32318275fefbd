"""Shared measurement protocol, table printing, CSV and plotting for the benchmarks.

Protocol (these machines are noisy):

* every comparison is a pair (baseline, candidate) timed **interleaved**: each
  round times one small batch of calls of each, the order alternating between
  rounds (A B, B A, A B, ...) so neither side always runs second;
* a batch is timed with :func:`time.perf_counter`, and its length is calibrated so
  that one baseline batch takes about ``target_s`` seconds;
* the garbage collector is off while timing;
* reported: the median per-call time of each side and the **median of the
  per-round ratios** candidate / baseline (with its 25th/75th percentiles), which
  cancels drift that affects both sides of a round alike.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


# --------------------------------------------------------------------------- setup
def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a fast smoke run (few rounds, small models)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the CSV and PNG (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores available)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per comparison")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--retries",
        type=int,
        default=None,
        help="re-measure comparisons disturbed by other processes up to this many times (default: 0 quick, 2 full)",
    )
    p.add_argument("--retry-budget", type=float, default=90.0, help="seconds allowed for re-measuring (default: 90)")
    return p


def setup(args: argparse.Namespace) -> int:
    """Threads, denormals and seed; prints the environment. Returns the thread count."""
    threads = args.threads or available_cores()
    torch.set_num_threads(threads)
    # Deep narrow nets produce tiny gradients; denormal arithmetic would make the
    # timings depend on the values rather than on the code under test.
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    print(
        f"torch {torch.__version__}, torch.get_num_threads() = {torch.get_num_threads()} "
        f"(cores available: {available_cores()}), flush_denormal on, quick={args.quick}"
    )
    return threads


# ---------------------------------------------------------------- foreign load
class LoadMeter:
    """How many cores other processes kept busy (on average) between start and stop.

    Read from ``/proc/stat`` (all processes) minus this process's own CPU time. On a
    2-core machine a foreign load near 1 means another program held a core the
    whole time: multi-threaded kernels then wait for their second thread, and
    single-tensor ops look slower than per-parameter loops of small serial ones.
    ``nan`` where ``/proc/stat`` is not available.
    """

    _HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _busy() -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal ...
        return (sum(fields[:8]) - fields[3] - fields[4]) / LoadMeter._HZ

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def start(self) -> LoadMeter:
        self._t0, self._busy0, self._own0 = time.perf_counter(), self._busy(), self._own()
        return self

    def stop(self) -> float:
        busy = self._busy()
        wall = time.perf_counter() - self._t0
        if busy is None or self._busy0 is None or wall <= 0:
            return float("nan")
        return max(0.0, (busy - self._busy0) - (self._own() - self._own0)) / wall


# -------------------------------------------------------------------------- timing
@dataclass
class Result:
    """One candidate against its baseline (times are per call, in microseconds)."""

    group: str
    name: str
    baseline: str
    cand_us: float
    base_us: float
    ratio: float  # median of per-round ratios candidate / baseline
    ratio_p25: float
    ratio_p75: float
    rounds: int
    batch: int
    foreign_load: float = float("nan")  # cores busy with other processes meanwhile
    note: str = ""
    extra: dict = field(default_factory=dict)


def _time_batch(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def per_call(fn: Callable[[], object], n: int = 3) -> float:
    """A rough per-call time of ``fn`` in seconds (after one warm-up call)."""
    fn()
    return _time_batch(fn, n)


def calibrate(*fns: Callable[[], object], target_s: float, multiple: int = 1, max_batch: int = 100_000) -> int:
    """A batch length so that ``batch`` calls of the slowest of ``fns`` take about
    ``target_s``, rounded up to a multiple of ``multiple``."""
    slowest = max(per_call(fn) for fn in fns)
    batch = max(1, min(max_batch, round(target_s / max(slowest, 1e-9))))
    return -(-batch // multiple) * multiple


def quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def interleaved(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    rounds: int,
    batch: int,
    warmup: int = 2,
    max_s: float | None = None,
    min_rounds: int = 8,
) -> tuple[list[float], list[float]]:
    """Per-call seconds of ``baseline`` and ``candidate``, one sample per round each,
    timed in alternating order. With ``max_s``, stops early (after at least
    ``min_rounds`` rounds) once that many seconds have passed, so that a run on a
    machine slowed down by other programs still ends in bounded time."""
    for _ in range(warmup):
        baseline()
        candidate()
    tb, tc = [], []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    t0 = time.perf_counter()
    try:
        for r in range(rounds):
            if max_s is not None and r >= min_rounds and time.perf_counter() - t0 > max_s:
                break
            if r % 2 == 0:
                tb.append(_time_batch(baseline, batch))
                tc.append(_time_batch(candidate, batch))
            else:
                tc.append(_time_batch(candidate, batch))
                tb.append(_time_batch(baseline, batch))
    finally:
        if was_enabled:
            gc.enable()
    return tb, tc


def compare(
    group: str,
    name: str,
    baseline_name: str,
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    rounds: int,
    batch: int,
    note: str = "",
    max_s: float | None = None,
) -> Result:
    meter = LoadMeter().start()
    tb, tc = interleaved(baseline, candidate, rounds=rounds, batch=batch, max_s=max_s)
    load = meter.stop()
    ratios = [c / b for b, c in zip(tb, tc)]
    return Result(
        group=group,
        name=name,
        baseline=baseline_name,
        cand_us=statistics.median(tc) * 1e6,
        base_us=statistics.median(tb) * 1e6,
        ratio=statistics.median(ratios),
        ratio_p25=quantile(ratios, 0.25),
        ratio_p75=quantile(ratios, 0.75),
        rounds=len(ratios),
        batch=batch,
        foreign_load=load,
        note=note,
    )


def spec(
    group: str,
    name: str,
    baseline_name: str,
    base_fn: Callable[[], object],
    fn: Callable[[], object],
    *,
    note: str,
    desc: str,
    rounds: int,
    target: float,
    max_s: float,
    multiple: int = 1,
) -> Callable[[], Result]:
    """A comparison to run (and re-run) later: the batch is calibrated to about
    ``target`` seconds (a multiple of ``multiple`` calls); ``desc`` names the model."""

    def run() -> Result:
        batch = calibrate(base_fn, fn, target_s=target, multiple=multiple)
        r = compare(group, name, baseline_name, base_fn, fn, rounds=rounds, batch=batch, note=note, max_s=max_s)
        r.extra = {"model": desc}
        return r

    return run


def log_result(r: Result, width: int = 46) -> None:
    """One line per finished comparison, as the run goes."""
    print(
        f"  {r.group:<22} {r.name:<{width}} ratio {r.ratio:6.3f}  ({r.cand_us:9.1f} us vs {r.base_us:9.1f} us)"
        f"  other load {r.foreign_load:.2f}",
        flush=True,
    )


def wait_quiet(max_wait_s: float, threshold: float = 0.3, window_s: float = 0.25) -> float:
    """Wait (up to ``max_wait_s``) until other processes use less than ``threshold``
    cores over a short window; returns the last load seen."""
    deadline = time.perf_counter() + max_wait_s
    while True:
        meter = LoadMeter().start()
        time.sleep(window_s)
        load = meter.stop()
        if not load > threshold or time.perf_counter() > deadline:
            return load


def measure(
    specs: Sequence[Callable[[], Result]],
    *,
    retries: int,
    budget_s: float,
    threshold: float = 0.3,
    log: Callable[[Result], None] = lambda r: None,
) -> list[Result]:
    """Run every comparison once; then re-run (up to ``retries`` times, within
    ``budget_s`` seconds, after waiting for a quiet moment) those timed while other
    processes kept more than ``threshold`` cores busy, keeping the least disturbed
    measurement of each."""
    results = []
    for spec in specs:
        r = spec()
        log(r)
        results.append(r)
    deadline = time.perf_counter() + budget_s
    for _ in range(retries):
        loaded = [i for i, r in enumerate(results) if r.foreign_load > threshold]
        if not loaded or time.perf_counter() > deadline:
            break
        print(f"re-measuring {len(loaded)} comparison(s) timed while other processes were busy", flush=True)
        for i in loaded:
            if time.perf_counter() > deadline:
                break
            wait_quiet(min(10.0, max(0.0, deadline - time.perf_counter())), threshold)
            r = specs[i]()
            log(r)
            if r.foreign_load < results[i].foreign_load:
                results[i] = r
    return results


# -------------------------------------------------------------------------- output
def fmt_us(us: float) -> str:
    if us >= 1e4:
        return f"{us / 1e3:.1f} ms"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def print_table(results: Sequence[Result], title: str, ratio_label: str = "ratio") -> None:
    rows = [
        (
            r.group,
            r.name,
            fmt_us(r.cand_us),
            fmt_us(r.base_us),
            f"{r.ratio:.3f}",
            f"[{r.ratio_p25:.3f}, {r.ratio_p75:.3f}]",
            f"{r.foreign_load:.2f}",
            r.note,
        )
        for r in results
    ]
    head = ("group", "candidate", "median", "baseline median", ratio_label, "IQR of ratios", "other load", "note")
    widths = [max(len(h), *(len(row[k]) for row in rows)) if rows else len(h) for k, h in enumerate(head)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print()
    print(title)
    print(line.format(*head))
    print(line.format(*("-" * w for w in widths)))
    last = None
    for r, row in zip(results, rows):
        if last is not None and r.group != last:
            print()
        last = r.group
        print(line.format(*row))
    loads = [r.foreign_load for r in results if r.foreign_load == r.foreign_load]
    if loads:
        worst = max(loads)
        print(
            f"other load = cores kept busy by other processes while a row was timed (max {worst:.2f} "
            f"of {available_cores()}); rows with load > 0.3 are suspect: another program competed for the CPUs"
        )
    print()


def save_csv(results: Sequence[Result], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = [k for k in asdict(results[0]) if k != "extra"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in results:
            d = asdict(r)
            w.writerow([f"{d[k]:.6g}" if isinstance(d[k], float) else d[k] for k in keys])
    print(f"wrote {path}")


def bar_plot(
    panels: dict[str, Sequence[Result]],
    path: Path,
    title: str,
    xlabel: str,
    goals: dict[str, Sequence[tuple[float, str]]] | None = None,
    log: bool = False,
) -> None:
    """One horizontal bar panel per key: the median ratio with its IQR as error bar."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written ({path})")
        return
    sizes = [len(v) for v in panels.values()]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(10, 0.34 * sum(sizes) + 1.3 * len(panels) + 0.6),
        squeeze=False,
        gridspec_kw={"height_ratios": [s + 2.5 for s in sizes]},
    )
    for ax, (key, rs) in zip(axes[:, 0], panels.items()):
        names = [r.name for r in rs][::-1]
        vals = [r.ratio for r in rs][::-1]
        lo = [r.ratio - r.ratio_p25 for r in rs][::-1]
        hi = [r.ratio_p75 - r.ratio for r in rs][::-1]
        colors = ["tab:gray" if r.name.startswith(("ref:", "A/A")) else "tab:blue" for r in rs][::-1]
        ax.barh(names, vals, xerr=[lo, hi], color=colors, alpha=0.85, capsize=2, height=0.7)
        ax.axvline(1.0, color="k", lw=1)
        for x, label in (goals or {}).get(key, ()):
            ax.axvline(x, color="tab:red", ls="--", lw=1)
            ax.annotate(
                label, (x, 1.0), xycoords=("data", "axes fraction"), color="tab:red", fontsize=8, ha="left", va="bottom"
            )
        for y, (v, h) in enumerate(zip(vals, hi)):
            ax.text(v + h, y, f"  {v:.2f}", va="center", fontsize=8)
        if log:
            ax.set_xscale("log")
        ax.set_xlim(right=ax.get_xlim()[1] * (1.6 if log else 1.12))
        ax.set_title(key, fontsize=10, pad=12)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.tick_params(axis="y", labelsize=9)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
