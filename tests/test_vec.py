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
