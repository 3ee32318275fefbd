"""Game checkpoints: all or nothing (devices and impossible values included), a
checkpoint identifies the run that saved it, players are named uniquely, and
checkpoints of the pre-release format are refused, changing nothing."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from games import GAMES, assert_same_state
from models import gan_mlps
from torch import nn

import gameopt

DATA = Path(__file__).resolve().parents[1] / "data"


def _stepped(make, steps: int = 2):
    tg = GAMES["bilinear"]()
    game = tg.build(make())
    for _ in range(steps):
        game.step()
    return tg, game


def _refused_changes_nothing(game, sd, match: str) -> None:
    before = game.state_dict()
    with pytest.raises(ValueError, match=match):
        game.load_state_dict(sd)
    assert_same_state(game.state_dict(), before)


ADAM = lambda: gameopt.Extragradient(0.05, update=gameopt.Adam())  # noqa: E731


# ------------------------------------------------------------------ all or nothing
def test_a_checkpoint_read_onto_the_meta_device_is_refused_and_changes_nothing(tmp_path):
    _, saved = _stepped(ADAM, 4)
    path = tmp_path / "ckpt.pt"
    torch.save(saved.state_dict(), path)
    _, game = _stepped(ADAM, 2)
    meta = torch.load(path, weights_only=True, map_location="meta")
    _refused_changes_nothing(game, meta, "meta device")


@pytest.mark.parametrize("where", ["params", "moments"])
def test_one_tensor_on_the_meta_device_is_refused_and_changes_nothing(where):
    _, saved = _stepped(ADAM, 4)
    sd = saved.state_dict()
    if where == "params":
        sd["players"][1]["params"][0] = sd["players"][1]["params"][0].to("meta")
    else:
        sd["algorithm"]["state"]["rule"]["v"][0] = sd["algorithm"]["state"]["rule"]["v"][0].to("meta")
    _, game = _stepped(ADAM, 2)
    _refused_changes_nothing(game, sd, "meta device")


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda sd: sd["algorithm"]["state"]["rule"].__setitem__("t", -3), r"rule\.t: a count, must be >= 0"),
        (lambda sd: sd["algorithm"]["state"]["rule"]["v"][0].__setitem__(0, -1.0), r"second moments must be >= 0"),
        (lambda sd: sd["players"][0]["params"][0].__setitem__(0, float("nan")), r"players\[0\].*non-finite"),
        (lambda sd: sd["algorithm"]["state"]["rule"]["m"][0].__setitem__(0, float("inf")), r"rule\.m.*non-finite"),
    ],
    ids=["negative step count", "negative second moment", "NaN parameter", "inf moment"],
)
def test_impossible_values_are_refused_naming_the_entry(edit, match):
    _, saved = _stepped(ADAM, 4)
    sd = copy.deepcopy(saved.state_dict())
    edit(sd)
    _, game = _stepped(ADAM, 2)
    _refused_changes_nothing(game, sd, match)


def test_non_finite_module_buffers_are_refused():
    def make():
        torch.manual_seed(0)
        a = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 1)).double()
        b = nn.Linear(2, 1).double()
        x = torch.randn(6, 2, dtype=torch.float64)
        return gameopt.Game(
            [gameopt.Player(a, name="a"), gameopt.Player(b, name="b")], lambda: (a(x).sum(), b(x).sum())
        )

    sd = make().state_dict()
    sd["players"][0]["buffers"]["1.running_var"][0] = float("nan")
    _refused_changes_nothing(make(), sd, r"1\.running_var: holds non-finite values")


# ------------------------------------------------------------------ identity
@pytest.mark.parametrize(
    "saved, other, match",
    [
        (
            lambda: gameopt.Lookahead(gameopt.Extragradient(0.05), k=2),
            lambda: gameopt.Lookahead(gameopt.SimGD(0.05), k=2),
            r"base\.type: 'Extragradient' in the checkpoint, 'SimGD' here",
        ),
        (
            lambda: gameopt.Averaging(gameopt.SimGD(0.05, update=gameopt.Adam())),
            lambda: gameopt.Averaging(gameopt.SimGD(0.05, update=gameopt.RMSProp())),
            r"base\.rule\.type: 'Adam' in the checkpoint, 'RMSProp' here",
        ),
        (
            lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.5, nesterov=True)),
            lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.5, nesterov=False)),
            r"rule\.nesterov: True in the checkpoint, False here",
        ),
        (
            lambda: gameopt.SimGD(0.05, update=gameopt.RMSProp(0.9, 1e-8, convention="torch")),
            lambda: gameopt.SimGD(0.05, update=gameopt.RMSProp(0.9, 1e-8, convention="tf1")),
            r"rule\.convention: 'torch' in the checkpoint, 'tf1' here",
        ),
        (
            lambda: gameopt.SimGD(0.05, update=gameopt.Adam(eps=1e-8)),
            lambda: gameopt.SimGD(0.05, update=gameopt.Adam(eps=1e-3)),
            r"rule\.eps: 1e-08 in the checkpoint, 0\.001 here",
        ),
        (
            lambda: gameopt.Lookahead(gameopt.SimGD(0.05), k=2),
            lambda: gameopt.Lookahead(gameopt.SimGD(0.05), k=3),
            r"settings\.k: 2 in the checkpoint, 3 here",
        ),
    ],
    ids=["Lookahead base", "Averaging base rule", "nesterov", "RMSProp convention", "Adam eps", "Lookahead k"],
)
def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(saved, other, match):
    _, a = _stepped(saved, 3)
    _, b = _stepped(other, 1)
    _refused_changes_nothing(b, a.state_dict(), "checkpoint is from another run: " + match)


@pytest.mark.parametrize(
    "make",
    [
        lambda: gameopt.Lookahead(gameopt.Extragradient(0.05, update=gameopt.Adam()), k=2),
        lambda: gameopt.Averaging(gameopt.SimGD(0.05, update=gameopt.Momentum(0.5, nesterov=True))),
        lambda: gameopt.SimGD(0.05, update=gameopt.RMSProp(convention="tf1")),
    ],
)
def test_a_checkpoint_of_the_same_run_resumes_bit_for_bit(make):
    tg_a, a = _stepped(make, 3)
    tg_b, b = _stepped(make, 1)
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        a.step()
        b.step()
    assert all(torch.equal(x, y) for x, y in zip(tg_a.params(), tg_b.params()))


# ------------------------------------------------------------------ names
def test_players_with_the_same_default_name_are_named_by_their_place():
    a, b = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2))
    game = gameopt.Game([a, b], lambda: (a(torch.ones(2)).sum(), b(torch.ones(2)).sum()))
    assert [p.name for p in game.players] == ["Sequential_0", "Sequential_1"]


def test_swapped_players_of_the_same_type_do_not_load_each_others_weights():
    a, b = nn.Sequential(nn.Linear(2, 2)), nn.Sequential(nn.Linear(2, 2))
    game = gameopt.Game([a, b], lambda: (a(torch.ones(2)).sum(), b(torch.ones(2)).sum()))
    sd = game.state_dict()
    sd["players"] = sd["players"][::-1]
    with pytest.raises(ValueError, match="checkpoint player 'Sequential_1' does not match player 'Sequential_0'"):
        game.load_state_dict(sd)


def test_two_given_names_that_coincide_are_refused():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    with pytest.raises(ValueError, match="two players are named 'x'"):
        gameopt.Game(
            [gameopt.Player(a, name="x"), gameopt.Player(b, name="x")], lambda: (a.weight.sum(), b.weight.sum())
        )


def test_players_built_from_tensors_are_told_apart():
    x, y = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    game = gameopt.Game([gameopt.Player([x]), gameopt.Player(y)], lambda: ((x * y).sum(), (x * y).sum()))
    assert [p.name for p in game.players] == ["params_0", "params_1"]
    with pytest.raises(gameopt.LossError, match="'params_1'"):
        gameopt.Game([gameopt.Player([x]), gameopt.Player(y)], lambda: ((x * x).sum(), (x * x).sum())).step()


# ------------------------------------------------------------------ older checkpoints
def _old_game():
    gen, disc = gan_mlps(4)
    x = torch.randn(8, 2, dtype=torch.float64)
    z = torch.randn(8, 2, dtype=torch.float64)
    game = gameopt.Game(
        [gen, disc],
        lambda: (-disc(gen(z)).mean(), disc(gen(z)).mean() - disc(x).mean()),
        algorithm=gameopt.Extragradient(0.05, update=gameopt.Adam((0.5, 0.9))),
    )
    return game, [*gen.parameters(), *disc.parameters()]


@pytest.mark.parametrize("renamed", [False, True], ids=["default-names", "a-player-renamed"])
def test_a_checkpoint_of_the_pre_release_format_is_refused_and_changes_nothing(renamed):
    """tests/data/checkpoint_9d15ce9.pt: written by the package at commit 9d15ce9 (two
    default-named Sequential players, Extra-Adam after 3 steps), before checkpoints
    recorded the run that saved them: nothing has been released, so that format is
    not loaded, with a message that says why, whatever the players are called."""
    data = torch.load(DATA / "checkpoint_9d15ce9.pt", weights_only=True)
    assert [p["name"] for p in data["checkpoint"]["players"]] == ["Sequential", "Sequential"]
    game, _ = _old_game()
    if renamed:
        game.players[0].name_given = True  # a name that is not a made-unique default
        game.players[0].name = "generator"
    game.step()
    before = game.state_dict()
    with pytest.raises(ValueError, match=r"^algorithm: the checkpoint does not record the run .*before 0\.1"):
        game.load_state_dict(data["checkpoint"])
    assert_same_state(before, game.state_dict())
    game.step()  # and the game goes on


# ------------------------------------------------------------------ the docs' recipe
def test_the_docs_whole_resume_recipe_runs_and_resumes_bit_for_bit():
    """docs/checkpoints.md's code block (game, scheduler, RNG and data order) as a user
    pastes it: it asserts that the resumed run equals the straight one."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    state = torch.get_rng_state()
    try:
        exec(compile(blocks[0], "docs/checkpoints.md", "exec"), {"__name__": "recipe"})
    finally:
        torch.set_rng_state(state)
