"""CUDA: fused buffers, mixed CPU + CUDA players, every algorithm matching its CPU
float64 result, and Jacobian products through GAN layers.

Skipped without a CUDA device (``benchmarks/gpu.sh`` runs them on one).
``GAMEOPT_TEST_DEVICE=cpu`` runs the same checks with the CPU as the "device", a
self-check of this file on machines without a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch
from games import GAMES
from models import VecModule
from torch import nn

import gameopt
from gameopt.testing import ALGORITHMS, GENERIC, learning_rates
from gameopt_players.gan_conv import ConvDiscriminator, ConvGenerator, gan_losses

DEVICE = os.environ.get("GAMEOPT_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device"
)
TABLE = ALGORITHMS + GENERIC
F64 = torch.float64


def test_fused_buffers_live_on_the_device_and_train() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(DEVICE)
    player = gameopt.Player(m)
    (buf,) = player.buffers
    assert buf.data.device.type == torch.device(DEVICE).type
    start, end = buf.data.data_ptr(), buf.data.data_ptr() + buf.data.numel() * buf.data.element_size()
    for p in m.parameters():
        assert start <= p.data_ptr() < end and p.grad is not None and p.grad.device == p.device
    x = torch.randn(11, 5, device=DEVICE)
    m(x).square().sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
    assert torch.equal(player.grad, grads)
    before = player.flat_param.clone()
    other = nn.Linear(3, 1).to(DEVICE)
    game = gameopt.Game(
        [player, other], lambda: [m(x).square().mean(), other(m(x)).mean()], algorithm=gameopt.SimGD(0.1)
    )
    xi = game.vector_field()[0]
    game.step()
    torch.testing.assert_close(player.flat_param, before - 0.1 * xi)


def _assert_device_matches_cpu(game_name: str, make) -> None:
    """Four steps on the CPU and on the device from the same start, float64."""
    results = []
    for device in ("cpu", DEVICE):
        tg = GAMES[game_name]()
        game = tg.build(make(len(tg.init)), device=device)
        for _ in range(4):
            game.step()
        results.append([p.cpu() for p in tg.params()])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("info", TABLE, ids=[a.name for a in TABLE])
@pytest.mark.parametrize("game_name", ["quadratic", "nonquadratic"])
def test_algorithm_on_the_device_matches_cpu_float64(info, game_name) -> None:
    _assert_device_matches_cpu(game_name, lambda n: info.make(learning_rates(n)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: gameopt.ACGD([0.1, 0.2]),
        lambda: gameopt.CGD([0.1, 0.2], tol=1e-12),
        lambda: gameopt.Extragradient(0.1, update=gameopt.Adam()),
    ],
    ids=["ACGD", "CGD", "Extra-Adam"],
)
def test_zero_sum_methods_on_the_device_match_cpu_float64(make) -> None:
    _assert_device_matches_cpu("bilinear", lambda n: make())


@pytest.mark.parametrize(
    "make",
    [lambda: gameopt.SimGD([0.1, 0.05]), lambda: gameopt.Extragradient(0.1), lambda: gameopt.SGA(0.1)],
    ids=["SimGD", "Extragradient", "SGA"],
)
def test_mixed_cpu_and_device_players_match_an_all_cpu_game(make) -> None:
    g = torch.Generator().manual_seed(3)
    A = torch.randn(4, 4, generator=g, dtype=F64)
    init = [torch.randn(4, generator=g, dtype=F64) for _ in range(2)]
    results = []
    for second in ("cpu", DEVICE):
        x, y = VecModule(init[0]), VecModule(init[1]).to(second)

        def losses(x=x, y=y):
            f = x.w @ A @ y.w.cpu()
            return [f + 0.1 * x.w.square().sum(), -f + 0.1 * y.w.square().sum()]

        game = gameopt.Game([x, y], losses, algorithm=make())
        assert len(game.layout.data) == (1 if second == "cpu" else 2)
        for _ in range(4):
            game.step()
        results.append([x.w.detach().clone(), y.w.detach().cpu()])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def test_jacobian_products_through_a_conv_gan_on_the_device() -> None:
    torch.manual_seed(0)
    G, D = ConvGenerator(latent=8, width=8).to(DEVICE, F64), ConvDiscriminator(width=8).to(DEVICE, F64)
    x = torch.randn(6, 1, 8, 8, device=DEVICE, dtype=F64)
    z = torch.randn(6, 8, device=DEVICE, dtype=F64)
    game = gameopt.Game([G, D], lambda: gan_losses(G, D, x, z))
    u = tuple(torch.randn_like(t) for t in game.vector_field())
    v = tuple(torch.randn_like(t) for t in u)
    jv, jtu = game.jvp(v), game.vjp(u)
    lhs = sum((a * b).sum() for a, b in zip(u, jv))
    rhs = sum((a * b).sum() for a, b in zip(jtu, v))
    torch.testing.assert_close(lhs, rhs, rtol=1e-9, atol=1e-12)
    game.algorithm = gameopt.ConsensusOptimization(1e-3, gamma=0.5)  # bound by the assignment
    before = [p.flat_param.clone() for p in game.players]
    game.step()
    assert all(not torch.equal(b, p.flat_param) for b, p in zip(before, game.players))


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="the rule is for a CUDA device")
def test_a_step_on_the_device_copies_each_players_gradient_in_one_fused_copy() -> None:
    """No copy per tensor (a device-to-device memcpy each): ξ lands in the buffers with
    one ``_foreach_copy_`` per player, with the bits ``autograd.grad`` gives."""
    from gameopt.testing.traffic import count

    torch.manual_seed(0)
    # tensors large enough (IN_PLACE_MIN on average) that a CPU player would take ``.grad``
    G = nn.Sequential(nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 64)).to(DEVICE)
    D = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1)).to(DEVICE)
    x, z = torch.randn(32, 64, device=DEVICE), torch.randn(32, 8, device=DEVICE)

    def gan_losses(G: nn.Module, D: nn.Module, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d_fake, d_real = D(G(z)), D(x)
        return nn.functional.softplus(-d_fake).mean(), (
            nn.functional.softplus(-d_real) + nn.functional.softplus(d_fake)
        ).mean()

    game = gameopt.Game([G, D], lambda: gan_losses(G, D, x, z), algorithm=gameopt.SimGD(1e-3))
    with gameopt.debug.enabled_in(False):
        c = count(game.step, big=1)
    assert c.names.get("copy_", 0) == 0 and c.names.get("_foreach_copy_", 0) <= 2, c.names
    params = list(G.parameters()) + list(D.parameters())
    lg, ld = gan_losses(G, D, x, z)
    grads = torch.autograd.grad(lg, params[: len(list(G.parameters()))], retain_graph=True)
    grads += torch.autograd.grad(ld, params[len(grads) :])
    want = [torch.add(p.detach(), g, alpha=-1e-3) for p, g in zip(params, grads)]
    game.step()
    assert all(torch.equal(p.detach(), w) for p, w in zip(params, want))


@pytest.mark.parametrize("where", ["device to cpu", "cpu to device"])
def test_a_checkpoint_moves_between_the_device_and_the_cpu(where) -> None:
    """As torch.optim does: each state tensor goes to the device of the parameter it
    belongs to, and the resumed run equals the one that saved it."""
    save_on, load_on = (DEVICE, "cpu") if where == "device to cpu" else ("cpu", DEVICE)

    def build(device):
        tg = GAMES["quadratic"]()
        modules = [VecModule(w.to(device, F64)) for w in tg.init]
        players = [gameopt.Player(m, name=f"p{i}") for i, m in enumerate(modules)]
        algo = gameopt.Extragradient(0.05, update=gameopt.Adam())
        game = gameopt.Game(players, lambda: tg.losses_fn([m.w for m in modules]), algorithm=algo)
        return game, modules

    saver, a = build(save_on)
    for _ in range(3):
        saver.step()
    loader, b = build(load_on)
    loader.load_state_dict(saver.state_dict())
    assert all(t.device.type == torch.device(load_on).type for t in loader.algorithm_state["rule"]["m"])
    for _ in range(3):
        saver.step()
        loader.step()
    for x, y in zip(a, b):
        torch.testing.assert_close(x.w.detach().cpu(), y.w.detach().cpu(), rtol=1e-12, atol=1e-13)


FIRST_ORDER_ON_DEVICE = {
    "SimGD": lambda: gameopt.SimGD(0.1),
    "Extragradient": lambda: gameopt.Extragradient(0.1),
    "Optimistic": lambda: gameopt.Optimistic(0.1),
    "Extra-Adam": lambda: gameopt.Extragradient(0.1, update=gameopt.Adam()),
    "SimGD + Momentum": lambda: gameopt.SimGD(0.1, update=gameopt.Momentum(0.9)),
}


@pytest.mark.parametrize("name", list(FIRST_ORDER_ON_DEVICE))
def test_the_device_verdict_steps_as_the_host_verdict_without_a_host_sync(name) -> None:
    """Issue #35, item 2: ``Game(verdict="device")`` takes the host verdict's steps (to
    the fused kernel's rounding: it forms lr·d in double) and, once warm, runs its
    steps under ``torch.cuda.set_sync_debug_mode("error")``: no host sync inside."""
    results = []
    for verdict in ("host", "device"):
        tg = GAMES["nonquadratic"]()
        game = tg.build(FIRST_ORDER_ON_DEVICE[name](), dtype=torch.float32, device=DEVICE, verdict=verdict)
        game.step()
        game.step()
        if verdict == "device" and DEVICE.startswith("cuda"):
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(3):
                    game.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        else:
            for _ in range(3):
                game.step()
        if verdict == "device":
            game.synchronize()
        results.append(tg.params())
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_a_step_refused_on_the_device_is_undone_and_raised_by_synchronize() -> None:
    tg = GAMES["bilinear"]()
    armed = {"on": False}
    base = tg.losses_fn
    tg.losses_fn = lambda ws: [loss * (float("nan") if armed["on"] else 1.0) for loss in base(ws)]
    game = tg.build(gameopt.Extragradient(0.1, update=gameopt.Adam()), device=DEVICE, verdict="device")
    game.step()
    game.synchronize()
    before, state = tg.params(), game.state_dict()
    armed["on"] = True
    game.step()
    with pytest.raises(gameopt.NonFiniteError, match="not finite"):
        game.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(tg.params(), before))
    after = game.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(after["players"][0]["params"], state["players"][0]["params"]))


def _large_bilinear(dtypes, verdict="host"):
    """Two players of one tensor each, large enough (``DEVICE_PIECES_MIN``) that a plain
    step leaves ξ in pieces on the device."""
    from gameopt.autodiff.xi import DEVICE_PIECES_MIN

    g = torch.Generator().manual_seed(0)
    x, y = (nn.Parameter((torch.randn(DEVICE_PIECES_MIN, generator=g) / 8).to(DEVICE, dt)) for dt in dtypes)

    def losses():
        f = (x.float() * y.float()).sum() + (x.float() ** 2).sum() / 2
        return f, -f + (y.float() ** 2).sum() / 4

    return [x, y], losses


@pytest.mark.parametrize("name", ["SimGD", "Extragradient"])
def test_a_plain_step_on_the_device_reads_xi_where_autograd_left_it(name) -> None:
    """Issue #35, item 1: no copy of ξ into the buffers (``gameopt.vec.Pieces``); the
    move is ``torch._foreach_add_`` of the gradients, as the bare foreach loop's."""
    from gameopt.testing.traffic import count

    params, losses = _large_bilinear([torch.float32, torch.float32])
    make = gameopt.SimGD if name == "SimGD" else gameopt.Extragradient
    game = gameopt.Game([gameopt.Player([p]) for p in params], losses, algorithm=make(1e-2))
    with gameopt.debug.enabled_in(False):
        c = count(game.step, big=1 << 20)
        assert c.names.get("_foreach_copy_", 0) == (2 if name == "Extragradient" else 0), c.names
        if name == "SimGD":
            f, h = losses()
            grads = [torch.autograd.grad(f, params[0], retain_graph=True)[0], torch.autograd.grad(h, params[1])[0]]
            want = [p.detach().clone() for p in params]
            torch._foreach_add_(want, grads, alpha=-1e-2)
            game.step()
            assert all(torch.equal(p.detach(), w) for p, w in zip(params, want))


def test_the_device_verdict_moves_a_bfloat16_group_beside_a_float32_one_in_pieces() -> None:
    """One fused add per joint group (one dtype a call): both groups move as under the
    host verdict, without a host sync inside a warm step."""
    results = []
    for verdict in ("host", "device"):
        params, losses = _large_bilinear([torch.float32, torch.bfloat16])
        game = gameopt.Game(
            [gameopt.Player([p]) for p in params], losses, algorithm=gameopt.SimGD(1e-2), verdict=verdict
        )
        start = [p.detach().clone() for p in params]
        with gameopt.debug.enabled_in(False):
            game.step()
            game.step()
            if verdict == "device" and DEVICE.startswith("cuda"):
                torch.cuda.set_sync_debug_mode("error")
            try:
                game.step()
            finally:
                if DEVICE.startswith("cuda"):
                    torch.cuda.set_sync_debug_mode("default")
            game.synchronize()
        assert all(not torch.equal(p.detach(), s) for p, s in zip(params, start))
        results.append([p.detach().float() for p in params])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-3)
