"""experiments.matrix_games from the command line: a short run, bad values,
bit-exact --resume, and the figure code on a few steps."""

from __future__ import annotations

import json

import pytest

from experiments import common
from experiments import matrix_games as experiment


def _main(capsys, *args: str) -> tuple[int, str]:
    code = experiment.main([*args, "--no-progress"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("method", sorted(experiment.METHODS))
def test_a_short_run_stays_on_the_simplex_and_reports_the_value(tmp_path, capsys, method) -> None:
    out = tmp_path / "run"
    code, err = _main(capsys, "--method", method, "--game", "random", "--steps", "25", "--out", str(out))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    for key in ("x", "y"):
        p = summary[key]
        assert min(p) >= 0 and abs(sum(p) - 1) < 1e-12
    assert summary["duality_gap"] >= -1e-12
    assert summary["nash_conv"] == pytest.approx(summary["duality_gap"], rel=1e-12, abs=1e-15)
    assert (out / "metrics.csv").read_text().count("\n") == 26


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "nope"], "invalid choice"),
        (["--hp", "gamma=1"], "takes no --hp"),
        (["--lr", "0.1", "0.2", "0.3"], "3 learning rates for 2 players"),
        (["--lr", "-1"], "--lr must be positive"),
    ],
)
def test_bad_values_exit_2(tmp_path, capsys, args, message) -> None:
    try:
        code, err = _main(capsys, "--steps", "5", "--out", str(tmp_path / "run"), *args)
    except SystemExit as exit_:  # argparse's own errors
        code, err = exit_.code, capsys.readouterr().err
    assert code == 2 and message in err


def test_resume_continues_bit_for_bit(tmp_path, capsys) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ["--method", "omwu", "--checkpoint-every", "10"]
    assert _main(capsys, *args, "--steps", "40", "--out", str(straight))[0] == 0
    assert _main(capsys, *args, "--steps", "20", "--out", str(resumed))[0] == 0
    assert _main(capsys, *args, "--steps", "40", "--out", str(resumed), "--resume")[0] == 0
    assert json.loads((straight / "summary.json").read_text()) == json.loads((resumed / "summary.json").read_text())
    assert (straight / "metrics.csv").read_text() == (resumed / "metrics.csv").read_text()


def test_the_figure_code_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(common, "figures_dir", lambda: tmp_path)
    monkeypatch.setattr(experiment, "FIGURE_STEPS", 40)
    paths = experiment.make_figures(quiet=True)
    names = ["matrix_games.png", "matrix_games.json", "matrix_games_3p.png", "matrix_games_3p.md"]
    assert [p.split("/")[-1] for p in paths] == names
    payload = json.loads((tmp_path / "matrix_games.json").read_text())
    assert set(payload["games"]["rock-paper-scissors"]) == set(experiment.METHODS)
    three = json.loads((tmp_path / "matrix_games_3p.json").read_text())
    for per_method in three["games"].values():
        assert set(per_method) == set(experiment.METHODS)
        assert all(r["nash_conv"] >= 0 for runs in per_method.values() for r in runs)


@pytest.mark.parametrize("method", ["mwu", "popov"])
def test_a_three_player_run_reports_nash_conv(tmp_path, capsys, method) -> None:
    out = tmp_path / "run"
    code, err = _main(capsys, "--method", method, "--game", "random3", "--steps", "10", "--out", str(out))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nash_conv"] >= 0 and len(summary["strategies"]) == 3
    assert all(min(p) >= 0 and abs(sum(p) - 1) < 1e-12 for p in summary["strategies"])
