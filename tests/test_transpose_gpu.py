"""GPU tier: transpose(a, method=...) and ascontiguousarray of transposed views.

A transpose only moves bits, so every result is compared with NumPy's ``a.T``
byte for byte, for every method and dtype, odd shapes (including ones that
leave partial tiles), non-contiguous and negative-stride inputs, and
hypothesis-generated shapes and slices (of C and transposed arrays).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cudalab
from _support import (BF16, DTYPE_IDS, DTYPES, F16, F32, F64, I8, I64, U8, arg_error,
                      assert_bit_equal, dtype_id, random_array)

pytestmark = pytest.mark.gpu

METHODS = ["naive", "coalesced_write", "tiled", "tiled_padded", "best"]


def check(d, h, method="best"):
    """transpose(d, method) is a new C-contiguous array bit-equal to h.T."""
    out = cudalab.transpose(d, method=method)
    assert out.shape == (h.shape[1], h.shape[0])
    assert out.dtype == h.dtype
    assert out.is_contiguous
    assert out.base is None
    if out.size:
        assert out.data_ptr != d.data_ptr
    assert_bit_equal(out, h.T)
    return out


SHAPES = [(1, 1), (1, 7), (7, 1), (37, 129), (64, 64), (65, 63), (33, 1000), (1000, 33),
          (257, 130)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_transpose_every_method_and_dtype(rng, dtype, method):
    for shape in SHAPES:
        h = random_array(rng, shape, dtype)
        check(cudalab.asarray(h), h, method)


@pytest.mark.parametrize("method", METHODS)
def test_transpose_large_float32(rng, method):
    """Many tiles, more than one grid-stride pass for no method, odd extents."""
    h = random_array(rng, (1031, 2053), np.float32)
    check(cudalab.asarray(h), h, method)


def test_transpose_default_method_is_best(rng):
    h = random_array(rng, (45, 77), np.float32)
    out = cudalab.transpose(cudalab.asarray(h))
    assert_bit_equal(out.get(), h.T)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [F32, F64, BF16, I8], ids=dtype_id)
def test_transpose_of_views(rng, dtype, method):
    """Non-contiguous inputs are read through their strides, negative ones too."""
    base = random_array(rng, (90, 70), dtype)
    d = cudalab.asarray(base)
    views = [
        (d[::2, 1::3], base[::2, 1::3]),
        (d[5:40, 3:61], base[5:40, 3:61]),
        (d[1::3, ::2], base[1::3, ::2]),
        (d.T, base.T),  # column-major input: 'best' turns it into a row copy
        (d.T[::2], base.T[::2]),
        (d[:, 4:5], base[:, 4:5]),
        (d[6:7, :], base[6:7, :]),
        (d[::-1], base[::-1]),
        (d[:, ::-2], base[:, ::-2]),
        (d.T[::-3, 60:5:-1], base.T[::-3, 60:5:-1]),
        (d[80:2:-3, ::-1], base[80:2:-3, ::-1]),
    ]
    for dv, hv in views:
        assert dv.shape == hv.shape
        check(dv, hv, method)


@pytest.mark.parametrize("method", METHODS)
def test_transpose_of_empty(method):
    for shape in [(0, 5), (5, 0), (0, 0)]:
        d = cudalab.empty(shape, dtype=np.float32)
        out = cudalab.transpose(d, method=method)
        assert out.shape == (shape[1], shape[0])
        assert out.get().shape == (shape[1], shape[0])


def test_transpose_twice_is_identity(rng):
    h = random_array(rng, (123, 321), np.float64)
    d = cudalab.asarray(h)
    back = cudalab.transpose(cudalab.transpose(d, method="tiled"), method="naive")
    assert_bit_equal(back.get(), h)


def test_transpose_input_is_untouched(rng):
    h = random_array(rng, (50, 60), np.float32)
    d = cudalab.asarray(h)
    for m in METHODS:
        cudalab.transpose(d, method=m)
    assert_bit_equal(d.get(), h)


def test_transpose_special_floats_survive():
    h = np.array([[np.nan, -0.0, np.inf], [-np.inf, 1.5, -2.25]], dtype=np.float32)
    h16 = h.astype(np.float16)
    for m in METHODS:
        check(cudalab.asarray(h), h, m)
        check(cudalab.asarray(h16), h16, m)


# ------------------------------------------------ argument errors -----------


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (1, 1, 1, 1)])
def test_transpose_rejects_non_2d(shape):
    d = cudalab.zeros(shape, dtype=np.float32)
    with pytest.raises(ValueError, match=arg_error("transpose", "a") + ".*2-D"):
        cudalab.transpose(d)


@pytest.mark.parametrize("method", ["fast", "Best", "", "v5", "coalesced_read"])
def test_transpose_rejects_unknown_method(method):
    d = cudalab.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=arg_error("transpose", "method") + ".*" + re.escape(
            "'naive', 'coalesced_write', 'tiled', 'tiled_padded', 'best'")):
        cudalab.transpose(d, method=method)


@pytest.mark.parametrize("method", [None, 1, b"best"])
def test_transpose_rejects_non_str_method(method):
    d = cudalab.zeros((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match=arg_error("transpose", "method")):
        cudalab.transpose(d, method=method)


def test_transpose_checks_method_before_anything_else_happens():
    """A bad method on a huge (valid) array fails fast, allocating nothing."""
    d = cudalab.zeros((4, 4), dtype=np.float32)
    before = cudalab.memory_allocated()
    with pytest.raises(ValueError):
        cudalab.transpose(d, method="nope")
    assert cudalab.memory_allocated() == before


# ------------------------------------- ascontiguousarray of a.T -------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ascontiguousarray_of_transposed_view(rng, dtype):
    """The (N,1) <- (1,M) layout goes through the tiled kernel; bit-exact."""
    for shape in [(1, 9), (9, 1), (37, 129), (128, 64), (1000, 3), (301, 517)]:
        h = random_array(rng, shape, dtype)
        d = cudalab.asarray(h)
        c = cudalab.ascontiguousarray(d.T)
        assert c.is_contiguous and c.shape == h.T.shape
        assert_bit_equal(c.get(), h.T)
        assert_bit_equal(d.T.copy().get(), h.T)


def test_ascontiguousarray_of_padded_transposed_views(rng):
    """Sliced sources and batched (3-D) transposes keep working."""
    h = random_array(rng, (80, 90), np.float32)
    d = cudalab.asarray(h)
    for dv, hv in [
        (d[3:70, 5:80].T, h[3:70, 5:80].T),
        (d[::2].T, h[::2].T),
        (d[:, 1::4].T, h[:, 1::4].T),
    ]:
        assert_bit_equal(cudalab.ascontiguousarray(dv).get(), hv)
    h3 = random_array(rng, (4, 33, 65), np.float64)
    d3 = cudalab.asarray(h3)
    for axes in [(0, 2, 1), (2, 1, 0), (1, 0, 2)]:
        assert_bit_equal(d3.transpose(axes).copy().get(), h3.transpose(axes))


def test_astype_of_transposed_view_still_converts(rng):
    """A dtype change is not routed to the transpose (raw-bit) kernel."""
    h = random_array(rng, (40, 70), np.float32)
    d = cudalab.asarray(h)
    got = d.T.astype(np.float64).get()
    assert_bit_equal(got, h.T.astype(np.float64))


# ------------------------------------------------------------ hypothesis ----


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 150),
    cols=st.integers(1, 150),
    r0=st.integers(0, 3),
    c0=st.integers(0, 3),
    rstep=st.sampled_from([1, 2, 3]),
    cstep=st.sampled_from([1, 2, 5]),
    transposed=st.booleans(),
    method=st.sampled_from(METHODS),
    dtype=st.sampled_from([F32, I64, F16, U8]),
    seed=st.integers(0, 2**32 - 1),
)
def test_transpose_hypothesis(rows, cols, r0, c0, rstep, cstep, transposed, method, dtype, seed):
    rng = np.random.default_rng(seed)
    h = random_array(rng, (rows + 4, cols + 4), dtype)
    d = cudalab.asarray(h)
    if transposed:
        h, d = h.T, d.T
    hv, dv = h[r0::rstep, c0::cstep], d[r0::rstep, c0::cstep]
    check(dv, hv, method)
    assert_bit_equal(cudalab.ascontiguousarray(dv.T).get(), hv.T)
