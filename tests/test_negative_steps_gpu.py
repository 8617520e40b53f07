"""GPU tier (issue 21): reversed views, empty out= arguments, get(out=) into any layout.

* Negative slice steps give views as in NumPy (data at the view's first
  element, negative byte strides): their shape, strides, data pointer and
  values, views of views, reshape, and every op family reading or writing
  them against NumPy: element-wise ops (inputs, out=, out= aliasing an input
  backwards), reductions, softmax, transpose, astype / copy, copyto, matmul
  (operands and out=), and the DLPack / CUDA Array Interface round trips.
* An empty out= of the right shape is accepted by every op that has out=,
  whatever its strides (an empty array is contiguous, NumPy's rule).
* get(out=) fills a writable host array of any layout: dense in another
  order, with gaps, reversed; pinned and asynchronous where it is dense.

Random data, never zeros; odd sizes; several dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest
from _support import (BF16, BOOL, DTYPE_IDS, DTYPES, F16, F32, F64, FLOAT_DTYPES, FLOAT_IDS, I8,
                      I32, I64, U8, assert_arg_error, assert_bit_equal, assert_close, check_result,
                      cupy_device, dtype_id, is_float, random_array, rel_err, tolerance, widen)

import cudalab

pytestmark = pytest.mark.gpu

# (name, root shape, view): the same basic indexing on a host root and on the
# DeviceArray holding it. Odd extents; 1-D, 2-D and 3-D mixes.
VIEWS = [
    ("1d_reversed", (1001,), lambda a: a[::-1]),
    ("1d_step_-3", (1001,), lambda a: a[::-3]),
    ("1d_bounded", (1001,), lambda a: a[997:3:-7]),
    ("2d_rows_reversed", (37, 129), lambda a: a[::-1]),
    ("2d_cols_step_-2", (37, 129), lambda a: a[:, ::-2]),
    ("2d_mixed", (37, 129), lambda a: a[::-3, 1:70:2]),
    ("2d_both_reversed", (37, 129), lambda a: a[::-1, ::-1]),
    ("2d_transposed_reversed", (37, 129), lambda a: a.T[::-1]),
    ("3d_outer_inner", (7, 13, 33), lambda a: a[::-1, :, ::-2]),
    ("3d_stepped_middle", (7, 13, 33), lambda a: a[:, ::-3, 1:30:4]),
    ("3d_rotated_reversed", (7, 13, 33), lambda a: a.transpose(2, 0, 1)[::-1]),
    ("3d_indexed", (7, 13, 33), lambda a: a[::-2, 5, ::-1]),
]
VIEW_IDS = [v[0] for v in VIEWS]


def views(rng, dtype, *, ndim=None, **random_kw):
    """[(name, device view, host view, device root, host root)] over VIEWS."""
    out = []
    for name, shape, view in VIEWS:
        if ndim is not None and len(shape) != ndim:
            continue
        h = random_array(rng, shape, dtype, **random_kw)
        d = cudalab.asarray(h)
        out.append((name, view(d), view(h), d, h))
    return out


def byte_offset(view: np.ndarray, root: np.ndarray) -> int:
    return view.__array_interface__["data"][0] - root.__array_interface__["data"][0]


# ------------------------------------------------------------ the views ----


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_views_have_numpys_layout_and_values(rng, dtype):
    for name, dv, hv, d, h in views(rng, dtype):
        assert dv.shape == hv.shape, name
        assert dv.strides == hv.strides, name
        assert dv.base is d, name
        assert dv.data_ptr == d.data_ptr + byte_offset(hv, h), name
        assert dv.is_contiguous == hv.flags.c_contiguous, name
        assert dv.is_f_contiguous == hv.flags.f_contiguous, name
        got = dv.get()
        assert got.flags.c_contiguous, name  # compacted on the device, C order
        assert_bit_equal(got, hv)
        assert_bit_equal(cudalab.asnumpy(dv), hv)


def test_views_of_views_and_edge_slices(rng):
    h = random_array(rng, (41,), I32)
    d = cudalab.asarray(h)
    keys = [
        (slice(None, None, -1), slice(None, None, -1)),  # back to the original order
        (slice(None, None, -1), slice(2, 9)),
        (slice(None, None, -2), slice(None, None, -3)),
        (slice(30, 3, -4), slice(1, None, 2)),
        (slice(100, None, -1), slice(None)),    # start past the end is clipped
        (slice(-1, -42, -1), slice(None)),      # every element, backwards
        (slice(2, 5, -1), slice(None)),         # empty
        (slice(3, 2, -1), slice(None)),         # one element
        (slice(None, None, -5), slice(-1, None, -1)),
    ]
    for k1, k2 in keys:
        dv, hv = d[k1][k2], h[k1][k2]
        assert dv.shape == hv.shape, (k1, k2)
        # An empty view's strides mean nothing (NumPy resets some of them).
        assert dv.strides == hv.strides or hv.size == 0, (k1, k2)
        assert dv.base is d
        assert_bit_equal(dv, hv)
        if hv.size:
            assert dv.data_ptr == d.data_ptr + byte_offset(hv, h)
    m = random_array(rng, (6, 7), F32)
    dm = cudalab.asarray(m)
    assert_bit_equal(dm[::-1, 3], m[::-1, 3])
    assert_bit_equal(dm[2, ::-1], m[2, ::-1])
    assert_bit_equal(dm[..., ::-2], m[..., ::-2])
    assert_bit_equal(dm[None, ::-1, None, 1:6:-1], m[None, ::-1, None, 1:6:-1])


def test_reshape_of_reversed_views(rng):
    h = random_array(rng, (6, 35), F64)
    d = cudalab.asarray(h)
    r = d[::-1, ::-1].reshape(-1)  # one backwards run: a view, as in NumPy
    assert r.base is d and r.strides == (-8,)
    assert_bit_equal(r, h[::-1, ::-1].reshape(-1))
    r = d[::-1].reshape(2, 3, 5, 7)  # rows reversed, each split: a view
    assert r.base is d
    assert r.strides == h[::-1].reshape(2, 3, 5, 7).strides
    assert_bit_equal(r, h[::-1].reshape(2, 3, 5, 7))
    c = d[::-1].reshape(-1)  # not one run: a C-contiguous copy
    assert c.base is None and c.is_contiguous
    assert_bit_equal(c, h[::-1].reshape(-1))


# ------------------------------------------------------- element-wise ops ----


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64, I32, I8, U8, I64], ids=dtype_id)
def test_elementwise_inputs(rng, dtype):
    for name, dv, hv, _, _ in views(rng, dtype):
        other = random_array(rng, hv.shape, dtype)
        check_result(cudalab.add(dv, cudalab.asarray(other)), widen(hv) + widen(other), dtype)
        check_result(cudalab.mul(dv, dv), widen(hv) * widen(hv), dtype)
        check_result(dv - 3, widen(hv) - 3, dtype)
        if dtype != U8:
            check_result(-dv, -widen(hv), dtype)
        if is_float(dtype):
            check_result(cudalab.tanh(dv), np.tanh(widen(hv)), dtype)
        # broadcasting a reversed row against a reversed matrix
        if hv.ndim == 2:
            row = dv[0, ::-1]
            check_result(cudalab.sub(dv[:, ::-1], row), widen(hv)[:, ::-1] - widen(hv)[0, ::-1],
                         dtype)


def reversed_buffer(rng, shape, dtype):
    """(device root, host root, key): root[key] has `shape`, every axis
    reversed with step -2, so the root's other elements are gaps."""
    root = random_array(rng, tuple(2 * n + 1 for n in shape), dtype)
    key = tuple(slice(2 * n - 1, None, -2) for n in shape)
    return cudalab.asarray(root), root, key


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=dtype_id)
def test_elementwise_out_reversed(rng, dtype):
    for name, dv, hv, _, _ in views(rng, dtype):
        other = random_array(rng, hv.shape, dtype)
        droot, hroot, key = reversed_buffer(rng, hv.shape, dtype)
        out = droot[key]
        assert out.shape == hv.shape and all(s < 0 for s in out.strides)
        got = cudalab.add(dv, cudalab.asarray(other), out=out)
        assert got is out
        check_result(got, widen(hv) + widen(other), dtype)
        expect = hroot.copy()  # only out's elements changed, the gaps kept
        expect[key] = got.get()
        assert_bit_equal(droot, expect)


@pytest.mark.parametrize("dtype", [F32, F64, I64], ids=dtype_id)
def test_elementwise_out_aliases_input_backwards(rng, dtype):
    """out=a[::-1] while reading a: NumPy's result (the overlap is detected
    and the input copied first), not a half-overwritten mix."""
    for shape in [(1001,), (37, 129), (7, 13, 33)]:
        h = random_array(rng, shape, dtype)
        d = cudalab.asarray(h)
        rev = tuple(slice(None, None, -1) for _ in shape)
        expect = h.copy()
        np.add(expect, 1, out=expect[rev])
        got = cudalab.add(d, 1, out=d[rev])
        assert got.base is d
        assert_bit_equal(d, expect)
        # the exact same elements (in place through the reversed view) need no copy
        h2 = random_array(rng, shape, dtype)
        d2 = cudalab.asarray(h2)
        v = d2[rev]
        v += 5
        assert_bit_equal(d2, h2 + np.asarray(5, dtype))
        # reversed input, plain out over the same memory
        h3 = random_array(rng, shape, dtype)
        d3 = cudalab.asarray(h3)
        expect3 = h3.copy()
        np.subtract(expect3[rev], expect3, out=expect3)
        cudalab.sub(d3[rev], d3, out=d3)
        assert_bit_equal(d3, expect3)


def test_elementwise_out_of_another_dtype_reversed(rng):
    h = random_array(rng, (37, 129), F32)
    d = cudalab.asarray(h)
    out = cudalab.zeros((37, 129), dtype=F64)
    cudalab.mul(d[::-1], 2.0, out=out[:, ::-1])
    ref = np.zeros((37, 129))
    ref[:, ::-1] = (h[::-1] * np.float32(2)).astype(np.float64)
    assert_bit_equal(out, ref)
    cond = cudalab.asarray(random_array(rng, (37, 129), BOOL))
    w = cudalab.where(cond[::-1], d[::-1], d)
    check_result(w, np.where(cond.get()[::-1], h[::-1], h), F32)
    c = cudalab.clamp(d[:, ::-3], -0.5, 0.5)
    check_result(c, np.clip(h[:, ::-3], -0.5, 0.5), F32)


# ------------------------------------------------------------ reductions ----


def reduce_data(rng, shape, dtype, signed):
    dtype = np.dtype(dtype)
    if is_float(dtype) and not signed:
        scale = 1 / 64 if dtype == F16 else 1.0
        return random_array(rng, shape, dtype, low=0.5 * scale, high=1.5 * scale)
    return random_array(rng, shape, dtype)


def reduce_reference(op, x, axis):
    w = widen(x)
    if op == "mean":
        return np.asarray(np.mean(w.astype(np.float64), axis=axis))
    return np.asarray(getattr(np, op)(w, axis=axis))


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64, I32, U8, BOOL], ids=dtype_id)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "argmax"])
def test_reductions(rng, dtype, op):
    signed = op in ("max", "min", "argmax")
    for name, shape, view in VIEWS:
        h = reduce_data(rng, shape, dtype, signed)
        d = cudalab.asarray(h)
        dv, hv = view(d), view(h)
        for axis in [None, *range(hv.ndim)]:
            got = getattr(cudalab, op)(dv, axis=axis)
            ref = reduce_reference(op, hv, axis)
            assert got.shape == ref.shape, (name, axis)
            if op in ("max", "min", "argmax") or not is_float(got.dtype):
                np.testing.assert_array_equal(widen(got), ref, err_msg=f"{name} axis={axis}")
            else:
                assert_close(got, ref, tol=1e-9 if not is_float(dtype) else None)
        # out= a reversed view (written through a temporary)
        axis = hv.ndim - 1
        ref = reduce_reference(op, hv, axis)
        if ref.ndim >= 1:
            rdtype = getattr(cudalab, op)(dv, axis=axis).dtype
            buf = cudalab.zeros(ref.shape, dtype=rdtype)
            rev = tuple(slice(None, None, -1) for _ in ref.shape)
            got = getattr(cudalab, op)(dv, axis=axis, out=buf[rev])
            assert got.base is buf
            if op in ("max", "min", "argmax") or not is_float(rdtype):
                np.testing.assert_array_equal(widen(buf)[rev], ref)
            else:
                assert_close(buf.get()[rev], ref, tol=1e-9 if not is_float(dtype) else None)


def test_argmax_ties_count_in_view_order(rng):
    h = np.array([3, 1, 3, 2, 3], dtype=np.int32)
    d = cudalab.asarray(h)
    assert int(cudalab.argmax(d[::-1]).get()) == int(np.argmax(h[::-1])) == 0
    m = random_array(rng, (9, 11), BOOL)
    dm = cudalab.asarray(m)
    for axis in (None, 0, 1):
        np.testing.assert_array_equal(cudalab.argmax(dm[::-1, ::-2], axis=axis).get(),
                                      np.argmax(m[::-1, ::-2], axis=axis))


# ----------------------------------------------------------------- softmax ----


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("func", ["softmax", "log_softmax"])
def test_softmax(rng, dtype, func):
    def reference(x, axis):
        w = widen(x)
        z = w - np.max(w, axis=axis, keepdims=True)
        s = np.sum(np.exp(z), axis=axis, keepdims=True)
        return z - np.log(s) if func == "log_softmax" else np.exp(z) / s

    f = getattr(cudalab, func)
    for name, dv, hv, d, h in views(rng, dtype):
        for axis in range(hv.ndim):
            assert_close(f(dv, axis=axis), reference(hv, axis))
            # out= a reversed buffer
            buf = cudalab.zeros(hv.shape, dtype=dtype)
            rev = tuple(slice(None, None, -1) for _ in hv.shape)
            assert f(dv, axis=axis, out=buf[rev]).base is buf
            assert_close(buf.get()[rev], reference(hv, axis))
        # out= the input read backwards: computed from the input, not from a mix
        expect = reference(h[::-1], 0)
        f(d[::-1], axis=0, out=d)
        assert_close(d, expect)


# ---------------------------------------------- transpose, astype, copies ----


@pytest.mark.parametrize("dtype", [F32, BF16, I8, F64, BOOL], ids=dtype_id)
def test_transpose_astype_copy(rng, dtype):
    for name, dv, hv, _, _ in views(rng, dtype):
        assert_bit_equal(dv.T, hv.T)
        if hv.ndim == 2:
            for method in ["naive", "coalesced_write", "tiled", "tiled_padded", "best"]:
                t = cudalab.transpose(dv, method=method)
                assert t.is_contiguous
                assert_bit_equal(t, hv.T)
        for to in [F32, F64, I32, BOOL]:
            with np.errstate(invalid="ignore", over="ignore"):
                want = hv.astype(to)
            got = dv.astype(to)
            assert got.is_contiguous
            assert_bit_equal(got, want)
        c = dv.copy()
        assert c.is_contiguous and c.base is None
        assert_bit_equal(c, hv)
        a = cudalab.ascontiguousarray(dv)
        assert a.is_contiguous
        assert_bit_equal(a, hv)
        assert_bit_equal(cudalab.asarray(dv, dtype=F32), hv.astype(F32))


# ------------------------------------------------------------------ copyto ----


@pytest.mark.parametrize("dtypes", [(F32, F32), (F32, BF16), (I32, F64), (U8, I64)],
                         ids=["f32_f32", "f32_bf16", "i32_f64", "u8_i64"])
def test_copyto(rng, dtypes):
    src_dtype, dst_dtype = dtypes
    for name, dv, hv, _, _ in views(rng, src_dtype):
        root = random_array(rng, hv.shape, dst_dtype)
        dst = cudalab.asarray(root)
        rev = tuple(slice(None, None, -1) for _ in hv.shape)
        assert cudalab.copyto(dst[rev], dv) is None
        expect = root.copy()
        expect[rev] = hv.astype(dst_dtype)
        assert_bit_equal(dst, expect)
        if hv.ndim == 2:  # a reversed row broadcast into a reversed matrix
            cudalab.copyto(dst[::-1], dv[1, ::-1])
            expect[::-1] = hv[1, ::-1].astype(dst_dtype)
            assert_bit_equal(dst, expect)


def test_copyto_overlapping_backwards(rng):
    for shape in [(1001,), (37, 129)]:
        h = random_array(rng, shape, F32)
        d = cudalab.asarray(h)
        rev = tuple(slice(None, None, -1) for _ in shape)
        cudalab.copyto(d, d[rev])
        assert_bit_equal(d, h[rev])
        cudalab.copyto(d[rev], d)  # reversed twice: the original again
        assert_bit_equal(d, h)


def test_random_values_into_reversed_views(rng):
    """The random functions make fresh arrays; copyto puts them into views."""
    cudalab.random.seed(21)
    r = cudalab.random.normal((37, 129), dtype=F32)
    base = random_array(rng, (37, 129), F32)
    d = cudalab.asarray(base)
    cudalab.copyto(d[::-1, ::-1], r)
    assert_bit_equal(d, r.get()[::-1, ::-1])
    i = cudalab.random.integers((1001,), 1, 100, dtype=I32)
    d = cudalab.asarray(random_array(rng, (2002,), I32))
    cudalab.copyto(d[::-2], i)
    assert_bit_equal(d[::-2], i.get())


# ------------------------------------------------------------------ matmul ----


def matmul_check(got, a, b, dtype):
    ref = np.matmul(widen(a), widen(b))
    assert got.shape == ref.shape
    assert got.dtype == np.dtype(dtype)
    err = rel_err(got, ref)
    assert err < tolerance(dtype), f"relative error {err:.3g}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_matmul_reversed_operands(rng, dtype):
    a = random_array(rng, (45, 31), dtype)
    b = random_array(rng, (31, 23), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    pairs = [
        (da[::-1], db, a[::-1], b),
        (da, db[:, ::-1], a, b[:, ::-1]),
        (da[::-1, ::-1], db[::-1, ::-1], a[::-1, ::-1], b[::-1, ::-1]),
        (da.T[::-1].T, db.T[:, ::-1].T, a.T[::-1].T, b.T[:, ::-1].T),
        (da[::-2], db[::-1, 1::2], a[::-2], b[::-1, 1::2]),
        (da[3, ::-1], db, a[3, ::-1], b),          # 1-D row vector, reversed
        (da, db[::-1, 5], a, b[::-1, 5]),          # 1-D column vector, reversed
        (da[7, ::-1], db[::-1, 2], a[7, ::-1], b[::-1, 2]),
    ]
    for x, y, hx, hy in pairs:
        matmul_check(cudalab.matmul(x, y), hx, hy, dtype)
        matmul_check(x @ y, hx, hy, dtype)
    # batched, the batch axis reversed and broadcast
    a3 = random_array(rng, (5, 17, 31), dtype)
    b3 = random_array(rng, (5, 31, 9), dtype)
    da3, db3 = cudalab.asarray(a3), cudalab.asarray(b3)
    matmul_check(cudalab.matmul(da3[::-1], db3), a3[::-1], b3, dtype)
    matmul_check(cudalab.matmul(da3[::-2, ::-1], db3[4]), a3[::-2, ::-1], b3[4], dtype)
    matmul_check(cudalab.matmul(da3, db3[::-1, :, ::-1]), a3, b3[::-1, :, ::-1], dtype)
    # the operands are left as they were
    assert_bit_equal(da, a)
    assert_bit_equal(db3, b3)


@pytest.mark.parametrize("dtype", [F32, BF16, F64], ids=dtype_id)
def test_matmul_out_reversed(rng, dtype):
    a = random_array(rng, (45, 31), dtype)
    b = random_array(rng, (31, 23), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    ref = np.matmul(widen(a), widen(b))
    for key in [(slice(None, None, -1),), (slice(None), slice(None, None, -1)),
                (slice(None, None, -1), slice(None, None, -1))]:
        c = cudalab.zeros((45, 23), dtype=dtype)
        got = cudalab.matmul(da, db, out=c[key])
        assert got.base is c
        assert rel_err(c.get()[key], ref) < tolerance(dtype)
    # out= reversed and overlapping an operand: the product of the old values
    sq = random_array(rng, (33, 33), dtype)
    d = cudalab.asarray(sq)
    cudalab.matmul(d, d, out=d[::-1])
    assert rel_err(d.get()[::-1], np.matmul(widen(sq), widen(sq))) < tolerance(dtype)
    # batched out= with the batch axis reversed
    a3 = random_array(rng, (4, 9, 31), dtype)
    c3 = cudalab.zeros((4, 9, 23), dtype=dtype)
    cudalab.matmul(cudalab.asarray(a3), db, out=c3[::-1])
    assert rel_err(c3.get()[::-1], np.matmul(widen(a3), widen(b))) < tolerance(dtype)


def test_matmul_out_with_gaps_is_still_refused(rng):
    da = cudalab.asarray(random_array(rng, (5, 4), F32))
    db = cudalab.asarray(random_array(rng, (4, 3), F32))
    for out in [cudalab.empty((10, 3), dtype=F32)[::-2], cudalab.empty((3, 5), dtype=F32).T,
                cudalab.empty((5, 6), dtype=F32)[:, ::-2]]:
        with assert_arg_error(ValueError, "matmul", "out", match="^must be C-contiguous$"):
            cudalab.matmul(da, db, out=out)


def test_linear_refuses_reversed_matrices_clearly(rng):
    """The fused cuBLASLt linear takes row-major operands only: a reversed
    view is refused with a message that says why (copy() it first)."""
    from cudalab import _core

    x = cudalab.asarray(random_array(rng, (16, 24), F32))
    w = cudalab.asarray(random_array(rng, (8, 24), F32))
    for xx, ww, param in [(x[::-1], w, "x"), (x, w[::-1], "weight"), (x, w[:, ::-1], "weight")]:
        with assert_arg_error(ValueError, "_nn_linear", param, match="increasing memory order"):
            _core._nn_linear(xx, ww)
    out = cudalab.empty((16, 8), dtype=F32)
    with assert_arg_error(ValueError, "_nn_linear", "out", match="increasing memory order"):
        _core._nn_linear(x, w, out=out[::-1])
    got = _core._nn_linear(x[::-1].copy(), w)  # the workaround
    assert rel_err(got, widen(x)[::-1] @ widen(w).T) < tolerance(F32)


# ------------------------------------------------------------- interop ----


class _CAIOnly:
    """Exposes another array's __cuda_array_interface__ and nothing else."""

    def __init__(self, arr):
        self.arr = arr
        self.__cuda_array_interface__ = arr.__cuda_array_interface__


class _DLPackOnly:
    """A DLPack producer forwarding to a DeviceArray (the import_dlpack path)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


@pytest.mark.parametrize("dtype", [F32, BF16, I64, U8], ids=dtype_id)
def test_dlpack_round_trip_keeps_negative_strides(rng, dtype):
    for name, dv, hv, _, _ in views(rng, dtype):
        for capsule in [dv.__dlpack__(), dv.__dlpack__(max_version=(1, 0))]:
            back = cudalab.from_dlpack(capsule)
            assert back.shape == dv.shape and back.strides == dv.strides, name
            assert back.data_ptr == dv.data_ptr, name
            assert_bit_equal(back, hv)
        back = cudalab.asarray(_DLPackOnly(dv))
        assert back.strides == dv.strides and back.data_ptr == dv.data_ptr
        assert_bit_equal(back, hv)
        copied = cudalab.from_dlpack(dv.__dlpack__(copy=True))
        assert copied.is_contiguous and copied.data_ptr != dv.data_ptr
        assert_bit_equal(copied, hv)


@pytest.mark.parametrize("dtype", [F32, F16, I8, BOOL], ids=dtype_id)
def test_cuda_array_interface_round_trip_keeps_negative_strides(rng, dtype):
    for name, dv, hv, _, _ in views(rng, dtype):
        cai = dv.__cuda_array_interface__
        assert cai["strides"] == (None if hv.flags.c_contiguous else hv.strides), name
        assert cai["data"][0] == dv.data_ptr
        back = cudalab.asarray(_CAIOnly(dv))
        assert back.strides == dv.strides and back.data_ptr == dv.data_ptr, name
        assert_bit_equal(back, hv)
    # writes through the import land in the exporter's memory
    h = random_array(rng, (37, 129), F32)
    d = cudalab.asarray(h)
    imported = cudalab.asarray(_CAIOnly(d[::-1, ::-2]))
    cudalab.mul(imported, 2.0, out=imported)
    expect = h.copy()
    expect[::-1, ::-2] *= 2
    assert_bit_equal(d, expect)


def test_cupy_sees_and_gives_negative_strides(rng):
    cupy = cupy_device()
    h = random_array(rng, (37, 129), F32)
    d = cudalab.asarray(h)
    keys = [(slice(None, None, -1),), (slice(None), slice(None, None, -2)),
            (slice(None, None, -3), slice(1, 70, 2))]
    for dv, hv in [(d[k], h[k]) for k in keys]:
        np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(dv)), hv)
        np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(dv)), hv)  # CAI
    c = cupy.asarray(h)
    for key in [(slice(None, None, -1),), (slice(None), slice(None, None, -3))]:
        got = cudalab.asarray(c[key])
        assert got.strides == c[key].strides
        assert_bit_equal(got, h[key])


# -------------------------------------------------------- empty out= (2) ----


def empty_out(shape, dtype):
    """An empty array of `shape` whose strides are not C's (every axis stepped)."""
    root = cudalab.empty(tuple(2 * n + 1 for n in shape), dtype=dtype)
    return root[tuple(slice(None, None, -2) for _ in shape)][
        tuple(slice(0, n) for n in shape)]


@pytest.mark.parametrize("strided", [False, True], ids=["plain", "strided"])
def test_matmul_empty_out(rng, strided):
    make = empty_out if strided else (lambda s, dt: cudalab.empty(s, dtype=dt))
    cases = [((0, 154), (154, 511)), ((5, 3), (3, 0)), ((3, 0, 5), (5, 4)), ((0, 7), (7,))]
    for sa, sb in cases:
        a = cudalab.asarray(random_array(rng, sa, F32))
        b = cudalab.asarray(random_array(rng, sb, F32))
        rshape = np.matmul(np.empty(sa, np.float32), np.empty(sb, np.float32)).shape
        out = make(rshape, F32)
        assert out.shape == rshape and out.size == 0 and out.is_contiguous
        assert cudalab.matmul(a, b, out=out) is out
    # the case of the issue, and a view whose strides cuBLAS could never take
    out = cudalab.empty((0, 1022), dtype=F32)[:, ::2]
    a = cudalab.asarray(random_array(rng, (0, 154), F32))
    b = cudalab.asarray(random_array(rng, (154, 511), F32))
    assert cudalab.matmul(a, b, out=out) is out


def test_elementwise_and_copyto_empty_out(rng):
    for shape in [(0,), (0, 7), (3, 0, 5)]:
        a = cudalab.asarray(random_array(rng, shape, F32))
        for out in [cudalab.empty(shape, dtype=F32), empty_out(shape, F32)]:
            assert cudalab.add(a, a, out=out) is out
            assert cudalab.exp(a, out=out) is out
            cond = cudalab.asarray(np.ones(shape, np.bool_))
            assert cudalab.where(cond, a, 1.0, out=out) is out
        assert cudalab.add(a, 1, out=empty_out(shape, F64)).shape == shape  # cast path
        assert cudalab.copyto(empty_out(shape, BF16), a) is None
        assert cudalab.copyto(empty_out(shape, F32), a[..., ::-1]) is None


def test_reduction_softmax_loss_empty_out(rng):
    a = cudalab.asarray(random_array(rng, (0, 5), F32))
    for op, dtype in [("sum", F32), ("mean", F32), ("max", F32), ("min", F32), ("argmax", I64)]:
        for out in [cudalab.empty((0,), dtype=dtype), empty_out((0,), dtype)]:
            assert getattr(cudalab, op)(a, axis=1, out=out) is out
    b = cudalab.asarray(random_array(rng, (3, 0, 4), F32))
    out = empty_out((3, 0), F32)
    assert cudalab.sum(b, axis=2, out=out) is out
    for func in (cudalab.softmax, cudalab.log_softmax):
        for out in [cudalab.empty((0, 5), dtype=F32), empty_out((0, 5), F32)]:
            assert func(a, axis=1, out=out) is out
    labels = cudalab.asarray(np.empty((0,), np.int64))
    out = empty_out((0,), F32)
    assert cudalab.nn.functional.cross_entropy(a, labels, reduction="none", out=out) is out


def test_get_into_empty_out_of_any_strides():
    d = cudalab.empty((0, 10), dtype=F32)
    for out in [np.empty((0, 10), np.float32), np.empty((0, 20), np.float32)[:, ::-2],
                np.empty((10, 0), np.float32).T]:
        assert d.get(out=out) is out


# ------------------------------------------------- get(out=) any layout (3) ----


def host_outs(shape, dtype):
    """Writable host arrays of `shape`: C, Fortran, another axis order, with
    gaps, reversed, reversed and Fortran."""
    n = len(shape)
    outs = {
        "c": np.empty(shape, dtype),
        "fortran": np.empty(shape, dtype, order="F"),
        "gaps": np.empty(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2],
        "reversed": np.empty(shape, dtype)[tuple(slice(None, None, -1) for _ in shape)],
        "reversed_fortran": np.empty(shape, dtype, order="F")[::-1],
    }
    if n >= 3:
        perm = (1, 2, 0)
        inverse = tuple(np.argsort(perm))
        outs["rotated"] = np.empty(tuple(shape[p] for p in perm), dtype).transpose(inverse)
    return outs


@pytest.mark.parametrize("dtype", [F32, BF16, BOOL, I64, F16], ids=dtype_id)
@pytest.mark.parametrize("shape", [(37, 129), (5, 7, 33)], ids=["2d", "3d"])
def test_get_out_any_layout(rng, dtype, shape):
    h = random_array(rng, shape, dtype)
    d = cudalab.asarray(h)
    rev = tuple(slice(None, None, -1) for _ in shape)
    sources = {
        "contiguous": (d, h),
        "transposed": (cudalab.asarray(np.ascontiguousarray(h.T)).T, h),
        "reversed": (cudalab.asarray(h[rev].copy())[rev], h),
    }
    big = random_array(rng, tuple(2 * n for n in shape), dtype)
    step = tuple(slice(None, None, 2) for _ in shape)
    sources["stepped"] = (cudalab.asarray(big)[step], big[step])
    for sname, (dsrc, want) in sources.items():
        for oname, out in host_outs(shape, dtype).items():
            got = dsrc.get(out=out)
            assert got is out, (sname, oname)
            assert_bit_equal(out, want)
    assert_bit_equal(d, h)  # the source is untouched


def test_get_out_pinned_layouts(rng):
    h = random_array(rng, (37, 129), F32)
    d = cudalab.asarray(h)
    fortran = cudalab.pinned_empty((129, 37)).T  # dense, pinned: asynchronous
    assert d.get(out=fortran, non_blocking=True) is fortran
    cudalab.synchronize()
    np.testing.assert_array_equal(fortran, h)
    gaps = cudalab.pinned_empty((37, 258))[:, ::-2]  # not dense: staged, synchronous
    assert d.get(out=gaps, non_blocking=True) is gaps
    np.testing.assert_array_equal(gaps, h)
    c = cudalab.pinned_empty((37, 129))
    assert d[::-1].get(out=c, non_blocking=True) is c
    cudalab.synchronize()
    np.testing.assert_array_equal(c, h[::-1])


def test_get_out_errors_come_first(rng):
    """Shape, dtype and read-only are still checked, whatever the layout."""
    d = cudalab.asarray(random_array(rng, (3, 4), F32))
    ro = np.empty((3, 4), np.float32, order="F")
    ro.flags.writeable = False
    with assert_arg_error(ValueError, "get", "out", match="^is read-only"):
        d.get(out=ro)
    with assert_arg_error(ValueError, "get", "out", match=r"^shape \(4, 3\) does not"):
        d.get(out=np.empty((4, 6), np.float32)[:, ::2])
    with assert_arg_error(TypeError, "get", "out", match="^dtype .* does not match"):
        d.get(out=np.empty((3, 4), np.float64)[::-1])
