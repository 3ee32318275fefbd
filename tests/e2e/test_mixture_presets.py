"""experiments.mixture_gan's presets (the papers' setups) and setup options: the
effective config from the command line, balanced batches, initializations."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest
import torch
from torch import nn

import gameopt
from experiments import mixture_gan
from experiments.common import hyperparameters
from gameopt_players.gan2d import mlp, sample_mixture

# the tables of issue 16 (Mescheder et al. 2017's and Balduzzi et al. 2018's code)
MESCHEDER = {
    "algorithm": "consensus",
    "lr": [1e-4],
    "dataset": "ring",
    "ring_modes": 8,
    "radius": 1.0,
    "std": 0.01,
    "balanced": True,
    "batch": 512,
    "latent": 16,
    "depth": 4,
    "hidden": 16,
    "activation": "relu",
    "init": "xavier",
}
BALDUZZI = {
    "algorithm": "sga",
    "lr": [1e-4],
    "dataset": "grid",
    "grid_size": 4,
    "spacing": 1.0,
    "std": 0.02,
    "balanced": True,
    "batch": 256,
    "latent": 64,
    "depth": 6,
    "hidden": 384,
    "activation": "relu",
    "init": "trunc_normal",
}


def _run(tmp_path, *args: str, name: str = "r") -> dict:
    out = tmp_path / name
    code = mixture_gan.main([*args, "--out", str(out), "--no-progress"])
    assert code == 0
    return json.loads((out / "config.json").read_text())


def _algorithm(config: dict) -> gameopt.Algorithm:
    hp = hyperparameters(argparse.Namespace(hp=config["hp"]))
    return mixture_gan.gan_algorithm(config["algorithm"], config["lr"][0], hp)


def test_mescheder2017_preset_sets_the_papers_setup(tmp_path) -> None:
    config = _run(tmp_path, "--preset", "mescheder2017", "--steps", "3", "--log-every", "1")
    assert config["preset"] == "mescheder2017"
    assert {k: config[k] for k in MESCHEDER} == MESCHEDER
    algo = _algorithm(config)
    assert isinstance(algo, gameopt.ConsensusOptimization) and algo.settings["gamma"] == 10.0
    assert isinstance(algo.rule, gameopt.RMSProp)
    assert (algo.rule.convention, algo.rule.decay, algo.rule.eps) == ("tf1", 0.9, 1e-10)
    assert mixture_gan.PRESETS["mescheder2017"]["steps"] == 50_000


def test_balduzzi2018_preset_sets_the_papers_setup(tmp_path) -> None:
    config = _run(tmp_path, "--preset", "balduzzi2018", "--steps", "2", "--log-every", "1")
    assert {k: config[k] for k in BALDUZZI} == BALDUZZI
    algo = _algorithm(config)
    assert isinstance(algo, gameopt.SGA)
    assert algo.settings["lam"] == 1.0 and algo.settings["sign_normalizer"] == "tensors" and algo.settings["align"]
    assert (algo.rule.convention, algo.rule.decay, algo.rule.eps) == ("tf1", 0.9, 1e-10)
    assert mixture_gan.PRESETS["balduzzi2018"]["steps"] == 10_001
    setup = mixture_gan.Setup(mixture_gan.PRESETS["balduzzi2018"]["spec"], gameopt.SimGD(1e-4), 0)
    assert sum(len(p.parameters) for p in setup.game.players) == 28  # n in the code's sign rule
    assert sorted(set(setup.modes.flatten().tolist())) == [-1.5, -0.5, 0.5, 1.5]


def test_explicit_options_override_the_preset(tmp_path) -> None:
    config = _run(
        tmp_path,
        *("--preset", "mescheder2017", "--algorithm", "simgd", "--hidden", "8", "--lr", "3e-4", "--no-balanced"),
        *("--hp", "update=rmsprop_torch", "--steps", "2", "--log-every", "1"),
    )
    assert config["algorithm"] == "simgd" and config["lr"] == [3e-4] and config["hidden"] == 8
    assert config["balanced"] is False and config["hp"] == ["update=rmsprop_torch"]  # no γ for simgd
    assert config["radius"] == 1.0 and config["batch"] == 512  # the rest of the preset stays
    algo = _algorithm(config)
    assert isinstance(algo, gameopt.SimGD) and algo.rule.convention == "torch"


def test_the_preset_baseline_keeps_the_update_rule_and_drops_the_method_hyperparameters(tmp_path) -> None:
    config = _run(tmp_path, "--preset", "balduzzi2018", "--algorithm", "simgd", "--hidden", "8", "--steps", "1")
    assert config["hp"] == ["update=rmsprop_tf1"]
    config = _run(tmp_path, "--preset", "mescheder2017", "--hp", "gamma=1", "--steps", "1", name="g")
    assert _algorithm(config).settings["gamma"] == 1.0


def test_without_a_preset_the_defaults_are_the_readmes_setup(tmp_path) -> None:
    config = _run(tmp_path, "--steps", "1", "--hidden", "8")
    default = mixture_gan.Spec()
    assert config["preset"] is None and config["algorithm"] == "extraadam" and config["hp"] == []
    assert (config["radius"], config["std"], config["balanced"], config["depth"]) == (2.0, 0.05, False, 3)
    assert (config["activation"], config["init"], config["latent"]) == (default.activation, "default", 16)


def test_preset_run_resumes_bit_exactly_with_its_snapshots(tmp_path) -> None:
    common = ["--preset", "mescheder2017", "--log-every", "5", "--snapshot-every", "5", "--checkpoint-every", "5"]
    assert mixture_gan.main([*common, "--steps", "20", "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert mixture_gan.main([*common, "--steps", "10", "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert mixture_gan.main([*common, "--steps", "20", "--out", str(tmp_path / "b"), "--no-progress", "--resume"]) == 0
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in "ab")
    assert a["params_sha256"] == b["params_sha256"]
    assert (tmp_path / "a" / "metrics.csv").read_text() == (tmp_path / "b" / "metrics.csv").read_text()
    sa, sb = (json.loads((tmp_path / n / "samples.json").read_text()) for n in "ab")
    assert sa == sb and list(sa["snapshots"]) == ["0", "5", "10", "15", "20"]
    assert len(sa["snapshots"]["20"]) == mixture_gan.SNAPSHOT_SAMPLES and len(sa["modes"]) == 8


@pytest.mark.parametrize("preset", ["mescheder2017", "balduzzi2018"])
def test_batches_are_balanced(preset) -> None:
    """The training batches (Setup.real, as Setup.step draws them) hold every mode equally often."""
    spec = dataclasses.replace(mixture_gan.PRESETS[preset]["spec"], hidden=4, depth=1)
    setup = mixture_gan.Setup(spec, gameopt.SimGD(1e-4), 0)
    modes = setup.modes
    for _ in range(3):
        x = setup.real(spec.batch, setup.data)
        nearest = torch.cdist(x, modes).min(1)
        assert float(nearest.values.max()) < 6 * spec.std  # each sample near its own mode
        counts = torch.bincount(nearest.indices, minlength=len(modes))
        assert counts.tolist() == [spec.batch // len(modes)] * len(modes)
    x = sample_mixture(modes, spec.batch, spec.std, setup.data)  # drawn at random: not balanced
    assert len(set(torch.bincount(torch.cdist(x, modes).argmin(1), minlength=len(modes)).tolist())) > 1


def _linears(net: nn.Module) -> list[nn.Linear]:
    return [m for m in net.modules() if isinstance(m, nn.Linear)]


def test_trunc_normal_init_has_std_one_over_sqrt_fan_in() -> None:
    """TF's truncated_normal_initializer(stddev=s): N(0, s²) cut at ±2s, so the weights'
    std is s·√(1 − 2·2φ(2)/(2Φ(2) − 1)) ≈ 0.880 s; zero biases."""
    torch.manual_seed(0)
    factor = math.sqrt(1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(2 / math.sqrt(2)))
    for layer in _linears(mlp(64, 2, 384, 6, "relu", "trunc_normal"))[:-1]:
        s = 1 / math.sqrt(layer.in_features)
        w = layer.weight.detach()
        assert float(w.abs().max()) <= 2 * s
        assert abs(float(w.std()) / (factor * s) - 1) < 0.03
        assert abs(float(w.mean())) < 0.02 * s
        assert torch.equal(layer.bias.detach(), torch.zeros_like(layer.bias))


def test_xavier_init_is_uniform_with_the_glorot_bound_and_zero_bias() -> None:
    torch.manual_seed(0)
    for layer in _linears(mlp(16, 2, 16, 4, "relu", "xavier")):
        bound = math.sqrt(6 / (layer.in_features + layer.out_features))
        w = layer.weight.detach()
        assert float(w.abs().max()) <= bound
        if w.numel() >= 256:  # enough weights to check the uniform's std, a/√3
            assert abs(float(w.std()) / (bound / math.sqrt(3)) - 1) < 0.15
        assert torch.equal(layer.bias.detach(), torch.zeros_like(layer.bias))


def test_default_init_is_pytorchs() -> None:
    torch.manual_seed(0)
    ours = mlp(2, 1, 8, 2, "tanh")
    torch.manual_seed(0)
    theirs = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hp", "update=rmsprop"], "ambiguous"),
        (["--hp", "update=rmsprop_tf1", "--hp", "rmsprop_decay=1"], "decay"),
        (["--std", "0"], "--std must be positive"),
        (["--depth", "0"], "--depth must be positive"),
        (["--radius", "nan"], "--radius must be positive"),
        (["--snapshot-every", "-1"], "--snapshot-every"),
        (["--preset", "mescheder2017", "--hp", "gamma=-1"], "gamma"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(tmp_path, capsys, args, message) -> None:
    assert mixture_gan.main([*args, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
