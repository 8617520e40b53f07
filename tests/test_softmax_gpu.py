"""GPU tier: softmax and log_softmax against a float64 NumPy reference.

Random rows of odd lengths around the kernels' limits (a warp per row up to
1024 elements, a block per row beyond; 16-byte vectors only when every row is
aligned), every axis (the strided-axis kernel and the axis-last copy), views
(sliced, stepped, transposed, misaligned), every float dtype, large
magnitudes, special values (-inf, +inf, NaN), out= (in place, strided,
overlapping), hypothesis-drawn views and axes, determinism, the profiler
record and the argument errors that need an array.

Tolerances (``|got - ref| <= atol + rtol * |ref|``): rtol is the dtype's
rounding (half an ulp: float16 2**-11, bfloat16 2**-8, each with a margin)
plus the float32 arithmetic behind it; float32 2e-5 covers a 256-term
per-thread chain of float32 additions; float64 1e-12. atol covers results
below the dtype's normal range (float16 subnormals are 6e-8 apart) and, for
log_softmax, the absolute error of log(sum) next to 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cudalab
from _support import (BF16, F16, F32, F64, FLOAT_DTYPES, FLOAT_IDS, arg_error, assorted_views,
                      random_array, view_recipes)

pytestmark = pytest.mark.gpu

FUNCS = ["softmax", "log_softmax"]
RTOL = {F16: 1e-3, BF16: 5e-3, F32: 2e-5, F64: 1e-12}
ATOL = {
    "softmax": {F16: 1e-7, BF16: 1e-37, F32: 1e-37, F64: 1e-300},
    "log_softmax": {F16: 1e-6, BF16: 1e-6, F32: 1e-6, F64: 1e-14},
}
LENGTHS = [1, 7, 33, 1000, 1025, 4097, 65537]


def random_floats(rng, shape, dtype, scale=1.0, offset=0.0) -> np.ndarray:
    """offset + scale * N(0, 1) in `dtype` (N never near 0: see random_array)."""
    return (offset + scale * random_array(rng, shape, F64)).astype(dtype)


def reference(func: str, x: np.ndarray, axis: int) -> np.ndarray:
    """softmax or log_softmax of `x` computed in float64."""
    w = np.asarray(x).astype(np.float64)
    if w.size == 0:
        return w
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = w - np.max(w, axis=axis, keepdims=True)
        s = np.sum(np.exp(z), axis=axis, keepdims=True)
        return z - np.log(s) if func == "log_softmax" else np.exp(z) / s


def assert_matches(func: str, got, x: np.ndarray, axis: int) -> None:
    """`got` (a DeviceArray) is func(x) within the dtype's tolerance."""
    assert isinstance(got, cudalab.DeviceArray)
    assert got.shape == x.shape and got.dtype == x.dtype
    g = got.get().astype(np.float64)
    ref = reference(func, x, axis)
    np.testing.assert_allclose(g, ref, rtol=RTOL[x.dtype], atol=ATOL[func][x.dtype],
                               err_msg=f"{func} axis={axis} shape={x.shape} {x.dtype}")


def check(func: str, d, x: np.ndarray, axis: int = -1):
    got = getattr(cudalab, func)(d, axis=axis)
    assert_matches(func, got, x, axis)
    return got


# ----------------------------------------------------------- row lengths ---


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("n", LENGTHS)
def test_odd_row_lengths(rng, dtype, n):
    rows = 3 if n > 5000 else 37
    x = random_floats(rng, (rows, n), dtype, scale=3.0)
    d = cudalab.asarray(x)
    for func in FUNCS:
        check(func, d, x)
        check(func, d[:, 1:], x[:, 1:])  # every row misaligned: the scalar loads
        check(func, d[5:, :], x[5:, :])
    flat = random_floats(rng, (n,), dtype)
    for func in FUNCS:
        check(func, cudalab.asarray(flat), flat, axis=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("n", LENGTHS)
def test_rows_sum_to_one(rng, dtype, n):
    x = random_floats(rng, (5, n), dtype, scale=2.0)
    got = cudalab.softmax(cudalab.asarray(x)).get().astype(np.float64)
    assert (got >= 0).all() and (got <= 1).all()
    sums = got.sum(axis=-1)
    bound = RTOL[np.dtype(dtype)] + n * ATOL["softmax"][np.dtype(dtype)] + 1e-15
    np.testing.assert_allclose(sums, 1.0, rtol=0, atol=bound)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_log_softmax_is_log_of_softmax(rng, dtype):
    x = random_floats(rng, (9, 1031), dtype, scale=2.0)
    d = cudalab.asarray(x)
    for axis in (0, 1):
        sm = cudalab.softmax(d, axis=axis).get().astype(np.float64)
        ls = cudalab.log_softmax(d, axis=axis).get().astype(np.float64)
        # Where softmax is not tiny, log(softmax) keeps the dtype's precision:
        # its error is softmax's relative error, beside log_softmax's own.
        keep = sm > 1e-3
        assert keep.any()
        rtol = RTOL[np.dtype(dtype)]
        np.testing.assert_allclose(ls[keep], np.log(sm[keep]), rtol=1.5 * rtol,
                                   atol=1.5 * rtol + ATOL["log_softmax"][np.dtype(dtype)])


def test_many_short_rows_and_one_long_row(rng):
    """Grid-stride loops: more rows than one grid, and a single long row."""
    x = random_floats(rng, (300007, 5), np.float32)
    d = cudalab.asarray(x)
    for func in FUNCS:
        check(func, d, x)
    y = random_floats(rng, (1, 200003), np.float32)
    for func in FUNCS:
        check(func, cudalab.asarray(y), y)


# ------------------------------------------------------- axes and views ---


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape", [(5, 37, 129), (129, 3, 7), (3, 1000, 40), (4097, 64),
                                   (2, 3, 5, 7)])
def test_every_axis(rng, dtype, shape):
    """Contiguous axis (row kernels), strided axis with wide contiguous inner
    axes (column kernel) and narrow ones (the axis-last copy)."""
    x = random_floats(rng, shape, dtype, scale=2.0)
    d = cudalab.asarray(x)
    for func in FUNCS:
        for axis in range(-len(shape), len(shape)):
            check(func, d, x, axis=axis)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_non_contiguous_views(rng, dtype):
    for _, d, x in assorted_views(lambda shape: random_floats(rng, shape, dtype, scale=2.0)):
        assert d.shape == x.shape
        for func in FUNCS:
            for axis in range(x.ndim):
                check(func, d, x, axis=axis)


def test_negative_strides(rng):
    """Views with negative strides (slices with negative steps)."""
    x = random_floats(rng, (33, 1025), np.float32)
    d = cudalab.asarray(x)
    views = [(d[::-1], x[::-1]), (d[:, ::-1], x[:, ::-1]), (d[::-2, ::-3], x[::-2, ::-3])]
    for dv, xv in views:
        for func in FUNCS:
            for axis in (0, 1):
                check(func, dv, xv, axis=axis)


def test_input_is_untouched(rng):
    x = random_floats(rng, (17, 300), np.float32)
    d = cudalab.asarray(x)
    for func in FUNCS:
        for axis in (0, 1):
            getattr(cudalab, func)(d, axis=axis)
    np.testing.assert_array_equal(d.get(), x)


@st.composite
def view_case(draw):
    """A random stepped, offset and permuted view of a random array (extents
    up to 40 with 1 or 2 axes, up to 12 with 3 or 4), an axis, a float dtype
    and whether to write in place."""
    view = draw(st.one_of(view_recipes(max_ndim=2, max_extent=40),
                          view_recipes(max_ndim=4, max_extent=12)))
    ndim = len(view.root_shape)
    axis = draw(st.integers(-ndim, ndim - 1))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    in_place = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return view, axis, dtype, in_place, seed


@settings(max_examples=60, deadline=None)
@given(view_case())
def test_hypothesis_views_and_axes(case):
    view, axis, dtype, in_place, seed = case
    x = random_floats(np.random.default_rng(seed), view.root_shape, dtype, scale=3.0)
    xv = view(x)
    for func in FUNCS:
        d = view(cudalab.asarray(x))
        got = getattr(cudalab, func)(d, axis=axis, out=d if in_place else None)
        assert (got is d) == in_place
        assert_matches(func, got, xv, axis)


# ----------------------------------------------------- values and limits ---


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("n", [7, 1000, 4097])
def test_large_magnitudes_do_not_overflow(rng, dtype, n):
    """Values around 1e4 (exp overflows without the max subtracted)."""
    spread = random_array(rng, (6, n), dtype, low=-1e4, high=1e4)
    near = random_floats(rng, (6, n), dtype, scale=4.0, offset=1e4)
    negative = random_floats(rng, (6, n), dtype, scale=4.0, offset=-1e4)
    for x in (spread, near, negative):
        d = cudalab.asarray(x)
        for func in FUNCS:
            for axis in (0, 1):
                got = check(func, d, x, axis=axis)
                assert np.isfinite(got.get().astype(np.float64)).all()


@pytest.mark.parametrize("rows", [5, 40])
@pytest.mark.parametrize("n", [7, 2000])
def test_special_values(rng, rows, n):
    """-inf entries give 0 (log: -inf); a row of only -inf, or holding NaN or
    +inf, gives NaN, as torch.softmax does. Short and long rows, and the same
    as columns (40 of them take the column kernel, 5 the axis-last copy)."""
    x = random_floats(rng, (rows, n), np.float32, scale=2.0)
    x[0, :] = -np.inf
    x[1, ::3] = -np.inf
    x[2, n // 2] = np.nan
    x[3, n - 1] = np.inf
    for dtype in FLOAT_DTYPES:
        xd = x.astype(dtype)
        xt = np.ascontiguousarray(xd.T)
        for d, axis in ((cudalab.asarray(xd), 1), (cudalab.asarray(xt).T, 1),
                        (cudalab.asarray(xt), 0)):
            for func in FUNCS:
                got = getattr(cudalab, func)(d, axis=axis).get().astype(np.float64)
                got = got if axis == 1 else got.T
                assert np.isnan(got[[0, 2, 3]]).all()
                finite = [1] + list(range(4, rows))
                np.testing.assert_allclose(got[finite], reference(func, xd[finite], 1),
                                           rtol=RTOL[np.dtype(dtype)],
                                           atol=ATOL[func][np.dtype(dtype)])
                assert (got[1, ::3] == (-np.inf if func == "log_softmax" else 0.0)).all()


def test_single_element_rows(rng):
    x = random_floats(rng, (11, 1), np.float32)
    d = cudalab.asarray(x)
    np.testing.assert_array_equal(cudalab.softmax(d).get(), np.ones((11, 1), np.float32))
    np.testing.assert_array_equal(cudalab.log_softmax(d).get(), np.zeros((11, 1), np.float32))


def test_empty_inputs():
    for shape, axis in (((0, 5), -1), ((5, 0), -1), ((0, 5), 0), ((3, 0, 4), 1), ((0,), 0)):
        d = cudalab.empty(shape, dtype=np.float32)
        for func in FUNCS:
            got = getattr(cudalab, func)(d, axis=axis)
            assert got.shape == shape and got.dtype == np.float32


def test_bit_identical_over_runs(rng):
    cases = [random_floats(rng, (513, 777), np.float32),
             random_floats(rng, (3, 100003), np.float32),
             random_floats(rng, (2000, 300), np.float16)]
    for x in cases:
        d = cudalab.asarray(x)
        for func in FUNCS:
            for axis in (0, 1):
                first = getattr(cudalab, func)(d, axis=axis).get().tobytes()
                for _ in range(4):
                    assert getattr(cudalab, func)(d, axis=axis).get().tobytes() == first


# ------------------------------------------------------------------- out= ---


@pytest.mark.parametrize("func", FUNCS)
def test_out(rng, func):
    x = random_floats(rng, (33, 1030), np.float32)
    d = cudalab.asarray(x)
    out = cudalab.empty((33, 1030), dtype=np.float32)
    assert getattr(cudalab, func)(d, out=out) is out
    assert_matches(func, out, x, -1)
    fortran = cudalab.empty((1030, 33), dtype=np.float32).T  # strided out
    assert getattr(cudalab, func)(d, axis=0, out=fortran) is fortran
    assert_matches(func, fortran, x, 0)
    big = cudalab.zeros((33, 2060), dtype=np.float32)
    view = big[:, ::2]  # every other column
    assert getattr(cudalab, func)(d, out=view) is view
    assert_matches(func, view, x, -1)
    np.testing.assert_array_equal(big.get()[:, 1::2], 0)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_out_in_place(rng, func, dtype):
    for shape, axis in (((37, 7), -1), ((5, 3000), 1), ((700, 40), 0), ((40, 3, 9), 0)):
        x = random_floats(rng, shape, dtype, scale=2.0)
        d = cudalab.asarray(x)
        assert getattr(cudalab, func)(d, axis=axis, out=d) is d
        assert_matches(func, d, x, axis)
    x = random_floats(rng, (40, 64), dtype)
    d = cudalab.asarray(x)
    v = d[:, ::2]
    assert getattr(cudalab, func)(v, axis=1, out=v) is v
    assert_matches(func, v, x[:, ::2], 1)
    np.testing.assert_array_equal(d.get()[:, 1::2], x[:, 1::2])


@pytest.mark.parametrize("func", FUNCS)
def test_out_overlapping_input(rng, func):
    """out shares memory with the input, shifted: the result is as if from a copy."""
    x = random_floats(rng, (41, 1200), np.float32)
    d = cudalab.asarray(x)
    getattr(cudalab, func)(d[:-1], out=d[1:])
    got = d.get()
    np.testing.assert_array_equal(got[0], x[0])
    np.testing.assert_allclose(got[1:], reference(func, x[:-1], -1), rtol=RTOL[F32],
                               atol=ATOL[func][F32])


# ------------------------------------------------------ profiler, memory ---


def test_profiler_record(rng):
    x = random_floats(rng, (64, 1000), np.float32)
    d = cudalab.asarray(x)
    with cudalab.profiler.profile() as prof:
        cudalab.softmax(d)
        cudalab.log_softmax(d, axis=0)
    events = [e for e in prof.events() if e.name in FUNCS]
    assert [e.name for e in events] == FUNCS
    for e in events:
        assert e.bytes == 2 * x.nbytes
        assert e.dtype == "float32"
        assert e.input_shapes == ((64, 1000),)


def test_direct_layouts_make_no_copy(rng):
    """A contiguous axis, or a strided one over contiguous inner axes, allocates
    only the result."""
    x = random_floats(rng, (512, 1024), np.float32)
    d = cudalab.asarray(x)
    cudalab.synchronize()
    for func in FUNCS:
        for axis in (0, 1):
            cudalab.reset_peak_memory_stats()
            before = cudalab.memory_stats()["requested_bytes.all.current"]
            r = getattr(cudalab, func)(d, axis=axis)
            cudalab.synchronize()
            peak = cudalab.memory_stats()["requested_bytes.all.peak"]
            assert peak - before <= x.nbytes + 4096, (func, axis, peak - before)
            del r


# ------------------------------------------------ errors that need arrays ---


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32, np.int64])
def test_integer_input_is_type_error(func, dtype):
    d = cudalab.asarray(np.ones((2, 3), dtype=dtype))
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=arg_error(func, "a") +
                       f"expected a float16, bfloat16, float32 or float64 array, got {name}$"):
        getattr(cudalab, func)(d)


@pytest.mark.parametrize("func", FUNCS)
def test_axis_out_of_bounds(func):
    d = cudalab.asarray(np.ones((2, 3), dtype=np.float32))
    for axis in (2, -3, 100):
        with pytest.raises(ValueError, match=arg_error(func, "axis") +
                           f"axis {axis} is out of bounds for array of dimension 2$"):
            getattr(cudalab, func)(d, axis=axis)
    z = cudalab.asarray(np.array(1.5, dtype=np.float32))
    with pytest.raises(ValueError, match="out of bounds for array of dimension 0"):
        getattr(cudalab, func)(z)


@pytest.mark.parametrize("func", FUNCS)
def test_out_shape_and_dtype(func):
    d = cudalab.asarray(np.ones((3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=arg_error(func, "out") +
                       r"has shape \(4, 3\) but the result has shape \(3, 4\)"):
        getattr(cudalab, func)(d, out=cudalab.empty((4, 3), dtype=np.float32))
    for dtype in (np.float64, np.float16, np.int32):
        name = np.dtype(dtype).name
        with pytest.raises(TypeError, match=arg_error(func, "out") +
                           f"has dtype {name} but the result has dtype float32"):
            getattr(cudalab, func)(d, out=cudalab.empty((3, 4), dtype=dtype))


def test_errors_leave_out_untouched():
    d = cudalab.asarray(np.ones((3, 4), dtype=np.float32))
    out = cudalab.full((3, 4), 7.0, dtype=np.float64)
    with pytest.raises(TypeError):
        cudalab.softmax(d, out=out)
    np.testing.assert_array_equal(out.get(), 7.0)
