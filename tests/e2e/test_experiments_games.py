"""The game experiments (Dirac GAN, n-player, spectrum, opponent shaping) run as a
user would: --help, a few steps from the command line, bad values (the SIGKILL
and --resume check of opponent shaping is in the KILLABLE table of
test_experiments.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.slow
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
