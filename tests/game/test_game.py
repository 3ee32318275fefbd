"""Game: the joint vector field, Jacobian products, bad input, checkpoints."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from games import GAMES, WAIT, assert_same_state, during_second_evaluation, saved_and_loaded
from models import VecModule, gan_mlps
from torch import nn

import gameopt


def _flat(per_player) -> torch.Tensor:
    return torch.cat([t if isinstance(t, torch.Tensor) else torch.cat(t) for t in per_player])


@pytest.mark.parametrize("game_name", list(GAMES))
@pytest.mark.parametrize("raw", [False, True], ids=["module", "params"])
def test_vector_field_and_jacobian_products_match_closed_form(game_name: str, raw: bool) -> None:
    tg = GAMES[game_name]()
    game = tg.build(gameopt.SimGD(0.1), raw=raw)
    ws = tg.params()
    torch.testing.assert_close(_flat(game.vector_field()), torch.cat(tg.xi_ref(ws)), rtol=1e-13, atol=1e-13)
    J = tg.jac_ref(ws)
    g = torch.Generator().manual_seed(3)
    v = tuple(torch.randn(w.numel(), generator=g, dtype=torch.float64) for w in ws)
    torch.testing.assert_close(_flat(game.jvp(v)), J @ torch.cat(v), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_flat(game.vjp(v)), J.T @ torch.cat(v), rtol=1e-12, atol=1e-12)


def test_jvp_double_backward_fallback_matches_forward_mode() -> None:
    tg = GAMES["nonquadratic"]()
    game = tg.build(gameopt.SimGD(0.1))
    v = tuple(torch.randn(2, dtype=torch.float64) for _ in range(3))
    forward = _flat(game.jvp(v))
    game.step_context.problem.forward_mode.ok = False  # the double-backward fallback from now on
    torch.testing.assert_close(_flat(game.jvp(v)), forward, rtol=1e-12, atol=1e-12)


def _gan(dtype=torch.float64, seed=0):
    gen, disc = gan_mlps(16, dtype, seed)
    x = torch.randn(32, 2, dtype=dtype)
    z = torch.randn(32, 2, dtype=dtype)

    def losses(x=x, z=z):
        real, fake = disc(x), disc(gen(z))
        d_loss = nn.functional.softplus(-real).mean() + nn.functional.softplus(fake).mean()
        g_loss = nn.functional.softplus(-fake).mean()
        return g_loss, d_loss

    return gen, disc, losses


def test_adjoint_identity_on_a_real_network() -> None:
    gen, disc, losses = _gan()
    game = gameopt.Game([gen, disc], losses)
    g = torch.Generator().manual_seed(1)
    u = tuple(torch.randn(p.numel, generator=g, dtype=torch.float64) for p in game.players)
    v = tuple(torch.randn(p.numel, generator=g, dtype=torch.float64) for p in game.players)
    lhs = torch.dot(_flat(u), _flat(game.jvp(v)))
    rhs = torch.dot(_flat(game.vjp(u)), _flat(v))
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-12)


def test_vector_field_is_each_players_own_gradient() -> None:
    gen, disc, losses = _gan()
    ref_g, ref_d = copy.deepcopy(gen), copy.deepcopy(disc)
    game = gameopt.Game([gen, disc], losses)
    xi_g, xi_d = game.vector_field()
    # reference: plain autograd on unfused copies
    x, z = losses.__defaults__
    real, fake = ref_d(x), ref_d(ref_g(z))
    d_loss = nn.functional.softplus(-real).mean() + nn.functional.softplus(fake).mean()
    g_loss = nn.functional.softplus(-fake).mean()
    gg = torch.autograd.grad(g_loss, list(ref_g.parameters()), retain_graph=True)
    gd = torch.autograd.grad(d_loss, list(ref_d.parameters()))
    torch.testing.assert_close(xi_g, torch.cat([t.reshape(-1) for t in gg]))
    torch.testing.assert_close(xi_d, torch.cat([t.reshape(-1) for t in gd]))


def test_step_arguments_reach_losses_and_one_batch_serves_extragradient() -> None:
    gen, disc, losses = _gan()
    calls = []

    def counted(x, z):
        calls.append((x, z))
        return losses(x, z)

    game = gameopt.Game([gen, disc], counted, algorithm=gameopt.Extragradient(0.01))
    x, z = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    out = game.step(x, z=z)
    assert len(calls) == 2 and all(c[0] is x and c[1] is z for c in calls)
    assert len(out) == 2 and all(t.dim() == 0 and not t.requires_grad for t in out)


def test_default_algorithm_and_players_own_losses() -> None:
    torch.manual_seed(0)
    gen, disc = nn.Linear(2, 2), nn.Linear(2, 1)
    z = torch.randn(16, 2)
    g_player = gameopt.Player(gen, loss=lambda: -disc(gen(z)).mean())
    d_player = gameopt.Player(disc, loss=lambda: disc(gen(z)).mean())
    game = gameopt.Game([g_player, d_player])
    assert isinstance(game.algorithm, gameopt.SimGD) and game.algorithm.lrs == [1e-3, 1e-3]
    before = g_player.flat_param.clone()
    xi_g, _ = game.vector_field()
    game.step()
    torch.testing.assert_close(g_player.flat_param, before - 1e-3 * xi_g)


def test_joint_vector_is_one_tensor_per_dtype_group() -> None:
    mods = [nn.Linear(3, 3) for _ in range(5)]
    game = gameopt.Game(mods, lambda: [m(torch.ones(1, 3)).sum() for m in mods])
    assert len(game.layout.data) == 1 and game.layout.data[0].numel() == 5 * 12
    ptr = game.layout.data[0].data_ptr()
    for i, p in enumerate(game.players):
        assert p.flat_param.data_ptr() == ptr + 12 * 4 * i
        assert mods[i].weight.data_ptr() == p.flat_param.data_ptr()


def test_parameter_owned_by_two_players_is_rejected() -> None:
    shared = nn.Linear(2, 2)
    a, b = nn.Sequential(shared, nn.Tanh()), nn.Sequential(nn.Linear(2, 2), shared)
    with pytest.raises(ValueError, match="owned by two players: 'a' and 'b'"):
        gameopt.Game([gameopt.Player(a, name="a"), gameopt.Player(b, name="b")], lambda: [])


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda ws: [ws[0].sum()], "returned 1 values for 2 players"),
        (lambda ws: [ws[0] * ws[1], -(ws[0] @ ws[1])], "player 'p0' is not a scalar"),
        (lambda ws: [(ws[0] @ ws[1]), ws[0].sum()], "player 'p1' does not depend"),
        (lambda ws: [(ws[0] @ ws[1]), torch.tensor(1.0, dtype=torch.float64)], "player 'p1' does not depend"),
    ],
)
@pytest.mark.parametrize("algo", [gameopt.SimGD, gameopt.Extragradient])
def test_bad_losses_raise_naming_the_player_and_change_nothing(bad, match, algo) -> None:
    tg = GAMES["bilinear"]()
    tg.losses_fn = bad
    game = tg.build(algo(0.1))
    before = tg.params()
    with pytest.raises(ValueError, match=match):
        game.step()
    for a, b in zip(tg.params(), before):
        assert torch.equal(a, b)


def _state_tensors(game):
    sd = game.state_dict()
    return copy.deepcopy(sd)


@pytest.mark.parametrize(
    "make, where",
    [
        (lambda: gameopt.SimGD(0.1), "first"),
        (lambda: gameopt.Optimistic(0.1, update=gameopt.Adam()), "first"),
        (lambda: gameopt.Extragradient(0.1), "first"),
        (lambda: gameopt.Extragradient(0.1), "second"),  # at the extrapolated point
        (lambda: gameopt.AltGD(0.1), "second"),  # after the first player moved
        (lambda: gameopt.Lookahead(gameopt.Extragradient(0.1, update=gameopt.Adam()), k=2), "second"),
        (lambda: gameopt.HamiltonianGD(0.1), "first"),
        (lambda: gameopt.ConsensusOptimization(0.1, update=gameopt.Adam()), "first"),
        (lambda: gameopt.SGA(0.1), "first"),
        (lambda: gameopt.LA(0.1, alpha=0.3), "first"),
        (lambda: gameopt.LOLA(0.1, alpha=0.3, shaping_only=True), "first"),
        (lambda: gameopt.SOS(0.1, alpha=0.3), "first"),
        (lambda: gameopt.CGD(0.1), "first"),
    ],
)
def test_non_finite_field_refuses_the_step_and_changes_nothing(make, where) -> None:
    tg = GAMES["bilinear"]()
    armed = {"on": False, "calls": 0}

    def losses(ws):
        f = ws[0] @ ws[1]
        armed["calls"] += 1
        if armed["on"] and (where == "first" or armed["calls"] > 1):
            f = f * float("nan")
        return [f, -f]

    tg.losses_fn = losses
    game = tg.build(make())
    game.step()
    game.step()
    before_params, before_state = tg.params(), _state_tensors(game)
    armed.update(on=True, calls=0)
    with pytest.raises(gameopt.NonFiniteError, match="not finite"):
        game.step()
    for a, b in zip(tg.params(), before_params):
        assert torch.equal(a, b)
    assert_same_state(game.state_dict(), before_state)
    if where == "first" and isinstance(game.algorithm, gameopt.Extragradient):
        assert armed["calls"] == 1  # never evaluated at a non-finite extrapolated point


FIRST_ORDER = {
    "SimGD": lambda: gameopt.SimGD(0.05),
    "SimGD+Momentum": lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.5)),
    "SimGD+Nesterov": lambda: gameopt.SimGD(0.05, update=gameopt.Momentum(0.5, nesterov=True)),
    "SimGD+Adam": lambda: gameopt.SimGD(0.05, update=gameopt.Adam()),
    "Extragradient": lambda: gameopt.Extragradient(0.05),
    "Extra-Adam": lambda: gameopt.Extragradient([0.05, 0.02, 0.03], update=gameopt.Adam()),
    "Optimistic": lambda: gameopt.Optimistic(0.05),
    "Optimistic+Adam": lambda: gameopt.Optimistic(0.05, update=gameopt.Adam()),
}


@pytest.mark.parametrize("name", list(FIRST_ORDER))
def test_state_dict_is_a_snapshot_that_later_steps_do_not_touch(name) -> None:
    game = GAMES["quadratic"]().build(FIRST_ORDER[name]())
    game.step()
    saved = game.state_dict()
    frozen = copy.deepcopy(saved)
    for _ in range(4):
        game.step()
    assert_same_state(saved, frozen)


def test_skip_option_skips_non_finite_steps() -> None:
    tg = GAMES["bilinear"]()
    bad = {"on": True}
    tg.losses_fn = lambda ws: [ws[0] @ ws[1] * (float("inf") if bad["on"] else 1.0), -(ws[0] @ ws[1])]
    game = tg.build(gameopt.SimGD(0.1))
    game.on_nonfinite = "skip"
    before = tg.params()
    game.step()
    assert game.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))
    bad["on"] = False
    game.step()
    assert not torch.equal(tg.params()[0], before[0])


def test_overflowing_update_is_refused() -> None:
    tg = GAMES["bilinear"]()
    tg.init = [torch.full((3,), 1e300, dtype=torch.float64), torch.full((3,), 1e300, dtype=torch.float64)]
    game = tg.build(gameopt.SimGD(1e10))
    before = tg.params()
    with pytest.raises(gameopt.NonFiniteError):
        game.step()
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))


def test_load_state_dict_rejects_mismatches_and_changes_nothing() -> None:
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.Optimistic(0.1))
    game.step()
    good = game.state_dict()
    before = tg.params()
    other = GAMES["bilinear"]().build(gameopt.Optimistic(0.1))
    with pytest.raises(ValueError):
        game.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="SimGD"):
        game.load_state_dict(GAMES["quadratic"]().build(gameopt.SimGD(0.1)).state_dict())
    wrong_dtype = copy.deepcopy(good)
    wrong_dtype["players"][0]["params"][0] = wrong_dtype["players"][0]["params"][0].float()
    with pytest.raises(ValueError, match="float64"):
        game.load_state_dict(wrong_dtype)
    wrong_shape = copy.deepcopy(good)
    wrong_shape["algorithm"]["state"]["prev"][0] = torch.zeros(5, dtype=torch.float64)
    with pytest.raises(ValueError):
        game.load_state_dict(wrong_shape)
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))
    assert_same_state(game.state_dict(), good)


def test_checkpoint_file_loads_with_weights_only(tmp_path) -> None:
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.Lookahead(gameopt.Extragradient(0.1, update=gameopt.Adam()), k=2))
    for _ in range(3):
        game.step()
    path = tmp_path / "ckpt.pt"
    torch.save(game.state_dict(), path)
    sd = torch.load(path, weights_only=True)
    assert_same_state(sd, game.state_dict())


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
    gen, disc, losses = _gan()
    game = gameopt.Game([gen, disc], losses)
    opt = torch.optim.SGD(gen.parameters(), lr=0.1)
    before = game.players[0].flat_param.clone()
    opt.zero_grad()
    losses()[0].backward()
    opt.step()
    assert not torch.equal(game.players[0].flat_param, before)
    assert gen[0].weight.grad.data_ptr() == game.players[0].grad.data_ptr()


# ---------------------------------------------------------- nothing lost (issue 11)
def _adam_game():
    tg = GAMES["quadratic"]()
    game = tg.build(gameopt.Extragradient(0.1, update=gameopt.Adam()))
    for _ in range(2):
        game.step()
    return tg, game


def _malformed(sd):
    """(description, a malformed copy of ``sd``) for every way a state can be wrong."""
    cases = []

    def case(name, edit):
        bad = copy.deepcopy(sd)
        edit(bad)
        cases.append((name, bad))

    case("skipped_steps None", lambda s: s.__setitem__("skipped_steps", None))
    case("skipped_steps negative", lambda s: s.__setitem__("skipped_steps", -1))
    case("skipped_steps missing", lambda s: s.pop("skipped_steps"))
    case("players entry not a dict", lambda s: s["players"].__setitem__(1, "oops"))
    case("players not a list", lambda s: s.__setitem__("players", {"a": 1}))
    case("algorithm not a dict", lambda s: s.__setitem__("algorithm", [1, 2]))
    case("algorithm missing", lambda s: s.pop("algorithm"))
    case("params missing", lambda s: s["players"][0].pop("params"))
    case("params not a list", lambda s: s["players"][0].__setitem__("params", None))
    case("lr a string", lambda s: s["algorithm"]["param_groups"][0].__setitem__("lr", "0.1"))
    case("lr nan", lambda s: s["algorithm"]["param_groups"][1].__setitem__("lr", float("nan")))
    case("param_groups short", lambda s: s["algorithm"]["param_groups"].pop())
    case("adam step None", lambda s: s["algorithm"]["state"]["rule"].__setitem__("t", None))
    case("adam step a float", lambda s: s["algorithm"]["state"]["rule"].__setitem__("t", 2.5))
    case("adam moment wrong shape", lambda s: s["algorithm"]["state"]["rule"]["m"].__setitem__(0, torch.zeros(2)))
    case("state not a dict", lambda s: s["algorithm"].__setitem__("state", 3))
    case("not a dict at all", lambda s: s.clear())
    cases.append(("a list", [sd]))
    return cases


def test_every_malformed_state_dict_is_a_value_error_that_changes_nothing() -> None:
    tg, game = _adam_game()
    good = game.state_dict()
    game.step()  # the game now differs from ``good``
    now = _state_tensors(game)
    for name, bad in _malformed(good):
        try:
            game.load_state_dict(bad)
        except ValueError:
            pass
        else:
            pytest.fail(f"accepted a state_dict with {name}")
        assert_same_state(game.state_dict(), now)
    game.load_state_dict(good)  # a good one still loads
    assert_same_state(game.state_dict(), good)


def test_state_dict_carries_module_buffers_and_a_game_checkpoint_alone_resumes(tmp_path) -> None:
    def make(seed):
        torch.manual_seed(seed)
        gen = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).double()
        disc = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).double()
        data = torch.Generator().manual_seed(1)
        batches = [(torch.randn(16, 2, generator=data, dtype=torch.float64),) * 2 for _ in range(6)]

        def losses(x, z):
            real, fake = disc(x), disc(gen(z))
            return fake.mean(), real.mean() - fake.mean()

        return gen, disc, gameopt.Game([gen, disc], losses, algorithm=gameopt.SimGD(0.05)), batches

    gen, disc, game, batches = make(0)
    for x, z in batches[:3]:
        game.step(x, z)
    sd = game.state_dict()
    assert set(sd["players"][0]["buffers"]) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    torch.save(sd, tmp_path / "game.pt")
    for x, z in batches[3:]:
        game.step(x, z)
    gen2, disc2, resumed, _ = make(1)  # other initial values everywhere
    resumed.load_state_dict(torch.load(tmp_path / "game.pt", weights_only=True))
    for x, z in batches[3:]:
        resumed.step(x, z)
    for m, m2 in ((gen, gen2), (disc, disc2)):
        for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
            assert torch.equal(a, b), k


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
    with pytest.raises(ValueError, match="torch.compile'd modules do not support"):
        gameopt.Game(list(compiled.players), compiled.losses, algorithm=gameopt.SGA(0.1))


# ------------------------------------------------ one step at a time (issue 22)


def _thread_game(pause: Callable[[], None] = lambda: None, make=None):
    """A small deterministic two-player game (tanh couplings, float64), Extra-Adam by
    default; ``pause()`` runs inside every evaluation of the losses."""
    torch.manual_seed(0)
    x, y = nn.Parameter(torch.randn(4, dtype=torch.float64)), nn.Parameter(torch.randn(4, dtype=torch.float64))
    A = torch.randn(4, 4, dtype=torch.float64)

    def losses():
        pause()
        f = torch.tanh(x) @ A @ torch.tanh(y) + 0.1 * x.square().sum()
        return f, -f + 0.1 * y.square().sum()

    algorithm = make() if make else gameopt.Extragradient(0.05, update=gameopt.Adam())
    game = gameopt.Game([gameopt.Player([x], name="x"), gameopt.Player([y], name="y")], losses, algorithm=algorithm)
    return game, x, y


def test_two_threads_stepping_one_game_apply_every_step_whole() -> None:
    steps = 12
    ref, *_ = _thread_game()
    for _ in range(2 * steps):
        ref.step()
    game, *_ = _thread_game(pause=lambda: time.sleep(0.0005))  # hands the interpreter to the other thread
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(lambda: [game.step() for _ in range(steps)]) for _ in range(2)]
        for run in runs:
            run.result(timeout=60)
    assert_same_state(game.state_dict(), ref.state_dict())  # every step applied whole: 2N steps in some order


def test_state_dict_from_another_thread_during_a_step_is_the_state_before_or_after_it() -> None:
    inside, asked = threading.Event(), threading.Event()
    game, *_ = _thread_game(pause=during_second_evaluation(inside, asked))
    before = game.state_dict()

    def read():
        assert inside.wait(WAIT)
        asked.set()
        return game.state_dict()

    with ThreadPoolExecutor(1) as pool:
        seen = pool.submit(read)
        game.step()
        seen = seen.result(timeout=WAIT)
    after = game.state_dict()
    assert not torch.equal(after["players"][0]["params"][0], before["players"][0]["params"][0])
    assert_same_state(seen, after)  # the call waited for the step (never the extrapolated point)


def test_load_state_dict_from_another_thread_during_a_step_waits_for_it_and_is_not_overwritten() -> None:
    inside, asked = threading.Event(), threading.Event()
    game, *_ = _thread_game(pause=during_second_evaluation(inside, asked))
    other, *_ = _thread_game()
    for _ in range(3):
        other.step()
    saved = other.state_dict()

    def load():
        assert inside.wait(WAIT)
        asked.set()
        game.load_state_dict(saved)

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(load)
        game.step()
        done.result(timeout=WAIT)
    assert_same_state(game.state_dict(), saved)  # loaded after the step, not written over by it


def test_a_step_may_call_into_its_own_game_from_its_thread() -> None:
    seen = []
    game, x, y = _thread_game()

    def losses():
        seen.append(game.state_dict()["players"][0]["params"][0])  # re-entrant: no deadlock
        f = torch.tanh(x).sum() * torch.tanh(y).sum()
        return f, -f

    game.losses = losses
    start = x.detach().clone()
    game.optimizer.step()  # the torch.optim path: optimizer.step -> step_closure
    after_one = x.detach().clone()
    game.step()
    # two evaluations per step (the second at the extrapolated point, which the closure's own thread sees)
    assert len(seen) == 4 and torch.equal(seen[0], start) and torch.equal(seen[2], after_one)
    assert not torch.equal(start, after_one)


def test_a_step_from_another_thread_waits_for_an_averaged_block() -> None:
    avg = gameopt.Averaging(gameopt.SimGD(0.1))
    game, x, y = _thread_game(make=lambda: avg)
    game.step()
    game.step()
    ref, rx, _ = _thread_game(make=lambda: gameopt.Averaging(gameopt.SimGD(0.1)))
    for _ in range(3):
        ref.step()
    started = threading.Event()

    def step():
        started.set()
        game.step()

    with ThreadPoolExecutor(1) as pool:
        with avg.averaged():
            at_average = x.detach().clone()
            run = pool.submit(step)
            assert started.wait(WAIT)
            time.sleep(0.05)
            assert not run.done()  # it waits for the block
            assert torch.equal(x.detach(), at_average)
            game.vector_field()  # the block's own thread may use the game
        run.result(timeout=WAIT)
    assert torch.equal(x.detach(), rx.detach())  # the step was taken from the restored point, and kept


def test_a_player_on_the_meta_device_is_refused_when_the_game_is_built() -> None:
    w = nn.Parameter(torch.empty(3, device="meta"))
    v = nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="parameter 0 .* is on the meta device"):
        gameopt.Game([gameopt.Player([w], name="m"), gameopt.Player([v])], lambda: (w.sum(), v.sum()))
