"""Game: the joint vector field and its Jacobian products, the step's arguments, bad losses and
non-finite fields refused with nothing changed, the state dict's snapshot."""

from __future__ import annotations

import copy

import pytest
import torch
from games import GAMES, assert_same_state
from models import gan_with_losses
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


def test_adjoint_identity_on_a_real_network() -> None:
    gen, disc, losses = gan_with_losses()
    game = gameopt.Game([gen, disc], losses)
    g = torch.Generator().manual_seed(1)
    u = tuple(torch.randn(p.numel, generator=g, dtype=torch.float64) for p in game.players)
    v = tuple(torch.randn(p.numel, generator=g, dtype=torch.float64) for p in game.players)
    lhs = torch.dot(_flat(u), _flat(game.jvp(v)))
    rhs = torch.dot(_flat(game.vjp(u)), _flat(v))
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-12)


def test_vector_field_is_each_players_own_gradient() -> None:
    gen, disc, losses = gan_with_losses()
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
    gen, disc, losses = gan_with_losses()
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
@pytest.mark.parametrize("verdict", ["host", "device"])
def test_non_finite_field_refuses_the_step_and_changes_nothing(make, where, verdict) -> None:
    """Under the device verdict the error surfaces at ``synchronize`` (a linearization's
    own check, on the host, still raises in the step)."""
    tg = GAMES["bilinear"]()
    armed = {"on": False, "calls": 0}

    def losses(ws):
        f = ws[0] @ ws[1]
        armed["calls"] += 1
        if armed["on"] and (where == "first" or armed["calls"] > 1):
            f = f * float("nan")
        return [f, -f]

    tg.losses_fn = losses
    game = tg.build(make(), verdict=verdict)
    game.step()
    game.step()
    game.synchronize()
    before_params, before_state = tg.params(), copy.deepcopy(game.state_dict())
    armed.update(on=True, calls=0)
    with pytest.raises(gameopt.NonFiniteError, match="not finite"):
        game.step()
        game.synchronize()
    for a, b in zip(tg.params(), before_params):
        assert torch.equal(a, b)
    assert_same_state(game.state_dict(), before_state)
    if where == "first" and isinstance(game.algorithm, gameopt.Extragradient) and verdict == "host":
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


def test_a_player_on_the_meta_device_is_refused_when_the_game_is_built() -> None:
    w = nn.Parameter(torch.empty(3, device="meta"))
    v = nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="parameter 0 .* is on the meta device"):
        gameopt.Game([gameopt.Player([w], name="m"), gameopt.Player([v])], lambda: (w.sum(), v.sum()))
