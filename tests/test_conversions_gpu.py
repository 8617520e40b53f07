"""GPU tier: float -> integer conversions on the device saturate (issue 21).

The rule (astype's docstring, docs/design.md "Conversions"): truncate toward
zero, clamp to the target's [min, max], NaN -> 0, +inf -> max, -inf -> min;
to bool is ``!= 0`` (NaN -> True). The reference is
``_conversions.saturating_cast`` (checked by hand in test_conversions_cpu.py).
Inputs: NaN, +-inf, +-0, +-0.5, 255.9, 256, -1, ... and every integer
target's edges and their neighbours, rounded into each float source dtype.

* astype on each copy kernel: contiguous and aligned (4-element vectors),
  contiguous from a misaligned start, strided, and a large tiled array;
* reductions: sum(dtype=int) (the input is cast first, then summed in int64
  and wrapped, as NumPy wraps), and a float result written into an integer
  out= (cast on the way out);
* full() with a float fill_value into an integer dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
from _conversions import FLOAT_SOURCES, INT_TARGETS, conversion_inputs, saturating_cast
from _support import to_host

import cudalab

pytestmark = pytest.mark.gpu

TARGETS = [*INT_TARGETS, np.dtype(np.bool_)]


def assert_converted(got, want: np.ndarray, x: np.ndarray) -> None:
    """Bit-equal, or a message listing the inputs that converted wrongly."""
    got = to_host(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    wrong = got != want
    assert not wrong.any(), f"inputs {x[wrong][:8]} gave {got[wrong][:8]}, want {want[wrong][:8]}"


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("src", FLOAT_SOURCES, ids=str)
def test_astype_saturates_on_every_copy_path(src, target):
    x = conversion_inputs(src)
    want = saturating_cast(x, target)
    d = cudalab.asarray(x)
    assert_converted(d.astype(target), want, x)              # aligned: 4 per vector
    assert_converted(d[1:].astype(target), want[1:], x[1:])   # misaligned contiguous
    assert_converted(d[::3].astype(target), want[::3], x[::3])  # strided
    two = x[: len(x) // 4 * 4].reshape(4, -1)
    assert_converted(cudalab.asarray(two).T.astype(target), saturating_cast(two, target).T,
                     two.T)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("src", FLOAT_SOURCES, ids=str)
def test_astype_saturates_on_a_large_array(rng, src, target):
    """Many blocks and the grid-stride loop: the inputs tiled and shuffled, odd length."""
    x = np.tile(conversion_inputs(src), 2001)
    x = x[rng.permutation(len(x))][: len(x) - 3]
    assert_converted(cudalab.asarray(x).astype(target), saturating_cast(x, target), x)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("src", FLOAT_SOURCES, ids=str)
def test_sum_with_integer_dtype_casts_each_element_by_the_rule(src, target):
    x = conversion_inputs(src)
    # Each element converted, summed in int64 and wrapped into the target (NumPy wraps too).
    want = np.array(saturating_cast(x, target).astype(np.int64).sum()).astype(target)
    got = cudalab.sum(cudalab.asarray(x), dtype=target)
    assert got.dtype == target
    assert_converted(got, want, x)
    cols = x[: len(x) // 4 * 4].reshape(-1, 4)
    want_cols = saturating_cast(cols, target).astype(np.int64).sum(axis=0).astype(target)
    assert_converted(cudalab.sum(cudalab.asarray(cols), axis=0, dtype=target), want_cols, cols)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("src", FLOAT_SOURCES, ids=str)
def test_float_result_into_integer_out(src, target):
    """max over an axis of length 1 is each element itself; out= casts it by the rule."""
    x = conversion_inputs(src)
    out = cudalab.empty((len(x),), dtype=target)
    r = cudalab.max(cudalab.asarray(x.reshape(-1, 1)), axis=1, out=out)
    assert r is out
    assert_converted(out, saturating_cast(x, target), x)


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_full_with_a_float_fill_value(target):
    x = conversion_inputs(np.float64)
    want = saturating_cast(x, target)
    got = np.array([to_host(cudalab.full(3, float(v), dtype=target))[1] for v in x],
                   dtype=target)
    assert_converted(got, want, x)
    for v in (np.float32(300.7), np.float16(-1.5), np.float64("nan"), np.float32("-inf")):
        expected = saturating_cast(np.array([v]), target)[0]
        assert to_host(cudalab.full(2, v, dtype=target)).tolist() == [expected, expected]
