"""The game experiments (Dirac GAN, n-player, spectrum, opponent shaping) run as a
user would: --help, a few steps from the command line, bad values, and a
SIGKILL followed by --resume that ends bit for bit where an uninterrupted run does."""

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
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
MODULES = ["experiments.dirac_gan", "experiments.n_player", "experiments.spectrum", "experiments.opponent_shaping"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("module", MODULES)
def test_help(module: str, capsys) -> None:
    # in-process (the smoke runs below cover the subprocess path)
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--algorithm" in out and "--resume" in out and "--figures" in out


# (module, arguments, expected metrics rows, a column of metrics.csv)
SMOKE = [
    ("experiments.dirac_gan", ["--algorithm", "cgd", "--r1", "0.3", "--steps", "5"], 5, "psi"),
    (
        "experiments.n_player",
        ["--game", "rotational", "--coupling", "3", "--algorithm", "sos", "--hp", "alpha=0.1", "--steps", "5"],
        5,
        "distance",
    ),
    ("experiments.spectrum", ["--steps", "4", "--log-every", "2", "--spectra", "2", "--hidden", "4"], 2, "rotation"),
    ("experiments.opponent_shaping", ["--game", "pennies", "--algorithm", "lola", "--steps", "5"], 5, "distance"),
    ("experiments.opponent_shaping", ["--game", "tandem", "--algorithm", "cgd", "--steps", "5"], 5, "x_plus_y"),
]


def test_smoke_runs(tmp_path) -> None:
    """A few steps of each experiment from the command line (all at once, to save time)."""
    procs = []
    for k, (module, args, _, _) in enumerate(SMOKE):
        out = tmp_path / f"run{k}"
        cmd = [sys.executable, "-m", module, *args, "--out", str(out), "--no-progress"]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    for k, ((module, args, rows, column), proc) in enumerate(zip(SMOKE, procs)):
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{module} {args}: {stderr}"
        out = tmp_path / f"run{k}"
        lines = (out / "metrics.csv").read_text().splitlines()
        assert len(lines) == rows + 1 and column in lines[0].split(","), (module, lines[0])
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["experiment"] == module.split(".")[1]
        assert (out / "checkpoint.pt").exists() and stdout.strip()
    spectra = json.loads((tmp_path / "run2" / "summary.json").read_text())["eigenvalues"]
    n_params = (2 * 4 + 4) + (4 * 4 + 4) + (4 * 2 + 2) + (2 * 4 + 4) + (4 * 4 + 4) + (4 + 1)  # --hidden 4
    assert [s[0] for s in spectra] == [0, 4] and len(spectra[0][1]) == len(spectra[0][2]) == n_params


@pytest.mark.parametrize(
    "module, args, message",
    [
        ("experiments.opponent_shaping", ["--game", "chess"], "--game must be one of"),
        ("experiments.n_player", ["--game", "chess"], "--game must be"),
        ("experiments.dirac_gan", ["--r1", "-1"], "--r1 must be non-negative"),
        ("experiments.opponent_shaping", ["--algorithm", "la", "--hp", "gamma=1"], "no hyperparameter"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(module, args, message, tmp_path, capsys) -> None:
    import importlib

    main = importlib.import_module(module).main
    assert main([*args, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_opponent_shaping_ipd_sigkill_then_resume_is_bit_exact(tmp_path) -> None:
    args = ["--game", "ipd", "--algorithm", "sos", "--steps", "800", "--checkpoint-every", "50", "--no-progress"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    def start(out: Path) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "experiments.opponent_shaping", *args, "--out", str(out)]
        return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    uninterrupted, proc = start(straight), start(killed)  # side by side
    ckpt = killed / "checkpoint.pt"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and (killed / "metrics.csv").exists():
            if (killed / "metrics.csv").read_text().count("\n") > 250:  # a few checkpoints in
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()
    saved_step = torch.load(ckpt, weights_only=True)["step"]
    assert 0 < saved_step < 800
    assert uninterrupted.wait(timeout=180) == 0, uninterrupted.stderr.read()
    uninterrupted.stderr.close()
    proc.stderr.close()

    res = _run("experiments.opponent_shaping", *args, "--out", str(killed), "--resume")
    assert res.returncode == 0, res.stderr
    a = json.loads((straight / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    assert a == b  # final parameters and metrics, bit for bit
    assert (straight / "metrics.csv").read_text() == (killed / "metrics.csv").read_text()
    assert a["final"]["loss"] < 1.2  # SOS cooperates from this seed
