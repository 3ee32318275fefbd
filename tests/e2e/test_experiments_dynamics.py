"""The issue-26 experiments (follow_the_ridge, stackelberg, anchored) from the command
line: a short run, bit-exact --resume, bad values, and the figure code on a few steps."""

from __future__ import annotations

import importlib
import json

import pytest

from experiments import common

RUNS = [
    ("follow_the_ridge", ["--function", "f3", "--algorithm", "ftr", "--lr", "0.05"]),
    ("follow_the_ridge", ["--function", "f2", "--algorithm", "simgd", "--lr", "0.05"]),
    ("stackelberg", ["--algorithm", "stackelberg", "--lr", "2.5e-4", "2.5e-2", "--start", "1"]),
    ("anchored", ["--algorithm", "eag", "--lr", "0.125"]),
    ("anchored", ["--algorithm", "popov", "--lr", "0.125"]),
]


def _main(module: str, capsys, *args: str) -> tuple[int, str]:
    code = importlib.import_module(f"experiments.{module}").main([*args, "--no-progress"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("module, args", RUNS, ids=[f"{m}-{a[1]}-{a[3]}" for m, a in RUNS])
def test_a_run_resumes_bit_for_bit(tmp_path, capsys, module, args) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common_args = [*args, "--checkpoint-every", "5"]
    assert _main(module, capsys, *common_args, "--steps", "12", "--out", str(straight))[0] == 0
    assert _main(module, capsys, *common_args, "--steps", "6", "--out", str(resumed))[0] == 0
    assert _main(module, capsys, *common_args, "--steps", "12", "--out", str(resumed), "--resume")[0] == 0
    assert json.loads((straight / "summary.json").read_text()) == json.loads((resumed / "summary.json").read_text())
    assert (straight / "metrics.csv").read_text() == (resumed / "metrics.csv").read_text()
    assert (straight / "metrics.csv").read_text().count("\n") == 13


@pytest.mark.parametrize(
    "module, args, message",
    [
        ("follow_the_ridge", ["--seed", "3"], "takes no --seed"),
        ("follow_the_ridge", ["--algorithm", "ftr", "--lr", "0.1", "0.1", "0.1"], "3 learning rates for 2 players"),
        ("stackelberg", ["--start", "7"], "--start must be in 0..6"),
        ("anchored", ["--lr", "-1"], "--lr must be positive"),
    ],
)
def test_bad_values_exit_2(tmp_path, capsys, module, args, message) -> None:
    code, err = _main(module, capsys, "--steps", "3", "--out", str(tmp_path / "run"), *args)
    assert code == 2 and message in err


def test_follow_the_ridge_is_refused_on_a_game_that_is_not_zero_sum() -> None:
    import gameopt
    from experiments.follow_the_ridge import build

    game, x, y = build("f1", gameopt.SimGD(0.05))
    game.losses = lambda: ((x * y).sum(), (x * y).sum())  # not (f, -f)
    with pytest.raises(ValueError, match="zero-sum"):
        game.algorithm = gameopt.FollowTheRidge(0.05)
        game.step()


@pytest.mark.parametrize(
    "module, names",
    [
        ("follow_the_ridge", ["follow_the_ridge.png", "follow_the_ridge.md"]),
        ("stackelberg", ["stackelberg.png", "stackelberg.md"]),
        ("anchored", ["anchored.png", "anchored.md"]),
    ],
)
def test_the_figure_code_runs(tmp_path, monkeypatch, module, names) -> None:
    experiment = importlib.import_module(f"experiments.{module}")
    monkeypatch.setattr(common, "figures_dir", lambda: tmp_path)
    monkeypatch.setattr(experiment, "STEPS", 100 if module == "anchored" else 30)
    if module == "stackelberg":
        monkeypatch.setattr(experiment, "STARTS", experiment.STARTS[:2])
    paths = experiment.make_figures(quiet=True)
    assert [p.split("/")[-1] for p in paths] == names
    assert (tmp_path / names[1]).read_text().startswith("# ")
