"""experiments.constrained_learning from the command line: a short run, bad values,
bit-exact --resume, and the figure code on a few steps."""

from __future__ import annotations

import csv
import json

import pytest

from experiments import common
from experiments import constrained_learning as experiment


def _main(capsys, *args: str) -> tuple[int, str]:
    code = experiment.main([*args, "--no-progress"])
    return code, capsys.readouterr().err


def test_a_short_run_writes_its_metrics(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, err = _main(capsys, "--steps", "30", "--lr", "0.5", "2.0", "--out", str(out))
    assert code == 0, err
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 30
    assert set(rows[0]) == {"step", "objective", "violation", "gap", "lambda_0", "lambda_1"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["algorithm"] == "extragradient" and len(summary["multipliers"]) == 2
    assert float(rows[0]["violation"]) > summary["violation"]  # the run starts far outside |gap| ≤ ε
    assert min(summary["multipliers"]) >= 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bound", "1.5"], "--bound must be in (0, 1)"),
        (["--penalty", "-1"], "penalty must be a finite number in [0, inf)"),
        (["--algorithm", "cgd"], "constrained players need a first-order algorithm"),
        (["--lr", "0.1", "0.2", "0.3"], "3 learning rates for 2 players"),
        (["--steps", "0"], "--steps must be positive"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(tmp_path, capsys, args, message) -> None:
    code, err = _main(capsys, "--steps", "5", "--out", str(tmp_path / "run"), *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and message in err


def test_resume_continues_bit_for_bit(tmp_path, capsys) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common_args = ["--algorithm", "optimistic", "--lr", "0.5", "2.0", "--checkpoint-every", "10"]
    assert _main(capsys, *common_args, "--steps", "40", "--out", str(straight))[0] == 0
    assert _main(capsys, *common_args, "--steps", "20", "--out", str(resumed))[0] == 0
    assert _main(capsys, *common_args, "--steps", "40", "--out", str(resumed), "--resume")[0] == 0
    a = json.loads((straight / "summary.json").read_text())
    b = json.loads((resumed / "summary.json").read_text())
    assert a == b  # parameters, multipliers and metrics, bit for bit
    assert (straight / "metrics.csv").read_text() == (resumed / "metrics.csv").read_text()


def test_the_figure_code_runs(tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(common, "figures_dir", lambda: tmp_path)
    monkeypatch.setattr(experiment, "figures_dir", lambda: tmp_path)
    monkeypatch.setattr(experiment, "FIGURE_STEPS", 3)
    paths = experiment.make_figures(quiet=True)
    assert [p.split("/")[-1] for p in paths] == ["constrained_learning.png", "constrained_learning.json"]
    payload = json.loads((tmp_path / "constrained_learning.json").read_text())
    assert payload["reference (SLSQP)"]["success"]
    assert {"GDA (SimGD)", "Extragradient", "Optimistic"} <= set(payload["final"])
    if "cooper GDA" in payload["final"]:  # cooper-optim installed: its GDA is gameopt's, step for step
        ours, theirs = payload["final"]["GDA (SimGD)"], payload["final"]["cooper GDA"]
        assert ours["objective"] == pytest.approx(theirs["objective"], abs=1e-12)


# ------------------------------------------------------------------ --constraints per-group
def test_a_per_group_run_writes_its_metrics_and_resumes_bit_for_bit(tmp_path, capsys) -> None:
    args = ["--constraints", "per-group", "--multipliers", "model", "--dual", "nupi", "--algorithm", "simgd"]
    args += ["--lr", "0.2", "1.0", "--checkpoint-every", "5"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _main(capsys, *args, "--steps", "12", "--out", str(straight))[0] == 0
    assert _main(capsys, *args, "--steps", "6", "--out", str(resumed))[0] == 0
    assert _main(capsys, *args, "--steps", "12", "--out", str(resumed), "--resume")[0] == 0
    rows = list(csv.DictReader((straight / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 12 and set(rows[0]) == {"step", "objective", "violation", "mean_violation", "violated_groups"}
    assert float(rows[-1]["mean_violation"]) < float(rows[0]["mean_violation"])  # from zeros: 22 groups violate
    assert (straight / "metrics.csv").read_text() == (resumed / "metrics.csv").read_text()
    a = json.loads((straight / "summary.json").read_text())
    assert a == json.loads((resumed / "summary.json").read_text()) and a["config"]["multipliers"] == "model"


def test_per_group_figure_code_runs_and_matches_cooper(tmp_path, monkeypatch) -> None:
    """Dense, sampled and model multipliers, plain and nuPI: each run equals cooper's
    (to 1e-9 in the objective) over the steps, except sampled with nuPI, where cooper
    updates only the observed multipliers' controller state and gameopt all of them."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("cooper")
    from experiments import per_group

    monkeypatch.setattr(common, "figures_dir", lambda: tmp_path)
    paths = per_group.make_figures(quiet=True, steps=8)
    assert [p.split("/")[-1] for p in paths] == ["constrained_per_group.png", "constrained_per_group.json"]
    payload = json.loads((tmp_path / "constrained_per_group.json").read_text())
    agree = payload["steps with |objective gameopt − cooper| <= 1e-9 from the start"]
    assert len(agree) == 6
    assert all(steps == 8 for label, steps in agree.items() if label != "sampled, nupi")
    assert agree["sampled, nupi"] < 8
