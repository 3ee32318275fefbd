"""The joint layout (gameopt/layout.py): JointLayout's placement of every player's
buffers into joint storage, its per-player views and vector helpers, and StepVectors."""

from __future__ import annotations

import pytest
import torch
from fused import cat_flat, inside
from models import Bag, VecModule, tiny_mlp
from torch import nn

from gameopt import Player
from gameopt.layout import JointLayout, StepVectors
from gameopt.vec import Vec

F64 = torch.float64


# ------------------------------------------------------------------ JointLayout
def _players(*modules: nn.Module, align: int | None = None) -> list[Player]:
    return [Player(m, name=f"p{i}", align=align) for i, m in enumerate(modules)]


def _one_group() -> tuple[JointLayout, list[nn.Module]]:
    """Three float64 players of 3, 5 (a 2×2 weight and a scalar) and 2 elements, every
    value distinct: player i holds 10·i, 10·i + 1, ..."""
    mods = [
        Bag(a=torch.arange(3, dtype=F64)),
        Bag(w=10 + torch.arange(4, dtype=F64).reshape(2, 2), s=torch.tensor(14.0, dtype=F64)),
        VecModule(20 + torch.arange(2, dtype=F64)),
    ]
    return JointLayout(_players(*mods)), mods


def _mixed() -> tuple[JointLayout, list[nn.Module]]:
    """Two (device, dtype) groups: player 0 has a float32 and a float64 parameter,
    player 1 one float64, player 2 one float32."""
    mods = [
        Bag(x=torch.tensor([1.0, 2.0]), y=torch.tensor([3.0, 4.0, 5.0], dtype=F64)),
        Bag(z=torch.tensor([6.0, 7.0, 8.0, 9.0], dtype=F64)),
        Bag(u=torch.tensor([10.0])),
    ]
    return JointLayout(_players(*mods)), mods


def _spans(layout: JointLayout) -> list[tuple[int, int, int, int]]:
    return [(e.player, e.group, e.start, e.stop) for e in layout.entries]


def test_joint_layout_places_players_side_by_side_in_player_order() -> None:
    layout, mods = _one_group()
    assert layout.keys == [(torch.device("cpu"), F64)] and layout.num_players == 3
    assert _spans(layout) == [(0, 0, 0, 3), (1, 0, 3, 8), (2, 0, 8, 10)]
    assert [[e.player for e in es] for es in layout.by_player] == [[0], [1], [2]]
    assert layout.num_elements == 10 and layout.dense
    assert len(layout.data) == len(layout.grad) == 1
    assert layout.data[0].dtype == layout.grad[0].dtype == F64
    expected = torch.tensor([0, 1, 2, 10, 11, 12, 13, 14, 20, 21], dtype=F64)
    assert torch.equal(layout.data[0], expected)
    assert torch.equal(layout.grad[0], torch.zeros(10, dtype=F64))
    # each player's buffer now lives in the joint storage at its entry's offset
    for e in layout.entries:
        assert e.buffer.data.data_ptr() == layout.data[0].data_ptr() + e.start * 8
        assert e.buffer.grad.data_ptr() == layout.grad[0].data_ptr() + e.start * 8
    assert all(inside(p, layout.data[0]) for m in mods for p in m.parameters())


def test_joint_layout_storage_is_the_modules_parameters_and_gradients() -> None:
    layout, (a, b, c) = _one_group()
    with torch.no_grad():
        layout.data[0][3] = -1.0  # player 1's first element: its weight's [0, 0]
        layout.data[0][7] = -2.0  # player 1's last: its scalar
        layout.data[0][8] = -3.0  # player 2's first
    assert b.w[0, 0].item() == -1.0 and b.s.item() == -2.0 and c.w[0].item() == -3.0
    assert torch.equal(a.a, torch.arange(3, dtype=F64))
    # each player's gradient lands in its own span of the joint gradient
    (a.a.sum() + 2 * (b.w.sum() + b.s) + 3 * c.w.sum()).backward()
    assert torch.equal(layout.grad[0], torch.tensor([1, 1, 1, 2, 2, 2, 2, 2, 3, 3], dtype=F64))


def test_joint_layout_splits_a_vector_per_player_and_joins_it_back() -> None:
    layout, _ = _one_group()
    vec = Vec([100 + torch.arange(10, dtype=F64)])
    parts = layout.per_player(vec)
    assert [p.tolist() for p in parts] == [[100, 101, 102], [103, 104, 105, 106, 107], [108, 109]]
    assert all(p.data_ptr() == vec[0].data_ptr() + e.start * 8 for p, e in zip(parts, layout.entries))  # views
    assert [v.tolist() for v in layout.player_views(vec, 1)] == [[103, 104, 105, 106, 107]]
    assert layout.entry_view(vec, layout.entries[2]).tolist() == [108, 109]
    joined = layout.from_per_player(parts)
    assert torch.equal(joined[0], vec[0]) and joined[0].data_ptr() != vec[0].data_ptr()  # a copy
    # and from arbitrary per-player tensors
    joined = layout.from_per_player(
        [torch.full((3,), 1.0, dtype=F64), torch.arange(5.0, dtype=F64), -torch.ones(2, dtype=F64)]
    )
    assert joined[0].tolist() == [1, 1, 1, 0, 1, 2, 3, 4, -1, -1]


def test_joint_layout_groups_by_dtype_in_order_of_first_appearance() -> None:
    layout, (p0, p1, p2) = _mixed()
    cpu = torch.device("cpu")
    assert layout.keys == [(cpu, torch.float32), (cpu, F64)]
    assert _spans(layout) == [(0, 0, 0, 2), (0, 1, 0, 3), (1, 1, 3, 7), (2, 0, 2, 3)]
    assert [t.dtype for t in layout.data] == [t.dtype for t in layout.grad] == [torch.float32, F64]
    assert [t.numel() for t in layout.data] == [3, 7] and layout.num_elements == 10 and layout.dense
    assert layout.data[0].tolist() == [1.0, 2.0, 10.0] and layout.data[1].tolist() == [
        3.0,
        4.0,
        5.0,
        6.0,
        7.0,
        8.0,
        9.0,
    ]
    assert [e.player for e in layout.group_entries(0)] == [0, 2]
    assert [e.player for e in layout.group_entries(1)] == [0, 1]
    layout.group_entries(0).clear()  # a copy
    assert len(layout.group_entries(0)) == 2
    # a player with two groups has a tuple of parts, one per group, in its buffers' order
    parts = layout.per_player(layout.data)
    assert isinstance(parts[0], tuple) and [t.tolist() for t in parts[0]] == [[1.0, 2.0], [3.0, 4.0, 5.0]]
    assert parts[0][0].dtype == torch.float32 and parts[0][1].dtype == F64
    assert parts[1].tolist() == [6.0, 7.0, 8.0, 9.0] and parts[2].tolist() == [10.0]
    joined = layout.from_per_player(parts)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(joined, layout.data))
    for vec in (layout.zeros(), layout.empty()):
        assert [(t.device, t.dtype, t.numel()) for t in vec] == [(cpu, torch.float32, 3), (cpu, F64, 7)]


def test_joint_layout_from_per_player_checks_counts_and_shapes() -> None:
    layout, _ = _mixed()
    good = [(torch.zeros(2), torch.zeros(3, dtype=F64)), torch.zeros(4, dtype=F64), torch.zeros(1)]
    assert [t.numel() for t in layout.from_per_player(good)] == [3, 7]
    with pytest.raises(ValueError, match="direction has 2 entries, the game has 3 players"):
        layout.from_per_player(good[:2], what="direction")
    with pytest.raises(ValueError, match=r"v\[0\] must hold 2 flat tensor\(s\)"):
        layout.from_per_player([torch.zeros(5), *good[1:]])
    with pytest.raises(ValueError, match=r"v\[1\] has shape \(3,\), expected \(4,\)"):
        layout.from_per_player([good[0], torch.zeros(3, dtype=F64), good[2]])


def test_joint_layout_only_keeps_one_players_part() -> None:
    layout, _ = _mixed()
    vec = Vec([torch.tensor([1.0, 2.0, 3.0]), torch.arange(1.0, 8.0, dtype=F64)])
    only0, only1, only2 = (layout.only(vec, i) for i in range(3))
    assert only0[0].tolist() == [1.0, 2.0, 0.0] and only0[1].tolist() == [1, 2, 3, 0, 0, 0, 0]
    assert only1[0].tolist() == [0.0, 0.0, 0.0] and only1[1].tolist() == [0, 0, 0, 4, 5, 6, 7]
    assert only2[0].tolist() == [0.0, 0.0, 3.0] and only2[1].tolist() == [0] * 7
    assert vec[1].tolist() == [1, 2, 3, 4, 5, 6, 7]  # untouched


@pytest.mark.parametrize("factors", [[2.0, -1.0, 0.5], [3.0, 3.0, 3.0]], ids=["per-player", "uniform"])
def test_joint_layout_scales_each_players_part_by_its_factor(factors: list[float]) -> None:
    layout, _ = _mixed()

    def vec() -> Vec:
        return Vec([torch.tensor([1.0, 2.0, 3.0]), torch.arange(1.0, 8.0, dtype=F64)])

    f0, f1, f2 = factors
    expected = [[f0 * 1, f0 * 2, f2 * 3], [f0 * 1, f0 * 2, f0 * 3, f1 * 4, f1 * 5, f1 * 6, f1 * 7]]
    v = vec()
    assert layout.scale_(v, factors) is v and [t.tolist() for t in v] == expected
    v, out = vec(), layout.zeros()
    assert layout.scale_(v, factors, out=out) is out and [t.tolist() for t in out] == expected
    assert [t.tolist() for t in v] == [t.tolist() for t in vec()]  # left as it was
    acc = Vec([torch.ones(3), torch.ones(7, dtype=F64)])
    assert layout.add_scaled_(acc, vec(), factors) is acc
    assert [t.tolist() for t in acc] == [[1 + x for x in row] for row in expected]
    assert [t.dtype for t in acc] == [torch.float32, F64]
    # a group that one player holds alone takes that player's factor
    alone = JointLayout(_players(Bag(x=torch.ones(2)), Bag(y=torch.ones(3, dtype=F64)), Bag(u=torch.ones(1))))
    assert [[e.player for e in alone.group_entries(g)] for g in range(2)] == [[0, 2], [1]]
    v = alone.scale_(Vec([torch.ones(3), torch.ones(3, dtype=F64)]), factors)
    assert [t.tolist() for t in v] == [[f0, f0, f2], [f1, f1, f1]]
    acc = alone.add_scaled_(
        Vec([torch.zeros(3), torch.ones(3, dtype=F64)]), Vec([torch.ones(3), torch.ones(3, dtype=F64)]), factors
    )
    assert [t.tolist() for t in acc] == [[f0, f0, f2], [1 + f1] * 3]


def test_joint_layout_offsets_follow_each_buffers_alignment() -> None:
    """A player fused with align=64 (float64: 8 elements) starts at the next multiple of
    8 elements; its segments start at 0, 16, 32 and 48 inside its 56-element buffer."""
    first, second = Bag(a=torch.tensor([1.0, 2.0, 3.0], dtype=F64)), tiny_mlp(F64)
    values = cat_flat(second.parameters())
    layout = JointLayout([Player(first), Player(second, align=64)])
    assert _spans(layout) == [(0, 0, 0, 3), (1, 0, 8, 64)]
    assert layout.data[0].numel() == 64 and layout.num_elements == 3 + 31 and not layout.dense
    base = layout.data[0].data_ptr()
    assert [(p.data_ptr() - base) // 8 for p in second.parameters()] == [8, 24, 40, 56]
    assert all((p.data_ptr() - base) % 64 == 0 for p in second.parameters())
    data = layout.data[0]
    assert torch.equal(data[:3], torch.tensor([1.0, 2.0, 3.0], dtype=F64))
    assert torch.equal(torch.cat([data[8:18], data[24:34], data[40:50], data[56:57]]), values)
    pad = torch.ones(64, dtype=torch.bool)
    for lo, hi in ((0, 3), (8, 18), (24, 34), (40, 50), (56, 57)):
        pad[lo:hi] = False
    assert torch.count_nonzero(data[pad]) == 0  # padding is zero
    assert [t.numel() for t in layout.per_player(layout.data)] == [3, 56]


@pytest.mark.parametrize(
    ("dtype", "spans"),
    [
        (torch.float16, [(0, 16), (16, 32)]),  # 32 bytes: 16 elements
        (torch.bfloat16, [(0, 16), (16, 32)]),
        (torch.float32, [(0, 8), (8, 16)]),
        (F64, [(0, 8), (8, 12)]),
        (torch.complex128, [(0, 6), (6, 10)]),  # 32 bytes: 2 elements
    ],
    ids=["float16", "bfloat16", "float32", "float64", "complex128"],
)
def test_joint_layout_alignment_is_counted_in_elements_of_the_groups_dtype(dtype: torch.dtype, spans) -> None:
    """align=32 bytes, players of 5 and 3 elements: each buffer is padded to a multiple
    of 32 bytes and the second starts right after the first."""
    first = Bag(a=torch.arange(1, 6).to(dtype))
    second = Bag(b=torch.arange(6, 9).to(dtype))
    layout = JointLayout([Player(first, align=32), Player(second, align=32)])
    assert [(e.start, e.stop) for e in layout.entries] == spans
    assert layout.keys == [(torch.device("cpu"), dtype)] and layout.data[0].dtype == dtype
    assert layout.data[0].numel() == spans[1][1]
    assert layout.dense  # the padding lies inside the buffers: writing every entry defines all
    start, item = spans[1][0], layout.data[0].element_size()
    assert first.a.data_ptr() == layout.data[0].data_ptr()
    assert second.b.data_ptr() == layout.data[0].data_ptr() + start * item
    assert torch.equal(layout.data[0][:5], torch.arange(1, 6).to(dtype))
    assert torch.equal(layout.data[0][start : start + 3], torch.arange(6, 9).to(dtype))
    assert torch.count_nonzero(layout.data[0][5:start]) == 0 and torch.count_nonzero(layout.data[0][start + 3 :]) == 0


def test_joint_layout_param_views_cut_a_groups_vector_at_each_parameter() -> None:
    first, second = Bag(a=torch.tensor([1.0, 2.0, 3.0], dtype=F64)), tiny_mlp(F64)
    layout = JointLayout([Player(first), Player(second, align=64)])
    pairs = layout.param_views(0, layout.data[0])
    assert [p for p, _ in pairs] == [first.a, *second.parameters()]
    for p, view in pairs:  # views of the joint storage are the parameters themselves
        assert view.shape == p.shape and view.stride() == p.stride() and view.data_ptr() == p.data_ptr()
    other = torch.arange(64, dtype=F64)
    views = [v for _, v in layout.param_views(0, other)]
    assert views[0].tolist() == [0.0, 1.0, 2.0]
    assert torch.equal(views[1], torch.arange(8.0, 18.0, dtype=F64).reshape(10, 1))  # weight at 8
    assert torch.equal(views[2], torch.arange(24.0, 34.0, dtype=F64))  # bias at 24
    assert torch.equal(views[3], torch.arange(40.0, 50.0, dtype=F64).reshape(1, 10))  # weight at 40
    assert views[4].tolist() == [56.0]  # bias at 56


def test_joint_layout_param_views_keep_channels_last_strides() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 2).double().to(memory_format=torch.channels_last)
    head = VecModule(torch.ones(2, dtype=F64))
    layout = JointLayout([Player(head), Player(conv)])
    assert _spans(layout) == [(0, 0, 0, 2), (1, 0, 2, 2 + 24 + 3)]
    (w, wv), (b, bv) = layout.param_views(0, layout.data[0])[1:]
    assert w is conv.weight and wv.stride() == w.stride() == (8, 1, 4, 2)
    assert torch.equal(wv, w) and torch.equal(bv, b)
    # the joint storage holds the weight in memory (NHWC) order
    assert torch.equal(layout.data[0][2:26], w.detach().permute(0, 2, 3, 1).reshape(-1))


def test_joint_layout_keeps_each_group_on_its_device() -> None:
    cpu, meta = torch.device("cpu"), torch.device("meta")
    mods = [
        Bag(a=torch.ones(3, dtype=F64)),
        Bag(b=torch.empty(2, 2, device="meta", dtype=F64), c=torch.zeros(4, dtype=F64)),
    ]
    layout = JointLayout(_players(*mods))
    assert layout.keys == [(cpu, F64), (meta, F64)]
    assert _spans(layout) == [(0, 0, 0, 3), (1, 1, 0, 4), (1, 0, 3, 7)]
    assert [t.device for t in layout.data] == [t.device for t in layout.grad] == [cpu, meta]
    assert [t.device for t in layout.zeros()] == [t.device for t in layout.empty()] == [cpu, meta]
    assert mods[1].b.device == meta and inside(mods[1].c, layout.data[0])
    assert layout.data[0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_a_joint_vector_s_dot_is_float64_over_all_groups() -> None:
    a = Vec([torch.tensor([1.0, 2.0, 3.0]), torch.arange(1.0, 8.0, dtype=F64)])
    b = Vec([torch.tensor([0.5, 0.5, 2.0]), torch.ones(7, dtype=F64)])
    d = a.dot(b)
    assert d.dtype == F64 and d.shape == () and d.item() == 0.5 + 1.0 + 6.0 + 28.0


def test_step_vectors_keep_the_vectors_held_and_poison_the_rest() -> None:
    layout, _ = _mixed()
    pool = StepVectors(layout)
    kept, dropped = pool.take(), pool.take()
    assert [(t.dtype, t.numel()) for t in kept] == [(torch.float32, 3), (F64, 7)]
    for t in (*kept, *dropped):
        t.fill_(1.0)
    pool.keep_only([kept[0][1:]])  # a view of its (first) tensor keeps the whole vector
    assert all(torch.equal(t, torch.ones_like(t)) for t in kept)
    assert all(torch.isnan(t).all() for t in dropped)  # debug mode (conftest)
    pool.keep_only([])
    assert all(torch.isnan(t).all() for t in kept)
