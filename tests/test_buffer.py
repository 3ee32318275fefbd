"""FlatBuffer (gameopt/buffer.py): how fused parameters are laid out in flat storage
and how their gradients land there.

Every corner case below is written so that the naive recipe
``p.data = flat[a:b].view(p.shape); p.grad = flat_grad[a:b].view(p.shape)`` fails it:
the naive recipe keeps each parameter's own version counter, loses the link as soon as
autograd allocates a fresh ``.grad`` (``zero_grad(set_to_none=True)``, sparse or
expanded gradients), drops ``channels_last`` strides and silently fuses parameters
that a live autograd graph still points at.

Values are always checked against an unfused reference made with ``copy.deepcopy``
before fusing. Buffers are made through :class:`~gameopt.Player`, as a game makes them.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fused import assert_fused, cat_flat, cat_grads, inside
from models import Bag, tiny_mlp
from torch import Tensor, nn

from gameopt import Player
from gameopt.buffer import FlatBuffer

F64 = torch.float64


# --------------------------------------------- gradients land in the flat grad
def test_gradients_land_in_the_flat_grad() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    x = torch.linspace(-1, 1, 7, dtype=F64).unsqueeze(1)
    m(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    assert_fused(player)
    assert torch.equal(player.grad, cat_grads(ref))
    assert torch.equal(player.buffers[0].grad, cat_grads(ref))


def test_scalar_and_empty_parameters_fuse_and_get_their_gradients() -> None:
    torch.manual_seed(0)
    m = Bag(s=torch.tensor(2.0, dtype=F64), e=torch.empty(0, 3, dtype=F64), v=torch.randn(4, dtype=F64))
    ref = copy.deepcopy(m)
    player = Player(m)
    assert player.numel == 5 and m.s.shape == () and m.e.shape == (0, 3)
    assert torch.equal(player.flat_param, cat_flat(ref.parameters()))
    (m.s * m.v.sum() + m.e.sum()).backward()
    (ref.s * ref.v.sum() + ref.e.sum()).backward()
    assert torch.equal(player.grad, cat_grads(ref))
    assert m.s.grad.shape == () and m.e.grad.shape == (0, 3)
    assert player.why_stale() is None


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
    assert torch.equal(g[:n_used], cat_flat(p.grad for p in ref[0].parameters()))
    # after reading, the unused .grad are the (zero) views again, not None
    assert_fused(player)
    assert torch.count_nonzero(unused.weight.grad) == 0


def test_unused_parameters_read_as_zeros_after_backward_with_inputs() -> None:
    torch.manual_seed(0)
    m = Bag(a=torch.randn(3, dtype=F64), b=torch.randn(2, dtype=F64))
    player = Player(m)
    player.grad.fill_(7.0)
    m.zero_grad()
    m.a.pow(2).sum().backward(inputs=[m.a, m.b], retain_graph=False)
    assert torch.equal(player.grad, torch.cat([2 * m.a.detach(), torch.zeros(2, dtype=F64)]))


# -------------------------------------------- broadcast and expanded gradients
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
        assert_fused(player)
        assert torch.equal(player.grad, cat_grads(ref))
        assert m.scale.grad.shape == (1,) and m.col.grad.shape == (3, 1)


def test_gradient_of_a_plain_sum_is_not_left_expanded() -> None:
    # d(p.sum())/dp is an expanded (stride-0) tensor: it must be copied into the buffer
    torch.manual_seed(0)
    m = Bag(p=torch.randn(2, 3, dtype=F64))
    player = Player(m)
    for _ in range(2):
        m.zero_grad()
        m.p.sum().backward()
        assert_fused(player)
        assert m.p.grad.stride() == m.p.stride() == (3, 1)
        assert torch.equal(player.grad, torch.ones(6, dtype=F64))


# ------------------------------------------------------------ sparse gradients
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
        assert_fused(player)
        assert torch.allclose(player.grad, cat_grads(ref), rtol=1e-12, atol=0)
        opt.step()
        ref_opt.step()
        assert torch.allclose(player.flat_param, cat_flat(ref.parameters()), rtol=1e-12, atol=0)


# ------------------------------------------- in-place landing, no reallocation
def test_gradients_stay_in_place_across_zero_grad_set_to_none() -> None:
    m = tiny_mlp(F64)
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
        assert all(inside(p.grad, grad_flat) for p in m.parameters())
        assert torch.equal(grad_flat, cat_grads(ref))
        opt.step()
        ref_opt.step()
        assert torch.equal(player.flat_param, cat_flat(ref.parameters()))
    assert player.grad.data_ptr() == grad_flat.data_ptr()


def test_gradients_accumulate_in_place() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    grad_obj = [p.grad for p in m.parameters()]
    x = torch.randn(4, 1, dtype=F64)
    for mod in (m, ref):
        mod(x).sum().backward()
        mod(2 * x).sum().backward()
    assert all(p.grad is g for p, g in zip(m.parameters(), grad_obj))  # same tensors, added into
    assert torch.equal(player.grad, cat_grads(ref))
    m.zero_grad(set_to_none=False)
    assert all(p.grad is g for p, g in zip(m.parameters(), grad_obj))
    assert torch.equal(player.grad, torch.zeros(31, dtype=F64))


def test_user_tensor_hooks_survive_fusing() -> None:
    m = tiny_mlp(F64)
    calls: list[str] = []
    m[0].weight.register_hook(lambda g: calls.append("grad"))
    m[0].weight.register_post_accumulate_grad_hook(lambda p: calls.append("post"))
    player = Player(m)
    x = torch.randn(2, 1, dtype=F64)
    for _ in range(2):
        m.zero_grad()
        m(x).sum().backward()
        assert_fused(player)
    assert calls == ["grad", "post", "grad", "post"]


def test_rehome_moves_values_and_grads_and_later_gradients_land_there() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m)
    buf = player.buffers[0]
    x = torch.randn(3, 1, dtype=F64)
    m(x).sum().backward()
    grads = player.grad.clone()
    data, grad = torch.zeros(40, dtype=F64), torch.zeros(40, dtype=F64)
    buf.rehome(data[5:36], grad[5:36])
    assert torch.equal(data[5:36], cat_flat(ref.parameters())) and torch.equal(grad[5:36], grads)
    assert all(inside(p, data) and inside(p.grad, grad) for p in m.parameters())
    m.zero_grad()
    m(x).sum().backward()
    assert all(inside(p.grad, grad) for p in m.parameters())
    assert torch.equal(grad[5:36], grads)
    assert torch.count_nonzero(grad[:5]) == 0 and torch.count_nonzero(grad[36:]) == 0


# ----------------------------------------------------- align: padded segment starts
@pytest.mark.parametrize(
    ("dtype", "align"), [(torch.float32, 64), (torch.float64, 64), (torch.float64, 16), (torch.bfloat16, 16)]
)
def test_align_pads_segment_starts(dtype: torch.dtype, align: int) -> None:
    m = tiny_mlp(dtype)
    ref = copy.deepcopy(m)
    player = Player(m, align=align)
    buf = player.buffers[0]
    item = buf.data.element_size()
    assert player.numel == buf.num_elements == 31
    assert buf.padded_numel > 31 and (buf.padded_numel * item) % align == 0
    for p, seg in zip(buf.params, buf.segments):
        assert (seg.offset * item) % align == 0
        assert (p.data_ptr() - buf.data.data_ptr()) % align == 0
        assert (p.grad.data_ptr() - buf.grad.data_ptr()) % align == 0
    assert torch.equal(cat_flat(m.parameters()), cat_flat(ref.parameters()))
    assert_fused(player)


def _padding_mask(buf: FlatBuffer) -> Tensor:
    used = torch.zeros(buf.padded_numel, dtype=torch.bool)
    for seg in buf.segments:
        used[seg.offset : seg.offset + seg.numel] = True
    return ~used


def test_align_padding_stays_zero_and_reductions_match() -> None:
    m = tiny_mlp(F64)
    ref = copy.deepcopy(m)
    player = Player(m, align=64)
    buf = player.buffers[0]
    pad = _padding_mask(buf)
    assert pad.sum() == buf.padded_numel - 31 > 0
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    x = torch.linspace(-1, 1, 9, dtype=F64).unsqueeze(1)
    for _ in range(3):
        for mod, o in ((m, opt), (ref, ref_opt)):
            o.zero_grad()
            mod(x).pow(2).mean().backward()
        assert torch.equal(player.grad[pad], torch.zeros(int(pad.sum()), dtype=F64))
        assert torch.equal(player.grad[~pad], cat_grads(ref))
        opt.step()
        ref_opt.step()
        assert torch.equal(player.flat_param[pad], torch.zeros(int(pad.sum()), dtype=F64))
        assert torch.allclose(player.flat_param[~pad], cat_flat(ref.parameters()), rtol=1e-12, atol=0)
    assert_fused(player)
    # whole-buffer reductions see only the parameters
    rp, rg = cat_flat(ref.parameters()), cat_grads(ref)
    assert torch.allclose(player.flat_param.dot(player.flat_param), rp.dot(rp), rtol=1e-12, atol=0)
    assert torch.allclose(player.flat_param.dot(player.grad), rp.dot(rg), rtol=1e-12, atol=0)
    assert torch.allclose(torch.linalg.vector_norm(player.grad), torch.linalg.vector_norm(rg), rtol=1e-12, atol=0)
    assert torch.allclose(player.flat_param.abs().max(), rp.abs().max())


@pytest.mark.parametrize("align", [0, -8, 2.5, "64", 3])
def test_invalid_align_is_a_value_error(align) -> None:
    with pytest.raises(ValueError, match="align"):
        Player(tiny_mlp(torch.float32), align=align)  # 3 bytes does not fit 4-byte elements


# ----------------------------- strides: channels_last and non-dense parameters
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
        assert_fused(player)
        assert [p.grad.stride() for p in m.parameters()] == strides
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=0)
    # the flat buffer is the raw storage: a weight's segment holds it in memory (NHWC) order
    seg = player.buffers[0].segments[0]
    raw = player.flat_param[seg.offset : seg.offset + seg.numel]
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
    assert_fused(player)
    assert m.transposed.grad.stride() == (1, 5)
    assert torch.equal(m.strided.grad, ref.strided.grad) and torch.equal(m.transposed.grad, ref.transposed.grad)


# ------------------------------------------------------ shared version counter
def test_in_place_change_between_forward_and_backward_is_caught() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    assert all(p._version == player.flat_param._version for p in m.parameters())
    x = torch.randn(4, 1, dtype=F64)
    out = m(x).pow(2).sum()  # tanh and the weights are saved for backward
    with torch.no_grad():
        player.flat_param.mul_(2.0)  # naive p.data = view: silently wrong gradients
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


def test_in_place_change_through_the_module_bumps_the_flat_version() -> None:
    m = tiny_mlp(F64)
    player = Player(m)
    version = player.flat_param._version
    with torch.no_grad():
        m[2].bias.add_(1.0)
    assert player.flat_param._version > version
    assert m[0].weight._version == player.flat_param._version


# --------------------------------------------------------- fusing a live graph
@pytest.mark.parametrize("saved", [False, True], ids=["weight-not-saved", "weight-saved"])
def test_fusing_while_a_graph_is_alive_raises_and_moves_nothing(saved: bool) -> None:
    m = tiny_mlp(F64)
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
    assert torch.equal(cat_grads(m), cat_grads(ref))
    del out
    player = Player(m)
    assert torch.equal(player.grad, cat_grads(ref))  # existing grads are kept
    assert_fused(player)
