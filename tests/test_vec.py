"""The joint vector's arithmetic against the same math on concatenated tensors."""

from __future__ import annotations

import pytest
import torch
from games import saved_and_loaded

from gameopt.vec import READ_MAX, Vec, all_finite, dot


def _vecs():
    g = torch.Generator().manual_seed(0)
    a = Vec([torch.randn(5, generator=g, dtype=torch.float64), torch.randn(3, generator=g).float()])
    b = Vec([torch.randn(5, generator=g, dtype=torch.float64), torch.randn(3, generator=g).float()])
    return a, b


def _cat(v):
    return torch.cat([t.double() for t in v])


def test_operators_are_elementwise_over_the_groups() -> None:
    a, b = _vecs()
    s = torch.tensor(0.7, dtype=torch.float64)  # a 0-d tensor scalar: cast per group, no host read
    cases = {
        "a + b": (a + b, _cat(a) + _cat(b)),
        "a - b": (a - b, _cat(a) - _cat(b)),
        "-a": (-a, -_cat(a)),
        "2 * a": (2 * a, 2 * _cat(a)),
        "a * b": (a * b, _cat(a) * _cat(b)),
        "a / 4": (a / 4, _cat(a) / 4),
        "1 - a": (1 - a, 1 - _cat(a)),
        "a * s": (a * s, _cat(a) * 0.7),
        "a.add(b, alpha=-3)": (a.add(b, alpha=-3), _cat(a) - 3 * _cat(b)),
        "sqrt(a*a)": ((a * a).sqrt(), _cat(a).abs()),
        "reciprocal": ((a * a + 1).reciprocal(), 1 / (_cat(a) ** 2 + 1)),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, Vec), name
        assert [t.dtype for t in got] == [t.dtype for t in a], name
        torch.testing.assert_close(_cat(got), want, rtol=1e-6, atol=1e-6, msg=name)
    assert float(a.dot(b)) == pytest.approx(float(_cat(a) @ _cat(b)), rel=1e-6)
    assert a.dot(b).dtype == torch.float64
    assert float(a.norm()) == pytest.approx(float(_cat(a).norm()), rel=1e-6)
    assert float(dot(list(a), list(b))) == float(a.dot(b))


def test_in_place_operators_write_into_the_same_tensors() -> None:
    a, b = _vecs()
    want = (_cat(a) + _cat(b) - 0.5 * _cat(b)) * 3 / 2
    ids = [id(t) for t in a]
    a += b
    a.add_(b, alpha=-0.5)
    a *= torch.tensor(3.0)
    a /= 2
    assert [id(t) for t in a] == ids
    torch.testing.assert_close(_cat(a), want, rtol=1e-6, atol=1e-6)
    c = a.clone().zero_()
    assert float(c.norm()) == 0 and float(a.norm()) > 0
    c.copy_(b).addcmul_(b, b, value=2.0)
    torch.testing.assert_close(_cat(c), _cat(b) + 2 * _cat(b) ** 2, rtol=1e-6, atol=1e-6)


def test_plus_and_times_are_arithmetic_not_list_operations() -> None:
    a, b = _vecs()
    assert len(a + b) == 2 and len(3 * a) == 2


def test_a_saved_state_holding_joint_vectors_loads_with_weights_only() -> None:
    """Algorithm states hold joint vectors; state_dicts store them as plain lists."""
    import gameopt
    from gameopt.state import clone_state as _clone

    a, _ = _vecs()
    back = saved_and_loaded(_clone({"v": a, "t": 3}))
    assert type(back["v"]) is list and torch.equal(back["v"][0], a[0])
    assert gameopt.Vec is Vec


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("n", [7, READ_MAX, READ_MAX + 1, 1000], ids=["read", "read-max", "summed", "summed-large"])
@pytest.mark.parametrize("shape", ["1-D", "2-D"])
def test_all_finite_sees_every_non_finite_element(dtype, bad, n, shape) -> None:
    """On both paths: values read one by one (small real CPU tensors) and sums."""
    last = torch.arange(n).to(dtype) / n
    if shape == "2-D" and n % 2 == 0:
        last = last.reshape(2, n // 2)
    vecs = [torch.ones(5, dtype=dtype), torch.zeros(0, dtype=dtype), last]
    if bad is not None:
        last.view(-1)[n // 2] = complex(1.0, bad) if dtype.is_complex else bad  # complex: in the imaginary part
    assert all_finite(vecs) is (bad is None)
    assert all_finite(vecs[2:]) is (bad is None)  # one tensor
    assert all_finite([vecs[2], vecs[0]]) is (bad is None)  # the bad one first


def test_all_finite_reads_huge_finite_values_of_a_small_tensor_as_finite() -> None:
    """Read one by one, values whose sum would overflow are still finite."""
    big = torch.full((3,), 1e308, dtype=torch.float64)
    assert all_finite([big]) is True
    assert all_finite([torch.tensor(2.0)]) is True  # a 0-d tensor
    assert all_finite([torch.tensor(float("nan"))]) is False


def test_all_finite_of_nothing_or_empty_tensors() -> None:
    assert all_finite([]) is True
    assert all_finite([torch.zeros(0)]) is True


def test_all_finite_in_half_precision_does_not_overflow_its_sum() -> None:
    """65504 is float16's largest value: a float16 sum of two would be infinite."""
    assert all_finite([torch.full((2,), 65504.0, dtype=torch.float16)]) is True


def test_all_finite_of_a_conjugate_view() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert all_finite([z.conj()]) is True
    z[1] = complex(1.0, float("inf"))
    assert all_finite([z.conj()]) is False


def test_tensor_style_in_place_methods_match_the_tensor_ones() -> None:
    """``mul_``, ``div_``, ``sub_``, ``add_`` (vector or scalar), ``lerp_`` and ``copy_``
    do what the same ``torch.Tensor`` methods do on the concatenated tensor, in place."""
    a, b = _vecs()
    s = torch.tensor(0.7, dtype=torch.float64)
    want = _cat(a).clone()
    ids = [id(t) for t in a]
    steps = [
        (lambda v: v.mul_(2), lambda t: t.mul_(2)),
        (lambda v: v.mul_(s), lambda t: t.mul_(0.7)),
        (lambda v: v.mul_(b), lambda t: t.mul_(_cat(b))),
        (lambda v: v.div_(4), lambda t: t.div_(4)),
        (lambda v: v.div_(b * b + 1), lambda t: t.div_(_cat(b) ** 2 + 1)),
        (lambda v: v.sub_(b, alpha=0.5), lambda t: t.sub_(_cat(b), alpha=0.5)),
        (lambda v: v.sub_(3.0), lambda t: t.sub_(3.0)),
        (lambda v: v.sub_(1.0, alpha=2), lambda t: t.sub_(1.0, alpha=2)),
        (lambda v: v.add_(s, alpha=-2), lambda t: t.add_(0.7, alpha=-2)),
        (lambda v: v.add_(5), lambda t: t.add_(5)),
        (lambda v: v.add_(b, alpha=3), lambda t: t.add_(_cat(b), alpha=3)),
        (lambda v: v.lerp_(b, 0.25), lambda t: t.lerp_(_cat(b), 0.25)),
    ]
    for k, (on_vec, on_tensor) in enumerate(steps):
        assert on_vec(a) is a, k
        on_tensor(want)
        torch.testing.assert_close(_cat(a), want, rtol=1e-5, atol=1e-5, msg=f"step {k}")
    assert [id(t) for t in a] == ids
    a.copy_(b)
    assert [id(t) for t in a] == ids and torch.equal(_cat(a), _cat(b))


def test_a_missing_method_names_what_a_vec_has() -> None:
    a, _ = _vecs()
    with pytest.raises(AttributeError, match=r"no attribute 'addcdiv_'.*in place: add_, sub_, mul_, div_"):
        a.addcdiv_(a, a)
    assert not hasattr(a, "sqrt_")
    with pytest.raises(AttributeError):
        a.__no_such_dunder__  # noqa: B018
