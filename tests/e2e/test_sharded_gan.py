"""Players sharded with FSDP2 end to end: the documented launch of the sharded GAN
(torchrun, 2 gloo ranks, DCP checkpoints, --resume), and the sharded benchmark's
quick mode (a gameopt step against plain torch on the same sharded modules)."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from ranks import free_port

from gameopt import _torch_compat as tc

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not tc.FSDP_PUBLIC or not dist.is_available(), reason="FSDP2 is public from torch 2.6"),
]


def _torchrun(*args: str, ranks: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--master-port"]
    return subprocess.run(
        [*cmd, str(free_port()), "-m", "experiments.sharded_gan", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _said(res: subprocess.CompletedProcess) -> str:
    """A failed run's output: how far it got (stdout) and why it stopped (stderr)."""
    return f"stdout:\n{res.stdout[-1500:]}\nstderr:\n{res.stderr[-3000:]}"


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _sane(rows: list[dict[str, str]]) -> None:
    for row in rows:
        assert 0 <= int(row["modes"]) <= 8, row
        assert 0 <= float(row["high_quality"]) <= 100, row
        g, d = float(row["g_loss"]), float(row["d_loss"])
        assert math.isfinite(g) and math.isfinite(d), row
        assert 0 < g < 10 and 0 < d < 10, row  # a non-saturating GAN's losses near the start (log 2, 2 log 2)


def test_torchrun_sharded_gan_trains_checkpoints_and_resumes(tmp_path) -> None:
    """torchrun --nproc-per-node 2 -m experiments.sharded_gan: a few steps, rank 0's
    metrics are sane, a DCP checkpoint is written every 10 steps, and --resume
    continues from the newest."""
    out = tmp_path / "run"
    common = ["--hidden", "32", "--batch", "64", "--log-every", "10", "--checkpoint-every", "10", "--out", str(out)]
    first = _torchrun("--steps", "20", *common)
    assert first.returncode == 0, _said(first)
    rows = _rows(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [10, 20]
    _sane(rows)
    assert "step     20  modes" in first.stdout and "on 2 rank(s)" in first.stdout
    assert (out / "latest").read_text() == "checkpoint-20"
    assert (out / "checkpoint-10" / ".metadata").is_file() and (out / "checkpoint-20" / ".metadata").is_file()
    second = _torchrun("--steps", "30", "--resume", *common)
    assert second.returncode == 0, _said(second)
    rows = _rows(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [10, 20, 30]  # continued after step 20, not from 0
    _sane(rows)
    assert "step     10" not in second.stdout


def test_sharded_benchmark_quick(tmp_path) -> None:
    """python -m benchmarks.distributed --sharded --quick: the table's rows, the plain
    step computes gameopt's step exactly (SimGD), and memory per rank falls with the
    ranks."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.distributed", "--sharded", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, _said(res)
    timing = _rows(tmp_path / "distributed_sharded.csv")
    assert [(r["algorithm"], r["ranks"]) for r in timing] == [("SimGD", "2")]
    assert float(timing[0]["max_rel_diff"]) == 0.0  # the same per-player gradients, the same SGD step
    assert float(timing[0]["ratio"]) > 0
    memory = {(r["side"], int(r["ranks"])): r for r in _rows(tmp_path / "distributed_sharded_memory.csv")}
    for side in ("gameopt", "plain"):  # parameters, gradients and Adam's moments: 4 parameter vectors
        one, two = float(memory[side, 1]["held"]), float(memory[side, 2]["held"])
        assert two < 0.6 * one, (side, one, two)
        assert float(memory[side, 1]["held"]) >= 4 * float(memory[side, 1]["param_bytes"]) * 0.99


def test_resumed_sharded_gan_continues_as_one_run(tmp_path) -> None:
    """10 steps, a DCP checkpoint, --resume to 20: the metrics of an uninterrupted run of 20."""
    common = ["--hidden", "32", "--batch", "64", "--log-every", "10"]
    whole = _torchrun("--steps", "20", *common, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, _said(whole)
    parts = ["--checkpoint-every", "10", "--out", str(tmp_path / "parts")]
    for steps, more in (("10", []), ("20", ["--resume"])):
        res = _torchrun("--steps", steps, *common, *parts, *more)
        assert res.returncode == 0, _said(res)
    a, b = _rows(tmp_path / "whole" / "metrics.csv"), _rows(tmp_path / "parts" / "metrics.csv")
    for ra, rb in zip(a, b, strict=True):
        for key in ("step", "modes", "high_quality", "g_loss", "d_loss"):
            assert ra[key] == rb[key], (key, ra, rb)
