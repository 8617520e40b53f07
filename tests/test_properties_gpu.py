"""GPU tier: property-based differential tests against NumPy (issue 21, item 3).

Hypothesis draws cases for each family of ops: random shapes (extents of 0
and 1 included, a long axis sometimes), views with offsets, steps and
transposed axes (positive steps: see _properties.DEVICE_NEGATIVE_STEPS),
broadcasting, Python and NumPy scalars, every dtype the op accepts, and out=
fresh, aliased (out is an input), strided (a view into a larger array whose
other elements must stay untouched) or overlapping (shifted by one row). Each
result is compared with NumPy: shape, dtype, and values within the family's
tolerance below. Where NumPy refuses a call (bool subtraction, a result that
does not cast to out's dtype, max of an empty slice) cudalab must raise the
same exception type.

Error measure: ``rel_err`` of _support, ``||got - ref|| / ||ref||`` over the
whole result, ref computed in float64 from the inputs' exact values. An out=
of another dtype adds the error of that cast (``cast_bound``). Results that
are exact by construction (integer and bool arithmetic, max/min, neg/abs/relu,
clamp, where, argmax, copies, casts, transposes) must equal NumPy's.

Data (``_properties.values``) is never all zeros, and stays where each op is
well conditioned: floats of magnitude 0.25..4, small integers, positive data
for sums, matmul, log and sqrt, gelu above -2. Casts stay in range (float to
int out of range is left to another change).

Runs: ``derandomize=True`` and no example database, so every run draws the
same cases. ``MAX_EXAMPLES`` says how many each family draws; its keys are the
families and each test is named ``test_<family>``. When a case fails,
hypothesis prints it as valid Python ("Falsifying example: test_x(case=...)"):
paste that case into an ``@example(case=...)`` under the test's ``@given``
(the names are imported here) so it stays a regression test.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings  # noqa: F401  (example: pinned cases)

import _properties as P
import cudalab as cl
from _properties import (Arr, AstypeCase, CopytoCase, EwCase, Layout, MatmulCase, Out,  # noqa: F401
                         ReduceCase, RoundtripCase, Scalar, SoftmaxCase, TransposeCase)
from _support import BF16, F16, F32, F64, assert_bit_equal, assert_close, is_float, widen

pytestmark = pytest.mark.gpu

# ================================================================ examples

# Examples each family draws (one test per family, named test_<family>).
MAX_EXAMPLES = {
    "elementwise_unary": 100,
    "elementwise_binary": 150,
    "elementwise_ternary": 80,
    "reduction": 120,
    "softmax": 80,
    "matmul": 100,
    "transpose": 60,
    "astype": 80,
    "copyto": 80,
    "roundtrip": 80,
}


def family_settings(family: str) -> settings:
    """Reproducible runs: the same cases every time, nothing stored between runs."""
    return settings(
        max_examples=MAX_EXAMPLES[family],
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ============================================================== tolerances

# Half an ulp at 1: float64 2**-53, float32 2**-24, float16 2**-11, bfloat16 2**-8.
U = P.UNIT_ROUNDOFF

# family -> result dtype -> (largest rel_err accepted, why). Exact results are not listed: 0.
TOLERANCES = {
    # add sub mul div axpy
    "arithmetic": {
        F64: (2 * U[F64], "one IEEE rounding of the exact result (axpy: one fma)"),
        F32: (2 * U[F32], "one IEEE rounding of the exact result"),
        F16: (2 * U[F16], "exact or rounded once in float32, then rounded to float16"),
        BF16: (2 * U[BF16], "exact or rounded once in float32, then rounded to bfloat16"),
    },
    # exp log sqrt tanh sigmoid gelu (both forms) pow
    "transcendental": {
        F64: (2e-14, "double functions within 2 ulp; gelu's 1 + erf(x/sqrt 2) magnifies 22x at -2"),
        F32: (1e-5, "float functions within 4 ulp (powf); the same 22x gelu cancellation at -2"),
        F16: (2 * U[F16] + 1e-5, "the float32 evaluation, then one rounding to float16"),
        BF16: (2 * U[BF16] + 1e-5, "the float32 evaluation, then one rounding to bfloat16"),
    },
    # sum, mean (positive data: no cancellation)
    "reduction": {
        F64: (1e-12, "float64 partial sums in a fixed tree"),
        F32: (1e-5, "float32 chains of up to 256 additions combined by a tree"),
        F16: (2 * U[F16] + 1e-5, "accumulated in float32, rounded once to float16"),
        BF16: (2 * U[BF16] + 1e-5, "accumulated in float32, rounded once to bfloat16"),
    },
    # softmax, log_softmax
    "softmax": {
        F64: (1e-12, "computed in float64 throughout"),
        F32: (2e-5, "expf within 2 ulp and float32 row sums (test_softmax_gpu's bound)"),
        F16: (2 * U[F16] + 2e-5, "computed in float32, rounded once to float16"),
        BF16: (2 * U[BF16] + 2e-5, "computed in float32, rounded once to bfloat16"),
    },
    # matmul, positive data, K <= 40
    "matmul": {
        F64: (1e-13, "float64 dot products of at most 40 positive terms: <= K u"),
        F32: (1e-5, "precision 'highest' (the default): true fp32, <= K u = 2.4e-6"),
        F16: (2 * U[F16] + 1e-5, "accumulated in float32 (documented), rounded once to float16"),
        BF16: (2 * U[BF16] + 1e-5, "accumulated in float32 (documented), rounded once to bfloat16"),
    },
    # matmul of float32 with precision 'high'
    "matmul_tf32": {
        F32: (4e-3, "TF32 rounds the inputs to 10 mantissa bits: <= 2 * 2**-10 per product"),
    },
}


def tolerance(family: str, dtype) -> float:
    """The bound of TOLERANCES for a float `dtype`; 0 (exact) for integers and bool."""
    dtype = np.dtype(dtype)
    return TOLERANCES[family][dtype][0] if is_float(dtype) else 0.0


# ================================================================= helpers


class Operand(NamedTuple):
    """The same values on the host and on the device, as a view of a root."""

    host: np.ndarray
    device: cl.DeviceArray
    host_root: np.ndarray
    device_root: cl.DeviceArray
    view: object  # the _support.View that cut host and device out of their roots


def upload(spec: Arr, make_root) -> Operand:
    """A random root from make_root(root_shape), uploaded whole, and the view of `spec`."""
    view = spec.view()
    host_root = make_root(view.root_shape)
    device_root = cl.asarray(host_root)
    return Operand(view(host_root), view(device_root), host_root, device_root, view)


def upload_values(rng, spec: Arr, domain: str) -> Operand:
    return upload(spec, lambda shape: P.values(rng, shape, spec.dtype, domain))


def shifted_pair(rng, shape, dtype, domain: str):
    """One dense root of ``(shape[0] + 1, ...)``: returns (host root, device root);
    root[1:] is the input and root[:-1] the out= that overlaps it."""
    host_root = P.values(rng, (shape[0] + 1,) + tuple(shape[1:]), dtype, domain)
    return host_root, cl.asarray(host_root)


def c_order(a: np.ndarray) -> np.ndarray:
    """A C-ordered copy (np.ascontiguousarray would make a 0-d array 1-d)."""
    return np.array(a, order="C", copy=True)


def assert_untouched(root_after: np.ndarray, root_before: np.ndarray, view) -> None:
    """Every element of the root outside `view` kept its value."""
    inside = np.zeros(root_before.shape, dtype=bool)
    view(inside)[...] = True
    np.testing.assert_array_equal(widen(root_after)[~inside], widen(root_before)[~inside],
                                  err_msg="out= wrote outside its view")


def assert_inputs_unchanged(operands) -> None:
    """No input was written (their device roots still hold the uploaded values)."""
    for op in operands:
        assert_bit_equal(op.device_root, op.host_root)


def assert_values(got, ref, *, exact: bool, family: str, r, out_dtype) -> None:
    """`got` (host, dtype out_dtype) against `ref` (see elementwise_reference)."""
    if exact:
        want = np.asarray(ref).astype(r).astype(out_dtype)
        np.testing.assert_array_equal(widen(got), widen(want))
    else:
        assert_close(got, ref, tol=tolerance(family, r) + P.cast_bound(r, out_dtype))


# ============================================================ element-wise

INPLACE = {"add": operator.iadd, "sub": operator.isub, "mul": operator.imul,
           "div": operator.itruediv}
OPERATORS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
             "div": operator.truediv}


def call_elementwise(case: EwCase, args, out):
    """The call the case describes (function or operator form, out= or not)."""
    if case.form == "operator":
        if out is not None:
            x = args[0]
            x = INPLACE[case.op](x, args[1])  # ``x op= b``: out= is x
            return x
        return OPERATORS[case.op](*args)
    kw = {} if out is None else {"out": out}
    if case.op == "gelu_tanh":
        return cl.gelu(args[0], approximate="tanh", **kw)
    if case.op == "clamp":
        return cl.clamp(args[0], lo=args[1], hi=args[2], **kw)
    return getattr(cl, case.op)(*args, **kw)


def run_elementwise(case: EwCase) -> None:
    rng = np.random.default_rng(case.seed)
    out_spec = case.out
    host_args, dev_args, uploaded = [], [], []
    overlap = None  # (host root, device root) when out= overlaps the target shifted by a row
    for i, spec in enumerate(case.operands):
        if spec is None or isinstance(spec, Scalar):
            value = None if spec is None else spec.make()
            host_args.append(value)
            dev_args.append(value)
        elif case.same and i == 1:  # b is the very array a
            host_args.append(host_args[0])
            dev_args.append(dev_args[0])
        elif out_spec.mode == "overlap" and i == out_spec.target:
            domain = P.operand_domain(case.op, i, spec.dtype)
            overlap = shifted_pair(rng, spec.shape, spec.dtype, domain)
            host_args.append(overlap[0][1:])
            dev_args.append(overlap[1][1:])
        else:
            operand = upload_values(rng, spec, P.operand_domain(case.op, i, spec.dtype))
            host_args.append(operand.host)
            dev_args.append(operand.device)
            uploaded.append((i, operand))
    shape = np.broadcast_shapes(*(s.shape for s in case.operands if isinstance(s, Arr)))
    r = P.elementwise_result(case.op, [P.dtype_key(s) for s in case.operands])

    out, strided = None, None
    if out_spec.mode == "alias":
        out = dev_args[out_spec.target]
    elif out_spec.mode == "overlap":
        out = overlap[1][:-1]
    elif out_spec.mode == "strided":
        strided = upload_values(rng, Arr(tuple(shape), out_spec.dtype, out_spec.layout), "signed")
        out = strided.device
    out_dtype = r if out is None else out.dtype

    if r is None or not P.can_cast(r, out_dtype):
        with pytest.raises(TypeError):
            call_elementwise(case, dev_args, out)
        return

    result = call_elementwise(case, dev_args, out)
    assert isinstance(result, cl.DeviceArray)
    if out is not None:
        assert result is out
    else:
        assert all(result is not a for a in dev_args)
    assert result.shape == shape
    assert result.dtype == out_dtype
    ref = P.elementwise_reference(case.op, host_args, r)
    check = dict(exact=P.is_exact(case.op, r), family=P.family_of(case.op), r=r,
                 out_dtype=out_dtype)
    if overlap is not None:
        after = overlap[1].get()
        assert_values(after[:-1], ref, **check)
        assert_bit_equal(after[-1], overlap[0][-1])  # the row out= does not cover
    else:
        assert_values(result.get(), ref, **check)
    if strided is not None:
        assert_untouched(strided.device_root.get(), strided.host_root, strided.view)
    # Inputs other than out= itself are never written (with `same`, a and b are one array).
    written = set()
    if out_spec.mode == "alias":
        written = {0, 1} if case.same else {out_spec.target}
    assert_inputs_unchanged([o for i, o in uploaded if i not in written])


@family_settings("elementwise_unary")
@given(case=P.unary_cases())
def test_elementwise_unary(case):
    """neg abs exp log sqrt tanh sigmoid relu gelu (both forms), every dtype."""
    run_elementwise(case)


@family_settings("elementwise_binary")
@given(case=P.binary_cases())
def test_elementwise_binary(case):
    """add sub mul div maximum minimum pow: broadcasting, scalars, mixed dtypes,
    a op b and a op= b, and b being a itself."""
    run_elementwise(case)


@family_settings("elementwise_ternary")
@given(case=P.ternary_cases())
def test_elementwise_ternary(case):
    """axpy (alpha a scalar), clamp (a bound may be absent), where (cond of any dtype)."""
    run_elementwise(case)


# ============================================================== reductions


@family_settings("reduction")
@given(case=P.reduce_cases())
def test_reduction(case):
    """sum mean max min argmax: axis None, an int or a 1-tuple, keepdims, dtype=, out=."""
    rng = np.random.default_rng(case.seed)
    x = upload_values(rng, case.x, P.reduce_domain(case.op))
    func = getattr(cl, case.op)
    kwargs = {"axis": (case.axis,) if case.axis_as_tuple and case.axis is not None else case.axis,
              "keepdims": case.keepdims}
    if case.dtype is not None:
        kwargs["dtype"] = case.dtype
    try:
        ref, final = P.reduce_reference(case.op, x.host, case.axis, case.keepdims, case.dtype)
    except ValueError:  # NumPy: max/min/argmax of an empty slice
        with pytest.raises(ValueError):
            func(x.device, **kwargs)
        return

    out, strided = None, None
    if case.out.mode == "alias":
        out = x.device
    elif case.out.mode == "strided":
        strided = upload_values(rng, Arr(ref.shape, case.out.dtype, case.out.layout), "signed")
        out = strided.device
    result = func(x.device, out=out, **kwargs)
    assert isinstance(result, cl.DeviceArray)
    if out is not None:
        assert result is out
    assert result.shape == ref.shape
    assert result.dtype == final
    got = result.get()
    if not is_float(final) or case.op in ("max", "min", "argmax"):
        np.testing.assert_array_equal(widen(got), widen(ref))
    else:
        kernel, _ = P.reduce_dtypes(case.op, case.x.dtype, case.dtype)
        tol = tolerance("reduction", final) + P.cast_bound(case.x.dtype, kernel)
        assert_close(got, ref, tol=tol)
    if strided is not None:
        assert_untouched(strided.device_root.get(), strided.host_root, strided.view)
    if case.out.mode != "alias":
        assert_inputs_unchanged([x])


@pytest.mark.parametrize("op", ["max", "min", "argmax"])
def test_reduction_of_nothing_into_nothing_raises(op):
    """max/min/argmax over an empty axis whose result is empty too (axis 1 of a
    (0, 0) array): NumPy raises ValueError, and so does cudalab (it returned an
    empty result until issue 21; found reading csrc/ops/reduce.c)."""
    x = cl.asarray(np.ones((0, 0), dtype=np.float32))
    with pytest.raises(ValueError):
        getattr(cl, op)(x, axis=1)


# ================================================================= softmax


@family_settings("softmax")
@given(case=P.softmax_cases())
def test_softmax(case):
    """softmax and log_softmax along any axis of any view; out= in place, strided, overlapping."""
    rng = np.random.default_rng(case.seed)
    func = getattr(cl, case.func)
    overlap, strided, out, inputs = None, None, None, []
    if case.out.mode == "overlap":
        overlap = shifted_pair(rng, case.x.shape, case.x.dtype, "signed")
        host, dev, out = overlap[0][1:], overlap[1][1:], overlap[1][:-1]
    else:
        x = upload_values(rng, case.x, "signed")
        host, dev = x.host, x.device
        if case.out.mode == "alias":
            out = dev
        else:
            inputs = [x]
        if case.out.mode == "strided":
            spec = Arr(case.x.shape, case.out.dtype, case.out.layout)
            strided = upload_values(rng, spec, "signed")
            out = strided.device
    ref = P.softmax_reference(case.func, host, case.axis)

    result = func(dev, axis=case.axis, out=out)
    assert isinstance(result, cl.DeviceArray)
    if out is not None:
        assert result is out
    else:
        assert result.is_contiguous  # a new result is C-contiguous (docstring)
    assert result.shape == host.shape
    assert result.dtype == host.dtype
    tol = tolerance("softmax", host.dtype)
    if overlap is not None:
        after = overlap[1].get()
        assert_close(after[:-1], ref, tol=tol)
        assert_bit_equal(after[-1], overlap[0][-1])
    else:
        assert_close(result.get(), ref, tol=tol)
    if strided is not None:
        assert_untouched(strided.device_root.get(), strided.host_root, strided.view)
    assert_inputs_unchanged(inputs)


# ================================================================== matmul


@family_settings("matmul")
@given(case=P.matmul_cases())
def test_matmul(case):
    """1-D, 2-D and broadcast-batched operands of any layout, K = 0, precision=, pad=, out=."""
    rng = np.random.default_rng(case.seed)
    a = upload_values(rng, case.a, "positive")
    b = upload_values(rng, case.b, "positive")
    shape = P.matmul_shape(case.a.shape, case.b.shape)
    dtype = np.dtype(case.a.dtype)
    out, sentinel = None, None
    if case.out.mode == "alias":
        out = a.device  # out= is a itself: C-contiguous, a's shape
    elif case.out.mode == "strided":
        if case.out.layout is None:  # a 0-d result: one element in the middle of a 1-D array
            host_root = P.values(rng, (3,), dtype, "signed")
            device_root = cl.asarray(host_root)
            out = device_root[1]
            sentinel = (device_root, host_root, lambda root: root[1, ...])  # a 0-d view
        else:
            strided = upload_values(rng, Arr(shape, dtype.name, case.out.layout), "signed")
            out = strided.device
            sentinel = (strided.device_root, strided.host_root, strided.view)
    kwargs = {}
    if case.precision is not None:
        kwargs["precision"] = case.precision
    if case.pad is not None:
        kwargs["pad"] = case.pad
    # The precision in effect (None: the process-wide setting, 'highest' unless changed).
    precision = case.precision or cl.get_float32_matmul_precision()
    family = "matmul_tf32" if dtype == F32 and precision == "high" else "matmul"

    result = cl.matmul(a.device, b.device, out=out, **kwargs)
    assert isinstance(result, cl.DeviceArray)
    if out is not None:
        assert result is out
    assert result.is_contiguous
    assert result.shape == shape
    assert result.dtype == dtype
    ref = np.matmul(a.host.astype(np.float64), b.host.astype(np.float64))
    assert_close(result.get(), ref, tol=tolerance(family, dtype))
    if sentinel is not None:
        assert_untouched(sentinel[0].get(), sentinel[1], sentinel[2])
    assert_inputs_unchanged([b] if case.out.mode == "alias" else [a, b])


# =============================================================== transpose


@family_settings("transpose")
@given(case=P.transpose_cases())
def test_transpose(case):
    """cudalab.transpose with each kernel, and transposed views made contiguous or read back."""
    rng = np.random.default_rng(case.seed)
    x = upload_values(rng, case.x, "raw")
    if case.kind == "kernel":
        got = cl.transpose(x.device, method=case.method)
        assert got.is_contiguous
        assert_bit_equal(got, c_order(x.host.T))
        assert_inputs_unchanged([x])
        return
    if case.perm is None:
        view, want = x.device.T, x.host.T
    else:
        view, want = x.device.transpose(*case.perm), x.host.transpose(case.perm)
    assert view.shape == want.shape
    if want.size > 0:
        assert view.strides == want.strides  # the same bytes, walked in the same order
    if case.how == "copy":
        got = view.copy()
    elif case.how == "ascontiguousarray":
        got = cl.ascontiguousarray(view)
    else:
        got = view.get()
    if case.how != "get":
        assert got.is_contiguous
    assert_bit_equal(got, c_order(want))


# ================================================================== astype


@family_settings("astype")
@given(case=P.astype_cases())
def test_astype(case):
    """Every dtype to every dtype, from any view, bit for bit as NumPy's astype."""
    rng = np.random.default_rng(case.seed)
    x = upload(case.x, lambda shape: P.cast_values(rng, shape, case.x.dtype, case.to))
    to = np.dtype(case.to)
    if case.how == "astype":
        got = x.device.astype(to)
        assert got is not x.device
    elif case.how == "nocopy":
        got = x.device.astype(to, copy=False)
        assert (got is x.device) == (to == x.device.dtype)
    else:
        got = cl.asarray(x.device, dtype=to)
    if got is not x.device:
        assert got.is_contiguous  # a new C-contiguous array (docstring)
    assert got.dtype == to
    assert got.shape == x.host.shape
    assert_bit_equal(got, x.host.astype(to))
    assert_inputs_unchanged([x])


# ================================================================== copyto


@family_settings("copyto")
@given(case=P.copyto_cases())
def test_copyto(case):
    """Broadcast and 'same_kind' cast into a view; an overlapping src; refused casts."""
    rng = np.random.default_rng(case.seed)
    if case.overlap:
        # src = root[1:] is copied into dst = root[:-1]: as if src were copied aside first.
        host_root, device_root = shifted_pair(rng, case.dst.shape, case.dst.dtype, "signed")
        assert cl.copyto(device_root[:-1], device_root[1:]) is None
        want = host_root.copy()
        want[:-1] = host_root[1:]
        assert_bit_equal(device_root, want)
        return
    dst = upload_values(rng, case.dst, "signed")
    src = upload(case.src, lambda shape: P.cast_values(rng, shape, case.src.dtype, case.dst.dtype))
    if not P.can_cast(case.src.dtype, case.dst.dtype):
        with pytest.raises(TypeError):
            cl.copyto(dst.device, src.device)
        assert_inputs_unchanged([dst, src])
        return
    assert cl.copyto(dst.device, src.device) is None
    want = dst.host_root.copy()
    dst.view(want)[...] = np.broadcast_to(src.host.astype(dst.host.dtype), dst.host.shape)
    assert_bit_equal(dst.device_root, want)  # the view written, the rest of its root untouched
    assert_inputs_unchanged([src])


# ============================================================= round trips


@family_settings("roundtrip")
@given(case=P.roundtrip_cases())
def test_roundtrip(case):
    """asarray of any NumPy view (optionally converting), and every way back to the host."""
    rng = np.random.default_rng(case.seed)
    dtype = np.dtype(case.dtype)
    # Host -> device: any NumPy view (backward steps included), optionally converted.
    host_view = case.host_layout.view(case.shape)
    if case.upload is None:
        host_root = P.values(rng, host_view.root_shape, dtype, "raw")
        src = host_view(host_root)
        up, want = cl.asarray(src), src
    else:
        host_root = P.cast_values(rng, host_view.root_shape, dtype, case.upload)
        src = host_view(host_root)
        up, want = cl.asarray(src, dtype=case.upload), src.astype(case.upload)
    assert up.shape == want.shape
    assert up.dtype == want.dtype
    assert_bit_equal(up, want)
    # Device -> host: a device view, copied back by each way there is.
    x = upload_values(rng, Arr(case.shape, case.dtype, case.device_layout), "raw")
    if case.download == "get":
        got = x.device.get()
    elif case.download == "asnumpy":
        got = cl.asnumpy(x.device)
    elif case.download == "pinned" and x.host.size > 0:
        out = cl.pinned_empty(case.shape, dtype)
        assert x.device.get(out=out, non_blocking=True) is out
        cl.synchronize()  # a non-blocking copy is only complete after this
        got = out
    else:  # get_out (and pinned of an empty array)
        out = np.empty(case.shape, dtype=dtype)
        assert x.device.get(out=out) is out
        got = out
    assert isinstance(got, np.ndarray)
    assert_bit_equal(got, x.host)
    assert_inputs_unchanged([x])
