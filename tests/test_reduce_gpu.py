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

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cudalab

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
INT_DTYPES = [np.dtype(np.bool_), np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32),
              np.dtype(np.int64)]
FLOAT_DTYPES = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
DTYPES = INT_DTYPES + FLOAT_DTYPES
IDS = [d.name for d in DTYPES]
OPS = ["sum", "mean", "max", "min", "argmax"]
TOL = {np.dtype(np.float16): 1e-2, BF16: 1e-2, np.dtype(np.float32): 1e-5,
       np.dtype(np.float64): 1e-12}


def is_float(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BF16


def random_array(rng: np.random.Generator, shape, dtype, signed: bool = False) -> np.ndarray:
    """Random host data; integers and floats are never 0 (bool is 0/1).

    Floats are uniform in [0.5, 1.5) (float16 scaled by 1/64 so that a
    million of them still sum below its 65504 maximum): a sum without
    cancellation has a well-defined relative error. ``signed=True`` gives
    standard normals instead, for max/min/argmax.
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        hi = min(int(info.max), 2**62)
        mag = rng.integers(1, hi, size=shape, dtype=np.int64, endpoint=True)
        if dtype.kind == "i":
            mag = mag * rng.choice(np.array([-1, 1], dtype=np.int64), size=shape)
        return mag.astype(dtype)
    if signed:
        x = rng.standard_normal(size=shape)
        x = np.where(np.abs(x) < 1e-3, 0.5, x)  # keep away from 0 after rounding
    else:
        x = rng.uniform(0.5, 1.5, size=shape)
        if dtype == np.float16:
            x = x / 64
    return x.astype(dtype)


def exact(x: np.ndarray) -> np.ndarray:
    """Lossless wide copy: int64 for bool/integers, float64 for floats."""
    return x.astype(np.float64 if is_float(x.dtype) else np.int64)


def result_dtype(op: str, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if op == "argmax":
        return np.dtype(np.int64)
    if op in ("max", "min"):
        return dtype
    if is_float(dtype):
        return dtype
    return np.dtype(np.int64) if op == "sum" else np.dtype(np.float64)


def reference(op: str, x: np.ndarray, axis, keepdims: bool) -> np.ndarray:
    """What cudalab should return, computed by NumPy in float64 / int64."""
    w = exact(x)
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
    g = got.get()
    if op in ("max", "min", "argmax") or not is_float(got.dtype):
        np.testing.assert_array_equal(exact(g), ref, err_msg=f"{op} axis={axis}")
        return
    # mean of integers: float64 sums of values up to 2**62 in another order
    tol = 1e-9 if not is_float(x.dtype) else TOL[np.dtype(got.dtype)]
    assert_close(g, ref, tol)


def assert_close(got: np.ndarray, ref: np.ndarray, tol: float) -> None:
    got = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    if ref.size == 0:
        return
    assert np.isfinite(got).all(), got
    denom = np.linalg.norm(ref)
    if denom == 0:  # e.g. the sum of a single random False
        np.testing.assert_array_equal(got, ref)
        return
    err = np.linalg.norm(got - ref) / denom
    assert err < tol, f"relative error {err:.3g} >= {tol}"


# ------------------------------------------------------------- full reduce ---


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("n", [1, 7, 1000003])
def test_all_elements_odd_sizes(rng, dtype, n):
    x = random_array(rng, (n,), dtype)
    d = cudalab.asarray(x)
    for op in OPS:
        check(op, d, x)
        check(op, d, x, keepdims=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_all_elements_multidim_is_0d(rng, dtype):
    x = random_array(rng, (37, 129, 5), dtype)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", OPS)
def test_every_axis_and_keepdims(rng, op, dtype):
    x = random_array(rng, (37, 129, 5), dtype)
    d = cudalab.asarray(x)
    for axis in (0, 1, 2, -1, -2, -3):
        for keepdims in (False, True):
            check(op, d, x, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8],
                         ids=["float32", "float16", "int32", "int8"])
@pytest.mark.parametrize("shape", [(3, 200001), (100003, 3), (4099, 1027), (2048, 4096),
                                   (1, 300007), (300007, 1), (5, 7, 20011)])
def test_split_paths(rng, shape, dtype):
    """Few long rows / few columns split the reduced axis across blocks."""
    x = random_array(rng, shape, dtype)
    d = cudalab.asarray(x)
    for axis in range(len(shape)):
        for op in ("sum", "max", "argmax"):
            check(op, d, x, axis=axis)
    check("mean", d, x, axis=-1)


def test_axis_tuple_of_one(rng):
    x = random_array(rng, (6, 9), np.float32)
    d = cudalab.asarray(x)
    check("sum", d, x, axis=1)
    got = cudalab.sum(d, axis=(1,)).get()
    assert_close(got, x.astype(np.float64).sum(axis=1), 1e-5)


# -------------------------------------------------------------- views ------


def _views(rng, dtype):
    base = random_array(rng, (64, 131, 9), dtype)
    b = cudalab.asarray(base)
    yield b[:, 3:100:2, :], base[:, 3:100:2, :]
    yield b[1:, :, 1:], base[1:, :, 1:]
    yield b.transpose(1, 0, 2), base.transpose(1, 0, 2)
    yield b.transpose(2, 1, 0), base.transpose(2, 1, 0)
    yield b[::3, 5, ::2], base[::3, 5, ::2]
    m = random_array(rng, (257, 1031), dtype)
    dm = cudalab.asarray(m)
    yield dm.T, m.T
    yield dm[:, 1:], m[:, 1:]          # every row starts misaligned
    yield dm[3:, 5:1000:3], m[3:, 5:1000:3]
    v = random_array(rng, (100003,), dtype)
    dv = cudalab.asarray(v)
    yield dv[1:], v[1:]                # misaligned head, odd tail
    yield dv[3::7], v[3::7]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16, np.int32,
                                   np.uint8, np.bool_],
                         ids=["float32", "float64", "float16", "bfloat16", "int32", "uint8",
                              "bool"])
def test_non_contiguous_views(rng, dtype):
    for d, x in _views(rng, dtype):
        assert d.shape == x.shape
        for op in OPS:
            check(op, d, x)
            for axis in range(x.ndim):
                check(op, d, x, axis=axis)
                check(op, d, x, axis=axis - x.ndim, keepdims=True)


def test_contiguous_axis_reduction_does_not_copy(rng):
    """Axis reductions of a C-contiguous array allocate only result + scratch."""
    x = random_array(rng, (512, 1024), np.float32)
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
    big = cudalab.asarray(rng.standard_normal(2**24 + 3).astype(np.float32))
    mat = cudalab.asarray(rng.standard_normal((4096, 4099)).astype(np.float32))
    half = cudalab.asarray(rng.standard_normal((3, 1 << 20)).astype(np.float16))
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
    x = rng.uniform(0.5, 1.5, size=2**24 + 11).astype(np.float32)
    got = float(cudalab.sum(cudalab.asarray(x)).get())
    ref = float(np.sum(x.astype(np.float64)))
    assert abs(got - ref) / ref < 1e-5
    m = rng.uniform(0.5, 1.5, size=(1 << 20, 8)).astype(np.float32)
    got = cudalab.sum(cudalab.asarray(m), axis=0).get()
    assert_close(got, m.astype(np.float64).sum(axis=0), 1e-5)


# -------------------------------------------------------- argmax, NaN ------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.dtype(np.int8), np.dtype(np.int64)],
                         ids=[d.name for d in FLOAT_DTYPES] + ["int8", "int64"])
def test_signed_data_extremes(rng, dtype):
    """max/min/argmax on data of both signs (exact), every axis."""
    x = random_array(rng, (37, 129, 5), dtype, signed=True)
    d = cudalab.asarray(x)
    for op in ("max", "min", "argmax"):
        check(op, d, x)
        for axis in (0, 1, 2):
            check(op, d, x, axis=axis)
    big = random_array(rng, (1000003,), dtype, signed=True)
    db = cudalab.asarray(big)
    for op in ("max", "min", "argmax"):
        check(op, db, big)
        check(op, db[5:], big[5:])


def test_sum_of_signed_normals(rng):
    """Many outputs of normal data: the norm-wise error stays small despite cancellation."""
    x = rng.standard_normal((512, 777)).astype(np.float32)
    d = cudalab.asarray(x)
    for axis in (0, 1):
        assert_close(cudalab.sum(d, axis=axis).get(), x.astype(np.float64).sum(axis=axis), 1e-5)
        assert_close(cudalab.mean(d, axis=axis).get(), x.astype(np.float64).mean(axis=axis),
                     1e-5)


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


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=[d.name for d in FLOAT_DTYPES])
def test_nan_handling(rng, dtype):
    x = random_array(rng, (41, 3001), dtype)
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
    for dtype in INT_DTYPES:
        d = cudalab.asarray(random_array(rng, (10,), dtype))
        assert cudalab.sum(d).dtype == np.int64  # NumPy: uint64 for uint8 (documented)
        assert cudalab.mean(d).dtype == np.float64
        assert cudalab.max(d).dtype == dtype
        assert cudalab.argmax(d).dtype == np.int64
    for dtype in FLOAT_DTYPES:
        d = cudalab.asarray(random_array(rng, (10,), dtype))
        for op in ("sum", "mean", "max", "min"):
            assert getattr(cudalab, op)(d).dtype == dtype


def test_dtype_override(rng):
    i8 = np.array([100, 100, 100, -7], dtype=np.int8)
    d = cudalab.asarray(i8)
    got = cudalab.sum(d, dtype=np.int8)
    assert got.dtype == np.int8
    assert int(got.get()) == int(np.sum(i8, dtype=np.int8))  # wraps like NumPy
    x = random_array(rng, (1001, 3), np.float32)
    dx = cudalab.asarray(x)
    got = cudalab.sum(dx, axis=0, dtype=np.float64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.get(), x.astype(np.float64).sum(axis=0), rtol=1e-12)
    got = cudalab.mean(dx, dtype="float16")
    assert got.dtype == np.float16
    ints = random_array(rng, (77,), np.int32)
    got = cudalab.mean(cudalab.asarray(ints), dtype=np.float32)
    assert got.dtype == np.float32
    assert_close(got.get(), np.mean(ints.astype(np.float64)), 1e-5)
    f = np.array([1.5, 2.5, -0.5], dtype=np.float64)
    got = cudalab.sum(cudalab.asarray(f), dtype=np.int64)
    assert got.dtype == np.int64 and int(got.get()) == int(np.sum(f, dtype=np.int64))
    b = np.array([1, -1], dtype=np.int32)
    got = cudalab.sum(cudalab.asarray(b), dtype=bool)
    assert got.dtype == np.bool_ and bool(got.get()) == bool(np.sum(b, dtype=bool))
    h = random_array(rng, (3, 513), np.float16)
    got = cudalab.sum(cudalab.asarray(h), axis=1, dtype=np.float32)
    assert got.dtype == np.float32
    assert_close(got.get(), h.astype(np.float64).sum(axis=1), 1e-5)


def test_out_argument(rng):
    x = random_array(rng, (33, 65), np.float32)
    d = cudalab.asarray(x)
    out = cudalab.empty((65,), dtype=np.float32)
    r = cudalab.sum(d, axis=0, out=out)
    assert r is out
    assert_close(out.get(), x.astype(np.float64).sum(axis=0), 1e-5)
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
    assert_close(scalar.get(), np.mean(x.astype(np.float64)), 1e-5)
    with pytest.raises(ValueError, match=r"sum\(\) argument 'out'"):
        cudalab.sum(d, axis=0, out=cudalab.empty((64,), dtype=np.float32))
    with pytest.raises(ValueError, match=r"min\(\) argument 'out'"):
        cudalab.min(d, out=cudalab.empty((1,), dtype=np.float32))


def test_out_overlapping_input(rng):
    x = random_array(rng, (16, 16), np.float32)
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
            with pytest.raises(ValueError,
                               match=rf"{op}\(\) argument 'axis': axis {axis} is out of bounds "
                                     r"for array of dimension 3"):
                getattr(cudalab, op)(d, axis=axis)
    z = cudalab.asarray(np.array(1.0, dtype=np.float32))
    with pytest.raises(ValueError, match="out of bounds for array of dimension 0"):
        cudalab.sum(z, axis=0)


# ---------------------------------------------------------- hypothesis -----


@st.composite
def view_case(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 23)) for _ in range(ndim))
    slices = []
    for n in shape:
        start = draw(st.integers(0, n - 1))
        step = draw(st.integers(1, 3))
        slices.append(slice(start, None, step))
    perm = draw(st.permutations(list(range(ndim))))
    axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1)))
    dtype = draw(st.sampled_from(["float32", "float64", "int32", "float16"]))
    keepdims = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, tuple(slices), perm, axis, dtype, keepdims, seed


@settings(max_examples=40, deadline=None)
@given(view_case())
def test_hypothesis_views_and_axes(case):
    shape, slices, perm, axis, dtype, keepdims, seed = case
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape, np.dtype(dtype))
    d = cudalab.asarray(x)[slices].transpose(*perm)
    xv = x[slices].transpose(*perm)
    for op in OPS:
        check(op, d, xv, axis=axis, keepdims=keepdims)
