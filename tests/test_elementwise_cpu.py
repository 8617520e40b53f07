"""CPU tier: element-wise ops' dtype promotion and argument checking.

Needs no GPU. DeviceArrays cannot be made without one, so operands here are
scalars: Python scalars (weak, NEP 50), NumPy scalars (strong, typed like 0-d
arrays) and, for ``_core._elementwise_result_type``, NumPy dtypes standing for
arrays of that dtype. The promotion table is checked against NumPy 2 itself.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cudalab
from _support import BF16, DTYPES, arg_error
from _references import NUMPY_REFERENCES

core = cudalab._core
result_type = core._elementwise_result_type

IDS = [d.name for d in DTYPES]
SUPPORTED = set(DTYPES)

# NumPy's ufuncs for the ops whose result dtypes are checked against NumPy's
# (from tests/_references.py, the one reference table).
BINARY = {name: NUMPY_REFERENCES[name]
          for name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow")}
FLOAT_UNARY = {name: NUMPY_REFERENCES[name] for name in ("exp", "log", "sqrt", "tanh")}


def numpy_dtype(ufunc, *operands):
    """The dtype NumPy's ufunc gives (arrays stand in for dtypes), or None if it raises."""
    args = [np.ones(2, dtype=o) if isinstance(o, np.dtype) else o for o in operands]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ufunc(*args).dtype
    except (TypeError, OverflowError):
        return None


def numpy_result_type(*operands):
    try:
        return np.result_type(*operands)
    except TypeError:  # ml_dtypes defines no promotion for some bfloat16 pairs
        return None


# ------------------------------------------------------------ promotion ----


@pytest.mark.parametrize("func", sorted(BINARY))
@pytest.mark.parametrize("x", DTYPES, ids=IDS)
@pytest.mark.parametrize("y", DTYPES, ids=IDS)
def test_binary_promotion_matches_numpy(func, x, y):
    """All 9x9 array pairs: the dtype NumPy 2 gives, or a TypeError where
    NumPy fails (bool - bool) or leaves the supported dtypes (int8 + uint8)."""
    expected = numpy_dtype(BINARY[func], x, y)
    if expected is None or expected not in SUPPORTED:
        with pytest.raises(TypeError, match=arg_error(func, "b") + "|" + arg_error(func, "a")):
            result_type(func, x, y)
        return
    assert result_type(func, x, y) == expected
    # Where np.result_type itself is defined, the arithmetic ops agree with it.
    rt = numpy_result_type(x, y)
    if rt is not None and func in ("add", "mul", "maximum", "minimum"):
        assert result_type(func, x, y) == rt


def test_bfloat16_pairs_without_numpy_result_type():
    """np.result_type raises for bfloat16 with int32/int64/float16; we follow
    the loops ml_dtypes' ufuncs use (like float16: int32 -> float64)."""
    assert result_type("add", BF16, np.dtype(np.float16)) == np.float32
    assert result_type("add", np.dtype(np.float16), BF16) == np.float32
    assert result_type("add", BF16, np.dtype(np.int32)) == np.float64
    assert result_type("mul", np.dtype(np.int64), BF16) == np.float64
    assert result_type("add", BF16, np.dtype(np.int8)) == BF16
    assert result_type("add", BF16, np.dtype(np.float32)) == np.float32


@pytest.mark.parametrize("func", sorted(BINARY))
@pytest.mark.parametrize("x", DTYPES, ids=IDS)
@pytest.mark.parametrize("scalar", [True, 3, 1.5], ids=["bool", "int", "float"])
def test_weak_python_scalars(func, x, scalar):
    """Python scalars are weak (NEP 50), on either side."""
    for operands in ((x, scalar), (scalar, x)):
        expected = numpy_dtype(BINARY[func], *operands)
        if x == BF16 and isinstance(scalar, float):
            # ml_dtypes' loops give float32 here (np.result_type says float64);
            # we keep NEP 50's rule, as for float16: the float array's dtype.
            expected = BF16
        if expected is None:
            with pytest.raises(TypeError, match=arg_error(func, "a") + "|" + arg_error(func, "b")):
                result_type(func, *operands)
            continue
        assert result_type(func, *operands) == expected, operands
        rt = numpy_result_type(*operands)
        if rt is not None and func in ("add", "mul") and x != BF16:
            assert result_type(func, *operands) == rt


@pytest.mark.parametrize("x", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    "scalar",
    [np.bool_(True), np.int8(2), np.uint8(2), np.int32(2), np.int64(2), np.float16(2),
     ml_dtypes.bfloat16(2), np.float32(2), np.float64(2)],
    ids=IDS,
)
def test_numpy_scalars_are_strong(x, scalar):
    """A NumPy scalar promotes like an array of its dtype (NEP 50)."""
    expected = numpy_dtype(np.add, x, scalar)
    if expected is None or expected not in SUPPORTED:
        with pytest.raises(TypeError):
            result_type("add", x, scalar)
    else:
        assert result_type("add", x, scalar) == expected
        assert result_type("add", x, np.dtype(type(scalar))) == expected


@pytest.mark.parametrize("func", sorted(FLOAT_UNARY))
@pytest.mark.parametrize("x", DTYPES, ids=IDS)
def test_float_unary_result_dtype(func, x):
    """exp/log/sqrt/tanh: NumPy's loops (bool/int8/uint8 -> float16,
    int32/int64 -> float64); sigmoid and gelu follow the same rule."""
    expected = numpy_dtype(FLOAT_UNARY[func], x)
    assert result_type(func, x) == expected
    assert result_type("sigmoid", x) == expected
    assert result_type("gelu", x) == expected


@pytest.mark.parametrize("x", DTYPES, ids=IDS)
def test_neg_abs_relu_result_dtype(x):
    if x == np.bool_:
        with pytest.raises(TypeError, match=arg_error("neg", "a") + ".*bool"):
            result_type("neg", x)
        with pytest.raises(TypeError, match=arg_error("relu", "a") + ".*bool"):
            result_type("relu", x)
    else:
        assert result_type("neg", x) == numpy_dtype(np.negative, x)
        assert result_type("relu", x) == x
    assert result_type("abs", x) == numpy_dtype(np.absolute, x)


@pytest.mark.parametrize("x", DTYPES, ids=IDS)
@pytest.mark.parametrize("y", DTYPES, ids=IDS)
def test_axpy_result_dtype(x, y):
    """axpy(alpha, x, y) is one fused operation: it promotes like
    np.result_type(alpha, x, y) (not like the two-step alpha * x + y)."""
    for alpha in (2, 0.5, np.float32(0.5)):
        if x == BF16 or y == BF16:
            continue  # np.result_type is partial for bfloat16; covered above
        expected = numpy_result_type(alpha, x, y)
        if x == y == np.bool_ and isinstance(alpha, int):
            expected = np.dtype(np.int64)  # NEP 50: a Python int makes bool int64
        if expected is None or expected not in SUPPORTED:
            with pytest.raises(TypeError):
                result_type("axpy", alpha, x, y)
        else:
            assert result_type("axpy", alpha, x, y) == expected, alpha


def test_bool_arithmetic_rules():
    b = np.dtype(np.bool_)
    assert result_type("add", b, b) == np.bool_
    assert result_type("mul", b, b) == np.bool_
    assert result_type("div", b, b) == np.float64
    assert result_type("sub", b, 1) == np.int64
    with pytest.raises(TypeError, match=arg_error("sub", "a") + ".*bool"):
        result_type("sub", b, b)
    with pytest.raises(TypeError, match=arg_error("sub", "a") + ".*bool"):
        result_type("sub", b, True)


def test_python_int_out_of_range():
    """NumPy 2 refuses a Python int that does not fit the integer result dtype."""
    with pytest.raises(OverflowError, match=arg_error("add", "b") + ".*300.*int8"):
        result_type("add", np.dtype(np.int8), 300)
    with pytest.raises(OverflowError, match=arg_error("maximum", "b") + ".*-1.*uint8"):
        result_type("maximum", np.dtype(np.uint8), -1)
    with pytest.raises(OverflowError, match="int64"):
        result_type("add", np.dtype(np.int64), 2**63)
    with pytest.raises(OverflowError, match="int64"):
        result_type("add", np.dtype(np.bool_), 2**64)
    # A float result dtype takes any int (NumPy: int8 / 300 is float64).
    assert result_type("div", np.dtype(np.int8), 300) == np.float64
    assert result_type("add", np.dtype(np.float32), 2**70) == np.float32
    assert result_type("add", np.dtype(np.int32), -(2**31)) == np.int32


# ------------------------------------------------------- argument errors ----

# The op table's functions by signature (a new op joins its family's tests).
_SIGNATURES = {name: getattr(core, name).__text_signature__ for name in core._ELEMENTWISE_OPS}
ALL_BINARY = [n for n, s in _SIGNATURES.items() if s == "(a, b, out=None)"]
ALL_UNARY = [n for n, s in _SIGNATURES.items()
             if s in ("(a, out=None)", "(a, approximate='none', out=None)")]
ALL_GRAD = [n for n, s in _SIGNATURES.items() if s.startswith("(grad, x, ")]  # backward
OTHERS = ["axpy", "clamp", "where"]  # a signature of their own each


@pytest.mark.parametrize("func", ALL_BINARY)
@pytest.mark.parametrize("bad", ["x", None, [1.0, 2.0], 1 + 2j, object()],
                         ids=["str", "None", "list", "complex", "object"])
def test_binary_rejects_non_numeric_operands(func, bad):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "a") + ".*DeviceArray or a real scalar"):
        f(bad, 1.0)
    with pytest.raises(TypeError, match=arg_error(func, "b") + ".*DeviceArray or a real scalar"):
        f(np.float32(1), bad)


@pytest.mark.parametrize("func", ALL_BINARY)
def test_binary_rejects_host_arrays(func):
    f = getattr(cudalab, func)
    host = np.ones(3, dtype=np.float32)
    with pytest.raises(TypeError, match=arg_error(func, "a") + ".*host arrays.*asarray"):
        f(host, 1.0)
    with pytest.raises(TypeError, match=arg_error(func, "b") + ".*host arrays.*asarray"):
        f(np.float32(1), host)
    with pytest.raises(TypeError, match=arg_error(func, "b") + ".*host arrays"):
        f(np.float32(1), np.array(2.0))  # 0-d arrays too


@pytest.mark.parametrize("func", ALL_BINARY)
def test_binary_needs_a_device_array(func):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "a") + ".*at least one operand"):
        f(1.0, 2.0)
    with pytest.raises(TypeError, match=arg_error(func, "a") + ".*at least one operand"):
        f(np.float32(1), np.float32(2))


@pytest.mark.parametrize("func", ALL_BINARY)
@pytest.mark.parametrize("bad", [5, "out", np.zeros(2, np.float32), [0.0]],
                         ids=["int", "str", "ndarray", "list"])
def test_out_must_be_a_device_array(func, bad):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "out")):
        f(np.float32(1), np.float32(2), out=bad)


@pytest.mark.parametrize("func", ALL_UNARY)
@pytest.mark.parametrize("bad", [1.0, 2, True, np.float32(1), np.ones(2), "x", None],
                         ids=["float", "int", "bool", "npscalar", "ndarray", "str", "None"])
def test_unary_needs_a_device_array(func, bad):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "a")):
        f(bad)


@pytest.mark.parametrize("func", ALL_UNARY)
def test_unary_out_checked_before_device(func):
    # The operand error comes first, but a bad `out` alone is named too.
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "a")):
        f(1.0, out=3)


def test_unsupported_scalar_dtypes():
    with pytest.raises(TypeError, match=arg_error("add", "b") + ".*unsupported dtype.*int16"):
        cudalab.add(np.float32(1), np.int16(2))
    with pytest.raises(TypeError, match=arg_error("mul", "a") + ".*unsupported dtype"):
        cudalab.mul(np.complex64(1), np.float32(2))
    with pytest.raises(TypeError, match=arg_error("add", "b") + ".*int16"):
        cudalab.add(np.int8(1), np.uint8(2))  # NumPy would give int16


def test_bool_subtraction_is_a_type_error():
    with pytest.raises(TypeError, match=arg_error("sub", "a") + ".*subtraction.*bool"):
        cudalab.sub(np.bool_(True), np.bool_(False))
    with pytest.raises(TypeError, match=arg_error("sub", "a") + ".*bool"):
        cudalab.sub(np.bool_(True), False)


def test_python_int_overflow_through_the_function():
    with pytest.raises(OverflowError, match=arg_error("add", "b") + ".*out of bounds for int8"):
        cudalab.add(np.int8(1), 1000)


def test_gelu_approximate():
    with pytest.raises(ValueError, match=arg_error("gelu", "approximate") + ".*'none' or 'tanh'"):
        cudalab.gelu(1.0, approximate="fast")
    with pytest.raises(TypeError, match=arg_error("gelu", "approximate")):
        cudalab.gelu(1.0, approximate=True)
    with pytest.raises(TypeError, match=arg_error("gelu", "approximate")):
        cudalab.gelu(1.0, approximate=None)
    # A valid approximate still needs a DeviceArray.
    for approximate in ("none", "tanh"):
        with pytest.raises(TypeError, match=arg_error("gelu", "a")):
            cudalab.gelu(1.0, approximate=approximate)


@pytest.mark.parametrize("x", DTYPES, ids=IDS)
@pytest.mark.parametrize("grad", DTYPES, ids=IDS)
def test_activation_grad_result_dtype(grad, x):
    """relu_grad: NumPy's promotion, bool refused; gelu_grad: the float rule of gelu."""
    promoted = numpy_result_type(grad, x)
    if promoted is None or np.dtype(promoted) not in SUPPORTED:
        return  # int16 and bfloat16 pairs: covered by the promotion tests
    promoted = np.dtype(promoted)
    if promoted == np.bool_:
        with pytest.raises(TypeError, match=arg_error("relu_grad", "grad") + ".*bool"):
            result_type("relu_grad", grad, x)
    else:
        assert result_type("relu_grad", grad, x) == promoted
    expected = {np.dtype(t): np.dtype(np.float16) for t in (np.bool_, np.int8, np.uint8)}
    expected.update({np.dtype(t): np.dtype(np.float64) for t in (np.int32, np.int64)})
    assert result_type("gelu_grad", grad, x) == expected.get(promoted, promoted)


@pytest.mark.parametrize("func", ALL_GRAD)
def test_activation_grad_arguments(func):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "grad") + ".*DeviceArray or a real scalar"):
        f("g", 1.0)
    with pytest.raises(TypeError, match=arg_error(func, "x") + ".*host arrays.*asarray"):
        f(np.float32(1), np.ones(3, np.float32))
    with pytest.raises(TypeError, match=arg_error(func, "grad") + ".*at least one operand"):
        f(1.0, 2.0)
    with pytest.raises(TypeError, match=arg_error(func, "out")):
        f(np.float32(1), np.float32(2), out=np.zeros(2))
    with pytest.raises(TypeError, match="missing required argument 'x'"):
        f(1.0)
    with pytest.raises(TypeError, match="multiple values for argument 'grad'"):
        f(1.0, grad=2.0)
    assert result_type(func, np.dtype(np.float32), 2.0) == np.float32


def test_gelu_grad_approximate():
    with pytest.raises(ValueError,
                       match=arg_error("gelu_grad", "approximate") + ".*'none' or 'tanh'"):
        cudalab.gelu_grad(1.0, 1.0, approximate="fast")
    with pytest.raises(TypeError, match=arg_error("gelu_grad", "approximate")):
        cudalab.gelu_grad(1.0, 1.0, approximate=None)
    with pytest.raises(TypeError, match=arg_error("gelu_grad", "approximate")):
        cudalab.gelu_grad(1.0, 1.0, 3)  # third positional is approximate
    with pytest.raises(TypeError, match="at most 4 positional"):
        cudalab.gelu_grad(1.0, 1.0, "tanh", None, None)
    for approximate in ("none", "tanh"):
        with pytest.raises(TypeError, match=arg_error("gelu_grad", "grad") + ".*at least one"):
            cudalab.gelu_grad(1.0, 1.0, approximate=approximate)
    with pytest.raises(TypeError, match="unexpected keyword argument 'approximate'"):
        cudalab.relu_grad(1.0, 1.0, approximate="tanh")


def test_axpy_arguments():
    with pytest.raises(TypeError, match=arg_error("axpy", "alpha") + ".*real scalar"):
        cudalab.axpy("2", np.float32(1), np.float32(1))
    with pytest.raises(TypeError, match=arg_error("axpy", "alpha") + ".*host arrays"):
        cudalab.axpy(np.ones(3), np.float32(1), np.float32(1))
    with pytest.raises(TypeError, match=arg_error("axpy", "x")):
        cudalab.axpy(2.0, "x", np.float32(1))
    with pytest.raises(TypeError, match=arg_error("axpy", "y") + ".*host arrays"):
        cudalab.axpy(2.0, np.float32(1), np.ones(2))
    with pytest.raises(TypeError, match=arg_error("axpy", "out")):
        cudalab.axpy(2.0, np.float32(1), np.float32(1), out=1)
    with pytest.raises(TypeError, match="missing required argument 'y'"):
        cudalab.axpy(2.0, np.float32(1))
    with pytest.raises(TypeError, match=arg_error("axpy", "x") + ".*at least one operand"):
        cudalab.axpy(2.0, 1.0, 2.0)


@pytest.mark.parametrize("func", ALL_BINARY)
def test_call_signature_errors(func):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match="missing required argument 'b'"):
        f(1.0)
    with pytest.raises(TypeError, match="at most 3 positional"):
        f(1.0, 2.0, None, None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'where'"):
        f(1.0, 2.0, where=True)
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        f(1.0, a=2.0)


def test_signatures_and_docstrings():
    for name in ALL_BINARY:
        f = getattr(cudalab, name)
        assert f.__text_signature__ == "(a, b, out=None)"
        assert "Parameters" in f.__doc__ and "Returns" in f.__doc__
    for name in ALL_UNARY:
        f = getattr(cudalab, name)
        expected = "(a, approximate='none', out=None)" if name == "gelu" else "(a, out=None)"
        assert f.__text_signature__ == expected
        assert "Parameters" in f.__doc__
    assert cudalab.axpy.__text_signature__ == "(alpha, x, y, out=None)"
    assert cudalab.clamp.__text_signature__ == "(a, lo=None, hi=None, out=None)"
    assert cudalab.where.__text_signature__ == "(cond, a, b, out=None)"
    assert cudalab.relu_grad.__text_signature__ == "(grad, x, out=None)"
    assert cudalab.gelu_grad.__text_signature__ == "(grad, x, approximate='none', out=None)"
    for name in ALL_GRAD:
        doc = getattr(cudalab, name).__doc__
        assert "Parameters" in doc and "Returns" in doc and "torch" in doc
    for name in ALL_BINARY + ALL_UNARY + ALL_GRAD + OTHERS:
        assert name in cudalab.__all__
        assert getattr(cudalab, name) is getattr(core, name)


def test_result_type_helper_errors():
    with pytest.raises(ValueError, match="unknown function"):
        result_type("nope", np.dtype(np.float32), 2.0)
    with pytest.raises(TypeError, match="takes 2 operands"):
        result_type("add", np.dtype(np.float32))
    with pytest.raises(TypeError, match="unsupported dtype"):
        result_type("add", np.dtype(np.int16), 1)


# ------------------------------------------------------------ pow ----------


def test_pow_result_dtypes():
    """Beyond the 9x9 table above: bool ** bool is int8, as NumPy has no
    bool power loop; scalars are weak."""
    b = np.dtype(np.bool_)
    assert result_type("pow", b, b) == np.int8
    assert result_type("pow", b, True) == np.int8
    assert result_type("pow", np.dtype(np.int32), 2) == np.int32
    assert result_type("pow", np.dtype(np.int32), 2.0) == np.float64
    assert result_type("pow", 2, np.dtype(np.uint8)) == np.uint8
    assert result_type("pow", np.dtype(np.float16), 3) == np.float16
    assert result_type("pow", BF16, 0.5) == BF16


@pytest.mark.parametrize("x", [np.int8, np.uint8, np.int32, np.int64, np.bool_], ids=str)
@pytest.mark.parametrize("exponent", [-1, -(2**70), np.int64(-2), np.int8(-1)], ids=str)
def test_pow_negative_integer_scalar_exponent(x, exponent):
    """An integer result with a negative scalar exponent is NumPy's
    ValueError (or its OverflowError, where the exponent does not fit)."""
    x = np.dtype(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            np.power(np.ones(2, x), exponent)
        except (ValueError, OverflowError) as e:
            expected = type(e)
        else:
            expected = None
    if x == np.uint8 and isinstance(exponent, np.int8):
        with pytest.raises(TypeError, match="int16"):  # NumPy's int16, which we lack
            result_type("pow", x, exponent)
        return
    assert expected is not None
    match = arg_error("pow", "b") + (
        ".*Integers to negative integer powers are not allowed"
        if expected is ValueError
        else ".*out of bounds"
    )
    with pytest.raises(expected, match=match):
        result_type("pow", x, exponent)


def test_pow_negative_exponent_allowed_for_floats():
    assert result_type("pow", np.dtype(np.int32), -1.0) == np.float64
    assert result_type("pow", np.dtype(np.float32), -1) == np.float32
    assert result_type("pow", np.dtype(np.float16), np.int8(-3)) == np.float16
    assert result_type("pow", -2, np.dtype(np.int32)) == np.int32  # a negative base is fine


def test_pow_through_the_function():
    with pytest.raises(ValueError, match=arg_error("pow", "b") + ".*negative integer powers"):
        cudalab.pow(np.int32(2), -1)
    with pytest.raises(TypeError, match=arg_error("pow", "a") + ".*at least one operand"):
        cudalab.pow(2.0, 3)


# ------------------------------------------------------------ clamp --------

NON_BF16 = [d for d in DTYPES if d != BF16]
NON_BF16_IDS = [d.name for d in NON_BF16]


@pytest.mark.parametrize("x", NON_BF16, ids=NON_BF16_IDS)
@pytest.mark.parametrize("lo", NON_BF16, ids=NON_BF16_IDS)
def test_clamp_result_dtype_matches_numpy(x, lo):
    """clamp's dtype is np.clip's: the promotion of a and the bounds given."""
    for bounds in ((lo, None), (None, lo), (lo, lo), (lo, x)):
        args = [np.ones(2, b) if b is not None else None for b in bounds]
        expected = np.clip(np.ones(2, x), *args).dtype
        if expected not in SUPPORTED:
            with pytest.raises(TypeError, match="int16"):
                result_type("clamp", x, *bounds)
        else:
            assert result_type("clamp", x, *bounds) == expected, bounds


@pytest.mark.parametrize("x", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    "bounds", [(0, 1), (-1, None), (None, 2.5), (True, None), (np.float32(0), 1), (0.5, 100)],
    ids=str,
)
def test_clamp_with_scalar_bounds(x, bounds):
    """Python scalars are weak; a Python int beyond an integer a's range is
    ignored, as np.clip does."""
    args = [np.ones(2, x)] + list(bounds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected = np.clip(*args).dtype
        except (TypeError, OverflowError) as e:
            expected = type(e)
    if x == BF16:
        # np.clip has no bfloat16 loop and computes in float32; clamp keeps
        # NEP 50's rule, as for float16 (torch.clamp keeps bfloat16 too).
        strong = any(isinstance(b, np.float32) for b in bounds)
        assert result_type("clamp", x, *bounds) == (np.float32 if strong else BF16)
        return
    if isinstance(expected, type) and issubclass(expected, Exception):
        with pytest.raises(expected):
            result_type("clamp", x, *bounds)
    else:
        assert result_type("clamp", x, *bounds) == expected


def test_clamp_ignores_python_int_bounds_beyond_the_range():
    i8, u8 = np.dtype(np.int8), np.dtype(np.uint8)
    assert result_type("clamp", i8, -1000, 1000) == i8
    assert result_type("clamp", u8, -1, 1000) == u8
    assert result_type("clamp", u8, -(2**70), None) == u8
    assert result_type("clamp", i8, None, 2**70) == i8
    # The other side of the range is NumPy's OverflowError.
    with pytest.raises(OverflowError, match=arg_error("clamp", "lo") + ".*1000.*int8"):
        result_type("clamp", i8, 1000, None)
    with pytest.raises(OverflowError, match=arg_error("clamp", "hi") + ".*-1000.*int8"):
        result_type("clamp", i8, None, -1000)
    # An ignored bound takes no part in the promotion (np.clip drops it).
    assert result_type("clamp", i8, -1000, np.dtype(np.int32)) == np.int32
    # A NumPy integer is strong: never ignored, it promotes.
    assert result_type("clamp", i8, np.int64(-1000), None) == np.int64


def test_clamp_arguments():
    at_least_one = arg_error("clamp", "lo") + ".*at least one of 'lo' and 'hi'"
    with pytest.raises(TypeError, match=at_least_one):
        result_type("clamp", np.dtype(np.float32), None, None)
    with pytest.raises(TypeError, match=arg_error("clamp", "a") + ".*expected a cudalab.Device"):
        cudalab.clamp(1.0, 0.0, 1.0)
    with pytest.raises(TypeError, match=arg_error("clamp", "a") + ".*asarray"):
        cudalab.clamp(np.ones(3, np.float32), 0.0, 1.0)
    with pytest.raises(TypeError, match=arg_error("clamp", "lo") + ".*host arrays"):
        result_type("clamp", np.dtype(np.float32), np.ones(3), None)
    with pytest.raises(TypeError, match=arg_error("clamp", "hi") + ".*real scalar"):
        result_type("clamp", np.dtype(np.float32), None, "1")
    with pytest.raises(TypeError, match=arg_error("clamp", "hi") + ".*int16"):
        result_type("clamp", np.dtype(np.uint8), None, np.int8(3))
    with pytest.raises(TypeError, match="missing required argument 'a'"):
        cudalab.clamp(lo=0.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'min'"):
        cudalab.clamp(1.0, min=0.0)
    with pytest.raises(TypeError, match="takes 3 operands"):
        result_type("clamp", np.dtype(np.float32), 0.0)


# ------------------------------------------------------------ where --------


@pytest.mark.parametrize("x", NON_BF16, ids=NON_BF16_IDS)
@pytest.mark.parametrize("y", NON_BF16, ids=NON_BF16_IDS)
def test_where_result_dtype_matches_numpy(x, y):
    """np.where's dtype: the promotion of a and b; cond's dtype takes no part."""
    expected = np.where(np.ones(2, np.bool_), np.ones(2, x), np.ones(2, y)).dtype
    for cond in (np.bool_, np.float32, np.int8):
        if expected not in SUPPORTED:
            with pytest.raises(TypeError, match=arg_error("where", "b") + ".*int16"):
                result_type("where", np.dtype(cond), x, y)
        else:
            assert result_type("where", np.dtype(cond), x, y) == expected


@pytest.mark.parametrize(
    "a,b",
    [(1, 2), (1, 2.0), (True, False), (True, 2), (np.float32(1), 2), (np.float16(1), 2.5),
     (np.int8(1), 3), (np.uint8(1), np.int32(2)), (2.5, np.int64(1))],
    ids=str,
)
def test_where_with_scalars(a, b):
    """Python scalars are weak; two Python scalars give NumPy's defaults."""
    expected = np.where(np.ones(2, np.bool_), a, b).dtype
    assert result_type("where", np.dtype(np.bool_), a, b) == expected
    assert result_type("where", np.dtype(np.float64), b, a) == np.where(True, b, a).dtype


def test_where_arguments():
    f32, b = np.dtype(np.float32), np.dtype(np.bool_)
    assert result_type("where", b, BF16, BF16) == BF16
    assert result_type("where", b, BF16, 1.0) == BF16
    assert result_type("where", b, np.dtype(np.int8), 3) == np.int8
    with pytest.raises(OverflowError, match=arg_error("where", "b") + ".*300.*int8"):
        result_type("where", b, np.dtype(np.int8), 300)  # NumPy itself wraps to 44
    for bad in (True, 1.0, np.bool_(True), "x", None):
        with pytest.raises(TypeError, match=arg_error("where", "cond") + ".*DeviceArray"):
            cudalab.where(bad, 1.0, 2.0)
    with pytest.raises(TypeError, match=arg_error("where", "cond") + ".*asarray"):
        cudalab.where(np.ones(3, np.bool_), 1.0, 2.0)
    with pytest.raises(TypeError, match=arg_error("where", "a") + ".*real scalar"):
        result_type("where", b, "x", f32)
    with pytest.raises(TypeError, match=arg_error("where", "b") + ".*host arrays"):
        result_type("where", b, f32, np.ones(3))
    with pytest.raises(TypeError, match=arg_error("where", "cond") + ".*unsupported dtype"):
        result_type("where", np.dtype(np.int16), f32, f32)
    with pytest.raises(TypeError, match="missing required argument 'b'"):
        cudalab.where(1.0, 2.0)
    with pytest.raises(TypeError, match="takes 3 operands"):
        result_type("where", b, f32)


# ----------------------------------------------------- the function list ----


def test_elementwise_functions_are_reexported_and_stubbed():
    """Every function of the C op table is cudalab.<name>, in __all__ and in _core.pyi."""
    names = core._ELEMENTWISE_OPS
    assert len(names) == len(set(names))
    assert set(ALL_BINARY + ALL_UNARY + ALL_GRAD + OTHERS) == set(names)  # every op tested
    stub = Path(cudalab.__file__).parent / "_core.pyi"
    if not stub.exists():
        pytest.skip("_core.pyi is not installed next to the package")
    pyi = stub.read_text()
    for name in names:
        assert getattr(cudalab, name) is getattr(core, name)
        assert name in cudalab.__all__
        assert f"def {name}(" in pyi, name
