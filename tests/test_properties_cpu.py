"""CPU tier: the property tests' own machinery (tests/_properties.py and the
tables of test_properties_gpu.py), checked without a GPU.

* The GPU property tests themselves run here against a NumPy stand-in for
  cudalab (tests/_numpy_cudalab.py), with the same derandomized cases: every
  case must be buildable and every check must pass on correct results.
* The dtype rules agree with NumPy's own ufuncs wherever NumPy has the op.
* The value domains, layouts and references keep their promises.
* The tolerance and example tables are complete and sane.
"""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import _numpy_cudalab
import _properties as P
import test_properties_gpu as G
from _support import BF16, BOOL, DTYPES, F16, F32, F64, I8, I32, I64, U8, is_float, is_int

QUICK = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
NON_BF16 = [d for d in DTYPES if d != BF16]


# ============================================ the GPU tests on a NumPy stand-in


@pytest.mark.parametrize("family", sorted(G.MAX_EXAMPLES))
def test_gpu_property_test_passes_on_numpy_stand_in(family, monkeypatch):
    """test_<family> of test_properties_gpu.py, with cudalab replaced by NumPy."""
    monkeypatch.setattr(G, "cl", _numpy_cudalab)
    getattr(G, f"test_{family}")()


STRATEGIES = {
    "elementwise_unary": P.unary_cases,
    "elementwise_binary": P.binary_cases,
    "elementwise_ternary": P.ternary_cases,
    "reduction": P.reduce_cases,
    "softmax": P.softmax_cases,
    "matmul": P.matmul_cases,
    "transpose": P.transpose_cases,
    "astype": P.astype_cases,
    "copyto": P.copyto_cases,
    "roundtrip": P.roundtrip_cases,
}


@pytest.mark.parametrize("family", sorted(G.MAX_EXAMPLES))
def test_gpu_property_test_body_on_more_cases(family, monkeypatch):
    """The same test body on 300 other cases (a different derandomized search),
    so a rare case the GPU run has not drawn yet cannot trip the test itself."""
    monkeypatch.setattr(G, "cl", _numpy_cudalab)
    body = getattr(G, f"test_{family}").hypothesis.inner_test

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=STRATEGIES[family]())
    def more(case):
        body(case)

    more()


def test_every_family_has_a_strategy():
    assert set(STRATEGIES) == set(G.MAX_EXAMPLES)


def test_stand_in_refuses_negative_device_steps():
    """Like DeviceArray today, so a strategy drawing negative device steps fails here."""
    d = _numpy_cudalab.asarray(np.arange(4.0))
    if not P.DEVICE_NEGATIVE_STEPS:
        with pytest.raises(ValueError):
            d[::-1]


# ================================================================ the tables


def test_every_family_has_one_test_and_a_modest_example_count():
    for family, count in G.MAX_EXAMPLES.items():
        assert callable(getattr(G, f"test_{family}")), family
        assert 60 <= count <= 150, (family, count)


def test_tolerance_table_is_complete_and_sane():
    for family, rows in G.TOLERANCES.items():
        dtypes = [F32] if family == "matmul_tf32" else [F64, F32, F16, BF16]
        assert sorted(d.name for d in rows) == sorted(d.name for d in dtypes), family
        for dtype, (bound, why) in rows.items():
            # Never tighter than one rounding, never loose enough to hide a wrong result.
            assert P.UNIT_ROUNDOFF[dtype] <= bound < 0.05, (family, dtype, bound)
            assert isinstance(why, str) and len(why) > 10, (family, dtype)
    for dtype in (BOOL, I8, U8, I32, I64):
        assert G.tolerance("arithmetic", dtype) == 0.0


def test_cast_bound():
    assert P.cast_bound(F32, F32) == 0.0
    assert P.cast_bound(F16, F32) == 0.0  # widening is exact
    assert P.cast_bound(I8, F16) == 0.0
    assert P.cast_bound(F32, F16) == 2 * 2.0**-11
    assert P.cast_bound(F16, BF16) == 2 * 2.0**-8  # bfloat16 keeps fewer mantissa bits
    assert P.cast_bound(I64, I8) == 0.0  # integers: exact (wrapping is compared exactly)


# ================================================================= dtype rules

WEAK = [True, 3, 2.5]


def test_promote_matches_numpy_result_type():
    """NEP 50 promotion, NumPy 2 as the oracle, wherever NumPy supports the dtypes."""
    for a in NON_BF16:
        for b in NON_BF16:
            want = np.result_type(a, b)
            assert P.promote([a, b]) == (want if want in DTYPES else None), (a, b)
        for w in WEAK:
            assert P.promote([a, w]) == np.result_type(a, w), (a, w)


def test_promote_bfloat16_keeps_bfloat16_with_weak_scalars():
    # np.result_type(bfloat16, 2.5) is float64 (ml_dtypes has no weak promotion);
    # cudalab follows NEP 50's intent: a weak float keeps a float dtype.
    assert P.promote([BF16, 2.5]) == BF16
    assert P.promote([BF16, 3]) == BF16
    assert P.promote([BF16, np.dtype(np.float32)]) == F32
    assert P.promote([BF16, I32]) is None  # NumPy refuses; the strategies never draw it
    assert P.promote([I8, U8]) is None  # int16
    assert P.promote([3, 2.5]) == F64  # where's two Python scalars
    assert P.promote([True]) == BOOL


NUMPY_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
                "maximum": np.maximum, "minimum": np.minimum, "pow": np.power,
                "neg": np.negative, "abs": np.absolute, "exp": np.exp, "log": np.log,
                "sqrt": np.sqrt, "tanh": np.tanh}


@pytest.mark.parametrize("op", sorted(NUMPY_UFUNCS))
def test_elementwise_result_matches_numpy_ufuncs(op):
    """The result dtype (or the TypeError) of every op NumPy also has, for every
    dtype pair NumPy supports and every kind of Python scalar."""
    ufunc = NUMPY_UFUNCS[op]
    one = {d: np.ones(3, dtype=d) for d in NON_BF16}
    cases = [[d] for d in NON_BF16] if ufunc.nin == 1 else (
        [[a, b] for a in NON_BF16 for b in NON_BF16] + [[a, w] for a in NON_BF16 for w in WEAK]
        + [[w, a] for a in NON_BF16 for w in WEAK])
    for keys in cases:
        args = [one[k] if isinstance(k, np.dtype) else k for k in keys]
        try:
            with np.errstate(all="ignore"):
                want = np.asarray(ufunc(*args)).dtype
        except TypeError:
            want = None
        if want is not None and want not in DTYPES:
            continue  # int16: cudalab refuses it too, tested by test_elementwise_cpu
        assert P.elementwise_result(op, keys) == want, (op, keys)


def test_elementwise_result_rules_without_numpy_counterpart():
    assert P.elementwise_result("relu", [BOOL]) is None
    assert P.elementwise_result("relu", [U8]) == U8
    assert P.elementwise_result("sigmoid", [I8]) == F16
    assert P.elementwise_result("gelu", [I64]) == F64
    assert P.elementwise_result("gelu_tanh", [BF16]) == BF16
    assert P.elementwise_result("axpy", [2.5, I32, I32]) == F64
    assert P.elementwise_result("axpy", [True, BOOL, BOOL]) == BOOL
    assert P.elementwise_result("clamp", [U8, 3, None]) == U8
    assert P.elementwise_result("where", [F32, 1, 2.5]) == F64  # cond does not take part
    assert P.elementwise_result("where", [I8, BF16, 0.5]) == BF16


def test_reduce_dtype_rules():
    assert P.reduce_dtypes("sum", U8, None) == (U8, I64)  # NumPy says uint64: cudalab int64
    assert P.reduce_dtypes("sum", BOOL, None) == (BOOL, I64)
    assert P.reduce_dtypes("mean", I32, None) == (I32, F64)
    assert P.reduce_dtypes("sum", F16, None) == (F16, F16)
    assert P.reduce_dtypes("sum", I8, "int64") == (I8, I64)  # already the natural result
    assert P.reduce_dtypes("sum", I8, "float16") == (F16, F16)  # the input is cast first
    assert P.reduce_dtypes("mean", I32, "float64") == (I32, F64)
    assert P.reduce_dtypes("argmax", F32, None) == (F32, I64)
    assert P.reduce_dtypes("max", BF16, None) == (BF16, BF16)


def test_ml_dtypes_rounds_to_bfloat16_through_float32():
    """astype/copyto compare bit for bit with NumPy: that holds because cudalab
    (cuda/dtype_convert.cuh) and ml_dtypes both round float64 -> bfloat16
    through float32, and float16 -> bfloat16 through float32 (exact)."""
    x = np.random.default_rng(0).uniform(-100, 100, size=200_000)
    for src in (x, x.astype(F16)):
        direct = src.astype(BF16).view(np.uint16)
        via32 = src.astype(np.float32).astype(BF16).view(np.uint16)
        np.testing.assert_array_equal(direct, via32)


def test_numpy_same_kind_casts_match_cudalab_table():
    """The table in csrc/core/dtype.c (copyto, out=) is NumPy's can_cast(same_kind)."""
    refused = {(a.name, b.name) for a in DTYPES for b in DTYPES if not P.can_cast(a, b)}
    assert ("float32", "int32") in refused and ("int8", "uint8") in refused
    assert ("bfloat16", "float16") in refused and ("float16", "bfloat16") not in refused
    assert ("int32", "int8") not in refused  # same kind, narrower: allowed (wraps)


# ============================================================= layouts, values


@QUICK
@given(shape=P.shapes(max_ndim=4, max_extent=5), data=st.data())
def test_layout_views_have_the_logical_shape(shape, data):
    layout = data.draw(P.layouts(len(shape), negative=True))
    view = layout.view(shape)
    root = np.arange(math.prod(view.root_shape)).reshape(view.root_shape)
    v = view(root)
    assert v.shape == shape
    assert np.unique(v).size == v.size  # every element its own
    if layout == P.contiguous(len(shape)):
        assert view.root_shape == shape
        np.testing.assert_array_equal(v, root)
    for step, n, stride in zip((layout.steps[i] for i in range(len(shape))), shape, v.strides):
        if n > 1:
            assert (stride < 0) == (step < 0)


def test_device_layouts_follow_the_negative_steps_flag():
    strategy = P.device_layouts(3)

    @QUICK
    @given(layout=strategy)
    def check(layout):
        assert layout.negative is False or P.DEVICE_NEGATIVE_STEPS

    check()


@QUICK
@given(shape=P.shapes(), dtype=st.sampled_from(DTYPES), domain=st.sampled_from(P.DOMAINS),
       seed=st.integers(0, 2**32 - 1))
def test_values_keep_their_domain(shape, dtype, domain, seed):
    x = P.values(np.random.default_rng(seed), shape, dtype, domain)
    assert x.shape == shape and x.dtype == dtype and x.flags.c_contiguous
    if x.size:
        assert np.any(x != 0) or domain == "raw" and is_float(dtype)
    if domain == "raw" or x.size == 0:
        return
    w = x.astype(np.float64)
    if domain in ("signed", "positive", "gelu") and dtype != BOOL:
        assert np.all(w != 0)
    if domain == "positive":
        assert np.all(w > 0) and np.all(w <= (9 if is_int(dtype) or dtype == BOOL else 4))
    elif is_float(dtype):
        bound = {"signed": (-4, 4), "exponent": (-2, 2), "gelu": (-2, 4), "cond": (-4, 4)}[domain]
        assert bound[0] <= w.min() and w.max() <= bound[1]
    elif is_int(dtype):
        assert -9 <= w.min() and w.max() <= 9
        if dtype == U8:
            assert w.min() >= 0


@QUICK
@given(shape=P.shapes(), src=st.sampled_from(DTYPES), dst=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**32 - 1))
def test_cast_values_convert_without_out_of_range(shape, src, dst, seed):
    x = P.cast_values(np.random.default_rng(seed), shape, src, dst)
    assert x.shape == shape and x.dtype == src
    if x.size:
        assert np.any(x != 0)
    if is_float(src) and is_int(dst):
        info = np.iinfo(dst)
        w = np.trunc(x.astype(np.float64))
        assert np.all((info.min <= w) & (w <= info.max))  # defined float -> int casts only
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NumPy warns on invalid casts
        x.astype(dst)


def test_special_floats_are_placed_in_float_arrays_only():
    rng = np.random.default_rng(1)
    f = P.special_floats(rng, np.ones(4000, np.float32))
    assert np.isnan(f).any() and np.isinf(f).any() and np.signbit(f[f == 0]).all()
    i = np.ones(10, np.int32)
    assert P.special_floats(rng, i) is i


# ================================================================== references


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow",
                                "exp", "log", "sqrt", "tanh"])
def test_elementwise_reference_agrees_with_numpy(op):
    rng = np.random.default_rng(2)
    dom = [P.operand_domain(op, i, F64) for i in range(2)]
    a = P.values(rng, (5, 7), F64, dom[0])
    b = P.values(rng, (7,), F64, dom[1])
    args = (a,) if op in P.UNARY_OPS else (a, b)
    np.testing.assert_allclose(P.elementwise_reference(op, args, F64), NUMPY_UFUNCS[op](*args),
                               rtol=1e-15)
    ints = tuple(P.values(rng, 9, I8, dom[i]) for i in range(len(args)))
    r = P.elementwise_result(op, [x.dtype for x in ints])
    want = NUMPY_UFUNCS[op](*ints)
    if is_float(r):
        np.testing.assert_allclose(P.elementwise_reference(op, ints, r), want, rtol=1e-3)
    else:
        np.testing.assert_array_equal(P.elementwise_reference(op, ints, r), want)


def test_gelu_and_sigmoid_references():
    from _support import gelu_reference

    x = np.linspace(-2, 4, 61)
    np.testing.assert_allclose(P.elementwise_reference("gelu", [x], F64), gelu_reference(x))
    np.testing.assert_allclose(P.elementwise_reference("gelu_tanh", [x], F64),
                               gelu_reference(x, "tanh"))
    np.testing.assert_allclose(P.elementwise_reference("sigmoid", [x], F64), 1 / (1 + np.exp(-x)))


def test_axpy_reference_is_rounded_once():
    # 3 * (1 + 2**-52) - 3 is 3 * 2**-52 exactly; fma gives it, two roundings give 4 * 2**-52.
    x = np.array([1 + 2.0**-52])
    got = P.elementwise_reference("axpy", [3, x, np.array([-3.0])], F64)
    assert got[0] == 3 * 2.0**-52
    i = P.elementwise_reference("axpy", [2, np.array([100], np.int8), np.array([100], np.int8)], I8)
    assert i.dtype == I8 and i[0] == np.int8(44)  # 300 wraps to 44, as in NumPy


def test_exact_ops_are_rounded_to_the_result_dtype():
    x = np.array([-1.5, 0.25], dtype=F16)
    ref = P.elementwise_reference("maximum", [x, 0.5], F16)
    assert ref.dtype == F16
    np.testing.assert_array_equal(ref, np.array([0.5, 0.5], F16))
    cond = np.array([0, 2], dtype=I8)
    np.testing.assert_array_equal(P.elementwise_reference("where", [cond, 1, 2.5], F64), [2.5, 1])
    np.testing.assert_array_equal(
        P.elementwise_reference("clamp", [np.array([1, 5, 9], I8), 3, None], I8), [3, 5, 9])


def test_reduce_reference_and_shapes():
    x = np.arange(1, 13, dtype=np.int8).reshape(3, 4)
    ref, final = P.reduce_reference("sum", x, 1, False, None)
    assert final == I64
    np.testing.assert_array_equal(ref, [10, 26, 42])
    ref, final = P.reduce_reference("mean", x, None, True, "float32")
    assert final == F32 and ref.shape == (1, 1) and ref[0, 0] == 6.5
    ref, _ = P.reduce_reference("argmax", np.array([[1, 3, 3], [2, 2, 1]]), 1, True, None)
    np.testing.assert_array_equal(ref, [[1], [0]])  # ties: the first
    with pytest.raises(ValueError):
        P.reduce_reference("max", np.ones((3, 0)), 1, False, None)
    for shape, axis, keep in [((3, 4), 1, False), ((3, 4), -2, True), ((2, 0, 3), None, True),
                              ((5,), None, False), ((), None, False)]:
        want = np.sum(np.ones(shape), axis=axis, keepdims=keep).shape
        assert P.reduce_shape(shape, axis, keep) == want


def test_reduce_of_nothing_raises_exactly_where_numpy_does():
    """cudalab's rule (csrc/ops/reduce.c): max/min/argmax raise when the
    reduced extent is 0, whatever the result's size; NumPy agrees."""
    for shape in [(0,), (0, 0), (0, 3), (3, 0), (2, 0, 3), (0, 0, 2)]:
        for axis in [None, *range(-len(shape), len(shape))]:
            try:
                np.max(np.ones(shape), axis=axis)
                numpy_raises = False
            except ValueError:
                numpy_raises = True
            reduced = math.prod(shape) if axis is None else shape[axis]
            assert numpy_raises == (reduced == 0), (shape, axis)


def test_softmax_reference():
    x = np.random.default_rng(3).standard_normal((4, 6))
    for axis in (0, 1, -1):
        s = P.softmax_reference("softmax", x, axis)
        np.testing.assert_allclose(s.sum(axis=axis), 1.0)
        np.testing.assert_allclose(P.softmax_reference("log_softmax", x, axis), np.log(s))
    assert P.softmax_reference("softmax", np.ones((0, 3)), 1).shape == (0, 3)


# ================================================================== strategies


def _check_cases(strategy, check):
    @QUICK
    @given(case=strategy)
    def run(case):
        # The printed falsifying example must be pastable into @example(case=...).
        assert eval(repr(case), vars(G)) == case
        check(case)

    run()


def _check_ew(case: P.EwCase):
    arrays = [o for o in case.operands if isinstance(o, P.Arr)]
    assert arrays
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if case.out.mode in ("alias", "overlap"):
        target = case.operands[case.out.target]
        assert isinstance(target, P.Arr) and target.shape == shape
    if case.out.mode == "overlap":
        assert target.layout == P.contiguous(len(shape)) and shape[0] >= 1
    if case.out.mode == "strided":
        assert len(case.out.layout.steps) == len(shape)
    if case.form == "operator":
        assert case.op in P.OPERATOR_OPS and case.out.mode in ("none", "alias")
        assert case.out.target == 0
    strong = P.promote([P.dtype_key(o) for o in case.operands[case.op == "where":]])
    assert strong is not None


def test_elementwise_strategies_build_valid_cases():
    for strategy in (P.unary_cases(), P.binary_cases(), P.ternary_cases()):
        _check_cases(strategy, _check_ew)


def test_reduce_cases_are_valid():
    def check(case):
        nd = len(case.x.shape)
        assert case.axis is None or -nd <= case.axis < nd
        if case.out.mode == "alias":
            assert case.keepdims and case.x.shape[case.axis] == 1 and case.dtype is None
        if case.dtype is not None:
            assert P.can_cast(case.x.dtype, case.dtype)

    _check_cases(P.reduce_cases(), check)


def test_matmul_cases_are_valid():
    def check(case):
        shape = P.matmul_shape(case.a.shape, case.b.shape)  # np.matmul accepts the shapes
        if case.out.mode == "alias":
            assert case.a.shape == shape and case.a.layout == P.contiguous(len(shape))

    _check_cases(P.matmul_cases(), check)


def test_other_strategies_build_valid_cases():
    _check_cases(P.softmax_cases(), lambda c: len(c.x.shape) >= 1)
    _check_cases(P.transpose_cases(), lambda c: c.kind == "view" or len(c.x.shape) == 2)
    _check_cases(P.astype_cases(), lambda c: c.to in P.DTYPE_NAMES)
    _check_cases(P.copyto_cases(),
                 lambda c: np.broadcast_shapes(c.src.shape, c.dst.shape) == c.dst.shape)
    _check_cases(P.roundtrip_cases(), lambda c: len(c.host_layout.steps) == len(c.shape))


def test_scalars_are_exact_in_every_float_dtype():
    for k in range(-32, 33):
        v = k / P.SCALAR_EIGHTHS
        for d in (F16, BF16, F32):
            assert float(np.asarray(v).astype(d)) == v
    assert float(ml_dtypes.bfloat16(4.0)) == 4.0
