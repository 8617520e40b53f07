"""GPU tier: element-wise ops and the number protocol against NumPy.

Floating results are compared with a float64 NumPy reference computed from
the same (rounded) inputs: ||out - ref|| / ||ref|| below 1e-5 for float32,
1e-12 for float64, 1e-2 for float16/bfloat16; integer and bool results must be
exact (NumPy's own wrapping arithmetic on the same dtypes). Inputs are random
and never zero, with odd sizes (vector tails), non-contiguous views (steps,
transposes, misaligned slices) and broadcast operands.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cudalab as cl
from _support import BF16, is_float
from _support import check_result as check
from _support import random_array as rand
from _references import FORMS, NUMPY_REFERENCES

pytestmark = pytest.mark.gpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, U8, I32, I64, B = (np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64, np.bool_))
FLOATS = [F32, F64, F16, BF16]
INTS = [I8, U8, I32, I64]
ALL = [B, *INTS, *FLOATS]


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


# NumPy references (tests/_references.py, one table for every test). Floats are
# computed in float64 from the rounded inputs; integers by NumPy itself on the
# same dtypes (so wrapping matches). The ops these tests sweep:
NP_BINARY = {name: NUMPY_REFERENCES[name]
             for name in ("add", "sub", "mul", "div", "maximum", "minimum")}
NP_UNARY = {name: NUMPY_REFERENCES[name]
            for name in ("neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu",
                         "gelu_tanh")}
FLOAT_ONLY = {"exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "gelu_tanh"}


def numpy_binary(name, a, b):
    """Reference of a binary op on host values (arrays or scalars)."""
    ref_dtype = cl._core._elementwise_result_type(
        name, *(x.dtype if isinstance(x, np.ndarray) else x for x in (a, b))
    )
    if is_float(ref_dtype):
        a64 = f64(a) if isinstance(a, np.ndarray) else a
        b64 = f64(b) if isinstance(b, np.ndarray) else b
        # Weak scalars are first rounded to the result dtype, as NumPy does.
        if not isinstance(a, np.ndarray):
            a64 = float(np.asarray(a).astype(ref_dtype))
        if not isinstance(b, np.ndarray):
            b64 = float(np.asarray(b).astype(ref_dtype))
        return NP_BINARY[name](a64, b64), ref_dtype
    with np.errstate(all="ignore"):
        return NP_BINARY[name](a, b), ref_dtype


def call_unary(name, d, **kw):
    if name == "gelu_tanh":
        return cl.gelu(d, approximate="tanh", **kw)
    return getattr(cl, name)(d, **kw)


# ---------------------------------------------------------- binary ops ------

SHAPES = [(1,), (7,), (1000003,), (37, 129), (3, 5, 7, 2)]
SHAPE_IDS = ["1", "7", "1000003", "37x129", "3x5x7x2"]


@pytest.mark.parametrize("name", sorted(NP_BINARY))
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, I8, U8, I32, I64], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_binary_contiguous(rng, name, dtype, shape):
    if dtype.kind in "iu" and name == "div" and shape == (1000003,):
        shape = (1001,)  # float64 results from ints: the size is covered elsewhere
    # Float denominators away from 0 (float16 would overflow to inf).
    a, b = rand(rng, shape, dtype), rand(rng, shape, dtype, low=0.1 if name == "div" else None)
    ref, rdt = numpy_binary(name, a, b)
    got = getattr(cl, name)(cl.asarray(a), cl.asarray(b))
    check(got, ref, rdt)


@pytest.mark.parametrize("name", ["add", "mul", "maximum", "minimum"])
def test_binary_bool(rng, name):
    a, b = rand(rng, (1001,), B), rand(rng, (1001,), B)
    got = getattr(cl, name)(cl.asarray(a), cl.asarray(b))
    check(got, NP_BINARY[name](a, b))


def test_div_bool_and_int_give_float64(rng):
    a, b = rand(rng, (513,), B), np.ones(513, np.bool_)
    check(cl.div(cl.asarray(a), cl.asarray(b)), f64(a) / f64(b), F64)
    x, y = rand(rng, (513,), I32), rand(rng, (513,), I8)
    check(cl.div(cl.asarray(x), cl.asarray(y)), f64(x) / f64(y), F64)
    # int8 with uint8 is int16 in NumPy, then float64 for true division.
    u = rand(rng, (513,), U8)
    check(cl.div(cl.asarray(y), cl.asarray(u)), f64(y) / f64(u), F64)


@pytest.mark.parametrize("name", sorted(NP_BINARY))
@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32, U8], ids=str)
@pytest.mark.parametrize("scalar", [3, 2.5, True], ids=["int", "float", "bool"])
def test_binary_with_scalars(rng, name, dtype, scalar):
    a = rand(rng, (1031,), dtype, low=0.1)
    d = cl.asarray(a)
    f = getattr(cl, name)
    ref, rdt = numpy_binary(name, a, scalar)
    check(f(d, scalar), ref, rdt)
    ref, rdt = numpy_binary(name, scalar, a)
    check(f(scalar, d), ref, rdt)


def test_numpy_scalars_are_strong(rng):
    a = rand(rng, (257,), F32)
    got = cl.add(cl.asarray(a), np.float64(0.1))
    check(got, f64(a) + 0.1, F64)
    got = cl.mul(cl.asarray(a), np.float16(3))
    check(got, f64(a) * 3.0, F32)
    i = rand(rng, (257,), I8)
    check(cl.add(cl.asarray(i), np.int64(5)), i.astype(np.int64) + 5, I64)


MIXED = [
    (F16, F32, F32), (BF16, F16, F32), (BF16, F32, F32), (I8, F32, F32), (I32, F32, F64),
    (I32, F16, F64), (U8, BF16, BF16), (I8, I32, I32), (U8, I64, I64), (B, F16, F16),
    (B, I8, I8), (I64, F64, F64), (F64, F16, F64),
]


@pytest.mark.parametrize("x,y,r", MIXED, ids=lambda d: str(d))
@pytest.mark.parametrize("name", ["add", "sub", "mul", "maximum"])
def test_mixed_dtypes(rng, x, y, r, name):
    if name == "sub" and x == y == B:
        pytest.skip("bool - bool is refused")
    a, b = rand(rng, (37, 65), x), rand(rng, (65,), y)
    got = getattr(cl, name)(cl.asarray(a), cl.asarray(b))
    assert got.dtype == r
    if is_float(r):
        check(got, NP_BINARY[name](f64(a), f64(b)), r)
    else:
        check(got, NP_BINARY[name](a.astype(r), b.astype(r)), r)


def test_maximum_minimum_propagate_nan(rng):
    a = rand(rng, (1000,), F32)
    b = rand(rng, (1000,), F32)
    a[::7] = np.nan
    b[::5] = np.nan
    for name in ("maximum", "minimum"):
        got = getattr(cl, name)(cl.asarray(a), cl.asarray(b)).get()
        np.testing.assert_array_equal(got, NP_BINARY[name](a, b))  # NaNs compare equal here
    got = cl.maximum(cl.asarray(a.astype(F16)), 0.0).get()
    np.testing.assert_array_equal(got, np.maximum(a.astype(F16), np.float16(0)))


# ------------------------------------------------------------ layouts -------


@pytest.mark.parametrize("dtype", [F32, F16, F64, I8], ids=str)
def test_non_contiguous_views(rng, dtype):
    base_a = rand(rng, (40, 130), dtype)
    base_b = rand(rng, (130, 40), dtype)
    da, db = cl.asarray(base_a), cl.asarray(base_b)
    # stepped slices, a transpose, and both
    check(cl.add(da[::2, 1::3], db.T[::2, 1::3]),
          *numpy_binary("add", base_a[::2, 1::3], base_b.T[::2, 1::3]))
    check(cl.mul(da.T, db), *numpy_binary("mul", base_a.T, base_b))
    check(cl.sub(da[3:, 5:], db.T[3:, 5:]), *numpy_binary("sub", base_a[3:, 5:], base_b.T[3:, 5:]))


@pytest.mark.parametrize("dtype", [F32, F16, I8, F64], ids=str)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_contiguous_slices(rng, dtype, offset):
    """Contiguous but not 16-byte aligned: the scalar fallback, every tail."""
    for n in (1, 5, 33, 4099):
        a, b = rand(rng, (n + 4,), dtype), rand(rng, (n + 4,), dtype)
        da, db = cl.asarray(a), cl.asarray(b)
        check(cl.add(da[offset:offset + n], db[:n]), *numpy_binary("add", a[offset:offset + n], b[:n]))
        check(cl.mul(da[offset:offset + n], 3), *numpy_binary("mul", a[offset:offset + n], 3))


@pytest.mark.parametrize("n", [1, 3, 4, 5, 15, 16, 17, 1023, 1024, 1025, 4096 * 33 + 5, 2_500_007])
def test_every_size_fast_path(rng, n):
    """The vectorized path with tails of every length (float32: 4 per vector)."""
    a, b = rand(rng, (n,), F32), rand(rng, (n,), F32)
    check(cl.add(cl.asarray(a), cl.asarray(b)), f64(a) + f64(b), F32)
    check(cl.mul(cl.asarray(a), 2.0), f64(a) * 2.0, F32)
    h = a.astype(F16)
    check(cl.sub(2.0, cl.asarray(h)), 2.0 - f64(h), F16)


@pytest.mark.parametrize(
    "sa,sb",
    [((37, 1), (129,)), ((1, 129), (37, 1)), ((5, 1, 7), (3, 1)), ((), (11, 3)), ((1,), (1000,)),
     ((4, 1, 3, 1, 2), (5, 3, 7, 2))],
    ids=str,
)
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=str)
def test_broadcasting(rng, sa, sb, dtype):
    a, b = rand(rng, sa, dtype), rand(rng, sb, dtype)
    for name in ("add", "sub", "maximum"):
        ref, rdt = numpy_binary(name, a, b)
        check(getattr(cl, name)(cl.asarray(a), cl.asarray(b)), ref, rdt)
        ref, rdt = numpy_binary(name, b, a)
        check(getattr(cl, name)(cl.asarray(b), cl.asarray(a)), ref, rdt)


def test_rank_8_and_transposed_rank_8(rng):
    shape = (2, 3, 2, 1, 3, 2, 2, 3)
    a, b = rand(rng, shape, F32), rand(rng, shape[::-1], F32)
    da, db = cl.asarray(a), cl.asarray(b)
    check(cl.add(da, db.T), f64(a) + f64(b.T), F32)
    check(cl.mul(da.T, db), f64(a.T) * f64(b), F32)


def test_empty_arrays():
    for shape in [(0,), (3, 0), (0, 5)]:
        a = cl.asarray(np.ones(shape, np.float32))
        got = cl.add(a, a)
        assert got.shape == shape and got.dtype == F32
        assert cl.exp(a).shape == shape


def test_result_of_transposed_inputs_keeps_their_order(rng):
    a, b = rand(rng, (64, 48), F32), rand(rng, (64, 48), F32)
    got = cl.add(cl.asarray(a).T, cl.asarray(b).T)
    assert got.shape == (48, 64)
    check(got, f64(a.T) + f64(b.T), F32)


def test_broadcast_shape_error(rng):
    a, b = cl.asarray(rand(rng, (3, 4), F32)), cl.asarray(rand(rng, (5,), F32))
    with pytest.raises(ValueError, match=r"add\(\) argument 'b': operands could not be broadcast.*\(3, 4\).*\(5,\)"):
        cl.add(a, b)
    with pytest.raises(ValueError, match="broadcast"):
        a + b


# ------------------------------------------------------------ unary ops -----


@pytest.mark.parametrize("name", sorted(NP_UNARY))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7,), (100003,), (37, 129)], ids=["1", "7", "100003", "37x129"])
def test_unary_floats(rng, name, dtype, shape):
    if name.startswith("gelu") and shape == (100003,):
        shape = (20011,)  # the erf reference is a Python loop
    a = rand(rng, shape, dtype, low=0.1 if name in ("log", "sqrt") else None)
    got = call_unary(name, cl.asarray(a))
    check(got, NP_UNARY[name](f64(a)), dtype)


@pytest.mark.parametrize("name", ["neg", "abs", "relu"])
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_unary_ints_exact(rng, name, dtype):
    a = rand(rng, (1037,), dtype)
    if dtype.kind == "i":
        a[0] = np.iinfo(dtype).min  # abs/neg wrap like NumPy
    with np.errstate(all="ignore"):
        ref = NP_UNARY[name](a)
    check(call_unary(name, cl.asarray(a)), ref, dtype)


@pytest.mark.parametrize("name", ["exp", "sqrt", "tanh", "sigmoid", "gelu"])
@pytest.mark.parametrize("dtype,rdt", [(B, F16), (I8, F16), (U8, F16), (I32, F64), (I64, F64)], ids=str)
def test_unary_float_ops_on_ints(rng, name, dtype, rdt):
    a = rand(rng, (501,), dtype, low=0.1)
    if dtype in (I32, I64):
        a = (a % 7 + 1).astype(dtype)
    if dtype in (I8, U8):
        a = (a % 5 + 1).astype(dtype)
    got = call_unary(name, cl.asarray(a))
    # NumPy casts the input to the result dtype first (int8 -> float16).
    check(got, NP_UNARY[name](f64(a.astype(rdt))), rdt)


def test_abs_bool_and_unary_views(rng):
    a = rand(rng, (301,), B)
    check(cl.abs(cl.asarray(a)), a)
    x = rand(rng, (50, 60), F32)
    d = cl.asarray(x)
    check(cl.exp(d.T[::3, 1::2]), np.exp(f64(x.T[::3, 1::2])), F32)
    check(cl.neg(d[1:, 3:]), -f64(x[1:, 3:]), F32)


def test_gelu_forms_differ_and_match_torch_definitions(rng):
    x = np.linspace(-6, 6, 4001).astype(np.float32)
    erf_form = cl.gelu(cl.asarray(x)).get()
    tanh_form = cl.gelu(cl.asarray(x), approximate="tanh").get()
    np.testing.assert_allclose(erf_form, NP_UNARY["gelu"](f64(x)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tanh_form, NP_UNARY["gelu_tanh"](f64(x)), rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(erf_form - tanh_form)) > 1e-5
    np.testing.assert_array_equal(cl.gelu(cl.asarray(x), approximate="none").get(), erf_form)


def test_sigmoid_extremes():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], np.float32)
    got = cl.sigmoid(cl.asarray(x)).get()
    np.testing.assert_allclose(got, [0.0, 1.9287498e-22, 0.5, 1.0, 1.0], rtol=1e-5)


# ------------------------------------------------------------ axpy ----------


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, I32, I8], ids=str)
def test_axpy(rng, dtype):
    x, y = rand(rng, (100003,), dtype), rand(rng, (100003,), dtype)
    dx, dy = cl.asarray(x), cl.asarray(y)
    if is_float(dtype):
        check(cl.axpy(1.5, dx, dy), 1.5 * f64(x) + f64(y), dtype)
    else:
        with np.errstate(all="ignore"):
            check(cl.axpy(3, dx, dy), (np.asarray(3, dtype) * x + y), dtype)


def test_axpy_in_place_broadcast_and_scalars(rng):
    x, y = rand(rng, (37, 129), F32), rand(rng, (37, 129), F32)
    dx, dy = cl.asarray(x), cl.asarray(y)
    out = cl.axpy(-0.5, dx, dy, out=dy)
    assert out is dy
    check(dy, -0.5 * f64(x) + f64(y), F32)
    b = rand(rng, (129,), F32)
    check(cl.axpy(2.0, dx, cl.asarray(b)), 2.0 * f64(x) + f64(b), F32)
    check(cl.axpy(2.0, dx, 1.0), 2.0 * f64(x) + 1.0, F32)
    check(cl.axpy(2.0, 3.0, dx), 6.0 + f64(x), F32)
    # Fused: one rounding. 1 + 2^-23 squared needs the fma to keep 2^-46.
    e = np.float32(2.0**-23)
    one = cl.asarray(np.array([1 + e], np.float32))
    got = cl.axpy(float(1 + e), one, cl.asarray(np.array([-1 - 2 * e], np.float32))).get()
    assert got[0] == np.float32(2.0**-46)


# ---------------------------------------------- every op of the table -------


def table_operands(func) -> list[str]:
    """The operand parameters of an op-table function: its text signature's
    parameters, less approximate= and out=."""
    return [p for p in inspect.signature(func).parameters if p not in ("approximate", "out")]


@pytest.mark.parametrize("name", [*cl._core._ELEMENTWISE_OPS, *FORMS])
def test_every_table_op_matches_its_reference(rng, name):
    """Each function of the op table (and each approximate= form), on float32 arrays,
    against its NumPy reference in tests/_references.py: a table op without one fails."""
    func_name, kw = FORMS.get(name, (name, {}))
    func = getattr(cl, func_name)
    reference = NUMPY_REFERENCES[name]
    hosts = {p: rand(rng, (37, 129), F32, low=-2.0, high=2.0) for p in table_operands(func)}
    if "alpha" in hosts:
        hosts["alpha"] = 1.5  # axpy's alpha is a scalar
    if "cond" in hosts:
        hosts["cond"] = hosts["cond"] > 0  # where: both branches taken
    got = func(*(cl.asarray(h) if isinstance(h, np.ndarray) else h for h in hosts.values()), **kw)
    with np.errstate(all="ignore"):  # log, sqrt, pow of negatives: NaN on both sides
        ref = reference(*(f64(h) if isinstance(h, np.ndarray) and h.dtype != np.bool_ else h
                          for h in hosts.values()))
    check(got, ref, F32)


# ----------------------------------------------------- out= and in place ----


def test_out_in_place_aliasing(rng):
    a, b = rand(rng, (1001,), F32), rand(rng, (1001,), F32)
    da, db = cl.asarray(a), cl.asarray(b)
    r = cl.add(da, db, out=da)
    assert r is da
    check(da, f64(a) + f64(b), F32)
    r = cl.mul(da, 2.0, out=da)  # scale in place
    assert r is da
    check(da, (f64(a) + f64(b)) * 2.0, F32)
    cl.sub(db, da, out=db)
    check(db, f64(b) - (f64(a) + f64(b)) * 2.0, F32)
    cl.exp(db, out=db)
    check(db, np.exp(f64(b) - (f64(a) + f64(b)) * 2.0), F32)


def test_out_overlapping_shifted_views(rng):
    """Partial overlap is resolved like NumPy (as if inputs were copied first)."""
    x = rand(rng, (5003,), F32)
    d = cl.asarray(x)
    cl.add(d[1:], d[:-1], out=d[:-1])
    ref = x.copy()
    np.add(ref[1:], ref[:-1], out=ref[:-1])
    np.testing.assert_array_equal(d.get(), ref)
    y = rand(rng, (64, 64), F32)
    d = cl.asarray(y)
    cl.add(d, d.T, out=d)  # reads the transpose of what it writes
    check(d, f64(y) + f64(y.T), F32)


@pytest.mark.parametrize(
    "rdt,odt", [(F32, F64), (F32, F16), (F32, BF16), (F64, F32), (I32, I8), (I32, F32), (B, F32), (I8, I64)],
    ids=str,
)
def test_out_with_dtype_cast(rng, rdt, odt):
    a, b = rand(rng, (333,), rdt), rand(rng, (333,), rdt)
    out = cl.empty((333,), dtype=odt)
    r = cl.add(cl.asarray(a), cl.asarray(b), out=out)
    assert r is out
    ref = np.add(a, b)  # the result dtype rdt, then cast like astype
    with np.errstate(all="ignore"):
        check(out, ref.astype(odt), odt)


def test_out_into_non_contiguous_view(rng):
    a = rand(rng, (20, 30), F32)
    base = np.full((40, 30), 7.0, np.float32)
    dbase = cl.asarray(base)
    cl.mul(cl.asarray(a), 3.0, out=dbase[::2])
    expected = base.copy()
    expected[::2] = a * 3.0
    check(dbase, expected.astype(np.float64), F32)
    np.testing.assert_array_equal(dbase.get()[1::2], base[1::2])


def test_out_errors(rng):
    a = cl.asarray(rand(rng, (4, 5), F32))
    with pytest.raises(ValueError, match=r"add\(\) argument 'out': has shape \(5,\) but the result has shape \(4, 5\)"):
        cl.add(a, 1.0, out=cl.empty((5,), np.float32))
    with pytest.raises(ValueError, match="argument 'out'"):
        cl.add(a, 1.0, out=cl.empty((1, 5), np.float32))  # out never broadcasts
    with pytest.raises(TypeError, match=r"add\(\) argument 'out': has dtype int32 but the result has dtype float32, which does not cast to it under NumPy's 'same_kind' rule"):
        cl.add(a, a, out=cl.empty((4, 5), np.int32))
    with pytest.raises(TypeError, match="same_kind"):
        cl.exp(a, out=cl.empty((4, 5), np.int64))
    with pytest.raises(TypeError, match=r"argument 'out': expected a cudalab.DeviceArray or None.*asarray"):
        cl.add(a, a, out=np.empty((4, 5), np.float32))
    with pytest.raises(TypeError, match="host arrays"):
        cl.add(a, np.ones((4, 5), np.float32))


# -------------------------------------------------------- number protocol ---


def test_operators_with_arrays_and_scalars(rng):
    x, y = rand(rng, (33, 17), F32, low=0.1), rand(rng, (17,), F32, low=0.1)
    a, b = cl.asarray(x), cl.asarray(y)
    X, Y = f64(x), f64(y)
    check(a + b, X + Y, F32)
    check(a - b, X - Y, F32)
    check(a * b, X * Y, F32)
    check(a / b, X / Y, F32)
    check(a + 2, X + 2, F32)
    check(3.0 - a, 3.0 - X, F32)
    check(2 * a, 2 * X, F32)
    check(1 / a, 1 / X, F32)
    check(a / 4, X / 4, F32)
    check(-a, -X, F32)
    check(abs(-a), X, F32)
    check(a * np.float64(0.5), X * 0.5, F64)  # NumPy scalars are strong
    check(a + True, X + 1, F32)


def test_operator_dtypes(rng):
    i = cl.asarray(rand(rng, (9,), I32))
    assert (i + 1).dtype == I32
    assert (i + 1.5).dtype == F64
    assert (i / 2).dtype == F64
    assert (cl.asarray(rand(rng, (9,), F16)) * 2.0).dtype == F16
    assert (cl.asarray(rand(rng, (9,), BF16)) * 2.0).dtype == BF16
    b = cl.asarray(rand(rng, (9,), B))
    assert (b + b).dtype == B
    with pytest.raises(TypeError, match="bool"):
        b - b
    with pytest.raises(TypeError, match="bool"):
        -b


def test_in_place_operators(rng):
    x, y = rand(rng, (1001,), F32), rand(rng, (1001,), F32)
    a, b = cl.asarray(x), cl.asarray(y)
    ident = id(a)
    X = f64(x)
    a += b
    X = X + f64(y)
    a -= 1.5
    X = X - 1.5
    a *= 2
    X = X * 2
    a /= 3.0
    X = X / 3.0
    assert id(a) == ident
    check(a, X, F32)
    a += np.float64(1.0)  # float64 result cast back ('same_kind')
    check(a, X + 1.0, F32)
    # in place on a view writes through to the base
    base = cl.asarray(np.zeros(10, np.float32) + 1)
    view = base[::2]
    view += 5
    np.testing.assert_array_equal(base.get(), np.array([6, 1] * 5, np.float32))


def test_in_place_operator_casting_errors(rng):
    i = cl.asarray(rand(rng, (9,), I32))
    with pytest.raises(TypeError, match=r"add\(\) argument 'out': has dtype int32 but the result has dtype float64, which does not cast"):
        i += 1.5
    with pytest.raises(TypeError, match="same_kind"):
        i /= 2
    i8 = cl.asarray(rand(rng, (9,), I8))
    i8 += cl.asarray(rand(rng, (9,), I32))  # int32 -> int8 is same_kind: allowed, wraps
    with pytest.raises(ValueError, match="argument 'out'"):
        small = cl.asarray(rand(rng, (3, 1), F32))
        small += cl.asarray(rand(rng, (3, 4), F32))


def test_operators_refuse_other_types(rng):
    a = cl.asarray(rand(rng, (3,), F32))
    for bad in ("x", [1.0, 2.0, 3.0], None):
        with pytest.raises(TypeError):
            a + bad
        with pytest.raises(TypeError):
            bad * a
    with pytest.raises(TypeError, match="host arrays"):
        a + np.ones(3, np.float32)
    with pytest.raises(TypeError):
        np.ones(3, np.float32) + a  # NumPy tries __array__, which refuses


# -------------------------------------------------------- hypothesis --------


@st.composite
def strided_pair(draw):
    """Two operands: a view with random steps/offset/transposition, and a
    broadcastable partner (some axes 1, leading axes dropped)."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    steps = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    offs = tuple(draw(st.integers(0, 2)) for _ in range(ndim))
    transpose = draw(st.booleans())
    drop = draw(st.integers(0, ndim - 1))
    ones = tuple(draw(st.booleans()) for _ in range(ndim - drop))
    dtype = draw(st.sampled_from([F32, F16, I32, F64]))
    return shape, steps, offs, transpose, drop, ones, dtype


def _view(rng, shape, steps, offs, transpose, dtype):
    full = tuple(o + (n - 1) * s + 1 for n, s, o in zip(shape, steps, offs))
    if transpose:
        host = rand(rng, full[::-1], dtype)
        sl = tuple(slice(o, None, s) for o, s in zip(offs, steps))
        hv = host.T[sl]
        dv = cl.asarray(host).T[sl]
    else:
        host = rand(rng, full, dtype)
        sl = tuple(slice(o, None, s) for o, s in zip(offs, steps))
        hv, dv = host[sl], cl.asarray(host)[sl]
    hv = hv[tuple(slice(0, n) for n in shape)]
    dv = dv[tuple(slice(0, n) for n in shape)]
    return hv, dv


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=strided_pair())
def test_hypothesis_add_mul_strided_broadcast(rng, case):
    shape, steps, offs, transpose, drop, ones, dtype = case
    ha, da = _view(rng, shape, steps, offs, transpose, dtype)
    bshape = tuple(1 if one else n for n, one in zip(shape[drop:], ones))
    hb, db = _view(rng, bshape, (1,) * len(bshape), (0,) * len(bshape), False, dtype)
    for name in ("add", "mul"):
        ref, rdt = numpy_binary(name, ha, hb)
        check(getattr(cl, name)(da, db), ref, rdt)
        ref, rdt = numpy_binary(name, hb, ha)
        check(getattr(cl, name)(db, da), ref, rdt)
    # and in place into the strided view
    expected, _ = numpy_binary("add", ha, hb)
    cl.add(da, db, out=da)
    check(da, expected, dtype)


def test_numpy_operands_defer_to_device_array(rng):
    """ndarray/NumPy-scalar on the left reach DeviceArray's reflected ops."""
    h = rng.standard_normal((5, 3)).astype(np.float32) + 2
    d = cl.asarray(h)
    np.testing.assert_allclose((np.float32(2) * d).get(), np.float32(2) * h, rtol=1e-6)
    with pytest.raises(TypeError):
        h + d  # a host array is never uploaded implicitly
