"""Jacobian products through the layers GANs use: convolutions, normalization,
attention, recurrent layers; BatchNorm statistics untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gameopt


class ConvDisc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.LeakyReLU(0.2),
            nn.Conv2d(4, 4, 3, stride=2, padding=1),
            nn.GroupNorm(2, 4),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


class ConvGen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4 * 4 * 4)
        self.net = nn.Sequential(
            nn.BatchNorm2d(4), nn.ReLU(), nn.ConvTranspose2d(4, 1, 4, stride=2, padding=1), nn.Tanh()
        )

    def forward(self, z):
        return self.net(self.fc(z).view(-1, 4, 4, 4))


class AttnDisc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):  # x: (batch, tokens, 2)
        h = self.embed(x)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        q = torch.nn.functional.scaled_dot_product_attention(h, h, h)
        return self.out(q.mean(1)).squeeze(-1)


class LSTMGen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, 6, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, z):
        return self.out(self.lstm(z)[0])


def _gan_game(gen, disc, real, noise):
    def losses():
        r, f = disc(real), disc(gen(noise))
        d = nn.functional.softplus(-r).mean() + nn.functional.softplus(f).mean()
        return nn.functional.softplus(-f).mean(), d

    return gameopt.Game([gen, disc], losses)


def _explicit_jacobian(game):
    """J column by column via finite differences of ξ (central, float64)."""
    w = game.layout.data[0]
    n = w.numel()
    cols = []
    eps = 1e-6
    for k in range(n):
        old = w[k].item()
        w[k] = old + eps
        plus = torch.cat([t if isinstance(t, torch.Tensor) else torch.cat(t) for t in game.vector_field()])
        w[k] = old - eps
        minus = torch.cat([t if isinstance(t, torch.Tensor) else torch.cat(t) for t in game.vector_field()])
        w[k] = old
        cols.append((plus - minus) / (2 * eps))
    return torch.stack(cols, 1)


def _cases():
    torch.manual_seed(0)
    conv = (ConvGen().double(), ConvDisc().double(), torch.randn(6, 1, 8, 8).double(), torch.randn(6, 4).double())
    attn = (
        nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)).double(),
        AttnDisc().double(),
        torch.randn(4, 3, 2).double(),
        torch.randn(4, 3, 2).double(),
    )
    lstm = (LSTMGen().double(), AttnDisc().double(), torch.randn(4, 3, 2).double(), torch.randn(4, 3, 2).double())
    return {"conv-batchnorm": conv, "attention-layernorm": attn, "lstm": lstm}


@pytest.mark.parametrize("case", ["conv-batchnorm", "attention-layernorm", "lstm"])
def test_jacobian_products_through_gan_layers(case) -> None:
    gen, disc, real, noise = _cases()[case]
    for m in (gen, disc):
        m.eval()  # deterministic ξ for the finite-difference reference
    game = _gan_game(gen, disc, real, noise)
    J = _explicit_jacobian(game)
    g = torch.Generator().manual_seed(1)
    v = tuple(torch.randn(p.numel, generator=g, dtype=torch.float64) for p in game.players)
    flat_v = torch.cat(v)
    jv = torch.cat(game.jvp(v))
    jtv = torch.cat(game.vjp(v))
    torch.testing.assert_close(jv, J @ flat_v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(jtv, J.T @ flat_v, rtol=1e-5, atol=1e-6)
    # the off-diagonal product H_o v, through its own kept graph
    n0 = game.players[0].numel
    Ho = J.clone()
    Ho[:n0, :n0] = 0
    Ho[n0:, n0:] = 0
    ho_v = game.linearize().offdiag_jvp(game.layout.from_per_player(v))
    torch.testing.assert_close(torch.cat(game.layout.per_player(ho_v)), Ho @ flat_v, rtol=1e-5, atol=1e-6)
    # the double-backward fallback agrees with forward mode
    game.step_context.problem.forward_mode.ok = False  # the double-backward fallback from now on
    torch.testing.assert_close(torch.cat(game.jvp(v)), jv, rtol=1e-10, atol=1e-12)


def test_training_mode_batchnorm_statistics_do_not_change_during_jacobian_products() -> None:
    gen, disc, real, noise = _cases()["conv-batchnorm"]
    game = _gan_game(gen, disc, real, noise)
    stats = {
        k: v.clone()
        for k, v in list(gen.state_dict().items()) + list(disc.state_dict().items())
        if "running" in k or "num_batches" in k
    }
    v = tuple(torch.randn(p.numel, dtype=torch.float64) for p in game.players)
    game.jvp(v)
    game.vjp(v)
    lin = game.linearize()
    lin.offdiag_jvp(lin.xi)
    lin.chi()
    after = dict(list(gen.state_dict().items()) + list(disc.state_dict().items()))
    for k, val in stats.items():
        assert torch.equal(after[k], val), k
    # a real training step still updates them
    gameopt.Game([gen, disc], game.losses, algorithm=gameopt.SimGD(0.01)).step()
    assert not torch.equal(gen.net[0].running_mean, stats["net.0.running_mean"])


def test_second_order_step_on_a_conv_gan_in_training_mode() -> None:
    gen, disc, real, noise = _cases()["conv-batchnorm"]
    ref = copy.deepcopy(gen)
    game = _gan_game(gen, disc, real, noise)
    game.algorithm = gameopt.SGA(0.01)  # bound by the assignment
    game.step()
    assert not torch.equal(gen.fc.weight, ref.fc.weight)
    assert all(torch.isfinite(t).all() for t in game.layout.data)


# ------------------------------------------ first-order ξ: through .grad or captured (issue 13)
from gameopt import _torch_compat as tc  # noqa: E402
from gameopt import autodiff  # noqa: E402
from gameopt.autodiff import xi as first_order_xi  # noqa: E402
from gameopt.autodiff.engine import engine_vjp  # noqa: E402


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _through_grad(monkeypatch, on: bool) -> list[int]:
    """Every player through ``.grad`` (``on``) or every player captured; returns the
    players that went through ``.grad``, as they do."""
    monkeypatch.setattr(first_order_xi, "IN_PLACE_MIN", 0 if on else 1 << 62)
    went: list[int] = []
    real = first_order_xi.through_grad

    def counted(problem, i, *args, **kwargs):
        went.append(i)
        return real(problem, i, *args, **kwargs)

    monkeypatch.setattr(first_order_xi, "through_grad", counted)
    return went


def _field_cases():
    def mlp_pair():
        torch.manual_seed(0)
        gen = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)).double()
        disc = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1), nn.ReLU()).double()
        x, z = torch.randn(16, 2, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)

        def losses():
            d_fake = disc(gen(z))
            return nn.functional.softplus(-d_fake).mean(), (disc(x) - d_fake).square().mean()

        return [gen, disc], losses

    def unused_parameter():
        torch.manual_seed(1)
        used, unused, other = nn.Linear(2, 2).double(), nn.Linear(2, 2).double(), nn.Linear(2, 2).double()
        x = torch.randn(4, 2, dtype=torch.float64)

        def losses():
            y = other(used(x))
            return y.square().sum(), (y - 1).square().sum()

        return [nn.ModuleList([used, unused]), other], losses

    def sparse_embedding():
        torch.manual_seed(2)
        emb, head = nn.Embedding(10, 3, sparse=True).double(), nn.Linear(3, 1).double()
        idx = torch.tensor([1, 1, 4, 7, 7, 7])

        def losses():
            y = head(emb(idx))
            return -y.mean(), y.square().mean()

        return [emb, head], losses

    return {"mlp": mlp_pair, "unused parameter": unused_parameter, "sparse embedding": sparse_embedding}


@pytest.mark.parametrize("case", list(_field_cases()))
@pytest.mark.parametrize("scale", [1.0, 2.0**10])
def test_first_order_through_grad_writes_the_bits_of_the_captured_copy(monkeypatch, case, scale) -> None:
    """Both ways into the gradient buffers (``autograd.grad`` and a copy; ``backward``
    into ``.grad`` with gameopt's relinking hook) write the same bits: exact zeros
    for an unused parameter, dense sparse gradients, loss scaling; ``.grad`` stays
    the buffer's view and the players stay fused."""
    fields = []
    for on in (False, True):
        went = _through_grad(monkeypatch, on)
        players, losses = _field_cases()[case]()
        game = gameopt.Game(players, losses)
        for i in range(len(players)):
            game.layout.player_views(game.layout.grad, i)[0].fill_(float("nan"))  # stale contents
        autodiff.vector_field(game.step_context.problem, [0, 1], losses, scale)
        fields.append([game.layout.grad[0].clone()])
        for player in game.players:
            assert all(p.grad is v for p, v in zip(player.parameters, player.grad_views()))
            assert player.why_stale() is None
        if case == "unused parameter":
            unused = players[0][1]
            assert not torch.signbit(unused.weight.grad).any() and not unused.weight.grad.any()
        assert went == ([0, 1] if on else [])
    assert torch.equal(_bits(fields[0][0]), _bits(fields[1][0]))


def test_a_device_player_is_captured_whole_unless_too_large_to_hold(monkeypatch) -> None:
    """On a CUDA device a copy per tensor is a launch and a hook each: a player there
    has its gradient captured and copied with one ``_foreach_copy_``, up to
    ``DEVICE_CAPTURE_MAX`` elements; a CPU player with large tensors, or a larger
    device player, goes through ``.grad`` (its gradient never whole beside the buffer)."""
    from types import SimpleNamespace

    monkeypatch.setattr(first_order_xi, "_in_place", lambda problem, i: True)
    big = first_order_xi.IN_PLACE_MIN
    cap = first_order_xi.DEVICE_CAPTURE_MAX

    def through(size: int, tensors: int, on_cpu: bool) -> bool:
        problem = SimpleNamespace(params=[[None] * tensors], sizes=[size], on_cpu=[on_cpu])
        return first_order_xi._goes_through_grad(problem, 0)

    assert through(4 * big, 4, on_cpu=True)
    assert not through(4 * big, 4, on_cpu=False)
    assert not through(cap, 4, on_cpu=False)
    assert through(cap + 1, 4, on_cpu=False)
    assert not through(4 * big - 1, 4, on_cpu=True) and not through(0, 0, on_cpu=True)


def test_first_order_through_grad_steps_match_bit_for_bit(monkeypatch) -> None:
    results = []
    for on in (False, True):
        _through_grad(monkeypatch, on)
        players, losses = _field_cases()["mlp"]()
        game = gameopt.Game(players, losses, algorithm=gameopt.Extragradient(0.05, update=gameopt.Adam()))
        for _ in range(3):
            game.step()
        results.append([t.clone() for t in [*game.layout.data, *game.layout.grad]])
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(*results))


@pytest.mark.parametrize("on", [False, True], ids=["captured", "through .grad"])
def test_first_order_a_loss_without_its_parameters_is_a_loss_error_and_links_stay(monkeypatch, on) -> None:
    from gameopt.evaluation import LossError

    _through_grad(monkeypatch, on)
    a, b = nn.Linear(2, 2).double(), nn.Linear(2, 2).double()
    x = torch.randn(3, 2, dtype=torch.float64)
    for second in (lambda y: y.sum(), lambda y: torch.tensor(1.0, dtype=torch.float64)):
        players = [gameopt.Player(a, name="a"), gameopt.Player(b, name="b")]
        game = gameopt.Game(players, lambda second=second: [b(a(x)).sum(), second(a(x))])
        with pytest.raises(LossError, match="player 'b' does not depend"):
            autodiff.vector_field(game.step_context.problem, [0, 1], game.losses)
        for player in game.players:
            assert all(p.grad is v for p, v in zip(player.parameters, player.grad_views()))


@pytest.mark.parametrize("on", [False, True], ids=["captured", "through .grad"])
def test_first_order_users_tensor_hooks_behave_the_same_on_both_paths(monkeypatch, on) -> None:
    """A tensor hook (``register_hook``) fires once per evaluation and may change the
    gradient, on both paths; a post-accumulate-grad hook of the user's never fires
    during a step (the player's gradient is then captured, as ``autograd.grad`` does)."""
    went = _through_grad(monkeypatch, on)
    a, b = nn.Linear(2, 2).double(), nn.Linear(2, 2).double()
    x = torch.randn(3, 2, dtype=torch.float64)
    calls: list[str] = []
    a.weight.register_hook(lambda g: calls.append("pre") or 2 * g)
    b.weight.register_post_accumulate_grad_hook(lambda p: calls.append("post"))
    game = gameopt.Game([a, b], lambda: [b(a(x)).square().sum(), b(a(x)).sum()])
    for _ in range(2):
        ref = torch.autograd.grad(b(a(x)).square().sum(), a.weight)[0]  # the hook doubles it here too
        calls.clear()
        assert torch.equal(game.vector_field()[0][: ref.numel()], ref.reshape(-1))
        game.step()
        assert calls == ["pre", "pre"]  # vector_field's evaluation and the step's; never "post"
    assert set(went) == ({0} if on else set())  # the player with the user's post-accumulate hook: captured
    for player in game.players:
        assert all(p.grad is v for p, v in zip(player.parameters, player.grad_views()))


def test_first_order_through_grad_writes_each_gradient_before_the_next_arrives(monkeypatch) -> None:
    """Through ``.grad`` a player's gradient is never alive whole beside the buffer:
    when the last parameter's gradient arrives, the others' are in the buffer already."""
    went = _through_grad(monkeypatch, True)
    torch.manual_seed(3)
    net = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]).double()
    other = nn.Linear(4, 1).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    game = gameopt.Game([net, other], lambda: [other(net(x)).sum(), other(net(x)).square().sum()])
    views = game.players[0].grad_views()
    seen = []
    first = net[0].weight  # among the last the backward reaches
    first.register_hook(lambda g: seen.append([p.grad is v for p, v in zip(game.players[0].parameters, views)]))
    game.vector_field()
    later = {id(p) for p in net[1:].parameters()}  # their gradients come before the first layer's
    (done,) = seen
    assert [d for p, d in zip(game.players[0].parameters, done) if id(p) in later] == [True] * len(later)
    assert not done[[id(p) for p in game.players[0].parameters].index(id(first))]
    assert went == [0, 1]


# ----------------------- reverse passes without torch's Python-side check (issue 15)
def _graph():
    torch.manual_seed(5)
    a, b, unused = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = torch.autograd.grad((a.sin() * b).sum() + (a @ b.T).square().sum(), [a, b], create_graph=True)
    return list(g), [a, b, unused]


@pytest.mark.parametrize("create_graph", [False, True])
def test_product_is_autograd_grad_bit_for_bit(create_graph) -> None:
    outs, ins = _graph()
    vs = [torch.randn_like(t) for t in outs]
    ref = torch.autograd.grad(outs, ins, vs, retain_graph=True, create_graph=create_graph, allow_unused=True)
    got = engine_vjp(outs, ins, vs, retain_graph=True, create_graph=create_graph)
    assert got[2] is None and ref[2] is None  # unreached: None, as allow_unused gives
    for r, g in zip(ref[:2], got[:2]):
        assert torch.equal(_bits(r), _bits(g))
        assert g.requires_grad is create_graph


def test_product_without_the_fast_path_is_the_same(monkeypatch) -> None:
    outs, ins = _graph()
    vs = [torch.randn_like(t) for t in outs]
    fast = engine_vjp(outs, ins, vs, retain_graph=True)
    monkeypatch.setattr(tc, "engine_run_backward", None)  # an older torch (or GAMEOPT_TORCH_PUBLIC=1)
    slow = engine_vjp(outs, ins, vs, retain_graph=True)
    assert all(torch.equal(f, s) for f, s in zip(fast[:2], slow[:2]))


@pytest.mark.parametrize("shape", [(4, 3), (1, 4), (12,)], ids=["transposed", "broadcastable", "flat"])
def test_product_refuses_grad_outputs_that_do_not_fit(shape) -> None:
    """As ``torch.autograd.grad`` does: a grad_output the engine would sum to shape
    (broadcastable) is refused too, not silently summed."""
    if tc.engine_run_backward is None:
        pytest.skip("the fast path's own check; without it torch.autograd.grad checks (GAMEOPT_TORCH_PUBLIC=1)")
    outs, ins = _graph()
    bad = [torch.ones(3, 4, dtype=torch.float64), torch.ones(shape, dtype=torch.float64)]
    with pytest.raises(RuntimeError):  # (its message may come from a failing list.index)
        torch.autograd.grad(outs, ins, bad, retain_graph=True, allow_unused=True)
    with pytest.raises(RuntimeError, match="Mismatch in shape: grad_output\\[1\\] has a shape of"):
        engine_vjp(outs, ins, bad, retain_graph=True)
    with pytest.raises(ValueError, match="1 grad_outputs for 2 outputs"):
        engine_vjp(outs, ins, [torch.ones(3, 4, dtype=torch.float64)], retain_graph=True)
