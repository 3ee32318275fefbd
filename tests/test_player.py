"""Player (gameopt/player.py): which parameters it fuses (in ``parameters()`` order,
tied ones once, frozen ones not), one flat buffer per (device, dtype) group, its
arguments, and re-fusing when the module changes after fusing (conversions, replaced,
added, removed, frozen or unfrozen parameters, replaced submodules).

Values are always checked against an unfused reference made with ``copy.deepcopy``
before fusing.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fused import assert_fused, cat_flat, cat_grads, inside, trainable
from models import Bag, tiny_mlp
from torch import Tensor, nn

import gameopt
from gameopt import Player

F64 = torch.float64


# -------------------------------------------------- which parameters are fused
def test_mlp_is_one_flat_buffer_in_parameters_order() -> None:
    m = tiny_mlp()
    ref = copy.deepcopy(m)
    before = list(m.parameters())
    player = Player(m)
    assert player.flat_param.numel() == 31 and player.numel == 31
    assert player.name == "Sequential" and player.module is m
    assert Player(nn.Linear(2, 2), name="gen").name == "gen"
    assert len(player.buffers) == 1
    buf = player.buffers[0]
    assert buf.padded_numel == buf.num_elements == 31
    # same Python objects, in module.parameters() order, values unchanged
    assert all(a is b for a, b in zip(player.parameters, before))
    assert all(a is b for a, b in zip(buf.params, m.parameters()))
    assert [s.offset for s in buf.segments] == [0, 10, 20, 30]
    assert torch.equal(player.flat_param, cat_flat(ref.parameters()))
    for p, q in zip(m.parameters(), ref.parameters()):
        assert isinstance(p, nn.Parameter) and p.requires_grad
        assert p.shape == q.shape and p.stride() == q.stride() and torch.equal(p, q)
    assert_fused(player)
    # the flat grad starts as exact zeros and the module sees them as its grads
    assert torch.equal(player.grad, torch.zeros(31))


def test_tied_weights_are_stored_once() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)).double()
    m[2].weight = m[0].weight
    ref = copy.deepcopy(m)
    assert ref[2].weight is ref[0].weight
    player = Player(m)
    assert player.numel == 16 + 4 + 4
    assert len(player.parameters) == 3
    assert m[0].weight is m[2].weight
    assert inside(m[2].weight, player.flat_param)
    with torch.no_grad():
        player.flat_param[0] = 9.0
    assert m[2].weight[0, 0].item() == 9.0
    with torch.no_grad():
        ref[0].weight[0, 0] = 9.0
    x = torch.randn(3, 4, dtype=F64)
    m(x).sum().backward()
    ref(x).sum().backward()
    # the shared weight's gradient is the sum of both uses, stored once
    assert torch.allclose(player.grad, cat_grads(ref), rtol=1e-12, atol=0)
    assert_fused(player)


def test_frozen_parameters_stay_out_and_untouched() -> None:
    m = tiny_mlp(F64)
    m[0].bias.requires_grad_(False)
    frozen = m[0].bias
    frozen_ptr, frozen_value = frozen.data_ptr(), frozen.detach().clone()
    ref = copy.deepcopy(m)
    player = Player(m)
    assert player.numel == 31 - 10
    assert m[0].bias is frozen and frozen.data_ptr() == frozen_ptr
    assert not inside(frozen, player.flat_param) and frozen.grad is None
    assert all(p is not frozen for p in player.parameters)
    with torch.no_grad():
        player.flat_param.fill_(1.0)
    assert torch.equal(frozen, frozen_value)
    with torch.no_grad():
        player.flat_param.copy_(cat_flat(trainable(ref)))
    x = torch.randn(5, 1, dtype=F64)
    m(x).sum().backward()
    ref(x).sum().backward()
    assert frozen.grad is None
    assert torch.equal(player.grad, cat_grads(ref))
    assert torch.equal(frozen, frozen_value) and frozen.data_ptr() == frozen_ptr


def test_player_from_an_iterable_skips_duplicates_and_frozen_ones_and_re_fuses_conversions() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 2, dtype=F64))
    b = nn.Parameter(torch.randn(3, dtype=F64))
    frozen = nn.Parameter(torch.randn(2, dtype=F64), requires_grad=False)
    ref_w, ref_b = w.detach().clone(), b.detach().clone()
    player = Player(iter([w, b, w, frozen]))  # a one-shot iterator, a duplicate, a frozen one
    assert player.module is None and player.name == "params"
    assert player.numel == 9 and player.parameters == [w, b]
    assert torch.equal(player.flat_param, torch.cat([ref_w.reshape(-1), ref_b]))
    assert not inside(frozen, player.flat_param)
    x = torch.randn(4, 2, dtype=F64)
    (x @ w.t() + b).tanh().sum().backward()
    rw, rb = ref_w.clone().requires_grad_(), ref_b.clone().requires_grad_()
    (x @ rw.t() + rb).tanh().sum().backward()
    assert_fused(player)
    assert torch.equal(player.grad, torch.cat([rw.grad.reshape(-1), rb.grad]))
    # conversions are noticed for bare parameters too
    w.data = w.data.float()
    b.data = b.data.float()
    assert player.refresh()
    assert player.flat_param.dtype == torch.float32 and player.parameters == [w, b]
    assert_fused(player)


def test_player_from_a_parameters_generator_fuses_like_the_module() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m.parameters(), name="mlp")
    assert player.name == "mlp" and player.numel == 31
    x = torch.randn(3, 1, dtype=F64)
    m(x).sum().backward()
    ref(x).sum().backward()
    assert_fused(player)
    assert torch.equal(player.grad, cat_grads(ref))


def test_a_single_tensor_is_one_parameter() -> None:
    w = nn.Parameter(torch.arange(6.0).reshape(2, 3))
    player = Player(w)
    assert player.parameters == [w] and player.numel == 6
    assert torch.equal(player.flat_param, torch.arange(6.0)) and inside(w, player.flat_param)
    game = gameopt.Game([player], lambda: [(w - 1).square().sum()], algorithm=gameopt.SimGD(0.25))
    game.step()
    torch.testing.assert_close(w.detach(), torch.arange(6.0).reshape(2, 3) * 0.5 + 0.5)  # w - 0.25·2(w - 1)
    s = nn.Parameter(torch.tensor([0.2, 0.5, 0.3]))
    assert Player(s, constraint=gameopt.constraints.Simplex()).parameters == [s]


# ------------------------------------------------------------------- arguments
@pytest.mark.parametrize("kind", ["no-params", "all-frozen", "empty-iterable"])
def test_nothing_trainable_is_a_value_error(kind: str) -> None:
    if kind == "no-params":
        what = nn.Sequential(nn.Tanh(), nn.ReLU())
    elif kind == "all-frozen":
        what = nn.Linear(2, 2).requires_grad_(False)
    else:
        what = []
    with pytest.raises(ValueError, match="no trainable parameters"):
        Player(what)


def test_non_parameters_and_a_non_callable_loss_are_type_errors() -> None:
    with pytest.raises(TypeError, match="nn.Module or Parameters"):
        Player([nn.Parameter(torch.ones(2)), 3.0])
    with pytest.raises(TypeError, match="callable"):
        Player(nn.Linear(2, 2), loss=1.0)


def test_a_non_leaf_tensor_is_refused_with_torch_optims_reason() -> None:
    a = torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor") as player_err:
        Player([a * 2])
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor") as optim_err:
        torch.optim.SGD([a * 2], lr=0.1)
    assert "can't optimize a non-leaf Tensor" in str(player_err.value) and optim_err.value
    assert a.grad is None and torch.equal(a, torch.ones(3))


def test_player_is_public_and_flat_buffer_is_internal() -> None:
    assert gameopt.Player is Player and "FlatBuffer" not in gameopt.__all__  # an internal: gameopt.buffer.FlatBuffer


# -------------------------------------------------------- one buffer per dtype
@pytest.mark.parametrize("other", [torch.float64, torch.bfloat16])
def test_one_buffer_per_dtype_group(other: torch.dtype) -> None:
    torch.manual_seed(0)
    m = Bag(
        a=torch.randn(3, 2),
        b=torch.randn(5).to(other),
        c=torch.randn(4),
        d=torch.randn(2, 2).to(other),
    )
    ref = copy.deepcopy(m)
    player = Player(m)
    assert len(player.buffers) == 2 and player.numel == 6 + 5 + 4 + 4
    f32, oth = player.buffers
    assert (f32.dtype, oth.dtype) == (torch.float32, other)
    assert f32.params == [m.a, m.c] and oth.params == [m.b, m.d]
    assert torch.equal(f32.data, cat_flat([ref.a, ref.c]))
    assert torch.equal(oth.data, cat_flat([ref.b, ref.d]))
    for name, p in m.named_parameters():
        assert p.dtype == getattr(ref, name).dtype and torch.equal(p, getattr(ref, name))
    for attr in ("flat_param", "grad"):
        with pytest.raises(ValueError, match="player.buffers") as info:
            getattr(player, attr)
        msg = str(info.value)
        assert "2 parameter groups" in msg and "torch.float32" in msg and str(other) in msg

    def loss(mod: Bag) -> Tensor:
        return (mod.a.sum() * mod.c.prod()) + (mod.b.float() ** 2).sum() * mod.d.float().sum()

    loss(m).backward()
    loss(ref).backward()
    assert_fused(player)
    assert torch.equal(f32.grad, cat_flat([ref.a.grad, ref.c.grad]))
    assert torch.equal(oth.grad, cat_flat([ref.b.grad, ref.d.grad]))


# ------------------------------------------------------- one buffer per device
def test_cpu_and_meta_parameters_make_two_buffers() -> None:
    torch.manual_seed(0)
    m = Bag(a=torch.randn(3), b=torch.empty(4, 2, device="meta"), c=torch.randn(2))
    ref_a, ref_c = m.a.detach().clone(), m.c.detach().clone()
    player = Player(m)
    assert len(player.buffers) == 2
    cpu, meta = player.buffers
    assert cpu.device.type == "cpu" and cpu.data.device.type == "cpu" and cpu.params == [m.a, m.c]
    assert meta.device.type == "meta" and meta.data.device.type == "meta" and meta.grad.device.type == "meta"
    assert meta.params == [m.b] and m.b.device.type == "meta" and m.b.shape == (4, 2)
    assert torch.equal(cpu.data, torch.cat([ref_a, ref_c]))
    assert inside(m.a, cpu.data) and inside(m.c, cpu.data)
    with pytest.raises(ValueError, match="meta"):
        _ = player.flat_param
    assert player.why_stale() is None and not player.refresh()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_parameters_make_two_buffers() -> None:
    torch.manual_seed(0)
    m = Bag(a=torch.randn(3, dtype=F64), b=torch.randn(4, dtype=F64, device="cuda"))
    ref = copy.deepcopy(m)
    player = Player(m)
    assert [b.device.type for b in player.buffers] == ["cpu", "cuda"]
    assert player.buffers[1].data.is_cuda and player.buffers[1].grad.is_cuda
    (m.a.sum() * m.b.sum().cpu()).backward()
    (ref.a.sum() * ref.b.sum().cpu()).backward()
    assert_fused(player)
    assert torch.equal(player.buffers[0].grad, ref.a.grad)
    assert torch.equal(player.buffers[1].grad, ref.b.grad)
    m.zero_grad()
    (m.a.sum() * m.b.sum().cpu()).backward()
    assert_fused(player)
    assert torch.equal(player.buffers[1].grad, ref.b.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_module_moved_to_cuda_after_fusing_is_re_fused_there() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    values = player.flat_param.clone()
    m.cuda()
    assert "cuda" in player.why_stale()
    assert player.refresh()
    assert player.flat_param.is_cuda and torch.equal(player.flat_param.cpu(), values)
    assert_fused(player)


# ---------------------------------------------------- conversions after fusing
@pytest.mark.parametrize(
    ("convert", "dtype"),
    [
        (lambda m: m.double(), torch.float64),
        (lambda m: m.half(), torch.float16),
        (lambda m: m.to(torch.float64), torch.float64),
        (lambda m: m.to(torch.bfloat16), torch.bfloat16),
    ],
    ids=["double", "half", "to-float64", "to-bfloat16"],
)
def test_dtype_conversion_is_noticed_and_re_fused(convert, dtype: torch.dtype) -> None:
    m = tiny_mlp(torch.float32)
    player = Player(m)
    params = list(m.parameters())
    old_buffer = player.buffers[0]
    with torch.no_grad():
        player.flat_param.mul_(0.5)
    m(torch.randn(4, 1)).sum().backward()
    values, grads = player.flat_param.clone(), player.grad.clone()
    generation = player.generation
    convert(m)
    why = player.why_stale()
    assert why is not None and str(dtype) in why
    assert player.refresh() is True
    assert player.generation == generation + 1
    assert player.why_stale() is None and player.refresh() is False
    assert player.buffers[0] is not old_buffer and player.buffers[0].dtype == dtype
    assert player.flat_param.dtype == dtype
    assert torch.equal(player.flat_param, values.to(dtype))
    assert torch.equal(player.grad, grads.to(dtype))  # gradients survive the conversion too
    assert all(a is b for a, b in zip(m.parameters(), params))  # same Parameter objects
    assert_fused(player)
    # and it still trains through the new buffer, also after set_to_none
    x = torch.randn(4, 1, dtype=dtype)
    for _ in range(2):
        m.zero_grad()
        m(x).float().sum().backward()
        assert_fused(player)
        assert torch.count_nonzero(player.grad) > 0


def test_params_property_re_fuses_a_converted_module() -> None:
    m = tiny_mlp(torch.float32)
    player = Player(m)
    m.double()
    assert player.flat_param.dtype == torch.float64  # .params runs check()
    assert_fused(player)


def test_replacing_data_is_noticed_and_re_fused() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    new_weight = torch.arange(10, dtype=F64).reshape(10, 1)
    m[0].weight.data = new_weight.clone()
    assert "replaced" in player.why_stale()
    assert player.refresh()
    assert torch.equal(player.flat_param[:10], new_weight.reshape(-1))
    assert not inside(m[0].weight, new_weight)
    assert_fused(player)


def test_load_state_dict_with_assign_is_noticed_and_re_fused() -> None:
    m = tiny_mlp(F64, seed=0)
    other = tiny_mlp(F64, seed=1)
    sd = other.state_dict()
    player = Player(m)
    m.load_state_dict(sd, assign=True)
    assert "replaced" in player.why_stale()
    assert player.refresh()
    assert torch.equal(player.flat_param, cat_flat(other.parameters()))
    assert all(a is b for a, b in zip(player.parameters, m.parameters()))  # the new objects
    assert_fused(player)
    with torch.no_grad():
        player.flat_param.zero_()
    assert torch.count_nonzero(sd["0.weight"]) > 0  # the loaded tensors are not aliased
    x = torch.randn(3, 1, dtype=F64)
    m.zero_grad()
    m(x).sum().backward()
    assert_fused(player)


def test_re_fusing_while_a_graph_is_alive_fails_cleanly_then_recovers() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.randn(3, 1, dtype=F64)
    out = m(x).sum()
    m[0].weight.data = m[0].weight.data.clone()
    with pytest.raises(RuntimeError, match="re-fusing failed.*autograd graph"):
        player.refresh()
    del out
    assert player.refresh()
    assert torch.equal(player.flat_param, cat_flat(ref.parameters()))
    m(x).sum().backward()
    ref(x).sum().backward()
    assert_fused(player)
    assert torch.equal(player.grad, cat_grads(ref))


# ----------------------------------------- parameters that change after fusing
def test_parameter_added_after_fusing_joins_the_buffers() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    params = list(m.parameters())
    values = player.flat_param.clone()
    assert player.registry_intact()
    m.register_parameter("extra", nn.Parameter(torch.tensor([1.0, 2.0], dtype=F64)))
    assert not player.registry_intact()
    assert "'extra' was added to Sequential" in player.why_stale()
    assert player.refresh() and player.why_stale() is None
    # module.parameters() order: the Sequential's own parameter first
    assert player.numel == 33 and all(p is q for p, q in zip(player.parameters, [m.extra, *params]))
    assert all(p is q for p, q in zip(player.parameters, m.parameters()))
    assert torch.equal(player.flat_param, torch.cat([torch.tensor([1.0, 2.0], dtype=F64), values]))
    # setattr of a new Parameter, and a new submodule with parameters
    m[0].scale = nn.Parameter(torch.full((3,), 0.5, dtype=F64))
    assert "'scale' was added to Linear" in player.why_stale()
    m.add_module("head", nn.Linear(1, 2).double())
    assert player.refresh() and player.numel == 33 + 3 + 4
    assert all(any(p is q for q in player.parameters) for p in m.parameters())
    x = torch.randn(3, 1, dtype=F64)
    (m(x).sum() + m.extra.sum() + m[0].scale.sum() + m.head(x).sum()).backward()
    assert_fused(player)
    assert torch.equal(m.extra.grad, torch.ones(2, dtype=F64))


def test_parameter_set_where_none_was_joins_the_buffers() -> None:
    m = nn.Linear(2, 2, bias=False).double()
    player = Player(m)
    m.bias = nn.Parameter(torch.ones(2, dtype=F64))
    assert "'bias' of Linear was replaced" in player.why_stale()
    assert player.refresh() and player.numel == 6
    assert_fused(player)


@pytest.mark.parametrize("how", ["del", "pop", "none"])
def test_removed_parameter_leaves_the_buffers(how: str) -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    gone = m[2].bias
    value = gone.detach().clone()
    if how == "del":
        del m[2].bias
    elif how == "pop":
        m[2]._parameters.pop("bias")
    else:
        m[2].bias = None
    assert player.why_stale() is not None
    assert player.refresh() and player.numel == 30
    assert all(p is not gone for p in player.parameters)
    assert torch.equal(gone, value) and not inside(gone, player.flat_param)
    assert_fused(player)


def test_replaced_submodule_is_noticed_and_its_parameters_re_fused() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    old = m[0]
    m[0] = nn.Linear(1, 10).double()
    assert "submodule '0' of Sequential was replaced" in player.why_stale()
    assert player.refresh()
    assert player.parameters[0] is m[0].weight and all(p is not old.weight for p in player.parameters)
    assert_fused(player)


def test_iterable_player_re_fuses_without_a_frozen_parameter() -> None:
    w = nn.Parameter(torch.ones(3, dtype=F64))
    b = nn.Parameter(torch.zeros(2, dtype=F64))
    player = Player([w, b])
    b.requires_grad_(False)
    assert "frozen" in player.why_stale()
    assert player.refresh() and player.parameters == [w]


def test_nothing_left_trainable_after_freezing_is_a_value_error() -> None:
    m = nn.Linear(2, 1).double()
    player = Player(m)
    m.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        player.refresh()


def test_game_notices_a_parameter_frozen_after_fusing_and_trains_without_it() -> None:
    torch.manual_seed(0)
    m, rival = tiny_mlp(F64), nn.Linear(1, 1).double()
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    game = gameopt.Game([m, rival], lambda: (m(x).pow(2).mean(), rival(x).pow(2).mean()), algorithm=gameopt.SGA(0.1))
    game.step()
    m[0].bias.requires_grad_(False)
    frozen = m[0].bias.detach().clone()
    for _ in range(2):
        game.step()
    assert torch.equal(m[0].bias, frozen)
    assert game.players[0].numel == 21
    assert_fused(game.players[0])
