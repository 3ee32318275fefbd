"""The joint layout's helpers."""

from __future__ import annotations

import pytest
import torch

from gameopt.vec import all_finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_all_finite_sees_every_non_finite_element(dtype, bad) -> None:
    vecs = [torch.ones(5, dtype=dtype), torch.zeros(0, dtype=dtype), torch.arange(7).to(dtype)]
    if bad is not None:
        vecs[2][3] = complex(1.0, bad) if dtype.is_complex else bad  # complex: in the imaginary part
    assert all_finite(vecs) is (bad is None)
    assert all_finite(vecs[2:]) is (bad is None)  # one tensor


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
