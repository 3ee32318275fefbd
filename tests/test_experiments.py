"""Experiments run as a user would: command line, bad values, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


# (module, arguments for a run that lasts a few seconds, metrics rows before the
# kill, a check of the finished run's summary or None)
KILLABLE = [
    (
        "experiments.bilinear",
        ["--algorithm", "optimisticadam", "--lr", "0.01", "--steps", "6000", "--checkpoint-every", "300"],
        900,
        None,
    ),
    (
        "experiments.mixture_gan",
        ["--algorithm", "optimisticadam", "--hidden", "32", "--batch", "64", "--steps", "1500"]
        + ["--log-every", "1", "--checkpoint-every", "100"],
        400,
        None,
    ),
    (
        "experiments.opponent_shaping",
        ["--game", "ipd", "--algorithm", "sos", "--steps", "800", "--checkpoint-every", "50"],
        250,
        lambda summary: summary["final"]["loss"] < 1.2,  # SOS cooperates from this seed
    ),
]


@pytest.mark.parametrize("module, args, rows, check", KILLABLE, ids=[k[0] for k in KILLABLE])
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, module, args, rows, check) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(out: Path) -> subprocess.Popen:
        cmd = [sys.executable, "-m", module, *args, "--out", str(out), "--no-progress"]
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    uninterrupted, proc = start(straight), start(killed)  # side by side
    ckpt = killed / "checkpoint.pt"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and (killed / "metrics.csv").exists():
            if (killed / "metrics.csv").read_text().count("\n") > rows:  # a few checkpoints in
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert not (killed / "summary.json").exists()
    saved_step = torch.load(ckpt, weights_only=True)["step"]
    assert 0 < saved_step < int(args[args.index("--steps") + 1])
    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.stderr.read()
    uninterrupted.stderr.close()

    res = _run(module, *args, "--out", str(killed), "--no-progress", "--resume")
    assert res.returncode == 0, res.stderr
    a = json.loads((straight / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    assert a == b  # final parameters (or their digest) and metrics, bit for bit
    assert (straight / "metrics.csv").read_text() == (killed / "metrics.csv").read_text()
    assert check is None or check(a)


def test_damaged_or_foreign_checkpoints_are_refused(tmp_path) -> None:
    out = tmp_path / "run"
    base = ["experiments.bilinear", "--steps", "50", "--checkpoint-every", "10", "--no-progress", "--out", str(out)]
    assert _run(*base).returncode == 0
    good = (out / "checkpoint.pt").read_bytes()
    # another configuration
    res = _run(*base, "--lr", "0.05", "--resume")
    assert res.returncode == 2 and "another configuration" in res.stderr and "Traceback" not in res.stderr
    # truncated
    (out / "checkpoint.pt").write_bytes(good[: len(good) // 2])
    res = _run(*base, "--resume")
    assert res.returncode == 2 and "damaged" in res.stderr and "Traceback" not in res.stderr
    # not ours at all
    torch.save({"experiment": "mixture_gan"}, out / "checkpoint.pt")
    res = _run(*base, "--resume")
    assert res.returncode == 2 and "mixture_gan" in res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "nope"], "unknown algorithm"),
        (["--lr", "-0.1"], "--lr must be positive"),
        (["--steps", "0"], "--steps must be positive"),
        (["--out", "/nonexistent/dir/run"], "does not exist"),
        (["--hp", "gamma"], "KEY=VALUE"),
        (["--algorithm", "sga", "--hp", "gamma=1"], "no hyperparameter"),
    ],
)
def test_bad_command_lines_give_one_line_and_exit_2(args, message) -> None:
    res = _run("experiments.bilinear", *args, "--no-progress")
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_atomic_save_never_leaves_a_partial_file(tmp_path, monkeypatch) -> None:
    from experiments.common import atomic_save

    path = tmp_path / "ckpt.pt"
    atomic_save({"a": torch.ones(3)}, path)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_save({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(3))


def test_bilinear_smoke_and_help(tmp_path) -> None:
    res = _run("experiments.bilinear", "--help")
    assert res.returncode == 0 and "--algorithm" in res.stdout
    res = _run(
        "experiments.bilinear", "--algorithm", "cgd", "--steps", "5", "--out", str(tmp_path / "r"), "--no-progress"
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r" / "metrics.csv").read_text().count("\n") == 6
