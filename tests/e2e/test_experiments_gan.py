"""The GAN experiments run as a user would: a few steps through the command line,
--help, a missing scikit-learn (kill-then-resume of mixture_gan is in the KILLABLE
table of test_experiments.py)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_help() -> None:
    for module in ("experiments.mixture_gan", "experiments.digits_gan"):
        res = _run(module, "--help")
        assert res.returncode == 0, res.stderr
        assert "--algorithm" in res.stdout and "--figures" in res.stdout and "--resume" in res.stdout
        assert "--overwrite" in res.stdout
        if module == "experiments.mixture_gan":  # data-parallel: how long a rank waits for the others
            assert "--timeout SECONDS" in res.stdout and "torchrun" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "dataset, algorithm, hp",
    [("ring", "extraadam", []), ("grid", "consensus", ["--hp", "update=adam", "--hp", "gamma=0.1"])],
)
def test_mixture_gan_smoke(tmp_path, dataset, algorithm, hp) -> None:
    out = tmp_path / "r"
    res = _run(
        "experiments.mixture_gan",
        *("--dataset", dataset, "--algorithm", algorithm, *hp, "--steps", "6", "--log-every", "2"),
        *("--hidden", "32", "--batch", "64", "--out", str(out), "--no-progress"),
    )
    assert res.returncode == 0, res.stderr
    rows = _rows(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 3, 5]
    assert {"modes", "high_quality", "g_loss", "d_loss"} <= set(rows[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["dataset"] == dataset
    assert 0 <= summary["modes"] <= (8 if dataset == "ring" else 25)
    assert 0.0 <= summary["high_quality"] <= 100.0
    assert f"on {dataset}:" in res.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "sga", "--hp", "update=rmsprop"], "update=adam"),
        (["--algorithm", "adam", "--hp", "betas=2"], "betas"),
        (["--algorithm", "consensus", "--hp", "lam=1"], "no hyperparameter"),
        (["--batch", "0"], "--batch must be positive"),
        (["--dataset", "grid", "--steps", "0"], "--steps must be positive"),
    ],
)
def test_mixture_gan_bad_values_give_one_line_and_exit_2(tmp_path, capsys, args, message) -> None:
    from experiments import mixture_gan

    threads = torch.get_num_threads()
    assert mixture_gan.main([*args, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert torch.get_num_threads() == threads  # refused before touching anything global


@pytest.mark.slow
def test_digits_gan_smoke(tmp_path) -> None:
    out = tmp_path / "d"
    res = _run(
        "experiments.digits_gan",
        *("--algorithm", "sga", "--hp", "update=adam", "--steps", "4", "--log-every", "2", "--width", "8"),
        *("--batch", "16", "--out", str(out), "--no-progress"),
    )
    assert res.returncode == 0, res.stderr
    rows = _rows(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 3]
    assert {"classes", "class_entropy", "confidence", "fd"} <= set(rows[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["classifier_accuracy"] > 0.9  # the scoring classifier itself works
    assert 0 < summary["fd_real_vs_real"] < summary["fd"]  # a 4-step generator is far from the data
    assert 0 <= summary["classes"] <= 10


@pytest.mark.slow
def test_digits_gan_without_scikit_learn_says_so_in_one_line(tmp_path) -> None:
    fake = tmp_path / "fake" / "sklearn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no scikit-learn here')\n")
    res = _run(
        "experiments.digits_gan",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "d"),
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(ROOT)])},
    )
    assert res.returncode == 2
    assert "install the experiments extra" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
