"""GPU tier: sum, mean, max, min and argmax against float64 NumPy references.

Random data (never zeros), odd sizes that exercise the vector heads and tails,
every axis (negative ones too), keepdims, non-contiguous views (.T, stepped
and offset slices), every dtype, the kernels' split paths (few long rows, few
columns), determinism over 10 runs compared as raw bytes, argmax ties and
NaN, empty inputs, dtype= and out=, plus hypothesis-generated shapes, views
and axes. Error is ||out - ref|| / ||ref||: float64 1e-12, float32 1e-5,
float16/bfloat16 1e-2; integers, max, min and argmax are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cudalab
from _support import (BF16, BOOL, DTYPE_IDS, DTYPES, F16, F32, F64, FLOAT_DTYPES, FLOAT_IDS, I8,
                      I32, I64, INT_DTYPES, U8, arg_error, assert_arg_error, assert_close,
                      assorted_views, dtype_id, is_float, random_array, view_recipes, widen)

pytestmark = pytest.mark.gpu

OPS = ["sum", "mean", "max", "min", "argmax"]


def reduce_input(rng: np.random.Generator, shape, dtype, signed: bool = False) -> np.ndarray:
    """Random host data for reductions: never 0 (bool: a random mix, not all False).

    Floats are uniform in [0.5, 1.5) (float16 scaled by 1/64 so that a
    million of them still sum below its 65504 maximum): a sum without
    cancellation has a well-defined relative error. ``signed=True`` gives
    standard normals instead, for max/min/argmax. Integers span their whole
    range, int64 +-2**62 (sums wrap like NumPy's).
    """
    dtype = np.dtype(dtype)
    if dtype == I64:
        return random_array(rng, shape, dtype, low=-(2**62), high=2**62 + 1)
    if signed or not is_float(dtype):
        return random_array(rng, shape, dtype)
    scale = 1 / 64 if dtype == F16 else 1.0
    return random_array(rng, shape, dtype, low=0.5 * scale, high=1.5 * scale)


def result_dtype(op: str, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if op == "argmax":
        return I64
    if op in ("max", "min"):
        return dtype
    if is_float(dtype):
        return dtype
    return I64 if op == "sum" else F64


def reference(op: str, x: np.ndarray, axis, keepdims: bool) -> np.ndarray:
    """What cudalab should return, computed by NumPy in float64 / int64."""
    w = widen(x)
    if op == "sum":
        r = np.sum(w, axis=axis, keepdims=keepdims)
    elif op == "mean":
        r = np.mean(w.astype(np.float64), axis=axis, keepdims=keepdims)
    elif op == "max":
        r = np.max(w, axis=axis, keepdims=keepdims)
    elif op == "min":
        r = np.min(w, axis=axis, keepdims=keepdims)
    else:
        r = np.argmax(w, axis=axis, keepdims=keepdims)
    return np.asarray(r)


def check(op: str, d: cudalab.DeviceArray, x: np.ndarray, axis=None, keepdims=False,
          **kwargs) -> None:
    """Run cudalab.<op> on device array `d` (holding host data `x`) and compare."""
    got = getattr(cudalab, op)(d, axis=axis, keepdims=keepdims, **kwargs)
    assert isinstance(got, cudalab.DeviceArray)
    ref = reference(op, x, axis, keepdims)
    assert got.shape == ref.shape, (op, axis, keepdims, got.shape, ref.shape)
    assert got.dtype == result_dtype(op, x.dtype), (op, got.dtype)
    if op in ("max", "min", "argmax") or not is_float(got.dtype):
        np.testing.assert_array_equal(widen(got), ref, err_msg=f"{op} axis={axis}")
        return
    # mean of integers: float64 sums of values up to 2**62 in another order
    assert_close(got, ref, tol=1e-9 if not is_float(x.dtype) else None)


# ------------------------------------------------------------- full reduce ---


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", [1, 7, 1000003])
def test_all_elements_odd_sizes(rng, dtype, n):
    x = reduce_input(rng, (n,), dtype)
    d = cudalab.asarray(x)
    for op in OPS:
        check(op, d, x)
        check(op, d, x, keepdims=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_elements_multidim_is_0d(rng, dtype):
    x = reduce_input(rng, (37, 129, 5), dtype)
    d = cudalab.asarray(x)
    for op in OPS:
        got = getattr(cudalab, op)(d)
        assert got.shape == () and got.ndim == 0
        check(op, d, x)
        kept = getattr(cudalab, op)(d, keepdims=True)
        assert kept.shape == (1, 1, 1)


def test_zero_dim_input(rng):
    x = np.array(2.5, dtype=np.float32)
    d = cudalab.asarray(x)
    assert float(cudalab.sum(d).get()) == 2.5
    assert float(cudalab.max(d).get()) == 2.5
    assert int(cudalab.argmax(d).get()) == 0
    assert cudalab.sum(d, keepdims=True).shape == ()


# ---------------------------------------------------------------- one axis ---


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_every_axis_and_keepdims(rng, op, dtype):
    x = reduce_input(rng, (37, 129, 5), dtype)
    d = cudalab.asarray(x)
    for axis in (0, 1, 2, -1, -2, -3):
        for keepdims in (False, True):
            check(op, d, x, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("dtype", [F32, F16, I32, I8], ids=dtype_id)
@pytest.mark.parametrize("shape", [(3, 200001), (100003, 3), (4099, 1027), (2048, 4096),
                                   (1, 300007), (300007, 1), (5, 7, 20011)])
def test_split_paths(rng, shape, dtype):
    """Few long rows / few columns split the reduced axis across blocks."""
    x = reduce_input(rng, shape, dtype)
    d = cudalab.asarray(x)
    for axis in range(len(shape)):
        for op in ("sum", "max", "argmax"):
            check(op, d, x, axis=axis)
    check("mean", d, x, axis=-1)


def test_axis_tuple_of_one(rng):
    x = reduce_input(rng, (6, 9), np.float32)
    d = cudalab.asarray(x)
    check("sum", d, x, axis=1)
    assert_close(cudalab.sum(d, axis=(1,)), x.astype(np.float64).sum(axis=1), F32)


# -------------------------------------------------------------- views ------


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, I32, U8, BOOL], ids=dtype_id)
def test_non_contiguous_views(rng, dtype):
    for _, d, x in assorted_views(lambda shape: reduce_input(rng, shape, dtype)):
        assert d.shape == x.shape
        for op in OPS:
            check(op, d, x)
            for axis in range(x.ndim):
                check(op, d, x, axis=axis)
                check(op, d, x, axis=axis - x.ndim, keepdims=True)


def test_contiguous_axis_reduction_does_not_copy(rng):
    """Axis reductions of a C-contiguous array allocate only result + scratch."""
    x = reduce_input(rng, (512, 1024), np.float32)
    d = cudalab.asarray(x)
    cudalab.synchronize()
    for axis in (0, 1, -1):
        for op in OPS:
            cudalab.reset_peak_memory_stats()
            before = cudalab.memory_stats()["requested_bytes.all.current"]
            r = getattr(cudalab, op)(d, axis=axis)
            cudalab.synchronize()
            peak = cudalab.memory_stats()["requested_bytes.all.peak"]
            assert peak - before < x.nbytes // 4, (op, axis, peak - before)
            del r


# ------------------------------------------------------------ determinism ---


def test_bit_identical_over_runs(rng):
    big = cudalab.asarray(random_array(rng, 2**24 + 3, F32))
    mat = cudalab.asarray(random_array(rng, (4096, 4099), F32))
    half = cudalab.asarray(random_array(rng, (3, 1 << 20), F16))
    cases = [
        lambda: cudalab.sum(big),
        lambda: cudalab.mean(big),
        lambda: cudalab.sum(mat, axis=0),
        lambda: cudalab.sum(mat, axis=1),
        lambda: cudalab.sum(mat[:, 1:], axis=0),
        lambda: cudalab.sum(half, axis=1),
        lambda: cudalab.argmax(mat, axis=0),
    ]
    for case in cases:
        first = case().get().tobytes()
        for _ in range(9):
            assert case().get().tobytes() == first


def test_float32_sum_accuracy_large(rng):
    """A long float32 sum stays within 1e-5 of float64 (pairwise-like error)."""
    x = reduce_input(rng, 2**24 + 11, F32)
    got = float(cudalab.sum(cudalab.asarray(x)).get())
    ref = float(np.sum(x.astype(np.float64)))
    assert abs(got - ref) / ref < 1e-5
    m = reduce_input(rng, (1 << 20, 8), F32)
    assert_close(cudalab.sum(cudalab.asarray(m), axis=0), m.astype(np.float64).sum(axis=0), F32)


# -------------------------------------------------------- argmax, NaN ------


@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, I8, I64], ids=dtype_id)
def test_signed_data_extremes(rng, dtype):
    """max/min/argmax on data of both signs (exact), every axis."""
    x = reduce_input(rng, (37, 129, 5), dtype, signed=True)
    d = cudalab.asarray(x)
    for op in ("max", "min", "argmax"):
        check(op, d, x)
        for axis in (0, 1, 2):
            check(op, d, x, axis=axis)
    big = reduce_input(rng, (1000003,), dtype, signed=True)
    db = cudalab.asarray(big)
    for op in ("max", "min", "argmax"):
        check(op, db, big)
        check(op, db[5:], big[5:])


def test_sum_of_signed_normals(rng):
    """Many outputs of normal data: the norm-wise error stays small despite cancellation."""
    x = random_array(rng, (512, 777), F32)
    d = cudalab.asarray(x)
    for axis in (0, 1):
        assert_close(cudalab.sum(d, axis=axis), x.astype(np.float64).sum(axis=axis), F32)
        assert_close(cudalab.mean(d, axis=axis), x.astype(np.float64).mean(axis=axis), F32)


def test_argmax_ties_first_occurrence():
    x = np.array([1, 5, 3, 5, 5, 2], dtype=np.float32)
    assert int(cudalab.argmax(cudalab.asarray(x)).get()) == 1
    big = np.full(1000003, -3.0, dtype=np.float32)
    big[[777, 5000, 999999]] = 7.0
    assert int(cudalab.argmax(cudalab.asarray(big)).get()) == 777
    ints = np.full((50, 4001), 9, dtype=np.int32)
    d = cudalab.asarray(ints)
    assert int(cudalab.argmax(d).get()) == 0
    np.testing.assert_array_equal(cudalab.argmax(d, axis=0).get(), np.zeros(4001))
    np.testing.assert_array_equal(cudalab.argmax(d, axis=1).get(), np.zeros(50))
    neg = np.full((33, 17), -np.inf, dtype=np.float64)
    np.testing.assert_array_equal(cudalab.argmax(cudalab.asarray(neg), axis=0).get(),
                                  np.zeros(17))
    bools = np.zeros(1000, dtype=np.bool_)
    bools[[400, 401]] = True
    assert int(cudalab.argmax(cudalab.asarray(bools)).get()) == 400


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_nan_handling(rng, dtype):
    x = reduce_input(rng, (41, 3001), dtype)
    x[5, 2000] = np.nan
    x[5, 100] = np.nan
    x[30, 7] = np.nan
    d = cudalab.asarray(x)
    ref = x.astype(np.float64)
    assert np.isnan(float(cudalab.max(d).get().astype(np.float64)))
    assert np.isnan(float(cudalab.min(d).get().astype(np.float64)))
    assert np.isnan(float(cudalab.sum(d).get().astype(np.float64)))
    assert int(cudalab.argmax(d).get()) == int(np.argmax(ref))
    for axis in (0, 1):
        np.testing.assert_array_equal(cudalab.argmax(d, axis=axis).get(),
                                      np.argmax(ref, axis=axis))
        got = cudalab.max(d, axis=axis).get().astype(np.float64)
        want = np.max(ref, axis=axis)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
        got = cudalab.min(d, axis=axis).get().astype(np.float64)
        want = np.min(ref, axis=axis)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


# ---------------------------------------------------------------- empty ----


def test_empty_inputs():
    e = cudalab.asarray(np.zeros((0,), dtype=np.float32))
    assert float(cudalab.sum(e).get()) == 0.0
    assert cudalab.sum(e).dtype == np.float32
    assert int(cudalab.sum(cudalab.asarray(np.zeros((0, 3), np.int32))).get()) == 0
    assert np.isnan(float(cudalab.mean(e).get()))
    assert np.isnan(float(cudalab.mean(cudalab.asarray(np.zeros(0, np.int8))).get()))
    for op, text in (("max", "zero-size array to reduction operation maximum which has no "
                             "identity"),
                     ("min", "zero-size array to reduction operation minimum which has no "
                             "identity"),
                     ("argmax", "attempt to get argmax of an empty sequence")):
        with pytest.raises(ValueError, match=text):
            getattr(cudalab, op)(e)
    m = cudalab.asarray(np.zeros((0, 5), dtype=np.float64))
    np.testing.assert_array_equal(cudalab.sum(m, axis=0).get(), np.zeros(5))
    assert np.isnan(cudalab.mean(m, axis=0).get()).all()
    with pytest.raises(ValueError, match="maximum which has no identity"):
        cudalab.max(m, axis=0)
    with pytest.raises(ValueError, match="argmax of an empty sequence"):
        cudalab.argmax(m, axis=0)
    for op in OPS:
        r = getattr(cudalab, op)(m, axis=1)
        assert r.shape == (0,)
        assert getattr(cudalab, op)(m, axis=1, keepdims=True).shape == (0, 1)


# ---------------------------------------------------------- dtype=, out= ----


def test_result_dtypes_follow_numpy(rng):
    for dtype in [BOOL, *INT_DTYPES]:
        d = cudalab.asarray(reduce_input(rng, (10,), dtype))
        assert cudalab.sum(d).dtype == np.int64  # NumPy: uint64 for uint8 (documented)
        assert cudalab.mean(d).dtype == np.float64
        assert cudalab.max(d).dtype == dtype
        assert cudalab.argmax(d).dtype == np.int64
    for dtype in FLOAT_DTYPES:
        d = cudalab.asarray(reduce_input(rng, (10,), dtype))
        for op in ("sum", "mean", "max", "min"):
            assert getattr(cudalab, op)(d).dtype == dtype


def test_dtype_override(rng):
    i8 = np.array([100, 100, 100, -7], dtype=np.int8)
    d = cudalab.asarray(i8)
    got = cudalab.sum(d, dtype=np.int8)
    assert got.dtype == np.int8
    assert int(got.get()) == int(np.sum(i8, dtype=np.int8))  # wraps like NumPy
    x = reduce_input(rng, (1001, 3), np.float32)
    dx = cudalab.asarray(x)
    got = cudalab.sum(dx, axis=0, dtype=np.float64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.get(), x.astype(np.float64).sum(axis=0), rtol=1e-12)
    got = cudalab.mean(dx, dtype="float16")
    assert got.dtype == np.float16
    ints = reduce_input(rng, (77,), np.int32)
    got = cudalab.mean(cudalab.asarray(ints), dtype=np.float32)
    assert got.dtype == np.float32
    assert_close(got, np.mean(ints.astype(np.float64)), F32)
    f = np.array([1.5, 2.5, -0.5], dtype=np.float64)
    got = cudalab.sum(cudalab.asarray(f), dtype=np.int64)
    assert got.dtype == np.int64 and int(got.get()) == int(np.sum(f, dtype=np.int64))
    b = np.array([1, -1], dtype=np.int32)
    got = cudalab.sum(cudalab.asarray(b), dtype=bool)
    assert got.dtype == np.bool_ and bool(got.get()) == bool(np.sum(b, dtype=bool))
    h = reduce_input(rng, (3, 513), np.float16)
    got = cudalab.sum(cudalab.asarray(h), axis=1, dtype=np.float32)
    assert got.dtype == np.float32
    assert_close(got, h.astype(np.float64).sum(axis=1), F32)


def test_out_argument(rng):
    x = reduce_input(rng, (33, 65), np.float32)
    d = cudalab.asarray(x)
    out = cudalab.empty((65,), dtype=np.float32)
    r = cudalab.sum(d, axis=0, out=out)
    assert r is out
    assert_close(out, x.astype(np.float64).sum(axis=0), F32)
    out64 = cudalab.empty((33, 1), dtype=np.float64)  # result cast into out's dtype
    r = cudalab.max(d, axis=1, keepdims=True, out=out64)
    assert r is out64
    np.testing.assert_array_equal(out64.get(), x.max(axis=1, keepdims=True).astype(np.float64))
    big = cudalab.zeros((65, 4), dtype=np.int64)
    view = big[:, 2]                      # non-contiguous out
    r = cudalab.argmax(d, axis=0, out=view)
    assert r is view
    np.testing.assert_array_equal(big.get()[:, 2], np.argmax(x, axis=0))
    np.testing.assert_array_equal(big.get()[:, 0], 0)
    scalar = cudalab.empty((), dtype=np.float32)
    assert cudalab.mean(d, out=scalar) is scalar
    assert_close(scalar, np.mean(x.astype(np.float64)), F32)
    with assert_arg_error(ValueError, "sum", "out", match="has shape"):
        cudalab.sum(d, axis=0, out=cudalab.empty((64,), dtype=np.float32))
    with assert_arg_error(ValueError, "min", "out", match="has shape"):
        cudalab.min(d, out=cudalab.empty((1,), dtype=np.float32))


def test_out_overlapping_input(rng):
    x = reduce_input(rng, (16, 16), np.float32)
    d = cudalab.asarray(x)
    row0 = d[0]
    cudalab.sum(d, axis=0, out=row0)
    np.testing.assert_allclose(d.get()[0], x.astype(np.float64).sum(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(d.get()[1:], x[1:])


# ------------------------------------------------------------- errors ------


def test_axis_out_of_range():
    d = cudalab.asarray(np.ones((2, 3, 4), dtype=np.float32))
    for op in OPS:
        for axis in (3, -4, 100):
            with pytest.raises(ValueError, match=arg_error(op, "axis") +
                               f"axis {axis} is out of bounds for array of dimension 3$"):
                getattr(cudalab, op)(d, axis=axis)
    z = cudalab.asarray(np.array(1.0, dtype=np.float32))
    with pytest.raises(ValueError, match="out of bounds for array of dimension 0"):
        cudalab.sum(z, axis=0)


# ---------------------------------------------------------- hypothesis -----


@st.composite
def view_case(draw):
    """A random view recipe, an axis (or None), a dtype, keepdims and a seed."""
    view = draw(view_recipes(max_extent=23))
    ndim = len(view.root_shape)
    axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1)))
    dtype = draw(st.sampled_from([F32, F64, I32, F16]))
    keepdims = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return view, axis, dtype, keepdims, seed


@settings(max_examples=40, deadline=None)
@given(view_case())
def test_hypothesis_views_and_axes(case):
    view, axis, dtype, keepdims, seed = case
    x = reduce_input(np.random.default_rng(seed), view.root_shape, dtype)
    d = view(cudalab.asarray(x))
    xv = view(x)
    for op in OPS:
        check(op, d, xv, axis=axis, keepdims=keepdims)
