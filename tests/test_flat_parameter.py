"""Fused parameters with PyTorch's own machinery, and the flat parameter tensor.

The fused parameters are views of the flat buffers and their ``.grad`` views of the
flat gradient (gameopt/buffer.py), so ``torch.optim`` (every mode), ``torch.compile``,
autocast, activation checkpointing, ``copy.deepcopy`` and ``state_dict`` work on the
module as on an unfused one. ``player.flat_param`` (a ``gameopt.buffer.FlatParameter``) is
the storage as one tensor: an optimizer built on it trains the module like one built on
``module.parameters()``, and it follows the parameters through conversions, re-fusing
and into a game, or raises when it cannot.

Values are always checked against an unfused reference made with ``copy.deepcopy``
before fusing.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.utils.checkpoint
from fused import assert_fused, cat_flat, cat_grads, inside, trainable
from models import tiny_mlp
from torch import Tensor, nn

import gameopt
from gameopt import Player
from gameopt.buffer import FlatBuffer

F64 = torch.float64


# ------------------------------------------- the module's parameters are views
def test_params_and_the_module_share_storage_both_ways() -> None:
    m = tiny_mlp()
    player = Player(m)
    flat = player.flat_param
    with torch.no_grad():
        flat[0] = 5.0  # first weight entry
        flat[-1] = -3.0  # last bias
    assert m[0].weight[0, 0].item() == 5.0 and m[2].bias.item() == -3.0
    with torch.no_grad():
        m[0].bias.fill_(2.0)
        m[2].weight.mul_(0.0)
    assert torch.equal(flat[10:20], torch.full((10,), 2.0))
    assert torch.equal(flat[20:30], torch.zeros(10))
    assert player.flat_param.data_ptr() == flat.data_ptr()  # the same tensor every time
    assert torch.equal(player.flat_param, cat_flat(m.parameters()))


def test_deepcopy_of_a_fused_module_is_independent() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    x = torch.randn(3, 1, dtype=F64)
    m(x).sum().backward()
    values, grads = player.flat_param.clone(), player.grad.clone()
    twin = copy.deepcopy(m)
    assert torch.equal(cat_flat(twin.parameters()), values)
    assert not any(inside(p, player.flat_param) for p in twin.parameters())
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(1.0)
    twin.zero_grad()
    twin(x).pow(3).sum().backward()
    torch.optim.SGD(twin.parameters(), lr=1.0).step()
    assert not any(inside(p.grad, player.buffers[0].grad) for p in twin.parameters())
    assert torch.equal(player.flat_param, values) and torch.equal(player.grad, grads)
    # the copy can be fused on its own
    twin_player = Player(twin)
    assert twin_player.flat_param.data_ptr() != player.flat_param.data_ptr()
    assert_fused(twin_player)
    assert_fused(player)


def test_state_dict_save_load_round_trip_keeps_the_link(tmp_path) -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    values = player.flat_param.clone()
    torch.save(m.state_dict(), tmp_path / "m.pt")
    with torch.no_grad():
        player.flat_param.zero_()
    ptrs = [p.data_ptr() for p in m.parameters()]
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    assert set(sd) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(t.shape == p.shape for t, p in zip(sd.values(), m.parameters()))
    m.load_state_dict(sd)
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert player.why_stale() is None
    assert torch.equal(player.flat_param, values)
    fresh = tiny_mlp(F64, seed=3)
    fresh.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    assert torch.equal(cat_flat(fresh.parameters()), values)
    m(torch.randn(2, 1, dtype=F64)).sum().backward()
    assert_fused(player)


def test_plain_load_state_dict_copies_in_place_and_keeps_the_link() -> None:
    m = tiny_mlp(F64, seed=0)
    other = tiny_mlp(F64, seed=1)
    player = Player(m)
    ptrs = [p.data_ptr() for p in m.parameters()]
    flat = player.flat_param
    m.load_state_dict(other.state_dict())
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert player.why_stale() is None and player.refresh() is False
    assert player.flat_param is flat or player.flat_param.data_ptr() == flat.data_ptr()
    assert torch.equal(player.flat_param, cat_flat(other.parameters()))


# -------------------------------------- torch.optim on the module's parameters
OPTIMIZERS = {
    "sgd": lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, **kw),
    "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, **kw),
}


MODES = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_torch_optim_steps_match_an_unfused_module(opt_name: str, mode: str) -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat, flat_grad = player.flat_param, player.grad
    opt = OPTIMIZERS[opt_name](m.parameters(), **MODES[mode])
    ref_opt = OPTIMIZERS[opt_name](ref.parameters(), **MODES[mode])
    x = torch.linspace(-1, 1, 8, dtype=F64).unsqueeze(1)
    for _ in range(4):
        for mod, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()  # set_to_none=True
            (mod(x) - x.sin()).pow(2).mean().backward()
        # the optimizer steps on the buffer's own views (checked before reading player.grad)
        assert all(inside(p.grad, flat_grad) for p in m.parameters())
        torch.testing.assert_close(flat_grad, cat_grads(ref), rtol=1e-13, atol=1e-15)
        opt.step()
        ref_opt.step()
        torch.testing.assert_close(flat, cat_flat(ref.parameters()), rtol=1e-13, atol=1e-15)
        assert all(inside(p, flat) for p in m.parameters())
    assert player.flat_param.data_ptr() == flat.data_ptr() and player.grad.data_ptr() == flat_grad.data_ptr()
    assert_fused(player)
    assert not torch.equal(flat, cat_flat(tiny_mlp(F64).parameters()))  # it did move


# --------------------------------------------------------------- torch.compile
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning"
)  # torch: inductor imports deprecated torch.jit APIs
def test_torch_compile_trains_through_the_buffer() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    try:
        m = tiny_mlp(torch.float32)
        ref = copy.deepcopy(m)
        player = Player(m)
        compiled = torch.compile(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        x = torch.linspace(-1, 1, 8).unsqueeze(1)
        for _ in range(2):
            opt.zero_grad()
            ref_opt.zero_grad()
            compiled(x).pow(2).sum().backward()
            ref(x).pow(2).sum().backward()
            assert_fused(player)
            torch.testing.assert_close(player.grad, cat_grads(ref))
            opt.step()
            ref_opt.step()
            torch.testing.assert_close(player.flat_param, cat_flat(ref.parameters()))
        # writes to the flat buffer reach the compiled module too
        with torch.no_grad():
            player.flat_param.zero_()
        assert torch.equal(compiled(x), torch.zeros(8, 1))
    finally:
        torch._dynamo.reset()


# -------------------------------------------------- autocast and checkpointing
@pytest.mark.parametrize("set_to_none", [False, True])
def test_cpu_bfloat16_autocast_keeps_the_link(set_to_none: bool) -> None:
    m = tiny_mlp(torch.float32)
    ref = copy.deepcopy(m)
    player = Player(m)
    buf = player.buffers[0]
    x = torch.linspace(-1, 1, 8).unsqueeze(1)
    for _ in range(2):
        for mod in (m, ref):
            mod.zero_grad(set_to_none=set_to_none)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = mod(x)
            assert out.dtype == torch.bfloat16
            out.float().pow(2).sum().backward()
        assert_fused(player)  # before reading player.grad, which would relink
        assert buf.data.dtype == buf.grad.dtype == m[0].weight.grad.dtype == torch.float32
        assert torch.equal(buf.grad, cat_grads(ref))


# torch 2.4's own torch.utils.checkpoint calls its deprecated torch.cpu.amp.autocast
@pytest.mark.filterwarnings("ignore:.torch.cpu.amp.autocast.args.*. is deprecated:FutureWarning")
@pytest.mark.parametrize("set_to_none", [False, True])
def test_activation_checkpointing_keeps_the_link(set_to_none: bool) -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.linspace(-1, 1, 8, dtype=F64).unsqueeze(1)
    for _ in range(2):
        m.zero_grad(set_to_none=set_to_none)
        ref.zero_grad()
        torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        assert_fused(player)
        assert torch.equal(player.grad, cat_grads(ref))


# ------------------------------------------- the flat parameter in torch.optim
class TiedNet(nn.Module):
    """Two layers with biases, and an output layer tied to the input layer's weight."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(3, 4).double()
        self.hidden = nn.Linear(4, 4).double()
        self.out = nn.Linear(4, 3, bias=False).double()
        self.out.weight = nn.Parameter(torch.randn(3, 4, dtype=F64))
        self.inp.weight = self.out.weight  # (3, 4) used as (4 → 3) and, transposed, (3 → 4)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(x @ self.inp.weight + self.inp.bias)
        return self.out(torch.tanh(self.hidden(h)))


FLAT_OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "lbfgs": lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4, history_size=5),
}


def _regression(seed: int = 1) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 3, generator=g, dtype=F64), torch.randn(16, 3, generator=g, dtype=F64)


def _train(module: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    def closure() -> Tensor:
        opt.zero_grad()  # set_to_none=True
        loss = (module(x) - y).pow(2).mean()
        loss.backward()
        return loss

    return opt.step(closure)


@pytest.mark.parametrize("opt_name", list(FLAT_OPTIMIZERS))
def test_torch_optim_on_the_flat_parameter_matches_per_parameter(opt_name: str) -> None:
    m = TiedNet()
    ref = copy.deepcopy(m)
    assert ref.inp.weight is ref.out.weight
    player = Player(m)
    flat = player.flat_param
    assert flat.requires_grad is False and flat.is_leaf
    opt = FLAT_OPTIMIZERS[opt_name]([flat])
    ref_opt = FLAT_OPTIMIZERS[opt_name](ref.parameters())
    x, y = _regression()
    start = flat.clone()
    for _ in range(4):
        loss, ref_loss = _train(m, opt, x, y), _train(ref, ref_opt, x, y)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(flat, cat_flat(ref.parameters()), rtol=1e-12, atol=1e-14)
        # the flat gradient is player.grad itself, never an accumulation of stale ones
        assert flat.grad is player.grad
        torch.testing.assert_close(flat.grad, cat_grads(ref), rtol=1e-12, atol=1e-14)
    assert not torch.allclose(flat, start)  # it did train
    assert player.flat_param is flat
    assert_fused(player)


def test_flat_parameter_grad_is_the_flat_gradient_across_zero_grad_and_assignment() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.flat_param
    x = torch.linspace(-1, 1, 5, dtype=F64).unsqueeze(1)
    opt = torch.optim.SGD([flat], lr=0.1)
    for power in (2, 3):
        opt.zero_grad()  # flat.grad = None: the flat gradient restarts from zeros
        assert torch.count_nonzero(flat.grad) == 0
        m(x).pow(power).sum().backward()
        ref.zero_grad()
        ref(x).pow(power).sum().backward()
        g = flat.grad
        assert g is player.grad and g.data_ptr() == player.buffers[0].grad.data_ptr()
        assert torch.equal(g, cat_grads(ref))
        assert_fused(player)
    # an optimizer over module.parameters() resets the parameters' grads instead
    module_opt = torch.optim.SGD(m.parameters(), lr=0.1)
    module_opt.zero_grad()
    m(x).sum().backward()
    ref.zero_grad()
    ref(x).sum().backward()
    assert flat.grad is player.grad and torch.equal(flat.grad, cat_grads(ref))
    # assigning a gradient writes it into the buffer and keeps the links
    flat.grad = torch.ones(31, dtype=F64)
    assert torch.equal(m[0].weight.grad, torch.ones(10, 1, dtype=F64)) and flat.grad is player.grad
    with pytest.raises(RuntimeError, match="different size"):
        flat.grad = torch.ones(30, dtype=F64)
    del flat.grad
    assert torch.count_nonzero(player.grad) == 0
    assert_fused(player)


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_on_the_flat_parameter_matches_per_parameter(norm_type: float) -> None:
    m = TiedNet()
    ref = copy.deepcopy(m)
    player = Player(m)
    x, y = _regression()
    for mod in (m, ref):
        (mod(x) - y).pow(2).sum().backward()
    total = torch.nn.utils.clip_grad_norm_([player.flat_param], 0.5, norm_type=norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, norm_type=norm_type)
    assert total > 0.5
    torch.testing.assert_close(total, ref_total, rtol=1e-12, atol=0)
    torch.testing.assert_close(player.grad, cat_grads(ref), rtol=1e-12, atol=1e-15)
    assert_fused(player)


def test_flat_parameter_with_align_padding_trains_like_the_module() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m, align=64)
    buf = player.buffers[0]
    assert buf.padded_numel > buf.num_elements
    opt = torch.optim.Adam([player.flat_param], lr=0.05)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    for _ in range(3):
        _train(m, opt, x, x.sin())
        _train(ref, ref_opt, x, x.sin())
    assert torch.equal(cat_flat(m.parameters()), cat_flat(ref.parameters()))
    assert torch.count_nonzero(player.flat_param) == buf.num_elements - 0  # padding stayed zero
    assert_fused(player)


# ----------------------------------- the flat parameter follows the parameters
def test_flat_parameter_follows_a_conversion() -> None:
    m = tiny_mlp(torch.float32)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.flat_param
    opt = torch.optim.SGD([flat], lr=0.1)  # no state: it survives a dtype change
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, 6).unsqueeze(1)
    _train(m, opt, x, x.cos())
    _train(ref, ref_opt, x, x.cos())
    m.double()
    ref.double()
    x = x.double()
    for _ in range(3):
        _train(m, opt, x, x.cos())
        _train(ref, ref_opt, x, x.cos())
    assert flat.dtype == F64 and player.flat_param is flat
    assert torch.equal(flat, cat_flat(ref.parameters())) and torch.equal(cat_flat(m.parameters()), flat)
    assert_fused(player)


def test_flat_parameter_follows_load_state_dict_with_assign() -> None:
    m, other = tiny_mlp(F64, seed=0), tiny_mlp(F64, seed=1)
    player = Player(m)
    flat = player.flat_param
    m.load_state_dict(other.state_dict(), assign=True)  # new Parameter objects
    opt = torch.optim.SGD([flat], lr=0.1)
    ref_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    for _ in range(2):
        _train(m, opt, x, x.cos())
        _train(other, ref_opt, x, x.cos())
    assert player.flat_param is flat and torch.equal(flat, cat_flat(other.parameters()))
    assert_fused(player)


def test_flat_parameter_follows_into_a_game() -> None:
    torch.manual_seed(0)
    m, rival = tiny_mlp(F64), nn.Linear(1, 1).double()
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.flat_param
    opt = torch.optim.Adam([flat], lr=0.05)  # built before the game
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    _train(m, opt, x, x.sin())
    _train(ref, ref_opt, x, x.sin())
    game = gameopt.Game([player, rival], lambda: (m(x).pow(2).mean(), rival(x).pow(2).mean()))
    assert player.flat_param is flat
    assert inside(flat, game.layout.data[0]) and all(inside(p, game.layout.data[0]) for p in m.parameters())
    for _ in range(3):
        _train(m, opt, x, x.sin())
        _train(ref, ref_opt, x, x.sin())
    assert torch.equal(flat, cat_flat(ref.parameters())) and torch.equal(cat_flat(m.parameters()), flat)
    # the game and the optimizer move one and the same storage
    game.step()
    assert torch.equal(flat, cat_flat(m.parameters())) and not torch.equal(flat, cat_flat(ref.parameters()))
    assert_fused(player)


def test_frozen_parameter_leaves_the_flat_parameter_with_its_value_and_rejoins_when_unfrozen() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.flat_param
    opt = torch.optim.SGD([flat], lr=0.1)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    _train(m, opt, x, x.sin())
    frozen = m[0].bias
    value, grad = frozen.detach().clone(), frozen.grad.clone()
    frozen.requires_grad_(False)
    assert "'bias' of Linear was frozen" in player.why_stale()
    assert player.refresh() and player.numel == 21
    assert all(p is not frozen for p in player.parameters)
    assert player.flat_param is flat and flat.shape == (21,)
    # it keeps its value and gradient, in memory of its own
    assert torch.equal(frozen, value) and torch.equal(frozen.grad, grad)
    assert not inside(frozen, flat) and not inside(frozen.grad, player.grad)
    assert frozen.requires_grad is False
    # training goes on without it
    ref[0].bias.requires_grad_(False)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), m.parameters()):
            p.copy_(q)
    opt = torch.optim.SGD([flat], lr=0.1)
    ref_opt = torch.optim.SGD(trainable(ref), lr=0.1)
    for _ in range(2):
        _train(m, opt, x, x.sin())
        _train(ref, ref_opt, x, x.sin())
    assert torch.equal(frozen, value)
    assert torch.equal(cat_flat(m.parameters()), cat_flat(ref.parameters()))
    assert_fused(player)
    # unfreezing brings it back
    frozen.requires_grad_(True)
    assert "unfrozen" in player.why_stale()
    assert player.refresh() and player.numel == 31 and inside(frozen, player.flat_param)
    assert_fused(player)


def test_optimizer_on_the_flat_parameter_notices_a_freeze_by_itself() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    flat = player.flat_param
    opt = torch.optim.SGD([flat], lr=0.1)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    m[0].bias.requires_grad_(False)
    frozen = m[0].bias.detach().clone()
    for _ in range(2):
        _train(m, opt, x, x.sin())  # reading flat.grad re-fuses: no check() needed
    assert torch.equal(m[0].bias, frozen) and flat.shape == (21,) and player.numel == 21
    assert_fused(player)
    # an optimizer with per-element state refuses the new layout loudly
    momentum = torch.optim.SGD([flat], lr=0.1, momentum=0.9)
    _train(m, momentum, x, x.sin())
    m[0].bias.requires_grad_(True)
    with pytest.raises(RuntimeError, match="size"):
        _train(m, momentum, x, x.sin())


# ---------------------------------- a flat parameter that cannot follow raises
def test_flat_parameter_split_across_groups_raises_and_the_per_group_tensors_train() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    flat = player.flat_param
    opt = torch.optim.SGD([flat], lr=0.1)
    m[2].float()  # the group splits in two: no single tensor can follow
    assert player.refresh()
    with pytest.raises(RuntimeError, match="no longer holds the module's parameters"):
        opt.step()
    with pytest.raises(RuntimeError, match="no longer holds"):
        flat.add_(1.0)
    with pytest.raises(ValueError, match="2 parameter groups"):
        player.flat_param  # noqa: B018
    assert "stale" in repr(flat)
    # the per-group flat parameters train the module
    groups = [b.data for b in player.buffers]
    assert [g.dtype for g in groups] == [F64, torch.float32]
    before = [g.clone() for g in groups]
    opt = torch.optim.SGD(groups, lr=0.1)
    opt.zero_grad()
    m[2](m[1](m[0](torch.ones(2, 1, dtype=F64))).float()).sum().backward()
    opt.step()
    assert all(not torch.equal(g, b) for g, b in zip(groups, before))
    assert torch.equal(cat_flat(m.parameters()), torch.cat([groups[0], groups[1].double()]))


def test_flat_parameter_held_by_a_graph_raises_instead_of_training_nothing() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    flat = player.flat_param
    w = torch.ones(31, dtype=F64, requires_grad=True)
    kept = (flat * w).sum()  # the graph saves flat: it cannot move
    m.float()
    opt = torch.optim.SGD([flat], lr=0.1)
    with pytest.raises(RuntimeError, match="no longer holds"):
        opt.step()
    assert player.flat_param is not flat and player.flat_param.dtype == torch.float32
    del kept


def test_stale_flat_parameter_of_a_standalone_flat_buffer_raises() -> None:
    m = tiny_mlp(F64)
    buf = FlatBuffer(list(m.parameters()))
    assert torch.equal(buf.data.grad, torch.zeros(31, dtype=F64))
    m.float()
    with pytest.raises(RuntimeError, match="no player to re-fuse"):
        torch.optim.SGD([buf.data], lr=0.1).step()


# -------------------------------------------------------- pickling and copying
def test_flat_parameter_pickles_and_copies_as_a_plain_tensor(tmp_path) -> None:
    player = Player(tiny_mlp(F64))
    flat = player.flat_param
    torch.save(flat, tmp_path / "flat.pt")
    loaded = torch.load(tmp_path / "flat.pt", weights_only=True)
    assert type(loaded) is Tensor and torch.equal(loaded, flat)
    twin = copy.deepcopy(flat)
    assert type(twin) is Tensor and torch.equal(twin, flat) and twin.data_ptr() != flat.data_ptr()
    assert type(flat * 2) is Tensor
