"""One object, one game (issue #33, items 10, 11, 12 and 19).

* An algorithm bound to one game is refused by another (it holds that game's param
  groups); a deep copy of it is unbound and may join any game.
* Deep copies of players, algorithms and games are independent and step bit for bit
  as the originals do; a game refuses pickling with its own message.
* A refused ``Game(...)`` changes nothing it was given: names, values, gradients,
  storage, the algorithm's binding.
* A parameter that cannot move into gameopt's storage is refused naming what holds
  it: a view kept on the module, a weak reference, a DistributedDataParallel wrapper.
"""

from __future__ import annotations

import copy
import gc
import io
import pickle
import weakref

import pytest
import torch
import torch.distributed as dist
from games import assert_same_state, saved_and_loaded
from models import gan_mlps
from torch import nn

import gameopt
from gameopt import _torch_compat as tc
from gameopt.player import Player

F64 = torch.float64


def _gan(algorithm: gameopt.Algorithm | None = None, width: int = 4) -> gameopt.Game:
    gen, disc = gan_mlps(width=width)

    def losses(x, z):
        f = disc(x).mean() - disc(gen(z)).mean() + 0.1 * (disc(x) ** 2).mean()
        return f, -f

    return gameopt.Game([gen, disc], losses, algorithm=algorithm)


def _batches(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(6, 2, generator=g, dtype=F64) + 1, torch.randn(6, 2, generator=g, dtype=F64)) for _ in range(n)
    ]


def _inside(t: torch.Tensor, flat: torch.Tensor) -> bool:
    """``t`` lies within the storage range of ``flat``."""
    start = flat.data_ptr()
    return start <= t.data_ptr() < start + flat.numel() * flat.element_size()


# ------------------------------------------------------ item 10: bound twice
def test_an_algorithm_bound_to_one_game_is_refused_by_another() -> None:
    algorithm = gameopt.SimGD([0.1, 0.2])
    first = _gan(algorithm)
    other = _gan()
    with pytest.raises(ValueError, match=r"already bound to another game.*copy\.deepcopy\(algorithm\)"):
        _gan(algorithm)
    own, optimizer = other.algorithm, other.optimizer
    with pytest.raises(ValueError, match="already bound to another game"):
        other.algorithm = algorithm
    assert other.algorithm is own and other.optimizer is optimizer
    assert algorithm.game is first and algorithm.lrs == [0.1, 0.2]
    # the first game still steps with its own settings: w − η_i ξ_i
    x, z = _batches(1, seed=0)[0]
    w, xi = first.layout.per_player([t.clone() for t in first.layout.data]), first.vector_field(x, z)
    first.step(x, z)
    for i, lr in enumerate((0.1, 0.2)):
        assert torch.equal(first.layout.per_player(first.layout.data)[i], w[i] - lr * xi[i])


def test_a_wrapper_around_a_bound_algorithm_is_refused_and_the_same_game_may_rebind() -> None:
    base = gameopt.SimGD(0.1)
    game = _gan(base)
    with pytest.raises(ValueError, match="this SimGD is already bound to another game"):
        _gan(gameopt.Lookahead(base, k=2))
    wrapped = gameopt.Lookahead(gameopt.SimGD(0.1), k=2)
    _gan(wrapped)
    with pytest.raises(ValueError, match="this Lookahead is already bound to another game"):
        game.algorithm = wrapped
    # the same game may take its algorithm again, or wrap it
    game.algorithm = game.algorithm
    game.algorithm = gameopt.Lookahead(base, k=2)
    game.step(*_batches(1, seed=0)[0])
    # once a game replaced it, an algorithm is free for another game
    game.algorithm = gameopt.SimGD(0.3)
    other = _gan(base)
    assert base.game is other


def test_a_deep_copy_of_a_bound_algorithm_is_unbound_with_the_same_settings() -> None:
    algorithm = gameopt.Optimistic([0.1, 0.2], update=[gameopt.Adam(betas=(0.5, 0.9)), gameopt.Plain()])
    game = _gan(algorithm)
    twin = copy.deepcopy(algorithm)
    assert twin.game is None and twin.param_groups == [] and algorithm.game is game
    assert repr(twin) == repr(gameopt.Optimistic([0.1, 0.2], update=[gameopt.Adam(betas=(0.5, 0.9)), gameopt.Plain()]))
    other = _gan(twin)
    assert twin.game is other and twin.lrs == [0.1, 0.2] and algorithm.game is game
    loaded = pickle.loads(pickle.dumps(algorithm))  # a pickle is unbound too
    assert loaded.game is None and repr(loaded) == repr(twin)
    # the two games step apart: the same batches give the same iterates
    for x, z in _batches(2, seed=3):
        game.step(x, z)
        other.step(x, z)
    assert_same_state(game.state_dict(), other.state_dict())


# -------------------------------------------------------- item 11: copies
ALGORITHMS = {
    "SimGD+Adam": lambda: gameopt.SimGD([0.05, 0.03], update=gameopt.Adam()),
    "Extragradient": lambda: gameopt.Extragradient(0.05),
    "Optimistic per player": lambda: gameopt.Optimistic(0.05, update=[gameopt.Adam(), gameopt.Momentum(0.5)]),
    "Lookahead": lambda: gameopt.Lookahead(gameopt.SimGD(0.05, update=gameopt.Adam()), k=2),
    "Averaging": lambda: gameopt.Averaging(gameopt.Extragradient(0.05), kind="ema", decay=0.9),
    "LOLA": lambda: gameopt.LOLA(0.05, alpha=0.5),
}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_deep_copy_of_a_game_steps_as_the_original_and_alone(name: str) -> None:
    game = _gan(ALGORITHMS[name]())
    for x, z in _batches(2, seed=1):
        game.step(x, z)
    game.optimizer.param_groups[1]["lr"] = 0.02  # a scheduled value travels with the copy
    twin = copy.deepcopy(game)
    assert twin.lock is not game.lock and twin.algorithm is not game.algorithm and twin.algorithm.game is twin
    before = saved_and_loaded(game.state_dict())
    batches = _batches(3, seed=2)
    for x, z in batches:
        twin.step(x, z)
    assert_same_state(game.state_dict(), before)  # stepping the copy leaves the original as it was
    for x, z in batches:
        game.step(x, z)
    assert_same_state(twin.state_dict(), game.state_dict())  # bit for bit, state and param groups included
    for mine, theirs in zip(twin.players, game.players):  # the copy's modules are its own, fused into its storage
        for p, q in zip(mine.module.parameters(), theirs.module.parameters()):
            assert torch.equal(p, q) and p.data_ptr() != q.data_ptr()
            assert any(_inside(p, t) for t in twin.layout.data)


def test_a_deep_copy_of_a_constrained_game_of_given_tensors_steps_as_the_original() -> None:
    torch.manual_seed(0)
    x, y = (torch.rand(3, dtype=F64, requires_grad=True) for _ in range(2))
    A = torch.randn(3, 3, dtype=F64)
    players = [Player([w], name=n, constraint=gameopt.constraints.Simplex()) for w, n in ((x, "x"), (y, "y"))]
    game = gameopt.Game(players, lambda: (x @ A @ y, -(x @ A @ y)), algorithm=gameopt.Extragradient(0.1))
    game.step()
    twin = copy.deepcopy(game)
    assert all(torch.count_nonzero(p.grad) == 0 for p in twin.players)  # a copy starts without gradients
    for _ in range(3):
        twin.step()
        game.step()
    assert_same_state(twin.state_dict(), game.state_dict())
    assert not _inside(twin.players[0].parameters[0], game.layout.data[0])


def test_a_deep_copy_of_a_game_takes_its_scheduler_along() -> None:
    game = _gan(gameopt.SimGD(0.1))
    scheduler = torch.optim.lr_scheduler.StepLR(game.optimizer, step_size=1, gamma=0.5)
    twin, twin_scheduler = copy.deepcopy((game, scheduler))
    assert twin_scheduler.optimizer is twin.optimizer
    assert twin.optimizer.param_groups is twin.algorithm.param_groups
    twin.step(*_batches(1, seed=0)[0])
    twin_scheduler.step()
    assert twin.algorithm.lrs == [0.05, 0.05] and game.algorithm.lrs == [0.1, 0.1]


def test_a_deep_copy_of_a_player_is_fused_on_its_own_and_joins_a_game() -> None:
    gen, disc = gan_mlps(width=4)
    z = torch.randn(5, 2, dtype=F64)
    player = Player(gen, loss=lambda: gen(z).pow(2).mean(), name="gen")
    twin = copy.deepcopy(player)
    assert twin.name == "gen" and torch.equal(twin.flat_param, player.flat_param)
    assert twin.flat_param.data_ptr() != player.flat_param.data_ptr()
    assert all(_inside(p, twin.flat_param) for p in twin.module.parameters())
    with torch.no_grad():
        twin.flat_param.zero_()
    assert all(torch.count_nonzero(p) == 0 for p in twin.module.parameters())  # its views follow its storage
    assert torch.count_nonzero(player.flat_param) > 0
    assert torch.equal(twin.loss(), twin.module(z).pow(2).mean())  # the loss closure takes the copied module
    game = gameopt.Game([twin, Player(disc, loss=lambda: disc(z).mean())], algorithm=gameopt.SimGD(0.1))
    game.step()
    # a pickled player loads fused, and joins a game too
    loaded = pickle.loads(pickle.dumps(Player(gan_mlps(width=4)[0])))
    assert all(_inside(p, loaded.flat_param) for p in loaded.module.parameters())
    gameopt.Game([loaded, Player(nn.Linear(2, 1).double())], lambda: (loaded.module(z).sum(),) * 2)


def test_a_game_refuses_pickling_with_its_own_message() -> None:
    game = _gan()
    with pytest.raises(TypeError, match=r"gameopt\.Game cannot be pickled.*state_dict\(\)"):
        pickle.dumps(game)
    with pytest.raises(TypeError, match=r"gameopt\.Game cannot be pickled"):
        torch.save(game, io.BytesIO())


# ----------------------------------------------- item 12: refused, unchanged
def _losses(*args):
    raise AssertionError("a refused game evaluates nothing")


def _bound_elsewhere() -> gameopt.Algorithm:
    algorithm = gameopt.SimGD(0.1)
    gameopt.Game([nn.Linear(1, 1)], lambda: (torch.zeros((), requires_grad=True),), algorithm=algorithm)
    return algorithm


REFUSALS = {
    "losses not callable": lambda ps: gameopt.Game(ps, "losses"),
    "no losses and no loss=": lambda ps: gameopt.Game(ps),
    "bad on_nonfinite": lambda ps: gameopt.Game(ps, _losses, on_nonfinite="ignore"),
    "bad loss_scale": lambda ps: gameopt.Game(ps, _losses, loss_scale=2.0),
    "not an algorithm": lambda ps: gameopt.Game(ps, _losses, algorithm="SimGD"),
    "a learning rate per player missing": lambda ps: gameopt.Game(
        ps, _losses, algorithm=gameopt.SimGD([0.1, 0.2, 0.3])
    ),
    "algorithm bound elsewhere": lambda ps: gameopt.Game(ps, _losses, algorithm=_bound_elsewhere()),
    "non-finite start": lambda ps: gameopt.Game(
        [*ps, Player(torch.tensor([float("nan")], requires_grad=True))], _losses
    ),
    "second order on constrained players": lambda ps: gameopt.Game(
        [*ps, Player(nn.Linear(2, 2).double(), constraint=gameopt.constraints.Box(-1.0, 1.0))],
        _losses,
        algorithm=gameopt.LOLA(0.1),
    ),
    "a parameter owned twice": lambda ps: gameopt.Game([*ps, ps[0].module if isinstance(ps[0], Player) else ps[0]]),
}


def _snapshot(modules: list[nn.Module]) -> list[tuple[int, torch.Tensor, torch.Tensor | None]]:
    return [
        (p.data_ptr(), p.detach().clone(), None if p.grad is None else p.grad.clone())
        for m in modules
        for p in m.parameters()
    ]


def _two_linears() -> list[nn.Module]:
    torch.manual_seed(0)
    modules = [nn.Linear(2, 2).double(), nn.Linear(2, 2).double()]
    for m in modules:
        m(torch.ones(1, 2, dtype=F64)).sum().backward()
    return modules


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_game_leaves_the_players_it_was_given_as_they_were(refusal: str) -> None:
    modules = _two_linears()
    players = [Player(m) for m in modules]  # the same default name, "Linear": a game would rename them
    flats = [p.flat_param for p in players]
    before = _snapshot(modules)
    with pytest.raises((ValueError, TypeError)):
        REFUSALS[refusal](players)
    assert [p.name for p in players] == ["Linear", "Linear"]
    for (ptr, value, grad), p in zip(before, [p for m in modules for p in m.parameters()]):
        assert p.data_ptr() == ptr and torch.equal(p, value) and torch.equal(p.grad, grad)
    assert all(p.flat_param is flat for p, flat in zip(players, flats)) and all(not p.refresh() for p in players)
    # an identically built game then matches a game built from fresh players
    game = gameopt.Game(players, lambda: tuple(m.weight.sum() for m in modules))
    fresh = gameopt.Game([Player(m) for m in _two_linears()], lambda: (torch.zeros(()),) * 2)
    fresh.check_state_dict(game.state_dict())


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_game_leaves_the_modules_it_was_given_unfused(refusal: str) -> None:
    modules = _two_linears()
    before = _snapshot(modules)
    with pytest.raises((ValueError, TypeError)):
        REFUSALS[refusal](modules)
    params = [p for m in modules for p in m.parameters()]
    for (_, value, grad), p in zip(before, params):
        assert torch.equal(p, value) and torch.equal(p.grad, grad)
        assert not tc.post_accumulate_grad_hooks(p)  # no gameopt hook left behind
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)  # each its own storage again


def test_a_refused_game_does_not_project_its_start() -> None:
    outside = torch.tensor([2.0, -3.0], dtype=F64)
    player = Player(torch.nn.Parameter(outside.clone()), constraint=gameopt.constraints.Box(-1.0, 1.0))
    with pytest.raises(ValueError, match="3 learning rates for 2 players"):
        gameopt.Game([player, nn.Linear(2, 1).double()], _losses, algorithm=gameopt.SimGD([0.1, 0.2, 0.3]))
    assert torch.equal(player.flat_param, outside)


# ------------------------------------------ item 19: what holds a parameter
class _KeepsAView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3, dtype=F64))
        with torch.no_grad():
            self.w_view = self.weight[:2]  # a plain view, no graph


def test_a_module_keeping_a_view_of_its_weight_is_refused_naming_the_view() -> None:
    m = _KeepsAView()
    ptr = m.weight.data_ptr()
    with pytest.raises(
        RuntimeError, match=r"parameter 'weight' of _KeepsAView: attribute _KeepsAView\.w_view is a view"
    ) as info:
        Player(m)
    assert "autograd graph" not in str(info.value)
    assert m.weight.data_ptr() == ptr
    del m.w_view
    with torch.no_grad():
        elsewhere = m.weight[1:]  # a view the module does not keep
    with pytest.raises(RuntimeError, match=r"parameter 'weight' of _KeepsAView: something else references it") as info:
        Player(m)
    assert "autograd graph" not in str(info.value) and m.weight.data_ptr() == ptr
    del elsewhere
    assert _inside(m.weight, Player(m).flat_param)


def test_a_weakly_referenced_parameter_is_refused_before_anything_moves() -> None:
    m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1)).double()
    ref = weakref.ref(m[1].weight)
    ptrs = [p.data_ptr() for p in m.parameters()]
    with pytest.raises(RuntimeError, match=r"parameter 'weight' of Linear: a weak reference to it is alive"):
        Player(m)
    assert [p.data_ptr() for p in m.parameters()] == ptrs and not any(
        map(tc.post_accumulate_grad_hooks, m.parameters())
    )
    del ref


@pytest.fixture
def world_of_one(tmp_path):
    """A gloo process group of one rank (this process)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_distributed_data_parallel_is_refused_naming_the_unwrapped_module(world_of_one) -> None:
    gen, disc = gan_mlps(width=4)
    ddp = nn.parallel.DistributedDataParallel(gen)
    ptrs = [p.data_ptr() for p in gen.parameters()]
    with pytest.raises(ValueError, match=r"DistributedDataParallel wrapper.*ddp\.module.*process_group="):
        gameopt.Game([ddp, disc], _losses)
    assert [p.data_ptr() for p in gen.parameters()] == ptrs
    with pytest.raises(RuntimeError, match=r"DistributedDataParallel wrapper still holds it.*ddp\.module"):
        gameopt.Game([ddp.module, disc], _losses, process_group=world_of_one)
    assert [p.data_ptr() for p in gen.parameters()] == ptrs
    del ddp
    gc.collect()
    z = torch.randn(4, 2, dtype=F64)
    game = gameopt.Game([gen, disc], lambda: (disc(gen(z)).mean(), -disc(gen(z)).mean()), process_group=world_of_one)
    game.step()


def test_a_deep_copy_of_a_data_parallel_game_averages_over_the_same_group(world_of_one, monkeypatch) -> None:
    gen, disc = gan_mlps(width=4)

    def losses(x, z):
        f = disc(x).mean() - disc(gen(z)).mean()
        return f, -f

    game = gameopt.Game([gen, disc], losses, algorithm=gameopt.SimGD(0.1), process_group=world_of_one)
    twin = copy.deepcopy(game)
    groups, all_reduce = [], dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: groups.append(k.get("group")) or all_reduce(t, *a, **k))
    for x, z in _batches(2, seed=4):
        twin.step(x, z)
        assert groups and all(g is world_of_one for g in groups)  # the copy averages over the group itself
        game.step(x, z)
    assert_same_state(twin.state_dict(), game.state_dict())
