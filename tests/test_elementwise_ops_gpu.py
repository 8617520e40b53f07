"""GPU tier: pow, clamp and where against NumPy.

clamp and where compute no new values, so their results must equal NumPy's
exactly (bit for bit, NaNs in the same places); pow is compared with a float64
reference from the same rounded inputs (relative L2 error, as in
test_elementwise_gpu.py) and exactly for integers, whose wrapping NumPy shares.
Inputs are random and never zero, with odd sizes (vector tails), stepped,
transposed and reversed (negative-stride) views, broadcast operands, out= in
place and partially overlapping out=.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab as cl
from _support import BF16, DTYPE_IDS, DTYPES, arg_error, is_float
from _support import check_result as check
from _support import random_array as rand

pytestmark = pytest.mark.gpu

B, I8, U8, I32, I64 = (np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int32, np.int64))
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FLOATS = [F16, BF16, F32, F64]
SIZES = [1, 7, 1001, 100003]


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def exact(got, ref, dtype) -> None:
    """`got` equals `ref` cast to `dtype`, element for element (NaN == NaN)."""
    dtype = np.dtype(dtype)
    assert got.dtype == dtype, (got.dtype, dtype)
    np.testing.assert_array_equal(got.get(), np.asarray(ref).astype(dtype))


def views(rng, shape, dtype):
    """(host, device) pairs of the same values: stepped (from an offset),
    stepped twice, contiguous and, for 2-D, a transposed view. (Reversed
    views: test_negative_steps_gpu.py.)"""
    base = rand(rng, tuple(2 * n + 1 for n in shape), dtype)
    d = cl.asarray(base)
    step = tuple(slice(1, None, 2) for _ in shape)
    out = [(base[step], d[step])]
    coarse = tuple(slice(0, 2 * n, 2) for n in shape)
    out.append((base[coarse], d[coarse]))
    plain = rand(rng, shape, dtype)
    out.append((plain, cl.asarray(plain)))
    if len(shape) == 2:
        t = rand(rng, shape[::-1], dtype)
        out.append((t.T, cl.asarray(t).T))
    return out


# ------------------------------------------------------------- clamp -------


def clip_ref(a, lo, hi, dtype):
    """np.clip's values in `dtype` (computed in float64 for floats: max/min
    commute with the monotone rounding, so this is exact)."""
    dtype = np.dtype(dtype)
    conv = (lambda x: f64(np.asarray(x).astype(dtype))) if is_float(dtype) else (
        lambda x: np.asarray(x).astype(np.int64))
    r = conv(a)
    if lo is not None:
        r = np.maximum(r, conv(lo))
    if hi is not None:
        r = np.minimum(r, conv(hi))
    return r


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", SIZES)
def test_clamp_contiguous_every_dtype(rng, dtype, n):
    a = rand(rng, (n,), dtype)
    lo_arr, hi_arr = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    d = cl.asarray(a)
    if dtype == B:
        lo, hi = False, True
    elif dtype.kind == "u":
        lo, hi = 50, 200
    else:
        lo, hi = -3, 3
    exact(cl.clamp(d, lo, hi), clip_ref(a, lo, hi, dtype), dtype)      # two scalars
    exact(cl.clamp(d, lo), clip_ref(a, lo, None, dtype), dtype)        # maximum
    exact(cl.clamp(d, hi=hi), clip_ref(a, None, hi, dtype), dtype)     # minimum
    dl, dh = cl.asarray(lo_arr), cl.asarray(hi_arr)
    exact(cl.clamp(d, dl, dh), clip_ref(a, lo_arr, hi_arr, dtype), dtype)  # three arrays
    exact(cl.clamp(d, dl, hi), clip_ref(a, lo_arr, hi, dtype), dtype)
    exact(cl.clamp(d, lo, dh), clip_ref(a, lo, hi_arr, dtype), dtype)


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64, I8, U8, I32, I64], ids=str)
def test_clamp_views_and_broadcasting(rng, dtype):
    for ha, da in views(rng, (37, 41), dtype):
        lo = rand(rng, (37, 1), dtype)
        hi = rand(rng, (41,), dtype)
        exact(cl.clamp(da, cl.asarray(lo), cl.asarray(hi)), clip_ref(ha, lo, hi, dtype), dtype)
        lo_t = rand(rng, (1, 37), dtype)  # a transposed bound broadcast along axis 1
        exact(cl.clamp(da, cl.asarray(lo_t).T), clip_ref(ha, lo_t.T, None, dtype), dtype)
        lo_s = 0.25 if is_float(dtype) else 5
        exact(cl.clamp(da, lo_s, cl.asarray(hi)), clip_ref(ha, lo_s, hi, dtype), dtype)


def test_clamp_nan_and_crossed_bounds(rng):
    a = rand(rng, (1003,), F32)
    a[::7] = np.nan
    lo = rand(rng, (1003,), F32)
    lo[::11] = np.nan
    d, dl = cl.asarray(a), cl.asarray(lo)
    exact(cl.clamp(d, dl, 0.5), np.clip(a, lo, np.float32(0.5)), F32)
    exact(cl.clamp(d, hi=np.nan), np.clip(a, None, np.float32(np.nan)), F32)
    # lo > hi: the result is hi everywhere (NumPy and torch agree).
    exact(cl.clamp(d, 1.0, -1.0), np.clip(a, np.float32(1), np.float32(-1)), F32)
    h = a.astype(F16)
    exact(cl.clamp(cl.asarray(h), -0.3, 0.3), np.clip(h, np.float16(-0.3), np.float16(0.3)), F16)


def test_clamp_dtypes_and_ignored_bounds(rng):
    i8 = rand(rng, (517,), I8)
    d = cl.asarray(i8)
    exact(cl.clamp(d, -1000, 1000), i8, I8)  # both ignored: a itself
    exact(cl.clamp(d, -1000, 5), np.minimum(i8, 5), I8)
    got = cl.clamp(d, 1.5)  # a weak float makes float64, as np.clip
    exact(got, np.clip(i8, 1.5, None), F64)
    u8 = rand(rng, (517,), U8)
    exact(cl.clamp(cl.asarray(u8), -1, 1000), u8, U8)
    lo32 = rand(rng, (517,), I32)
    exact(cl.clamp(d, cl.asarray(lo32), 100), np.clip(i8, lo32, 100), I32)  # mixed: cast first
    h = rand(rng, (517,), F16)
    exact(cl.clamp(cl.asarray(h), np.float32(-0.5), 0.5), np.clip(h, np.float32(-0.5), 0.5), F32)
    bf = rand(rng, (517,), BF16)
    exact(cl.clamp(cl.asarray(bf), -0.5, 0.5), clip_ref(bf, -0.5, 0.5, BF16), BF16)


def test_clamp_out_in_place_and_overlap(rng):
    x = rand(rng, (4099,), F32)
    d = cl.asarray(x)
    r = cl.clamp(d, -0.5, 0.5, out=d)
    assert r is d
    exact(d, np.clip(x, -0.5, 0.5), F32)
    # out overlaps a shifted a: read as if a were copied first
    y = rand(rng, (4099,), F32)
    d = cl.asarray(y)
    cl.clamp(d[1:], -0.5, 0.5, out=d[:-1])
    ref = y.copy()
    ref[:-1] = np.clip(y[1:], -0.5, 0.5)
    exact(d, ref, F32)
    # out= of another dtype ('same_kind'), written through a stepped view
    z = rand(rng, (333,), F32)
    out = cl.asarray(rand(rng, (666,), F64))
    before = out.get()
    cl.clamp(cl.asarray(z), -1.0, 1.0, out=out[1::2])
    ref = before.copy()
    ref[1::2] = np.clip(z, -1, 1)
    exact(out, ref, F64)
    w = cl.asarray(z.copy())
    cl.clamp(w[:-1], -1.0, 1.0, out=w[1:])  # reads what it writes, one element behind
    ref = z.copy()
    ref[1:] = np.clip(z[:-1], -1, 1)
    exact(w, ref, F32)


def test_clamp_errors_on_device(rng):
    a = cl.asarray(rand(rng, (4, 5), F32))
    with pytest.raises(ValueError, match=arg_error("clamp", "hi") + "operands could not be"):
        cl.clamp(a, 0.0, cl.asarray(rand(rng, (3,), F32)))
    with pytest.raises(TypeError, match=arg_error("clamp", "out") + "has dtype int32"):
        cl.clamp(a, 0.0, 1.0, out=cl.empty((4, 5), np.int32))
    with pytest.raises(ValueError, match=arg_error("clamp", "out") + r"has shape \(5,\)"):
        cl.clamp(a, 0.0, 1.0, out=cl.empty((5,), np.float32))


# --------------------------------------------------------------- pow -------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_pow_floats(rng, dtype, n):
    a = rand(rng, (n,), dtype, low=0.1)
    b = (rng.uniform(-3, 3, size=n)).astype(dtype)
    da, db = cl.asarray(a), cl.asarray(b)
    check(cl.pow(da, db), f64(a) ** f64(b), dtype)
    check(cl.pow(da, 2.5), f64(a) ** f64(np.asarray(2.5).astype(dtype)), dtype)
    check(cl.pow(1.5, db), f64(np.asarray(1.5).astype(dtype)) ** f64(b), dtype)
    check(cl.pow(da, 2), f64(a) ** 2, dtype)


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_pow_special_values_as_numpy(dtype):
    inf, nan = np.inf, np.nan
    a = np.array([2, -2, -2, 0, 0, 1, nan, -inf, inf, 0.5, -1, -8], dtype)
    b = np.array([0, 0.5, 3, -1, 0, nan, 0, 3, -2, inf, inf, 1 / 3], dtype)
    with np.errstate(all="ignore"):
        exact(cl.pow(cl.asarray(a), cl.asarray(b)), np.power(a, b), dtype)


@pytest.mark.parametrize("dtype", [I8, U8, I32, I64], ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_pow_integers_wrap_like_numpy(rng, dtype, n):
    a = rand(rng, (n,), dtype)
    e = rng.integers(0, 40, size=n).astype(dtype)
    da, de = cl.asarray(a), cl.asarray(e)
    with np.errstate(all="ignore"):
        exact(cl.pow(da, de), np.power(a, e), dtype)
        exact(cl.pow(da, 3), np.power(a, dtype.type(3)), dtype)
        exact(cl.pow(da, 0), np.ones(n, dtype), dtype)
        exact(cl.pow(3, de), np.power(dtype.type(3), e), dtype)


def test_pow_integer_array_with_negative_exponents():
    """Not checked on the device (it would need a sync): the integer part of
    1 / a ** -b, as documented."""
    a = np.array([1, -1, -1, 2, 0, 5, -3, 7], np.int32)
    b = np.array([-1, -1, -2, -1, -3, -2, -1, 2], np.int32)
    exact(cl.pow(cl.asarray(a), cl.asarray(b)), [1, -1, 1, 0, 0, 0, 0, 49], I32)
    with pytest.raises(ValueError, match="negative integer powers"):
        cl.pow(cl.asarray(a), -1)


def test_pow_bool_and_mixed(rng):
    p, q = rand(rng, (515,), B), rand(rng, (515,), B)
    exact(cl.pow(cl.asarray(p), cl.asarray(q)), np.power(p, q), I8)
    i = rand(rng, (515,), I8, low=0.1) % 4
    f = rand(rng, (515,), F32, low=0.1)
    check(cl.pow(cl.asarray(f), cl.asarray(i)), f64(f) ** f64(i), F32)
    check(cl.pow(cl.asarray(i), 0.5), f64(i) ** 0.5, F64)


@pytest.mark.parametrize("dtype", [F32, F64, F16, I32], ids=str)
def test_pow_views_broadcasting_and_out(rng, dtype):
    for ha, da in views(rng, (23, 19), dtype):
        ha = np.abs(ha) + (0.1 if is_float(dtype) else 0)
        da = cl.abs(da)
        if is_float(dtype):
            da = cl.add(da, 0.1)
        e = (rng.integers(0, 4, size=(38,))).astype(dtype)
        de = cl.asarray(e)[1::2]
        he = e[1::2]
        with np.errstate(all="ignore"):
            ref = f64(ha) ** f64(he) if is_float(dtype) else np.power(ha.astype(dtype), he)
        check(cl.pow(da, de), ref, dtype)
    x = rand(rng, (1001,), F32, low=0.1)
    d = cl.asarray(x)
    r = cl.pow(d, 2.0, out=d)
    assert r is d
    check(d, f64(x) ** 2, F32)
    y = rand(rng, (1001,), F32, low=0.1)
    d = cl.asarray(y)
    cl.pow(d[:-1], d[1:], out=d[1:])  # overlap: inputs read as if copied first
    ref = y.copy()
    ref[1:] = f64(y[:-1]) ** f64(y[1:])
    check(d, ref, F32)


# ------------------------------------------------------------- where -------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n", SIZES)
def test_where_contiguous_every_dtype(rng, dtype, n):
    c = rand(rng, (n,), B)
    a, b = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    dc, da, db = cl.asarray(c), cl.asarray(a), cl.asarray(b)
    exact(cl.where(dc, da, db), np.where(c, a, b), dtype)
    s = True if dtype == B else 3
    exact(cl.where(dc, da, s), np.where(c, a, np.asarray(s).astype(dtype)), dtype)
    exact(cl.where(dc, s, db), np.where(c, np.asarray(s).astype(dtype), b), dtype)


@pytest.mark.parametrize("cond_dtype", DTYPES, ids=DTYPE_IDS)
def test_where_condition_of_any_dtype(rng, cond_dtype):
    """Truthiness: non-zero is true, NaN included (np.where)."""
    c = rand(rng, (1001,), cond_dtype, nonzero=False)
    c[::5] = 0
    if is_float(cond_dtype):
        c[1::9] = np.nan
    a, b = rand(rng, (1001,), F32), rand(rng, (1001,), F32)
    exact(cl.where(cl.asarray(c), cl.asarray(a), cl.asarray(b)), np.where(c, a, b), F32)


def test_where_two_scalars_and_mixed_dtypes(rng):
    c = rand(rng, (777,), B)
    dc = cl.asarray(c)
    exact(cl.where(dc, 1, 2), np.where(c, 1, 2), I64)
    exact(cl.where(dc, 1, 2.5), np.where(c, 1, 2.5), F64)
    exact(cl.where(dc, True, False), np.where(c, True, False), B)
    i8, f32 = rand(rng, (777,), I8), rand(rng, (777,), F32)
    exact(cl.where(dc, cl.asarray(i8), cl.asarray(f32)), np.where(c, i8, f32), F32)
    bf = rand(rng, (777,), BF16)
    exact(cl.where(dc, cl.asarray(bf), 0.5), np.where(c, bf, BF16.type(0.5)), BF16)


@pytest.mark.parametrize("dtype", [F32, F64, F16, I8, I64, B], ids=str)
def test_where_views_and_broadcasting(rng, dtype):
    for hc, dc in views(rng, (29, 33), B):
        for ha, da in views(rng, (29, 33), dtype)[:2]:
            hb = rand(rng, (33,), dtype)
            db = cl.asarray(hb)
            exact(cl.where(dc, da, db), np.where(hc, ha, hb), dtype)
    c = rand(rng, (29, 1), B)
    a = rand(rng, (1, 33), dtype)
    a2 = rand(rng, (1, 66), dtype)
    exact(cl.where(cl.asarray(c), cl.asarray(a), cl.asarray(a2)[:, 1::2]),
          np.where(c, a, a2[:, 1::2]), dtype)


def test_where_out_in_place_and_overlap(rng):
    c, x, y = rand(rng, (2049,), B), rand(rng, (2049,), F32), rand(rng, (2049,), F32)
    dc, dx, dy = cl.asarray(c), cl.asarray(x), cl.asarray(y)
    r = cl.where(dc, dx, dy, out=dx)
    assert r is dx
    exact(dx, np.where(c, x, y), F32)
    # the condition overwritten in place (bool result)
    p, q = rand(rng, (2049,), B), rand(rng, (2049,), B)
    dp = cl.asarray(p)
    cl.where(dp, cl.asarray(q), False, out=dp)
    exact(dp, np.where(p, q, False), B)
    # out overlapping a shifted input: read as if it were copied first
    z = rand(rng, (2050,), F32)
    dz = cl.asarray(z)
    cl.where(dc, dz[1:], 0.0, out=dz[:-1])
    ref = z.copy()
    ref[:-1] = np.where(c, z[1:], np.float32(0))
    exact(dz, ref, F32)


def test_where_errors_on_device(rng):
    c = cl.asarray(rand(rng, (4, 5), B))
    with pytest.raises(ValueError, match=arg_error("where", "b") + "operands could not be"):
        cl.where(c, 1.0, cl.asarray(rand(rng, (3,), F32)))
    with pytest.raises(TypeError, match=arg_error("where", "a") + "host arrays"):
        cl.where(c, np.ones((4, 5)), 1.0)
    with pytest.raises(TypeError, match=arg_error("where", "out") + "has dtype int8 but the"):
        cl.where(c, 1, 2.0, out=cl.empty((4, 5), np.int8))
