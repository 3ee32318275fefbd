"""Players inside a running game: mixed dtypes, a module converted, a parameter added, removed,
unused or frozen mid-run, algorithm state following its parameter, compiled modules, no_grad."""

from __future__ import annotations

import copy

import pytest
import torch
from games import GAMES, saved_and_loaded
from models import VecModule, gan_with_losses
from torch import nn

import gameopt


# ---------------------------------------------------------- player corner cases
def test_mixed_dtype_players_step_and_match_a_float64_reference() -> None:
    torch.manual_seed(0)
    a = nn.Linear(3, 3).double()
    b = nn.Linear(3, 3)
    b.bias = nn.Parameter(b.bias.detach().double())  # one module, two dtypes
    x = torch.randn(4, 3, dtype=torch.float64)

    def losses():
        h = a(x)
        out = (h.float() @ b.weight.T).double() + b.bias
        return (h**2).mean() + out.mean(), -(out**2).mean()

    ref_a, ref_b = copy.deepcopy(a), copy.deepcopy(b)
    pb = gameopt.Player(b)
    assert len(pb.buffers) == 2
    with pytest.raises(ValueError, match="player.buffers"):
        _ = pb.flat_param
    game = gameopt.Game([a, pb], losses, algorithm=gameopt.Optimistic([0.1, 0.05]))
    assert len(game.layout.data) == 2  # one joint tensor per dtype
    for _ in range(3):
        game.step()
    # reference: the same updates by hand on unfused copies
    prev = None
    for _ in range(3):
        h = ref_a(x)
        out = (h.float() @ ref_b.weight.T).double() + ref_b.bias
        la, lb = (h**2).mean() + out.mean(), -(out**2).mean()
        ga = torch.autograd.grad(la, list(ref_a.parameters()), retain_graph=True)
        gb = torch.autograd.grad(lb, list(ref_b.parameters()))
        cur = list(ga) + list(gb)
        prev = cur if prev is None else prev
        lrs = [0.1] * len(ga) + [0.05] * len(gb)
        with torch.no_grad():
            for p, c, q, lr in zip(list(ref_a.parameters()) + list(ref_b.parameters()), cur, prev, lrs):
                p.sub_(lr * (2 * c - q))
        prev = cur
    for p, q in zip(list(a.parameters()) + list(b.parameters()), list(ref_a.parameters()) + list(ref_b.parameters())):
        assert p.dtype == q.dtype
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_module_converted_mid_run_keeps_values_and_state() -> None:
    tg = GAMES["quadratic"]()
    tg.init = [w.float() for w in tg.init]
    game = tg.build(gameopt.Optimistic(0.05, update=gameopt.Momentum(0.5)), dtype=torch.float32)
    for _ in range(2):
        game.step()
    prev32 = [t.clone() for t in game.algorithm_state["prev"]]
    tg.modules[1].double()
    tg.losses_fn_orig = tg.losses_fn
    game.step()  # notices, re-fuses, carries state over
    assert tg.modules[1].w.dtype == torch.float64
    assert len(game.layout.data) == 2
    assert tg.modules[1].w.data_ptr() == game.players[1].flat_param.data_ptr()
    assert game.algorithm_state["prev"][1].dtype == torch.float64
    del prev32


def test_unused_parameters_get_exact_zero_field() -> None:
    used, unused = nn.Linear(2, 2).double(), nn.Linear(2, 2).double()
    holder = nn.ModuleList([used, unused])
    other = VecModule(torch.ones(2, dtype=torch.float64))
    x = torch.randn(3, 2, dtype=torch.float64)
    game = gameopt.Game([holder, other], lambda: [used(x).sum() * other.w.sum(), -(used(x).sum() * other.w.sum())])
    game.layout.grad[0].fill_(7.0)  # stale garbage must not survive
    xi_h, _ = game.vector_field()
    n_used = sum(p.numel() for p in used.parameters())
    assert torch.all(xi_h[n_used:] == 0)
    assert torch.any(xi_h[:n_used] != 0)


def test_player_module_still_trains_with_torch_optim_after_game_fusing() -> None:
    gen, disc, losses = gan_with_losses()
    game = gameopt.Game([gen, disc], losses)
    opt = torch.optim.SGD(gen.parameters(), lr=0.1)
    before = game.players[0].flat_param.clone()
    opt.zero_grad()
    losses()[0].backward()
    opt.step()
    assert not torch.equal(game.players[0].flat_param, before)
    assert gen[0].weight.grad.data_ptr() == game.players[0].grad.data_ptr()


class _Separable(nn.Module):
    """Parameters that each minimize their own quadratic: a parameter's trajectory
    depends on nothing but its own values and algorithm state."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64))
        self.c = nn.Parameter(torch.tensor([[0.3, -0.7]], dtype=torch.float64))

    def loss(self) -> torch.Tensor:
        scale = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.5}
        return sum(scale[n] * (p**2).sum() + p.sum() for n, p in self.named_parameters())


def _separable_game(make_algo):
    m, other = _Separable(), VecModule(torch.tensor([0.5], dtype=torch.float64))
    game = gameopt.Game([m, other], lambda: (m.loss(), (other.w**2).sum()), algorithm=make_algo())
    return m, game


SEPARABLE = {
    "SimGD-momentum": lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.9)),
    "Extra-Adam": lambda: gameopt.Extragradient(0.05, update=gameopt.Adam()),
    "Optimistic-Adam": lambda: gameopt.Optimistic(0.05, update=gameopt.Adam()),
    "Lookahead-SimGD-momentum": lambda: gameopt.Lookahead(gameopt.SimGD(0.05, update=gameopt.Momentum(0.9)), k=2),
}


@pytest.mark.parametrize("name", list(SEPARABLE))
def test_state_follows_its_parameter_when_another_is_removed(name) -> None:
    m, game = _separable_game(SEPARABLE[name])
    ref, ref_game = _separable_game(SEPARABLE[name])
    for _ in range(3):
        game.step()
        ref_game.step()
    del m.a  # b and c keep their own momentum, whatever their position
    for _ in range(4):
        game.step()
        ref_game.step()
    assert not hasattr(m, "a")
    assert torch.equal(m.b, ref.b) and torch.equal(m.c, ref.c)


@pytest.mark.parametrize("name", list(SEPARABLE))
def test_state_loaded_from_a_checkpoint_still_follows_its_parameter(name) -> None:
    """A checkpoint stores joint vectors as plain lists; loading types them again, so
    a re-fuse after a load carries each parameter's state as without the load."""

    m, game = _separable_game(SEPARABLE[name])
    ref, ref_game = _separable_game(SEPARABLE[name])
    for _ in range(3):
        game.step()
        ref_game.step()
    loaded = saved_and_loaded(game.state_dict())
    m, game = _separable_game(SEPARABLE[name])
    game.load_state_dict(loaded)
    vectors = [v for v in _lists(game.algorithm_state) if len(v) == len(game.layout.data)]
    assert vectors and all(isinstance(v, gameopt.Vec) for v in vectors)
    del m.a
    del ref.a
    for _ in range(4):
        game.step()
        ref_game.step()
    assert torch.equal(m.b, ref.b) and torch.equal(m.c, ref.c)


def _lists(obj):
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _lists(v)]
    if isinstance(obj, list) and obj and all(isinstance(t, torch.Tensor) for t in obj):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _lists(v)]
    return []


@pytest.mark.parametrize("name", list(SEPARABLE))
def test_a_parameter_added_after_the_game_was_built_trains_with_fresh_state(name) -> None:
    m, game = _separable_game(SEPARABLE[name])
    for _ in range(4):
        game.step()
    m.d = nn.Parameter(torch.tensor([1.5, -2.0], dtype=torch.float64))
    # the same parameter in a game of its own, from the start
    alone, other = nn.Module(), VecModule(torch.tensor([0.5], dtype=torch.float64))
    alone.d = nn.Parameter(torch.tensor([1.5, -2.0], dtype=torch.float64))
    g2 = gameopt.Game(
        [alone, other],
        lambda: (0.5 * (alone.d**2).sum() + alone.d.sum(), (other.w**2).sum()),
        algorithm=SEPARABLE[name](),
    )
    for _ in range(4):
        g2.step()
    moved = m.d.detach().clone()
    for _ in range(4):
        game.step()
    assert not torch.equal(m.d, moved)  # trained
    if "Adam" in name:
        # fresh moments, but Adam's step count (bias correction) is the game's
        assert torch.allclose(m.d, alone.d, rtol=0.2)
    else:
        assert torch.equal(m.d, alone.d)


SECOND_ORDER_TOO = {
    **SEPARABLE,
    "SGA": lambda: gameopt.SGA(0.05),
    "Consensus": lambda: gameopt.ConsensusOptimization(0.05, gamma=0.5),
    "LOLA": lambda: gameopt.LOLA(0.05, alpha=0.3),
    "CGD": lambda: gameopt.CGD(0.05),
    "AltGD": lambda: gameopt.AltGD(0.05),
}


@pytest.mark.parametrize("name", list(SECOND_ORDER_TOO))
def test_requires_grad_false_after_fusing_freezes_the_parameter_in_every_algorithm(name) -> None:
    m, game = _separable_game(SECOND_ORDER_TOO[name])
    game.step()
    m.b.requires_grad_(False)
    frozen = m.b.detach().clone()
    before_c = m.c.detach().clone()
    for _ in range(3):
        game.step()
    assert torch.equal(m.b, frozen)
    assert not torch.equal(m.c, before_c)  # the others still train


@pytest.mark.parametrize(
    "make",
    [
        lambda: gameopt.SimGD(0.1),
        lambda: gameopt.Extragradient(0.1, update=gameopt.Adam()),
        lambda: gameopt.SGA(0.1),
        lambda: gameopt.CGD(0.1),
    ],
)
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_step_works_inside_no_grad_and_inference_mode(make, mode) -> None:
    tg, ref = GAMES["nonquadratic"](), GAMES["nonquadratic"]()
    game, ref_game = tg.build(make()), ref.build(make())
    for _ in range(2):
        with mode():
            losses = game.step()
        ref_losses = ref_game.step()
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), ref.params()))


# torch.compile inspects a non-leaf input's .grad (d(g(x))) and PyTorch warns about it
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compiled_modules_keep_their_names_and_checkpoints_move_between_compiled_and_eager() -> None:
    def make(compiled):
        torch.manual_seed(0)
        gen = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)).double()
        disc = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).double()
        g, d = (torch.compile(gen, backend="eager"), torch.compile(disc, backend="eager")) if compiled else (gen, disc)
        x = torch.randn(16, 2, dtype=torch.float64)
        return gameopt.Game([g, d], lambda: (-d(g(x)).mean(), d(g(x)).mean() - d(x).mean()))

    compiled, eager = make(True), make(False)
    assert [p.name for p in compiled.players] == [p.name for p in eager.players] == ["Sequential_0", "Sequential_1"]
    compiled.step()
    eager.load_state_dict(compiled.state_dict())
    buffers = set(eager.state_dict()["players"][0]["buffers"])
    assert buffers == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
