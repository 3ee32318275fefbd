"""``game.optimizer``: the torch.optim surface of a game, built by composition around
the algorithm (which is not a ``torch.optim.Optimizer`` itself)."""

from __future__ import annotations

import pytest
import torch
from games import GAMES, saved_and_loaded

import gameopt


def _game(algorithm: gameopt.Algorithm | None = None) -> tuple[gameopt.Game, object]:
    tg = GAMES["quadratic"]()
    return tg.build(algorithm or gameopt.Extragradient(0.05, update=gameopt.Adam((0.5, 0.9)))), tg


def test_the_optimizer_is_a_torch_optimizer_and_the_algorithm_is_not() -> None:
    game, _ = _game()
    assert isinstance(game.optimizer, torch.optim.Optimizer)
    assert isinstance(game.optimizer, gameopt.GameOptimizer)
    assert not isinstance(game.algorithm, torch.optim.Optimizer)
    assert game.optimizer.algorithm is game.algorithm
    assert repr(game.optimizer) == f"GameOptimizer({game.algorithm!r})"


@pytest.mark.parametrize("wrap", [None, gameopt.Lookahead, gameopt.Averaging])
def test_the_param_groups_are_the_algorithms_own_dicts(wrap) -> None:
    base = gameopt.SimGD([0.1, 0.2, 0.3], update=gameopt.Adam())
    game, _ = _game(wrap(base) if wrap else base)
    groups = game.optimizer.param_groups
    assert groups is game.algorithm.param_groups and groups is base.param_groups
    assert [g["player"] for g in groups] == ["p0", "p1", "p2"]
    for g, p in zip(groups, game.players):  # the players' fused buffers, as torch.optim sees them
        assert [t.data_ptr() for t in g["params"]] == [b.data.data_ptr() for b in p.buffers]
    assert game.optimizer.defaults["betas"] == (0.9, 0.999)  # what OneCycleLR(cycle_momentum) looks for
    groups[1]["lr"] = 0.5  # as a scheduler writes it
    assert base.lrs == [0.1, 0.5, 0.3]


def test_step_is_one_game_step_with_hooks_and_the_games_losses() -> None:
    game, tg = _game()
    ref, tg2 = _game()
    calls = []
    game.optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    game.optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    out = game.optimizer.step()  # without a closure: the game's own losses
    ref.step()
    assert calls == ["pre", "post"]
    assert isinstance(out, gameopt.StepLosses) and len(out) == 3
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), tg2.params()))
    evaluations = []

    def closure():
        evaluations.append(1)
        return tg.losses_fn([m.w for m in tg.modules])

    game.optimizer.step(closure)
    assert len(evaluations) == 2  # extragradient evaluates twice, as LBFGS calls its closure
    assert calls == ["pre", "post"] * 2
    game.step()  # Game.step goes through the optimizer too
    assert calls == ["pre", "post"] * 3


def test_state_dict_is_the_algorithms_and_a_bad_one_changes_nothing() -> None:
    game, _ = _game()
    game.step()
    sd = saved_and_loaded(game.optimizer.state_dict())
    assert sd["type"] == "Extragradient" and sd["state"]["rule"]["t"] == 2
    other, _ = _game()
    other.optimizer.load_state_dict(sd)
    assert other.algorithm_state["rule"]["t"] == 2
    assert all(torch.equal(a, b) for a, b in zip(other.algorithm_state["rule"]["m"], game.algorithm_state["rule"]["m"]))
    before = saved_and_loaded(other.optimizer.state_dict())
    bad = {**sd, "state": {"rule": {**sd["state"]["rule"], "t": "one"}}}
    with pytest.raises(ValueError, match=r"algorithm\.state"):
        other.optimizer.load_state_dict(bad)
    after = other.optimizer.state_dict()
    assert after["param_groups"] == before["param_groups"] and after["state"]["rule"]["t"] == 2
    assert all(torch.equal(a, b) for a, b in zip(after["state"]["rule"]["v"], before["state"]["rule"]["v"]))


def test_players_are_fixed() -> None:
    game, _ = _game()
    with pytest.raises(TypeError, match="players are fixed"):
        game.optimizer.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
    assert len(game.optimizer.param_groups) == 3


def test_a_scheduler_needs_the_optimizer_not_the_algorithm() -> None:
    game, _ = _game()
    with pytest.raises(TypeError, match="is not an Optimizer"):
        torch.optim.lr_scheduler.StepLR(game.algorithm, step_size=1)  # type: ignore[arg-type]
    sched = torch.optim.lr_scheduler.StepLR(game.optimizer, step_size=1, gamma=0.5)
    game.step()
    sched.step()
    assert game.algorithm.lrs == [0.025] * 3


def test_assigning_another_algorithm_binds_it_and_makes_a_new_optimizer() -> None:
    game, tg = _game(gameopt.SimGD(0.1))
    old = game.optimizer
    game.step()
    game.algorithm = gameopt.Extragradient(0.05)
    assert game.optimizer is not old and game.optimizer.algorithm is game.algorithm
    assert game.algorithm.lrs == [0.05] * 3
    with pytest.raises(RuntimeError, match="algorithm was replaced"):
        old.step()
    before = tg.params()
    ref, tg2 = _game(gameopt.Extragradient(0.05))
    with torch.no_grad():
        for m, w in zip(tg2.modules, before):
            m.w.copy_(w)
    game.optimizer.step()
    ref.step()
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), tg2.params()))


def test_an_algorithm_that_does_not_fit_is_refused_and_nothing_changes() -> None:
    game, _ = _game(gameopt.SimGD(0.1))
    algorithm, optimizer = game.algorithm, game.optimizer
    with pytest.raises(TypeError, match="gameopt Algorithm"):
        game.algorithm = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # type: ignore[assignment]
    with pytest.raises(ValueError, match="3 players"):
        game.algorithm = gameopt.SimGD([0.1, 0.2])
    assert game.algorithm is algorithm and game.optimizer is optimizer
    game.step()
