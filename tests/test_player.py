"""Player: fused flat parameter and gradient buffers.

Every corner case below is written so that the naive recipe
``p.data = flat[a:b].view(p.shape); p.grad = flat_grad[a:b].view(p.shape)`` fails it:
the naive recipe keeps each parameter's own version counter, loses the link as soon as
autograd allocates a fresh ``.grad`` (``zero_grad(set_to_none=True)``, sparse or
expanded gradients), drops ``channels_last`` strides, never notices conversions, and
silently fuses parameters that a live autograd graph still points at.

Values are always checked against an unfused reference made with ``copy.deepcopy``
before fusing.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.utils.checkpoint
from torch import Tensor, nn

import gameopt
from gameopt import Player
from gameopt.buffer import FlatBuffer

F64 = torch.float64


# ---------------------------------------------------------------------------- helpers
def _mlp(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 10), nn.Tanh(), nn.Linear(10, 1)).to(dtype)


def _flat(tensors) -> Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _flat_grad(module: nn.Module) -> Tensor:
    return _flat(p.grad for p in _trainable(module))


def _inside(t: Tensor, base: Tensor) -> bool:
    """``t`` lives in ``base``'s memory (same storage, data pointer within its range)."""
    start = base.data_ptr()
    end = start + base.numel() * base.element_size()
    same_storage = t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    return same_storage and start <= t.data_ptr() < end


def _assert_fused(player: Player) -> None:
    """Every fused parameter is a view of its buffer's data, its grad of the buffer's grad."""
    for buf in player.buffers:
        assert buf.data.shape == buf.grad.shape == (buf.numel,)
        for p, seg in zip(buf.params, buf.segments):
            assert p.dtype == buf.dtype and p.device == buf.device
            assert p.data_ptr() == buf.data.data_ptr() + seg.offset * buf.data.element_size()
            assert _inside(p, buf.data)
            assert p.grad is not None and _inside(p.grad, buf.grad)
            assert p.grad.data_ptr() == buf.grad.data_ptr() + seg.offset * buf.grad.element_size()


class Bag(nn.Module):
    """A module holding the given tensors as parameters, in order."""

    def __init__(self, **tensors: Tensor) -> None:
        super().__init__()
        for name, t in tensors.items():
            setattr(self, name, nn.Parameter(t))


# ------------------------------------------------------------------ 1. basic fusing
def test_mlp_is_one_flat_buffer_in_parameters_order() -> None:
    m = _mlp()
    ref = copy.deepcopy(m)
    before = list(m.parameters())
    player = Player(m)
    assert player.params.numel() == 31 and player.numel == 31
    assert player.name == "Sequential" and player.module is m
    assert len(player.buffers) == 1
    buf = player.buffers[0]
    assert buf.numel == buf.num_elements == 31
    # same Python objects, in module.parameters() order, values unchanged
    assert all(a is b for a, b in zip(player.parameters, before))
    assert all(a is b for a, b in zip(buf.params, m.parameters()))
    assert [s.offset for s in buf.segments] == [0, 10, 20, 30]
    assert torch.equal(player.params, _flat(ref.parameters()))
    for p, q in zip(m.parameters(), ref.parameters()):
        assert isinstance(p, nn.Parameter) and p.requires_grad
        assert p.shape == q.shape and p.stride() == q.stride() and torch.equal(p, q)
    _assert_fused(player)
    # the flat grad starts as exact zeros and the module sees them as its grads
    assert torch.equal(player.grad, torch.zeros(31))


def test_params_is_the_storage_both_ways() -> None:
    m = _mlp()
    player = Player(m)
    flat = player.params
    with torch.no_grad():
        flat[0] = 5.0  # first weight entry
        flat[-1] = -3.0  # last bias
    assert m[0].weight[0, 0].item() == 5.0 and m[2].bias.item() == -3.0
    with torch.no_grad():
        m[0].bias.fill_(2.0)
        m[2].weight.mul_(0.0)
    assert torch.equal(flat[10:20], torch.full((10,), 2.0))
    assert torch.equal(flat[20:30], torch.zeros(10))
    assert player.params.data_ptr() == flat.data_ptr()  # the same tensor every time
    assert torch.equal(player.params, _flat(m.parameters()))


def test_gradients_land_in_the_flat_grad() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.linspace(-1, 1, 7, dtype=F64).unsqueeze(1)
    m(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    _assert_fused(player)
    assert torch.equal(player.grad, _flat_grad(ref))
    assert torch.equal(player.buffers[0].grad, _flat_grad(ref))


def test_odd_shapes_scalar_and_empty_parameters() -> None:
    torch.manual_seed(0)
    m = Bag(s=torch.tensor(2.0, dtype=F64), e=torch.empty(0, 3, dtype=F64), v=torch.randn(4, dtype=F64))
    ref = copy.deepcopy(m)
    player = Player(m)
    assert player.numel == 5 and m.s.shape == () and m.e.shape == (0, 3)
    assert torch.equal(player.params, _flat(ref.parameters()))
    (m.s * m.v.sum() + m.e.sum()).backward()
    (ref.s * ref.v.sum() + ref.e.sum()).backward()
    assert torch.equal(player.grad, _flat_grad(ref))
    assert m.s.grad.shape == () and m.e.grad.shape == (0, 3)
    assert player.why_stale() is None


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
    assert _inside(m[2].weight, player.params)
    with torch.no_grad():
        player.params[0] = 9.0
    assert m[2].weight[0, 0].item() == 9.0
    with torch.no_grad():
        ref[0].weight[0, 0] = 9.0
    x = torch.randn(3, 4, dtype=F64)
    m(x).sum().backward()
    ref(x).sum().backward()
    # the shared weight's gradient is the sum of both uses, stored once
    assert torch.allclose(player.grad, _flat_grad(ref), rtol=1e-12, atol=0)
    _assert_fused(player)


def test_frozen_parameters_stay_out_and_untouched() -> None:
    m = _mlp(F64)
    m[0].bias.requires_grad_(False)
    frozen = m[0].bias
    frozen_ptr, frozen_value = frozen.data_ptr(), frozen.detach().clone()
    ref = copy.deepcopy(m)
    player = Player(m)
    assert player.numel == 31 - 10
    assert m[0].bias is frozen and frozen.data_ptr() == frozen_ptr
    assert not _inside(frozen, player.params) and frozen.grad is None
    assert all(p is not frozen for p in player.parameters)
    with torch.no_grad():
        player.params.fill_(1.0)
    assert torch.equal(frozen, frozen_value)
    with torch.no_grad():
        player.params.copy_(_flat(_trainable(ref)))
    x = torch.randn(5, 1, dtype=F64)
    m(x).sum().backward()
    ref(x).sum().backward()
    assert frozen.grad is None
    assert torch.equal(player.grad, _flat_grad(ref))
    assert torch.equal(frozen, frozen_value) and frozen.data_ptr() == frozen_ptr


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


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="nn.Module or Parameters"):
        Player([nn.Parameter(torch.ones(2)), 3.0])
    with pytest.raises(TypeError, match="callable"):
        Player(nn.Linear(2, 2), loss=1.0)
    assert Player(nn.Linear(2, 2), name="gen").name == "gen"


# ------------------------------------------------------------ 2. several dtypes
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
    assert torch.equal(f32.data, _flat([ref.a, ref.c]))
    assert torch.equal(oth.data, _flat([ref.b, ref.d]))
    for name, p in m.named_parameters():
        assert p.dtype == getattr(ref, name).dtype and torch.equal(p, getattr(ref, name))
    for attr in ("params", "grad"):
        with pytest.raises(ValueError, match="player.buffers") as info:
            getattr(player, attr)
        msg = str(info.value)
        assert "2 parameter groups" in msg and "torch.float32" in msg and str(other) in msg

    def loss(mod: Bag) -> Tensor:
        return (mod.a.sum() * mod.c.prod()) + (mod.b.float() ** 2).sum() * mod.d.float().sum()

    loss(m).backward()
    loss(ref).backward()
    _assert_fused(player)
    assert torch.equal(f32.grad, _flat([ref.a.grad, ref.c.grad]))
    assert torch.equal(oth.grad, _flat([ref.b.grad, ref.d.grad]))


# ----------------------------------------------------------- 3. several devices
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
    assert _inside(m.a, cpu.data) and _inside(m.c, cpu.data)
    with pytest.raises(ValueError, match="meta"):
        _ = player.params
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
    _assert_fused(player)
    assert torch.equal(player.buffers[0].grad, ref.a.grad)
    assert torch.equal(player.buffers[1].grad, ref.b.grad)
    m.zero_grad()
    (m.a.sum() * m.b.sum().cpu()).backward()
    _assert_fused(player)
    assert torch.equal(player.buffers[1].grad, ref.b.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_module_moved_to_cuda_after_fusing_is_refused() -> None:
    m = _mlp(F64)
    player = Player(m)
    values = player.params.clone()
    m.cuda()
    assert "cuda" in player.why_stale()
    assert player.refresh()
    assert player.params.is_cuda and torch.equal(player.params.cpu(), values)
    _assert_fused(player)


# ----------------------------------------------------------------------- 4. align
@pytest.mark.parametrize(
    ("dtype", "align"), [(torch.float32, 64), (torch.float64, 64), (torch.float64, 16), (torch.bfloat16, 16)]
)
def test_align_pads_segment_starts(dtype: torch.dtype, align: int) -> None:
    m = _mlp(dtype)
    ref = copy.deepcopy(m)
    player = Player(m, align=align)
    buf = player.buffers[0]
    item = buf.data.element_size()
    assert player.numel == buf.num_elements == 31
    assert buf.numel > 31 and (buf.numel * item) % align == 0
    for p, seg in zip(buf.params, buf.segments):
        assert (seg.offset * item) % align == 0
        assert (p.data_ptr() - buf.data.data_ptr()) % align == 0
        assert (p.grad.data_ptr() - buf.grad.data_ptr()) % align == 0
    assert torch.equal(_flat(m.parameters()), _flat(ref.parameters()))
    _assert_fused(player)


def _padding_mask(buf: FlatBuffer) -> Tensor:
    used = torch.zeros(buf.numel, dtype=torch.bool)
    for seg in buf.segments:
        used[seg.offset : seg.offset + seg.numel] = True
    return ~used


def test_align_padding_stays_zero_and_reductions_match() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m, align=64)
    buf = player.buffers[0]
    pad = _padding_mask(buf)
    assert pad.sum() == buf.numel - 31 > 0
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    x = torch.linspace(-1, 1, 9, dtype=F64).unsqueeze(1)
    for _ in range(3):
        for mod, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            mod(x).pow(2).mean().backward()
        assert torch.equal(player.grad[pad], torch.zeros(int(pad.sum()), dtype=F64))
        assert torch.equal(player.grad[~pad], _flat_grad(ref))
        opt.step()
        ref_opt.step()
        assert torch.equal(player.params[pad], torch.zeros(int(pad.sum()), dtype=F64))
        assert torch.allclose(player.params[~pad], _flat(ref.parameters()), rtol=1e-12, atol=0)
    _assert_fused(player)
    # whole-buffer reductions see only the parameters
    rp, rg = _flat(ref.parameters()), _flat_grad(ref)
    assert torch.allclose(player.params.dot(player.params), rp.dot(rp), rtol=1e-12, atol=0)
    assert torch.allclose(player.params.dot(player.grad), rp.dot(rg), rtol=1e-12, atol=0)
    assert torch.allclose(torch.linalg.vector_norm(player.grad), torch.linalg.vector_norm(rg), rtol=1e-12, atol=0)
    assert torch.allclose(player.params.abs().max(), rp.abs().max())


@pytest.mark.parametrize("align", [0, -8, 2.5, "64", 3])
def test_invalid_align_is_a_value_error(align) -> None:
    with pytest.raises(ValueError, match="align"):
        Player(_mlp(torch.float32), align=align)  # 3 bytes does not fit 4-byte elements


# ---------------------------------------------------- 5. conversions after fusing
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
def test_dtype_conversion_is_noticed_and_refused(convert, dtype: torch.dtype) -> None:
    m = _mlp(torch.float32)
    player = Player(m)
    params = list(m.parameters())
    old_buffer = player.buffers[0]
    with torch.no_grad():
        player.params.mul_(0.5)
    m(torch.randn(4, 1)).sum().backward()
    values, grads = player.params.clone(), player.grad.clone()
    generation = player.generation
    convert(m)
    why = player.why_stale()
    assert why is not None and str(dtype) in why
    assert player.refresh() is True
    assert player.generation == generation + 1
    assert player.why_stale() is None and player.refresh() is False
    assert player.buffers[0] is not old_buffer and player.buffers[0].dtype == dtype
    assert player.params.dtype == dtype
    assert torch.equal(player.params, values.to(dtype))
    assert torch.equal(player.grad, grads.to(dtype))  # gradients survive the conversion too
    assert all(a is b for a, b in zip(m.parameters(), params))  # same Parameter objects
    _assert_fused(player)
    # and it still trains through the new buffer, also after set_to_none
    x = torch.randn(4, 1, dtype=dtype)
    for _ in range(2):
        m.zero_grad()
        m(x).float().sum().backward()
        _assert_fused(player)
        assert torch.count_nonzero(player.grad) > 0


def test_params_property_refuses_automatically() -> None:
    m = _mlp(torch.float32)
    player = Player(m)
    m.double()
    assert player.params.dtype == torch.float64  # .params runs check()
    _assert_fused(player)


def test_replacing_data_is_noticed_and_refused() -> None:
    m = _mlp(F64)
    player = Player(m)
    new_weight = torch.arange(10, dtype=F64).reshape(10, 1)
    m[0].weight.data = new_weight.clone()
    assert "replaced" in player.why_stale()
    assert player.refresh()
    assert torch.equal(player.params[:10], new_weight.reshape(-1))
    assert not _inside(m[0].weight, new_weight)
    _assert_fused(player)


def test_load_state_dict_with_assign_is_noticed_and_refused() -> None:
    m = _mlp(F64, seed=0)
    other = _mlp(F64, seed=1)
    sd = other.state_dict()
    player = Player(m)
    m.load_state_dict(sd, assign=True)
    assert "replaced" in player.why_stale()
    assert player.refresh()
    assert torch.equal(player.params, _flat(other.parameters()))
    assert all(a is b for a, b in zip(player.parameters, m.parameters()))  # the new objects
    _assert_fused(player)
    with torch.no_grad():
        player.params.zero_()
    assert torch.count_nonzero(sd["0.weight"]) > 0  # the loaded tensors are not aliased
    x = torch.randn(3, 1, dtype=F64)
    m.zero_grad()
    m(x).sum().backward()
    _assert_fused(player)


def test_plain_load_state_dict_copies_in_place_and_keeps_the_link() -> None:
    m = _mlp(F64, seed=0)
    other = _mlp(F64, seed=1)
    player = Player(m)
    ptrs = [p.data_ptr() for p in m.parameters()]
    flat = player.params
    m.load_state_dict(other.state_dict())
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert player.why_stale() is None and player.refresh() is False
    assert player.params is flat or player.params.data_ptr() == flat.data_ptr()
    assert torch.equal(player.params, _flat(other.parameters()))


def test_refusing_while_a_graph_is_alive_fails_cleanly_then_recovers() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.randn(3, 1, dtype=F64)
    out = m(x).sum()
    m[0].weight.data = m[0].weight.data.clone()
    with pytest.raises(RuntimeError, match="re-fusing failed.*autograd graph"):
        player.refresh()
    del out
    assert player.refresh()
    assert torch.equal(player.params, _flat(ref.parameters()))
    m(x).sum().backward()
    ref(x).sum().backward()
    _assert_fused(player)
    assert torch.equal(player.grad, _flat_grad(ref))


# ---------------------------------------------------------- 6. unused parameters
def test_unused_parameters_read_as_exact_zeros() -> None:
    torch.manual_seed(0)
    used, unused = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
    holder = nn.ModuleList([used, unused])
    ref = copy.deepcopy(holder)
    player = Player(holder)
    n_used = sum(p.numel() for p in used.parameters())
    player.grad.fill_(7.0)  # stale garbage everywhere
    holder.zero_grad()  # set_to_none=True
    assert all(p.grad is None for p in holder.parameters())
    x = torch.randn(4, 3, dtype=F64)
    used(x).sum().backward()
    ref[0](x).sum().backward()
    g = player.grad
    assert torch.equal(g[n_used:], torch.zeros(player.numel - n_used, dtype=F64))
    assert torch.equal(g[:n_used], _flat(p.grad for p in ref[0].parameters()))
    # after reading, the unused .grad are the (zero) views again, not None
    _assert_fused(player)
    assert torch.count_nonzero(unused.weight.grad) == 0


def test_unused_parameters_with_torch_autograd_grad_inputs() -> None:
    torch.manual_seed(0)
    m = Bag(a=torch.randn(3, dtype=F64), b=torch.randn(2, dtype=F64))
    player = Player(m)
    player.grad.fill_(7.0)
    m.zero_grad()
    m.a.pow(2).sum().backward(inputs=[m.a, m.b], retain_graph=False)
    assert torch.equal(player.grad, torch.cat([2 * m.a.detach(), torch.zeros(2, dtype=F64)]))


# ------------------------------------------------- 7. broadcast and expanded grads
class Broadcasty(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4, dtype=F64))
        self.bias = nn.Parameter(torch.randn(4, dtype=F64))
        self.scale = nn.Parameter(torch.randn(1, dtype=F64))
        self.col = nn.Parameter(torch.randn(3, 1, dtype=F64))
        self.c = nn.Parameter(torch.tensor(0.5, dtype=F64))

    def forward(self, x: Tensor) -> Tensor:
        h = x @ self.w + self.bias  # bias broadcast over the batch
        h = h * self.scale.expand(4)  # a parameter used through expand
        h = h + (self.col * torch.ones(3, 4, dtype=F64)).sum(0)  # (3,1) broadcast to (3,4)
        return (h.tanh().sum() + self.bias.sum()) * self.c  # bias used twice


@pytest.mark.parametrize("set_to_none", [False, True])
def test_broadcast_and_expanded_gradients_land_with_correct_values(set_to_none: bool) -> None:
    torch.manual_seed(0)
    m = Broadcasty()
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.randn(5, 3, dtype=F64)
    for _ in range(2):
        m.zero_grad(set_to_none=set_to_none)
        ref.zero_grad()
        m(x).backward()
        ref(x).backward()
        _assert_fused(player)
        assert torch.equal(player.grad, _flat_grad(ref))
        assert m.scale.grad.shape == (1,) and m.col.grad.shape == (3, 1)


def test_gradient_of_a_plain_sum_is_not_left_expanded() -> None:
    # d(p.sum())/dp is an expanded (stride-0) tensor: it must be copied into the buffer
    torch.manual_seed(0)
    m = Bag(p=torch.randn(2, 3, dtype=F64))
    player = Player(m)
    for _ in range(2):
        m.zero_grad()
        m.p.sum().backward()
        _assert_fused(player)
        assert m.p.grad.stride() == m.p.stride() == (3, 1)
        assert torch.equal(player.grad, torch.ones(6, dtype=F64))


# -------------------------------------------- 8. in-place landing, no reallocation
def test_gradients_stay_in_place_across_zero_grad_set_to_none() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    grad_flat = player.grad
    grad_ptrs = [p.grad.data_ptr() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    for _ in range(3):
        opt.zero_grad()  # set_to_none=True: autograd allocates fresh grads next time
        ref_opt.zero_grad()
        assert all(p.grad is None for p in m.parameters())
        m(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        # relinked by the post-accumulate-grad hook, before anyone reads player.grad
        assert [p.grad.data_ptr() for p in m.parameters()] == grad_ptrs
        assert all(_inside(p.grad, grad_flat) for p in m.parameters())
        assert torch.equal(grad_flat, _flat_grad(ref))
        opt.step()
        ref_opt.step()
        assert torch.equal(player.params, _flat(ref.parameters()))
    assert player.grad.data_ptr() == grad_flat.data_ptr()


def test_gradients_accumulate_in_place() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    grad_obj = [p.grad for p in m.parameters()]
    x = torch.randn(4, 1, dtype=F64)
    for mod in (m, ref):
        mod(x).sum().backward()
        mod(2 * x).sum().backward()
    assert all(p.grad is g for p, g in zip(m.parameters(), grad_obj))  # same tensors, added into
    assert torch.equal(player.grad, _flat_grad(ref))
    m.zero_grad(set_to_none=False)
    assert all(p.grad is g for p, g in zip(m.parameters(), grad_obj))
    assert torch.equal(player.grad, torch.zeros(31, dtype=F64))


def test_user_tensor_hooks_survive_fusing() -> None:
    m = _mlp(F64)
    calls: list[str] = []
    m[0].weight.register_hook(lambda g: calls.append("grad"))
    m[0].weight.register_post_accumulate_grad_hook(lambda p: calls.append("post"))
    player = Player(m)
    x = torch.randn(2, 1, dtype=F64)
    for _ in range(2):
        m.zero_grad()
        m(x).sum().backward()
        _assert_fused(player)
    assert calls == ["grad", "post", "grad", "post"]


def test_rehome_moves_values_grads_and_relinking() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    buf = player.buffers[0]
    x = torch.randn(3, 1, dtype=F64)
    m(x).sum().backward()
    grads = player.grad.clone()
    data, grad = torch.zeros(40, dtype=F64), torch.zeros(40, dtype=F64)
    buf.rehome(data[5:36], grad[5:36])
    assert torch.equal(data[5:36], _flat(ref.parameters())) and torch.equal(grad[5:36], grads)
    assert all(_inside(p, data) and _inside(p.grad, grad) for p in m.parameters())
    m.zero_grad()
    m(x).sum().backward()
    assert all(_inside(p.grad, grad) for p in m.parameters())
    assert torch.equal(grad[5:36], grads)
    assert torch.count_nonzero(grad[:5]) == 0 and torch.count_nonzero(grad[36:]) == 0


# ----------------------------------------------------- 9. shared version counter
def test_in_place_change_between_forward_and_backward_is_caught() -> None:
    m = _mlp(F64)
    player = Player(m)
    assert all(p._version == player.params._version for p in m.parameters())
    x = torch.randn(4, 1, dtype=F64)
    out = m(x).pow(2).sum()  # tanh and the weights are saved for backward
    with torch.no_grad():
        player.params.mul_(2.0)  # naive p.data = view: silently wrong gradients
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_in_place_change_through_the_module_bumps_the_flat_version() -> None:
    m = _mlp(F64)
    player = Player(m)
    version = player.params._version
    with torch.no_grad():
        m[2].bias.add_(1.0)
    assert player.params._version > version
    assert m[0].weight._version == player.params._version


# ------------------------------------------------------------- 10. channels_last
@pytest.mark.parametrize("set_to_none", [False, True])
def test_channels_last_conv_weight_keeps_its_strides(set_to_none: bool) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh(), nn.Conv2d(4, 2, 1)).double()
    m = m.to(memory_format=torch.channels_last)
    ref = copy.deepcopy(m)
    strides = [p.stride() for p in m.parameters()]
    assert strides[0] == (27, 1, 9, 3)  # really channels_last
    player = Player(m)
    assert [p.stride() for p in m.parameters()] == strides
    assert m[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), ref.parameters()))
    x = torch.randn(2, 3, 6, 6, dtype=F64).to(memory_format=torch.channels_last)
    for _ in range(2):
        m.zero_grad(set_to_none=set_to_none)
        ref.zero_grad()
        m(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        _assert_fused(player)
        assert [p.grad.stride() for p in m.parameters()] == strides
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=0)
    # the flat buffer is the raw storage: a weight's segment holds it in memory (NHWC) order
    seg = player.buffers[0].segments[0]
    raw = player.params[seg.offset : seg.offset + seg.numel]
    assert torch.equal(raw, m[0].weight.detach().permute(0, 2, 3, 1).reshape(-1))


def test_channels_last_with_one_input_channel_stays_channels_last() -> None:
    torch.manual_seed(0)
    m = nn.Conv2d(1, 4, 3).double().to(memory_format=torch.channels_last)
    ref = copy.deepcopy(m)
    Player(m)
    assert m.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(m.weight, ref.weight)
    x = torch.randn(2, 1, 5, 5, dtype=F64).to(memory_format=torch.channels_last)
    m(x).sum().backward()
    ref(x).sum().backward()
    assert torch.allclose(m.weight.grad, ref.weight.grad, rtol=1e-12, atol=0)


def test_non_dense_parameter_is_stored_densely() -> None:
    torch.manual_seed(0)
    base = torch.randn(4, 6, dtype=F64)
    m = Bag(strided=base[:, ::2], transposed=torch.randn(3, 5, dtype=F64).t())
    ref = copy.deepcopy(m)
    player = Player(m)
    assert m.transposed.stride() == (1, 5)  # a dense permutation keeps its layout
    assert m.strided.is_contiguous()  # a gappy one becomes contiguous
    assert torch.equal(m.strided, ref.strided) and torch.equal(m.transposed, ref.transposed)
    (m.strided.sum() * m.transposed.pow(2).sum()).backward()
    (ref.strided.sum() * ref.transposed.pow(2).sum()).backward()
    _assert_fused(player)
    assert m.transposed.grad.stride() == (1, 5)
    assert torch.equal(m.strided.grad, ref.strided.grad) and torch.equal(m.transposed.grad, ref.transposed.grad)


# --------------------------------------------------------------- 11. sparse grads
def test_sparse_embedding_gradients_are_densified_into_the_buffer() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(10, 3, sparse=True), nn.Linear(3, 1)).double()
    ref = nn.Sequential(nn.Embedding(10, 3, sparse=False), nn.Linear(3, 1)).double()
    ref.load_state_dict(m.state_dict())
    player = Player(m)
    assert player.has_sparse_grad
    idx = torch.tensor([[1, 2, 2], [7, 1, 0]])
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        if step:
            opt.zero_grad()  # set_to_none: the next grad arrives as a fresh sparse tensor
            ref_opt.zero_grad()
        m(idx).pow(2).sum().backward()
        ref(idx).pow(2).sum().backward()
        assert m[0].weight.grad.layout == torch.strided
        _assert_fused(player)
        assert torch.allclose(player.grad, _flat_grad(ref), rtol=1e-12, atol=0)
        opt.step()
        ref_opt.step()
        assert torch.allclose(player.params, _flat(ref.parameters()), rtol=1e-12, atol=0)


# ------------------------------------------------------ 12. fusing a live graph
@pytest.mark.parametrize("saved", [False, True], ids=["weight-not-saved", "weight-saved"])
def test_fusing_while_a_graph_is_alive_raises(saved: bool) -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    params = list(m.parameters())
    ptrs = [p.data_ptr() for p in params]
    x = torch.randn(3, 1, dtype=F64)
    out = m(x).sum() if not saved else m(x).sum() * m[0].weight.pow(2).sum()
    with pytest.raises(RuntimeError, match="autograd graph"):
        Player(m)
    # nothing moved and the pending backward still works, with the right values
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert all(a is b for a, b in zip(m.parameters(), params))
    out.backward()
    (ref(x).sum() if not saved else ref(x).sum() * ref[0].weight.pow(2).sum()).backward()
    assert torch.equal(_flat_grad(m), _flat_grad(ref))
    del out
    player = Player(m)
    assert torch.equal(player.grad, _flat_grad(ref))  # existing grads are kept
    _assert_fused(player)


# ----------------------------------------------------------------- 13. deepcopy
def test_deepcopy_of_a_fused_module_is_independent() -> None:
    m = _mlp(F64)
    player = Player(m)
    x = torch.randn(3, 1, dtype=F64)
    m(x).sum().backward()
    values, grads = player.params.clone(), player.grad.clone()
    twin = copy.deepcopy(m)
    assert torch.equal(_flat(twin.parameters()), values)
    assert not any(_inside(p, player.params) for p in twin.parameters())
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(1.0)
    twin.zero_grad()
    twin(x).pow(3).sum().backward()
    torch.optim.SGD(twin.parameters(), lr=1.0).step()
    assert not any(_inside(p.grad, player.buffers[0].grad) for p in twin.parameters())
    assert torch.equal(player.params, values) and torch.equal(player.grad, grads)
    # the copy can be fused on its own
    twin_player = Player(twin)
    assert twin_player.params.data_ptr() != player.params.data_ptr()
    _assert_fused(twin_player)
    _assert_fused(player)


# -------------------------------------------------------- 14. state_dict round trip
def test_state_dict_save_load_round_trip_keeps_the_link(tmp_path) -> None:
    m = _mlp(F64)
    player = Player(m)
    values = player.params.clone()
    torch.save(m.state_dict(), tmp_path / "m.pt")
    with torch.no_grad():
        player.params.zero_()
    ptrs = [p.data_ptr() for p in m.parameters()]
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    assert set(sd) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(t.shape == p.shape for t, p in zip(sd.values(), m.parameters()))
    m.load_state_dict(sd)
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert player.why_stale() is None
    assert torch.equal(player.params, values)
    fresh = _mlp(F64, seed=3)
    fresh.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    assert torch.equal(_flat(fresh.parameters()), values)
    m(torch.randn(2, 1, dtype=F64)).sum().backward()
    _assert_fused(player)


# ----------------------------------------------------------- 15. torch.optim modes
OPTIMIZERS = {
    "sgd": lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, **kw),
    "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, **kw),
}
MODES = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_torch_optim_steps_match_an_unfused_module(opt_name: str, mode: str) -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat, flat_grad = player.params, player.grad
    opt = OPTIMIZERS[opt_name](m.parameters(), **MODES[mode])
    ref_opt = OPTIMIZERS[opt_name](ref.parameters(), **MODES[mode])
    x = torch.linspace(-1, 1, 8, dtype=F64).unsqueeze(1)
    for _ in range(4):
        for mod, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()  # set_to_none=True
            (mod(x) - x.sin()).pow(2).mean().backward()
        # the optimizer steps on the buffer's own views (checked before reading player.grad)
        assert all(_inside(p.grad, flat_grad) for p in m.parameters())
        torch.testing.assert_close(flat_grad, _flat_grad(ref), rtol=1e-13, atol=1e-15)
        opt.step()
        ref_opt.step()
        torch.testing.assert_close(flat, _flat(ref.parameters()), rtol=1e-13, atol=1e-15)
        assert all(_inside(p, flat) for p in m.parameters())
    assert player.params.data_ptr() == flat.data_ptr() and player.grad.data_ptr() == flat_grad.data_ptr()
    _assert_fused(player)
    assert not torch.equal(flat, _flat(_mlp(F64).parameters()))  # it did move


# ------------------------------------------------------------- 16. torch.compile
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning"
)  # torch: inductor imports deprecated torch.jit APIs
def test_torch_compile_trains_through_the_buffer() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    try:
        m = _mlp(torch.float32)
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
            _assert_fused(player)
            torch.testing.assert_close(player.grad, _flat_grad(ref))
            opt.step()
            ref_opt.step()
            torch.testing.assert_close(player.params, _flat(ref.parameters()))
        # writes to the flat buffer reach the compiled module too
        with torch.no_grad():
            player.params.zero_()
        assert torch.equal(compiled(x), torch.zeros(8, 1))
    finally:
        torch._dynamo.reset()


# ------------------------------------------------- 17. autocast and checkpointing
@pytest.mark.parametrize("set_to_none", [False, True])
def test_cpu_bfloat16_autocast_keeps_the_link(set_to_none: bool) -> None:
    m = _mlp(torch.float32)
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
        _assert_fused(player)  # before reading player.grad, which would relink
        assert buf.data.dtype == buf.grad.dtype == m[0].weight.grad.dtype == torch.float32
        assert torch.equal(buf.grad, _flat_grad(ref))


# torch 2.4's own torch.utils.checkpoint calls its deprecated torch.cpu.amp.autocast
@pytest.mark.filterwarnings("ignore:.torch.cpu.amp.autocast.args.*. is deprecated:FutureWarning")
@pytest.mark.parametrize("set_to_none", [False, True])
def test_activation_checkpointing_keeps_the_link(set_to_none: bool) -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.linspace(-1, 1, 8, dtype=F64).unsqueeze(1)
    for _ in range(2):
        m.zero_grad(set_to_none=set_to_none)
        ref.zero_grad()
        torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        _assert_fused(player)
        assert torch.equal(player.grad, _flat_grad(ref))


# ---------------------------------------------------------- 18. iterable of params
def test_player_from_an_iterable_of_parameters() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 2, dtype=F64))
    b = nn.Parameter(torch.randn(3, dtype=F64))
    frozen = nn.Parameter(torch.randn(2, dtype=F64), requires_grad=False)
    ref_w, ref_b = w.detach().clone(), b.detach().clone()
    player = Player(iter([w, b, w, frozen]))  # a one-shot iterator, a duplicate, a frozen one
    assert player.module is None and player.name == "params"
    assert player.numel == 9 and player.parameters == [w, b]
    assert torch.equal(player.params, torch.cat([ref_w.reshape(-1), ref_b]))
    assert not _inside(frozen, player.params)
    x = torch.randn(4, 2, dtype=F64)
    (x @ w.t() + b).tanh().sum().backward()
    rw, rb = ref_w.clone().requires_grad_(), ref_b.clone().requires_grad_()
    (x @ rw.t() + rb).tanh().sum().backward()
    _assert_fused(player)
    assert torch.equal(player.grad, torch.cat([rw.grad.reshape(-1), rb.grad]))
    # conversions are noticed for bare parameters too
    w.data = w.data.float()
    b.data = b.data.float()
    assert player.refresh()
    assert player.params.dtype == torch.float32 and player.parameters == [w, b]
    _assert_fused(player)


def test_player_from_module_parameters_generator() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m.parameters(), name="mlp")
    assert player.name == "mlp" and player.numel == 31
    x = torch.randn(3, 1, dtype=F64)
    m(x).sum().backward()
    ref(x).sum().backward()
    _assert_fused(player)
    assert torch.equal(player.grad, _flat_grad(ref))


def test_public_exports() -> None:
    assert gameopt.Player is Player and "FlatBuffer" not in gameopt.__all__  # an internal: gameopt.buffer.FlatBuffer


# ------------------------------------------- 19. the flat parameter in torch.optim
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
    flat = player.params
    assert flat.requires_grad is False and flat.is_leaf
    opt = FLAT_OPTIMIZERS[opt_name]([flat])
    ref_opt = FLAT_OPTIMIZERS[opt_name](ref.parameters())
    x, y = _regression()
    start = flat.clone()
    for _ in range(4):
        loss, ref_loss = _train(m, opt, x, y), _train(ref, ref_opt, x, y)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(flat, _flat(ref.parameters()), rtol=1e-12, atol=1e-14)
        # the flat gradient is player.grad itself, never an accumulation of stale ones
        assert flat.grad is player.grad
        torch.testing.assert_close(flat.grad, _flat_grad(ref), rtol=1e-12, atol=1e-14)
    assert not torch.allclose(flat, start)  # it did train
    assert player.params is flat
    _assert_fused(player)


def test_flat_parameter_grad_across_zero_grad_and_backward() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.params
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
        assert torch.equal(g, _flat_grad(ref))
        _assert_fused(player)
    # an optimizer over module.parameters() resets the parameters' grads instead
    module_opt = torch.optim.SGD(m.parameters(), lr=0.1)
    module_opt.zero_grad()
    m(x).sum().backward()
    ref.zero_grad()
    ref(x).sum().backward()
    assert flat.grad is player.grad and torch.equal(flat.grad, _flat_grad(ref))
    # assigning a gradient writes it into the buffer and keeps the links
    flat.grad = torch.ones(31, dtype=F64)
    assert torch.equal(m[0].weight.grad, torch.ones(10, 1, dtype=F64)) and flat.grad is player.grad
    with pytest.raises(RuntimeError, match="different size"):
        flat.grad = torch.ones(30, dtype=F64)
    del flat.grad
    assert torch.count_nonzero(player.grad) == 0
    _assert_fused(player)


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_on_the_flat_parameter(norm_type: float) -> None:
    m = TiedNet()
    ref = copy.deepcopy(m)
    player = Player(m)
    x, y = _regression()
    for mod in (m, ref):
        (mod(x) - y).pow(2).sum().backward()
    total = torch.nn.utils.clip_grad_norm_([player.params], 0.5, norm_type=norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, norm_type=norm_type)
    assert total > 0.5
    torch.testing.assert_close(total, ref_total, rtol=1e-12, atol=0)
    torch.testing.assert_close(player.grad, _flat_grad(ref), rtol=1e-12, atol=1e-15)
    _assert_fused(player)


def test_flat_parameter_with_align_padding_trains_like_the_module() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m, align=64)
    buf = player.buffers[0]
    assert buf.numel > buf.num_elements
    opt = torch.optim.Adam([player.params], lr=0.05)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    for _ in range(3):
        _train(m, opt, x, x.sin())
        _train(ref, ref_opt, x, x.sin())
    assert torch.equal(_flat(m.parameters()), _flat(ref.parameters()))
    assert torch.count_nonzero(player.params) == buf.num_elements - 0  # padding stayed zero
    _assert_fused(player)


def test_flat_parameter_follows_a_conversion() -> None:
    m = _mlp(torch.float32)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.params
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
    assert flat.dtype == F64 and player.params is flat
    assert torch.equal(flat, _flat(ref.parameters())) and torch.equal(_flat(m.parameters()), flat)
    _assert_fused(player)


def test_flat_parameter_follows_load_state_dict_with_assign() -> None:
    m, other = _mlp(F64, seed=0), _mlp(F64, seed=1)
    player = Player(m)
    flat = player.params
    m.load_state_dict(other.state_dict(), assign=True)  # new Parameter objects
    opt = torch.optim.SGD([flat], lr=0.1)
    ref_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    for _ in range(2):
        _train(m, opt, x, x.cos())
        _train(other, ref_opt, x, x.cos())
    assert player.params is flat and torch.equal(flat, _flat(other.parameters()))
    _assert_fused(player)


def test_flat_parameter_follows_into_a_game() -> None:
    torch.manual_seed(0)
    m, rival = _mlp(F64), nn.Linear(1, 1).double()
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.params
    opt = torch.optim.Adam([flat], lr=0.05)  # built before the game
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    _train(m, opt, x, x.sin())
    _train(ref, ref_opt, x, x.sin())
    game = gameopt.Game([player, rival], lambda: (m(x).pow(2).mean(), rival(x).pow(2).mean()))
    assert player.params is flat
    assert _inside(flat, game.layout.data[0]) and all(_inside(p, game.layout.data[0]) for p in m.parameters())
    for _ in range(3):
        _train(m, opt, x, x.sin())
        _train(ref, ref_opt, x, x.sin())
    assert torch.equal(flat, _flat(ref.parameters())) and torch.equal(_flat(m.parameters()), flat)
    # the game and the optimizer move one and the same storage
    game.step()
    assert torch.equal(flat, _flat(m.parameters())) and not torch.equal(flat, _flat(ref.parameters()))
    _assert_fused(player)


def test_flat_parameter_that_cannot_follow_raises() -> None:
    m = _mlp(F64)
    player = Player(m)
    flat = player.params
    opt = torch.optim.SGD([flat], lr=0.1)
    m[2].float()  # the group splits in two: no single tensor can follow
    assert player.refresh()
    with pytest.raises(RuntimeError, match="no longer holds the module's parameters"):
        opt.step()
    with pytest.raises(RuntimeError, match="no longer holds"):
        flat.add_(1.0)
    with pytest.raises(ValueError, match="2 parameter groups"):
        player.params  # noqa: B018
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
    assert torch.equal(_flat(m.parameters()), torch.cat([groups[0], groups[1].double()]))


def test_flat_parameter_held_by_a_graph_raises_instead_of_training_nothing() -> None:
    m = _mlp(F64)
    player = Player(m)
    flat = player.params
    w = torch.ones(31, dtype=F64, requires_grad=True)
    kept = (flat * w).sum()  # the graph saves flat: it cannot move
    m.float()
    opt = torch.optim.SGD([flat], lr=0.1)
    with pytest.raises(RuntimeError, match="no longer holds"):
        opt.step()
    assert player.params is not flat and player.params.dtype == torch.float32
    del kept


def test_flat_parameter_pickles_and_copies_as_a_plain_tensor(tmp_path) -> None:
    player = Player(_mlp(F64))
    flat = player.params
    torch.save(flat, tmp_path / "flat.pt")
    loaded = torch.load(tmp_path / "flat.pt", weights_only=True)
    assert type(loaded) is Tensor and torch.equal(loaded, flat)
    twin = copy.deepcopy(flat)
    assert type(twin) is Tensor and torch.equal(twin, flat) and twin.data_ptr() != flat.data_ptr()
    assert type(flat * 2) is Tensor


def test_standalone_flat_buffer_refuses_a_stale_flat_parameter() -> None:
    m = _mlp(F64)
    buf = FlatBuffer(list(m.parameters()))
    assert torch.equal(buf.data.grad, torch.zeros(31, dtype=F64))
    m.float()
    with pytest.raises(RuntimeError, match="no player to re-fuse"):
        torch.optim.SGD([buf.data], lr=0.1).step()


# ------------------------------------------ 20. parameters that change after fusing
def test_parameter_added_after_fusing_joins_the_buffers() -> None:
    m = _mlp(F64)
    player = Player(m)
    params = list(m.parameters())
    values = player.params.clone()
    assert player.registry_intact()
    m.register_parameter("extra", nn.Parameter(torch.tensor([1.0, 2.0], dtype=F64)))
    assert not player.registry_intact()
    assert "'extra' was added to Sequential" in player.why_stale()
    assert player.refresh() and player.why_stale() is None
    # module.parameters() order: the Sequential's own parameter first
    assert player.numel == 33 and all(p is q for p, q in zip(player.parameters, [m.extra, *params]))
    assert all(p is q for p, q in zip(player.parameters, m.parameters()))
    assert torch.equal(player.params, torch.cat([torch.tensor([1.0, 2.0], dtype=F64), values]))
    # setattr of a new Parameter, and a new submodule with parameters
    m[0].scale = nn.Parameter(torch.full((3,), 0.5, dtype=F64))
    assert "'scale' was added to Linear" in player.why_stale()
    m.add_module("head", nn.Linear(1, 2).double())
    assert player.refresh() and player.numel == 33 + 3 + 4
    assert all(any(p is q for q in player.parameters) for p in m.parameters())
    x = torch.randn(3, 1, dtype=F64)
    (m(x).sum() + m.extra.sum() + m[0].scale.sum() + m.head(x).sum()).backward()
    _assert_fused(player)
    assert torch.equal(m.extra.grad, torch.ones(2, dtype=F64))


def test_parameter_set_where_none_was_joins_the_buffers() -> None:
    m = nn.Linear(2, 2, bias=False).double()
    player = Player(m)
    m.bias = nn.Parameter(torch.ones(2, dtype=F64))
    assert "'bias' of Linear was replaced" in player.why_stale()
    assert player.refresh() and player.numel == 6
    _assert_fused(player)


def test_frozen_parameter_leaves_the_buffers_with_its_value() -> None:
    m = _mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    flat = player.params
    opt = torch.optim.SGD([flat], lr=0.1)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    _train(m, opt, x, x.sin())
    frozen = m[0].bias
    value, grad = frozen.detach().clone(), frozen.grad.clone()
    frozen.requires_grad_(False)
    assert "'bias' of Linear was frozen" in player.why_stale()
    assert player.refresh() and player.numel == 21
    assert all(p is not frozen for p in player.parameters)
    assert player.params is flat and flat.shape == (21,)
    # it keeps its value and gradient, in memory of its own
    assert torch.equal(frozen, value) and torch.equal(frozen.grad, grad)
    assert not _inside(frozen, flat) and not _inside(frozen.grad, player.grad)
    assert frozen.requires_grad is False
    # training goes on without it
    ref[0].bias.requires_grad_(False)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), m.parameters()):
            p.copy_(q)
    opt = torch.optim.SGD([flat], lr=0.1)
    ref_opt = torch.optim.SGD(_trainable(ref), lr=0.1)
    for _ in range(2):
        _train(m, opt, x, x.sin())
        _train(ref, ref_opt, x, x.sin())
    assert torch.equal(frozen, value)
    assert torch.equal(_flat(m.parameters()), _flat(ref.parameters()))
    _assert_fused(player)
    # unfreezing brings it back
    frozen.requires_grad_(True)
    assert "unfrozen" in player.why_stale()
    assert player.refresh() and player.numel == 31 and _inside(frozen, player.params)
    _assert_fused(player)


def test_optimizer_on_the_flat_parameter_notices_a_freeze_by_itself() -> None:
    m = _mlp(F64)
    player = Player(m)
    flat = player.params
    opt = torch.optim.SGD([flat], lr=0.1)
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    m[0].bias.requires_grad_(False)
    frozen = m[0].bias.detach().clone()
    for _ in range(2):
        _train(m, opt, x, x.sin())  # reading flat.grad re-fuses: no check() needed
    assert torch.equal(m[0].bias, frozen) and flat.shape == (21,) and player.numel == 21
    _assert_fused(player)
    # an optimizer with per-element state refuses the new layout loudly
    momentum = torch.optim.SGD([flat], lr=0.1, momentum=0.9)
    _train(m, momentum, x, x.sin())
    m[0].bias.requires_grad_(True)
    with pytest.raises(RuntimeError, match="size"):
        _train(m, momentum, x, x.sin())


@pytest.mark.parametrize("how", ["del", "pop", "none"])
def test_removed_parameter_leaves_the_buffers(how: str) -> None:
    m = _mlp(F64)
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
    assert torch.equal(gone, value) and not _inside(gone, player.params)
    _assert_fused(player)


def test_replaced_submodule_is_noticed() -> None:
    m = _mlp(F64)
    player = Player(m)
    old = m[0]
    m[0] = nn.Linear(1, 10).double()
    assert "submodule '0' of Sequential was replaced" in player.why_stale()
    assert player.refresh()
    assert player.parameters[0] is m[0].weight and all(p is not old.weight for p in player.parameters)
    _assert_fused(player)


def test_iterable_player_notices_freezing() -> None:
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


def test_game_trains_without_a_parameter_frozen_after_fusing() -> None:
    torch.manual_seed(0)
    m, rival = _mlp(F64), nn.Linear(1, 1).double()
    x = torch.linspace(-1, 1, 6, dtype=F64).unsqueeze(1)
    game = gameopt.Game([m, rival], lambda: (m(x).pow(2).mean(), rival(x).pow(2).mean()), algorithm=gameopt.SGA(0.1))
    game.step()
    m[0].bias.requires_grad_(False)
    frozen = m[0].bias.detach().clone()
    game.players[0].refresh()  # until Game._unchanged runs Player.registry_intact (game.py), re-fuse by hand
    for _ in range(2):
        game.step()
    assert torch.equal(m[0].bias, frozen)
    assert game.players[0].numel == 21
    _assert_fused(game.players[0])


# ------------------------------------------- players that cannot be trained (issue 22)
def test_a_non_leaf_tensor_is_refused_with_torch_optims_reason() -> None:
    a = torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor") as player_err:
        Player([a * 2])
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor") as optim_err:
        torch.optim.SGD([a * 2], lr=0.1)
    assert "can't optimize a non-leaf Tensor" in str(player_err.value) and optim_err.value
    assert a.grad is None and torch.equal(a, torch.ones(3))


def test_a_single_tensor_is_one_parameter() -> None:
    w = nn.Parameter(torch.arange(6.0).reshape(2, 3))
    player = Player(w)
    assert player.parameters == [w] and player.numel == 6
    assert torch.equal(player.params, torch.arange(6.0)) and _inside(w, player.params)
    game = gameopt.Game([player], lambda: [(w - 1).square().sum()], algorithm=gameopt.SimGD(0.25))
    game.step()
    torch.testing.assert_close(w.detach(), torch.arange(6.0).reshape(2, 3) * 0.5 + 0.5)  # w - 0.25·2(w - 1)
    s = nn.Parameter(torch.tensor([0.2, 0.5, 0.3]))
    assert Player(s, constraint=gameopt.constraints.Simplex()).parameters == [s]
