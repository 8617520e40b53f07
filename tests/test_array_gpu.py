"""GPU tier: DeviceArray creation, layout, views, reshape, copies and casts.

Every result is checked against NumPy on the host copy, on random data (never
all zeros), with odd sizes and non-contiguous layouts. Comparisons are on raw
bytes of C-ordered copies, so NaN payloads and -0.0 are compared exactly.
"""

from __future__ import annotations

import gc
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from _support import BF16, DTYPE_IDS, DTYPES, assert_bit_equal, dtype_id, is_float, view_recipes
from _support import random_array as _random_array

import cudalab

pytestmark = pytest.mark.gpu


# ------------------------------------------------------------- helpers ------


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """_support's random_array, with int64 values over +-2**62: copies must keep every bit."""
    wide = {"low": -2**62, "high": 2**62} if np.dtype(dtype) == np.int64 else {}
    return _random_array(rng, shape, dtype, **wide)


def c_strides(shape, dtype) -> tuple[int, ...]:
    return np.empty(shape, dtype=dtype).strides


def assert_c_layout(d, shape, dtype) -> None:
    """C-contiguous strides, ignoring axes of extent <= 1 (whose stride is free)."""
    expected = c_strides(shape, dtype)
    for n, got, want in zip(shape, d.strides, expected, strict=True):
        if n > 1:
            assert got == want, (d.strides, expected)


def ptr(h: np.ndarray) -> int:
    return h.__array_interface__["data"][0]


def assert_view_of(view, root) -> None:
    """`view` is a view whose base is the root owner and whose data lies in root."""
    assert view.base is root
    if view.size > 0:
        assert root.data_ptr <= view.data_ptr <= root.data_ptr + root.nbytes


# ---------------------------------------------------- (a) round trips -------

N_SIZES = [0, 1, 7, 1_000_003]

LAYOUTS = {
    "contiguous": lambda rng, n, dt: random_array(rng, n, dt),
    "fortran": lambda rng, n, dt: np.asfortranarray(random_array(rng, (n, 5), dt)),
    "transposed": lambda rng, n, dt: random_array(rng, (5, n), dt).T,
    "sliced_cols": lambda rng, n, dt: random_array(rng, (n, 6), dt)[:, 1:4],
    "sliced_step": lambda rng, n, dt: random_array(rng, 2 * n, dt)[::2],
    "negative_stride": lambda rng, n, dt: random_array(rng, n, dt)[::-1],
}


@pytest.mark.parametrize("n", N_SIZES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_round_trip_is_bit_exact(rng, dtype, layout, n):
    """asarray(src).get() returns exactly src's values, dtype and shape."""
    src = LAYOUTS[layout](rng, n, dtype)
    d = cudalab.asarray(src)
    assert d.dtype == src.dtype
    assert d.shape == src.shape
    assert_bit_equal(d, src)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_round_trip_0d(rng, dtype):
    """A 0-d array round-trips as a 0-d array."""
    src = random_array(rng, (), dtype)
    d = cudalab.asarray(src)
    assert d.shape == () and d.ndim == 0 and d.size == 1
    assert_bit_equal(d, src)


def test_round_trip_special_floats():
    """NaN, +-inf and -0.0 survive the round trip bit for bit."""
    for dt in (np.float16, BF16, np.float32, np.float64):
        src = np.array([np.nan, -np.inf, np.inf, -0.0, 1.5, -2.25], dtype=dt)
        assert_bit_equal(cudalab.asarray(src), src)


# ----------------------------------------------- (b) layout preservation ----


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_asarray_keeps_c_and_f_strides(rng, dtype):
    """Dense C and Fortran sources keep their strides on the device."""
    c = random_array(rng, (7, 5, 3), dtype)
    f = np.asfortranarray(random_array(rng, (7, 5, 3), dtype))
    t = random_array(rng, (5, 7), dtype).T  # F-contiguous view
    for src in (c, f, t):
        d = cudalab.asarray(src)
        assert d.strides == src.strides
        assert d.is_contiguous == src.flags.c_contiguous
        assert d.is_f_contiguous == src.flags.f_contiguous
        assert_bit_equal(d, src)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_asarray_of_non_dense_source_is_c_contiguous(rng, dtype):
    """Non-dense and negative-stride sources land C-contiguous."""
    sources = [
        random_array(rng, (7, 6), dtype)[:, 1:4],
        random_array(rng, 14, dtype)[::2],
        random_array(rng, 7, dtype)[::-1],
        random_array(rng, (5, 7), dtype)[::-1, ::2],
        random_array(rng, (4, 5, 6), dtype)[:, ::-1].transpose(2, 0, 1),
    ]
    for src in sources:
        d = cudalab.asarray(src)
        assert d.is_contiguous
        assert d.strides == c_strides(src.shape, dtype)
        assert_bit_equal(d, src)


# ------------------------------------------------------ (c) attributes ------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("order", ["C", "F"])
def test_attributes_match_numpy(rng, dtype, order):
    """shape/strides/ndim/size/itemsize/nbytes/dtype/device/contiguity agree with NumPy."""
    h = random_array(rng, (4, 6, 7), dtype)
    if order == "F":
        h = np.asfortranarray(h)
    d = cudalab.asarray(h)
    assert d.shape == h.shape and type(d.shape) is tuple
    assert d.strides == h.strides and type(d.strides) is tuple
    assert d.ndim == h.ndim
    assert d.size == h.size
    assert d.itemsize == h.itemsize
    assert d.nbytes == h.nbytes
    assert isinstance(d.dtype, np.dtype)
    assert d.dtype == h.dtype
    assert d.device == cudalab.current_device()
    assert type(d.device) is int
    assert d.is_contiguous is (order == "C")
    assert d.is_f_contiguous is (order == "F")
    assert d.base is None
    assert isinstance(d.data_ptr, int) and d.data_ptr != 0


def test_bfloat16_dtype_is_ml_dtypes():
    """A bfloat16 array's dtype is ml_dtypes.bfloat16's dtype."""
    d = cudalab.asarray(np.array([1.5, -2.0], dtype=BF16))
    assert d.dtype == BF16
    assert d.dtype.type is ml_dtypes.bfloat16
    assert cudalab.empty(3, dtype=ml_dtypes.bfloat16).dtype == BF16
    assert cudalab.empty(3, dtype="bfloat16").dtype == BF16


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int8, np.bool_], ids=dtype_id)
def test_repr_shows_shape_dtype_and_device(rng, dtype):
    """repr names the shape, the dtype and the device."""
    d = cudalab.asarray(random_array(rng, (3, 4, 5), dtype))
    r = repr(d)
    assert str((3, 4, 5)) in r
    assert np.dtype(dtype).name in r
    assert re.search(rf"(device\s*[=:]\s*|cuda:){d.device}\b", r), r


# -------------------------------------------------------- (d) creation ------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_shape_and_dtype(dtype):
    """empty() gives the requested shape, dtype and C-contiguous strides."""
    d = cudalab.empty((3, 5, 2), dtype=dtype)
    assert d.shape == (3, 5, 2)
    assert d.dtype == dtype
    assert d.strides == c_strides((3, 5, 2), dtype)
    assert d.is_contiguous
    assert d.get().shape == (3, 5, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zeros_and_ones_values(dtype):
    """zeros() is all 0 and ones() all 1, bit-equal to NumPy's."""
    shape = (37, 11)
    assert_bit_equal(cudalab.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype))
    assert_bit_equal(cudalab.ones(shape, dtype=dtype), np.ones(shape, dtype=dtype))


def test_zeros_after_reused_memory_is_really_zero(rng):
    """zeros() clears memory the pool hands back from a freed random array."""
    h = random_array(rng, 100_003, np.float32)
    d = cudalab.asarray(h)
    del d
    gc.collect()
    assert_bit_equal(cudalab.zeros(100_003, dtype=np.float32), np.zeros(100_003, np.float32))


def test_default_dtype_is_float32():
    """empty/zeros/ones default to float32."""
    for f in (cudalab.empty, cudalab.zeros, cudalab.ones):
        assert f((2, 3)).dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_full_with_dtype(dtype):
    """full(shape, v, dtype) equals np.full for a value every dtype represents."""
    value = True if dtype == np.bool_ else 7
    for v in (value, 3.5 if is_float(dtype) else value):
        assert_bit_equal(cudalab.full((5, 9), v, dtype=dtype), np.full((5, 9), v, dtype=dtype))
    if dtype.kind == "i" or is_float(dtype):
        assert_bit_equal(cudalab.full(13, -5, dtype=dtype), np.full(13, -5, dtype=dtype))


@pytest.mark.parametrize(
    "value, expected",
    [(True, np.bool_), (False, np.bool_), (7, np.int64), (-3, np.int64), (3.5, np.float32), (-0.25, np.float32)],
)
def test_full_infers_dtype_from_python_scalar(value, expected):
    """dtype=None: bool -> bool, int -> int64, float -> float32."""
    d = cudalab.full((4, 3), value)
    assert d.dtype == expected
    assert_bit_equal(d, np.full((4, 3), value, dtype=expected))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_like_functions_keep_shape_and_take_dtype(rng, dtype):
    """*_like keep the shape and dtype of `a`, or take the dtype override."""
    a = cudalab.asarray(random_array(rng, (6, 5, 4), dtype))
    views = [a, a[1:, ::2], a.T]
    for src in views:
        assert cudalab.empty_like(src).shape == src.shape
        assert cudalab.empty_like(src).dtype == dtype
        assert_bit_equal(cudalab.zeros_like(src), np.zeros(src.shape, dtype))
        assert_bit_equal(cudalab.ones_like(src), np.ones(src.shape, dtype))
        fill = True if dtype == np.bool_ else 3
        assert_bit_equal(cudalab.full_like(src, fill), np.full(src.shape, fill, dtype))
        for other in (np.dtype(np.int32), BF16):
            assert cudalab.empty_like(src, dtype=other).dtype == other
            assert cudalab.empty_like(src, dtype=other).shape == src.shape
            assert_bit_equal(cudalab.zeros_like(src, dtype=other), np.zeros(src.shape, other))
            assert_bit_equal(cudalab.ones_like(src, dtype=other), np.ones(src.shape, other))
            assert_bit_equal(cudalab.full_like(src, 2, dtype=other), np.full(src.shape, 2, other))


def test_scalar_and_sequence_shapes():
    """An int shape is 1-d; () is 0-d; lists and NumPy integers are accepted."""
    assert cudalab.empty(5).shape == (5,)
    assert cudalab.empty(np.int64(5)).shape == (5,)
    assert cudalab.empty([2, 3]).shape == (2, 3)
    assert cudalab.empty((np.int32(2), 3)).shape == (2, 3)
    z = cudalab.empty(())
    assert z.shape == () and z.ndim == 0 and z.size == 1 and z.strides == ()
    assert_bit_equal(cudalab.ones(()), np.ones((), np.float32))
    assert_bit_equal(cudalab.full((), 2.5), np.full((), 2.5, np.float32))


def test_rank_eight_creation():
    """Rank 8 is the maximum and works."""
    shape = (2, 1, 3, 2, 1, 2, 3, 2)
    assert_bit_equal(cudalab.ones(shape, dtype=np.int8), np.ones(shape, np.int8))


def test_zero_size_arrays():
    """Zero-size arrays are created, round-trip and report their shape."""
    e = cudalab.empty((0, 3))
    assert e.shape == (0, 3) and e.size == 0 and e.nbytes == 0
    assert e.get().shape == (0, 3)
    z = cudalab.zeros(0)
    assert_bit_equal(z, np.zeros(0, np.float32))
    a = cudalab.asarray(np.ones((0, 5)))
    assert a.shape == (0, 5) and a.dtype == np.float64
    assert_bit_equal(a, np.ones((0, 5)))
    assert_bit_equal(cudalab.full((3, 0, 2), 1.5), np.full((3, 0, 2), 1.5, np.float32))
    # operations on zero-size arrays
    assert_bit_equal(a.copy(), np.ones((0, 5)))
    assert_bit_equal(a.T, np.ones((0, 5)).T)
    assert_bit_equal(a.reshape(5, 0), np.ones((5, 0)))
    assert_bit_equal(a.astype(np.int8), np.ones((0, 5), np.int8))
    assert_bit_equal(a[:, 1:3], np.ones((0, 5))[:, 1:3])
    assert_bit_equal(cudalab.ascontiguousarray(a.T), np.ones((5, 0)))
    assert len(a) == 0


# ------------------------------------------------------------ (e) views ----

GOOD_KEYS = [
    0, 5, -1, -6, np.int64(3),
    slice(None), slice(1, 4), slice(1, None, 2), slice(None, None, 3), slice(-3, None),
    slice(2, -1), slice(-100, 100), slice(5, 2), slice(10, 20), slice(0, 6, 4),
    (1, 2), (1, 2, 3), (-1, -2, -3), (slice(1, 4), 2), (2, slice(None), -1),
    Ellipsis, (Ellipsis, 1), (1, Ellipsis), (Ellipsis,), (1, Ellipsis, 2),
    None, (None,), (None, 1), (slice(None), None, 2), (1, None, slice(2, 5), None),
    (Ellipsis, None), (None, Ellipsis, None),
    (slice(0, 6, 4), slice(1, 7, 3), slice(None, None, 2)),
    (2, Ellipsis, slice(1, None, 3)),
    (slice(-4, -1, 2), slice(None, 100), slice(-100, 3)),
    (slice(2, 3), slice(3, 3), Ellipsis),
]


def _numpy_view_key(key):
    """Add a trailing Ellipsis when possible so NumPy returns a view, not a scalar."""
    t = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in t):
        return t
    return t + (Ellipsis,)


@pytest.mark.parametrize("key", GOOD_KEYS, ids=repr)
def test_getitem_matches_numpy_and_is_a_view(rng, key):
    """d[key] equals h[key], starts at NumPy's byte offset and its base is d."""
    h = random_array(rng, (6, 7, 8), np.float32)
    d = cudalab.asarray(h)
    hv = h[_numpy_view_key(key)]
    dv = d[key]
    assert isinstance(dv, cudalab.DeviceArray)
    assert dv.shape == hv.shape
    assert dv.dtype == hv.dtype
    assert_bit_equal(dv, hv)
    assert_view_of(dv, d)
    if hv.size > 0:
        assert dv.data_ptr - d.data_ptr == ptr(hv) - ptr(h)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_getitem_every_dtype_on_fortran_source(rng, dtype):
    """Slicing works for every dtype and on a Fortran-ordered array."""
    h = np.asfortranarray(random_array(rng, (9, 10), dtype))
    d = cudalab.asarray(h)
    for key in [(slice(1, None, 2), slice(None, None, 3)), (3,), (slice(None), -2), (Ellipsis, slice(2, 9, 2))]:
        dv = d[key]
        assert_bit_equal(dv, h[key])
        assert_view_of(dv, d)


def test_views_of_views_have_the_root_as_base(rng):
    """Chained views all point at the root owner and stay correct."""
    h = random_array(rng, (10, 9, 8), np.int32)
    d = cudalab.asarray(h)
    v1 = d[1:]
    v2 = v1[::2, 1]
    v3 = v2.T[2:5]
    v4 = v3.reshape(-1) if v3.is_contiguous else v3.transpose(1, 0)
    assert d.base is None
    for v, hv in [(v1, h[1:]), (v2, h[1:][::2, 1]), (v3, h[1:][::2, 1].T[2:5])]:
        assert_view_of(v, d)
        assert_bit_equal(v, hv)
    assert v4.base is d
    assert v1.T.base is d
    assert d.T.base is d


@pytest.mark.parametrize(
    "key",
    [slice(None, None, -1), (slice(None), slice(None, None, -2)), slice(5, 1, -1)],
    ids=repr,
)
def test_negative_step_is_a_view(rng, key):
    """Negative steps give views, as in NumPy (test_negative_steps_gpu.py has more)."""
    h = random_array(rng, (6, 7), np.float32)
    d = cudalab.asarray(h)
    v = d[key]
    assert v.base is d
    assert v.shape == h[key].shape and v.strides == h[key].strides
    assert_bit_equal(v, h[key])


@pytest.mark.parametrize("key", [slice(None, None, 0), (1, slice(0, 5, 0))], ids=repr)
def test_zero_step_is_value_error(rng, key):
    """A zero step is a ValueError (as in Python)."""
    d = cudalab.asarray(random_array(rng, (6, 7), np.float32))
    with pytest.raises(ValueError):
        d[key]


@pytest.mark.parametrize("key", [6, -7, (0, 7), (0, -8), (1, 2, 3), (Ellipsis, 1, 2, 3)], ids=repr)
def test_out_of_range_or_too_many_indices_is_index_error(rng, key):
    """Integer indices out of range and too many indices raise IndexError."""
    d = cudalab.asarray(random_array(rng, (6, 7), np.float32))
    with pytest.raises(IndexError):
        d[key]


def test_index_on_0d_is_index_error():
    """A 0-d array cannot be indexed by an integer."""
    d = cudalab.full((), 1.5)
    with pytest.raises(IndexError):
        d[0]


@pytest.mark.parametrize(
    "key",
    [1.0, (0, 1.5), [0, 1], np.array([0, 1]), np.array([True] * 6), True, False, (0, True), "a"],
    ids=repr,
)
def test_unsupported_index_is_type_error(rng, key):
    """Floats, lists, arrays, bools and strings are not basic indices: TypeError."""
    d = cudalab.asarray(random_array(rng, (6, 7), np.float32))
    with pytest.raises(TypeError):
        d[key]


@pytest.mark.parametrize("axes", [None, (2, 0, 1), (1, 0, 2), (0, 1, 2), (2, 1, 0)], ids=repr)
def test_transpose_matches_numpy_and_is_a_view(rng, axes):
    """.T, transpose(*axes) and transpose(axes) equal NumPy and share memory."""
    h = random_array(rng, (3, 4, 5), np.float64)
    d = cudalab.asarray(h)
    if axes is None:
        results = [(d.T, h.T), (d.transpose(), h.transpose())]
    else:
        results = [(d.transpose(*axes), h.transpose(axes)), (d.transpose(axes), h.transpose(axes))]
    for dv, hv in results:
        assert dv.shape == hv.shape
        assert dv.strides == hv.strides
        assert_bit_equal(dv, hv)
        assert dv.data_ptr == d.data_ptr
        assert dv.base is d


def test_transpose_of_offset_view(rng):
    """Transposing a sliced view keeps its start address."""
    h = random_array(rng, (6, 5), np.int32)
    d = cudalab.asarray(h)
    v = d[2:, 1::2]
    assert v.T.data_ptr == v.data_ptr
    assert_bit_equal(v.T, h[2:, 1::2].T)
    one = d[3]
    assert one.T.shape == (5,)
    assert_bit_equal(one.T, h[3])


@pytest.mark.parametrize("axes", [(0, 1), (0, 0, 1), (0, 1, 3), (0, 1, -4), (0, 1, 2, 3)], ids=repr)
def test_bad_transpose_axes_is_value_error(rng, axes):
    """Wrong count, repeats or out-of-range axes raise ValueError."""
    d = cudalab.asarray(random_array(rng, (3, 4, 5), np.float32))
    with pytest.raises(ValueError):
        d.transpose(*axes)


def test_len(rng):
    """len() is the first dimension; a 0-d array has no len()."""
    assert len(cudalab.asarray(random_array(rng, (6, 7), np.float32))) == 6
    assert len(cudalab.asarray(random_array(rng, 11, np.int8))) == 11
    assert len(cudalab.empty((0, 4))) == 0
    with pytest.raises(TypeError):
        len(cudalab.empty(()))


# ---------------------------------------------------------- (f) reshape -----

RESHAPES = [(120,), (-1,), (4, 30), (2, -1, 5), (2, 3, 4, 5), (120, 1), (1, 120), (-1, 1, 2), (5, 4, 6)]


@pytest.mark.parametrize("shape", RESHAPES, ids=repr)
def test_reshape_contiguous_is_a_view(rng, shape):
    """Reshaping a C array matches NumPy and is a view (tuple and varargs forms)."""
    h = random_array(rng, (4, 6, 5), np.float32)
    d = cudalab.asarray(h)
    expected = h.reshape(shape)
    for r in (d.reshape(shape), d.reshape(*shape), d.reshape(list(shape))):
        assert r.shape == expected.shape
        assert_bit_equal(r, expected)
        assert r.data_ptr == d.data_ptr
        assert r.base is d


def test_reshape_to_and_from_0d(rng):
    """A one-element array reshapes to () and back."""
    h = random_array(rng, (1, 1), np.int64)
    d = cudalab.asarray(h)
    z = d.reshape(())
    assert z.shape == ()
    assert_bit_equal(z, h.reshape(()))
    assert_bit_equal(z.reshape(1, 1, 1), h.reshape(1, 1, 1))


# (source view name, new shape): the view-ness is decided by NumPy itself.
NONCONTIG_RESHAPES = [
    ("T", (5, 6, 2, 2)),
    ("T", (5, 3, 2, 4)),
    ("T", (5, 6, 4)),
    ("T", (-1,)),
    ("T", (30, 4)),
    ("T", (5, 24)),
    ("T", (1, 5, 6, 4, 1)),
    ("step", (2, 2, 3, 5)),
    ("step", (4, 15)),
    ("step", (-1,)),
    ("step", (4, 3, 5, 1)),
    ("rows", (3, 30)),
    ("rows", (-1,)),
]


def _source_view(arr, name):
    if name == "T":
        return arr.T
    if name == "step":
        return arr[:, ::2]
    if name == "rows":
        return arr[1:]
    raise AssertionError(name)


@pytest.mark.parametrize("name, shape", NONCONTIG_RESHAPES, ids=repr)
def test_reshape_non_contiguous_view_or_copy_like_numpy(rng, name, shape):
    """A view exactly when NumPy's reshape is a view; otherwise a correct C copy."""
    h = random_array(rng, (4, 6, 5), np.float64)
    d = cudalab.asarray(h)
    hs, ds = _source_view(h, name), _source_view(d, name)
    expected = hs.reshape(shape)
    numpy_is_view = np.shares_memory(expected, h)
    r = ds.reshape(shape)
    assert r.shape == expected.shape
    assert_bit_equal(r, expected)
    if numpy_is_view:
        assert r.data_ptr == ds.data_ptr
        assert r.base is d
    else:
        assert r.is_contiguous
        assert r.base is None
        assert not (d.data_ptr <= r.data_ptr < d.data_ptr + d.nbytes)


def test_reshape_minus_one_of_transposed_is_a_copy(rng):
    """reshape(-1) of a transposed array equals h.T.reshape(-1) (a copy)."""
    h = random_array(rng, (7, 9), BF16)
    d = cudalab.asarray(h)
    r = d.T.reshape(-1)
    assert_bit_equal(r, h.T.reshape(-1))
    assert r.is_contiguous and r.base is None


@pytest.mark.parametrize("shape", [(7,), (-1, 7), (-1, -1), (-1, 2, -1), (121,), (0, -1), (2, 3)], ids=repr)
def test_bad_reshape_is_value_error(rng, shape):
    """Wrong total size, two -1s or other negative sizes raise ValueError."""
    d = cudalab.asarray(random_array(rng, (4, 6, 5), np.float32))
    with pytest.raises(ValueError):
        d.reshape(shape)


# ------------------------------------------------ (g) copy / contiguous -----


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_copy_is_contiguous_equal_and_independent(rng, dtype):
    """copy() is C-contiguous, equal, owns new memory and survives the source."""
    h = random_array(rng, (33, 17), dtype)
    d = cudalab.asarray(h)
    for src, hsrc in [(d, h), (d.T, h.T), (d[1::2, ::3], h[1::2, ::3])]:
        c = src.copy()
        assert c.is_contiguous
        assert c.strides == c_strides(hsrc.shape, dtype)
        assert c.base is None
        assert c is not src
        assert not (d.data_ptr <= c.data_ptr < d.data_ptr + d.nbytes)
        assert_bit_equal(c, hsrc)
    c = d.copy()
    del d, src
    gc.collect()
    # reuse the freed memory with different data; the copy must not change
    other = cudalab.asarray(random_array(rng, (33, 17), dtype))
    assert_bit_equal(c, h)
    del other


@settings(max_examples=50, deadline=None)
@given(view_recipes(max_extent=7), st.sampled_from(DTYPES), st.integers(0, 2**32 - 1))
def test_ascontiguousarray_of_random_views(view, dtype, seed):
    """ascontiguousarray of a random strided/transposed view equals NumPy's bit for bit."""
    h = random_array(np.random.default_rng(seed), view.root_shape, dtype)
    d = cudalab.asarray(h)
    hv = view(h)
    dv = view(d)
    out = cudalab.ascontiguousarray(dv)
    assert out.is_contiguous
    assert out.shape == hv.shape
    assert_c_layout(out, hv.shape, dtype)
    assert_bit_equal(out, np.ascontiguousarray(hv))


def test_ascontiguousarray_returns_self_when_c_contiguous(rng):
    """An already C-contiguous array is returned as is."""
    d = cudalab.asarray(random_array(rng, (5, 6), np.float32))
    assert cudalab.ascontiguousarray(d) is d
    row = d[2]
    assert cudalab.ascontiguousarray(row) is row


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_ascontiguousarray_rank_eight(rng, dtype):
    """The strided copy handles rank 8 with steps and a permutation."""
    shape = (3, 2, 4, 2, 3, 2, 3, 5)
    h = random_array(rng, shape, dtype)
    d = cudalab.asarray(h)
    key = (slice(None, None, 2), slice(None), slice(1, None, 2), slice(None),
           slice(None, None, 2), slice(None), slice(1, None), slice(None, None, 3))
    perm = (7, 0, 6, 1, 5, 2, 4, 3)
    hv = h[key].transpose(perm)
    out = cudalab.ascontiguousarray(d[key].transpose(perm))
    assert out.is_contiguous
    assert_bit_equal(out, np.ascontiguousarray(hv))
    assert_bit_equal(d.T.copy(), np.ascontiguousarray(h.T))


def test_ascontiguousarray_large_transpose(rng):
    """A large odd-sized transposed copy is right (exercises many blocks)."""
    h = random_array(rng, (1001, 1003), np.float32)
    d = cudalab.asarray(h)
    assert_bit_equal(cudalab.ascontiguousarray(d.T), np.ascontiguousarray(h.T))


# ----------------------------------------------------------- (h) astype -----


def astype_source(rng, shape, src, dst) -> np.ndarray:
    """Values every dtype holds exactly: ints 1..100, halves for float sources,
    some zeros only when the target is bool."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src == np.bool_:
        h = rng.integers(0, 2, size=shape).astype(np.bool_)
        flat = h.reshape(-1)
        flat[0], flat[1] = True, False
        return h
    vals = rng.integers(1, 101, size=shape).astype(np.float64)
    if is_float(src):
        vals += 0.5 * rng.integers(0, 2, size=shape)
    if dst == np.bool_:
        vals[rng.random(size=shape) < 0.3] = 0
        vals.reshape(-1)[0] = 0
    return vals.astype(src)


@pytest.mark.parametrize("dst", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("src", DTYPES, ids=DTYPE_IDS)
def test_astype_every_pair(rng, src, dst):
    """astype equals NumPy's astype bit for bit, contiguous and strided."""
    h = astype_source(rng, (12, 37), src, dst)
    d = cudalab.asarray(h)
    cases = [(d, h), (d[1::2, ::3], h[1::2, ::3]), (d[1::2, ::3].T, h[1::2, ::3].T), (d.T, h.T)]
    for dv, hv in cases:
        out = dv.astype(dst)
        assert out.dtype == dst
        assert out.shape == hv.shape
        assert_bit_equal(out, hv.astype(dst))


def test_astype_large_odd_size(rng):
    """A large odd-sized cast (float32 -> bfloat16 -> float64) matches NumPy."""
    h = (rng.integers(1, 101, size=1_000_003) + 0.5).astype(np.float32)
    d = cudalab.asarray(h)
    b = d.astype(BF16)
    assert_bit_equal(b, h.astype(BF16))
    assert_bit_equal(b.astype(np.float64), h.astype(BF16).astype(np.float64))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_astype_same_dtype(rng, dtype):
    """Same dtype: copy=False returns self; copy=True returns a new equal array."""
    h = random_array(rng, (9, 4), dtype)
    d = cudalab.asarray(h)
    assert d.astype(dtype, copy=False) is d
    c = d.astype(dtype)
    assert c is not d
    assert c.data_ptr != d.data_ptr
    assert_bit_equal(c, h)


def test_astype_accepts_dtype_spellings(rng):
    """dtype given as a string, a NumPy type or ml_dtypes.bfloat16."""
    h = (rng.integers(1, 101, size=10) + 0.5).astype(np.float64)
    d = cudalab.asarray(h)
    assert d.astype("float32").dtype == np.float32
    assert d.astype(np.int8).dtype == np.int8
    assert d.astype(ml_dtypes.bfloat16).dtype == BF16
    assert d.astype("bfloat16").dtype == BF16
    with pytest.raises(TypeError):
        d.astype(np.complex64)


# ---------------------------------------------------- (i) host interop ------


def test_implicit_host_conversion_is_refused(rng):
    """np.asarray(d) and d.__array__() raise TypeError: use .get()."""
    d = cudalab.asarray(random_array(rng, 8, np.float32))
    with pytest.raises(TypeError):
        d.__array__()
    with pytest.raises(TypeError):
        np.asarray(d)
    with pytest.raises(TypeError):
        np.array(d)


def test_asnumpy_equals_get(rng):
    """asnumpy(d) is d.get(), also for views."""
    h = random_array(rng, (5, 8), np.int64)
    d = cudalab.asarray(h)
    for got, want in [(cudalab.asnumpy(d), d.get()), (cudalab.asnumpy(d), h),
                      (cudalab.asnumpy(d[1:, ::2]), h[1:, ::2])]:
        assert isinstance(got, np.ndarray), type(got)
        assert_bit_equal(got, want)


def test_get_returns_a_fresh_writable_array(rng):
    """get() returns a new host array each time: writing to it changes nothing on the device."""
    h = random_array(rng, 16, np.int32)
    d = cudalab.asarray(h)
    g1 = d.get()
    g1[:] = 1
    assert_bit_equal(d, h)


def test_asarray_of_devicearray(rng):
    """asarray(d) is d; asarray(d, dtype=other) converts."""
    h = astype_source(rng, (6, 7), np.float32, np.float64)
    d = cudalab.asarray(h)
    assert cudalab.asarray(d) is d
    c = cudalab.asarray(d, dtype=np.float64)
    assert c.dtype == np.float64
    assert_bit_equal(c, h.astype(np.float64))
    v = d[::2, 1:]
    assert cudalab.asarray(v) is v
    assert_bit_equal(cudalab.asarray(v, dtype=np.int32), h[::2, 1:].astype(np.int32))


def test_asarray_with_dtype_from_numpy(rng):
    """asarray(ndarray, dtype=...) converts like np.asarray(..., dtype=...)."""
    h = astype_source(rng, (4, 9), np.float64, BF16)
    for dt in (np.float16, BF16, np.int32, np.bool_):
        assert_bit_equal(cudalab.asarray(h, dtype=dt), h.astype(dt))


def test_asarray_lists_and_scalars_use_numpy_inference(rng):
    """Lists and Python scalars follow NumPy's dtype inference."""
    a = cudalab.asarray([1, 2, 3])
    assert a.dtype == np.int64
    assert_bit_equal(a, np.asarray([1, 2, 3]))
    s = cudalab.asarray(1.5)
    assert s.shape == () and s.dtype == np.float64
    assert_bit_equal(s, np.asarray(1.5))
    b = cudalab.asarray([True, False, True])
    assert b.dtype == np.bool_
    vals = rng.standard_normal((3, 4)).tolist()
    assert_bit_equal(cudalab.asarray(vals), np.asarray(vals))
    assert_bit_equal(cudalab.asarray(vals, dtype="float16"), np.asarray(vals, dtype=np.float16))
