"""CPU tier: transpose() and cudalab.random argument checking, the default
generator's Python-side state, and a pure-Python Philox4x32-10 reference
checked against the published known-answer vectors.

Every argument error is raised before the device is touched, so these pass
with or without a GPU. Message convention: ``"<func>() argument '<param>': ..."``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import cudalab
import cudalab.random as clr
from _support import BF16, PHILOX_KAT, arg_error, dtype_id, no_gpu_only, philox4x32_10

core = cudalab._core

METHODS = ["naive", "coalesced_write", "tiled", "tiled_padded", "best"]


# ------------------------------------------------ pure-Python Philox --------
# The reference (test_random_gpu.py checks the device against it) lives in
# _support; these tests pin it to the published vectors.


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_python_reference_philox_matches_published_vectors(counter, key, expected):
    assert philox4x32_10(counter, key) == expected


def test_python_reference_philox_is_sensitive_to_every_word():
    base = philox4x32_10((1, 2, 3, 4), (5, 6))
    for i in range(4):
        c = [1, 2, 3, 4]
        c[i] ^= 1
        assert philox4x32_10(tuple(c), (5, 6)) != base
    assert philox4x32_10((1, 2, 3, 4), (5, 7)) != base


# ------------------------------------------------------------ transpose -----


def test_transpose_is_exported():
    assert cudalab.transpose is core.transpose
    assert "transpose" in cudalab.__all__
    assert "random" in cudalab.__all__
    assert cudalab.random is clr


def test_transpose_docstring_lists_every_method():
    doc = core.transpose.__doc__
    assert core.transpose.__text_signature__ == "(a, method='best')"
    for m in METHODS:
        assert f"'{m}'" in doc


@pytest.mark.parametrize("bad", [np.zeros((2, 2), np.float32), [[1, 2]], None, 3.0])
def test_transpose_rejects_non_device_array(bad):
    with pytest.raises(TypeError, match=arg_error("transpose", "a") +
                       "expected a cudalab.DeviceArray, got .*cudalab.asarray"):
        cudalab.transpose(bad)


@pytest.mark.parametrize("method,exc", [("fast", ValueError), ("Best", ValueError),
                                        (None, TypeError), (1, TypeError), (b"best", TypeError)])
def test_transpose_method_checked_before_the_array(method, exc):
    """The method needs no array, so it is checked first: testable without a GPU."""
    with pytest.raises(exc, match=arg_error("transpose", "method")):
        cudalab.transpose("not an array", method=method)


def test_transpose_argument_count_and_keywords():
    with pytest.raises(TypeError, match="missing required argument 'a'"):
        cudalab.transpose()
    with pytest.raises(TypeError, match="unexpected keyword argument 'axes'"):
        cudalab.transpose(None, axes=(1, 0))
    with pytest.raises(TypeError, match="at most 2 positional"):
        cudalab.transpose(None, "best", 3)


# ------------------------------------------------------------- random -------

FUNCS = {
    "normal": lambda **kw: clr.normal(**{"shape": 4, **kw}),
    "uniform": lambda **kw: clr.uniform(**{"shape": 4, **kw}),
    "integers": lambda **kw: clr.integers(**{"shape": 4, "low": 10, **kw}),
}


@pytest.mark.parametrize("func", sorted(FUNCS))
@pytest.mark.parametrize(
    "shape,exc,msg",
    [
        ("abc", TypeError, "expected an int or a tuple of ints"),
        (2.5, TypeError, "expected an int or a tuple of ints"),
        ((2, -1), ValueError, "negative dimensions"),
        ((1,) * 9, ValueError, "exceed the maximum of 8"),
        ((2, "x"), TypeError, "expected an int"),
    ],
)
def test_random_shape_errors(func, shape, exc, msg):
    with pytest.raises(exc, match=arg_error(func, "shape") + ".*" + re.escape(msg)):
        FUNCS[func](shape=shape)


@pytest.mark.parametrize("func", sorted(FUNCS))
@pytest.mark.parametrize(
    "seed,exc,msg",
    [
        (-1, ValueError, "must be in [0, 2**64)"),
        (2**64, ValueError, "must be in [0, 2**64)"),
        (1.5, TypeError, "expected an int or None"),
        ("7", TypeError, "expected an int or None"),
        (True, TypeError, "expected an int or None"),
    ],
)
def test_random_seed_errors(func, seed, exc, msg):
    with pytest.raises(exc, match=arg_error(func, "seed") + ".*" + re.escape(msg)):
        FUNCS[func](seed=seed)


@pytest.mark.parametrize("func", ["normal", "uniform"])
@pytest.mark.parametrize("dtype", ["int32", np.int64, np.bool_, np.uint8])
def test_float_functions_reject_integer_dtypes(func, dtype):
    with pytest.raises(TypeError, match=arg_error(func, "dtype") + ".*expected a float dtype"):
        FUNCS[func](dtype=dtype)


@pytest.mark.parametrize("func", sorted(FUNCS))
def test_random_rejects_unsupported_dtype(func):
    with pytest.raises(TypeError, match=arg_error(func, "dtype")):
        FUNCS[func](dtype=np.complex64)
    with pytest.raises(TypeError, match=arg_error(func, "dtype")):
        FUNCS[func](dtype="not a dtype")


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, BF16, np.bool_, "uint16"], ids=dtype_id
)
def test_integers_rejects_non_integer_dtypes(dtype):
    with pytest.raises(TypeError, match=arg_error("integers", "dtype")):
        clr.integers(4, 0, 10, dtype=dtype)


@pytest.mark.parametrize(
    "kw,param,exc,msg",
    [
        ({"std": -1.0}, "std", ValueError, "must be >= 0"),
        ({"std": float("nan")}, "std", ValueError, "must be finite"),
        ({"std": float("inf")}, "std", ValueError, "must be finite"),
        ({"mean": float("nan")}, "mean", ValueError, "must be finite"),
        ({"mean": "0"}, "mean", TypeError, "expected a real number"),
        ({"mean": 1j}, "mean", TypeError, "expected a real number"),
        ({"std": None}, "std", TypeError, "expected a real number"),
    ],
)
def test_normal_parameter_errors(kw, param, exc, msg):
    with pytest.raises(exc, match=arg_error("normal", param) + ".*" + re.escape(msg)):
        clr.normal(3, **kw)


@pytest.mark.parametrize(
    "kw,param,exc,msg",
    [
        ({"low": 1.0, "high": 1.0}, "high", ValueError, "must be greater than low"),
        ({"low": 2.0, "high": 1.0}, "high", ValueError, "must be greater than low"),
        ({"low": float("-inf")}, "low", ValueError, "must be finite"),
        ({"high": float("nan")}, "high", ValueError, "must be finite"),
        ({"high": "1"}, "high", TypeError, "expected a real number"),
        # Equal once rounded to float16 (spacing 2**-10 near 1).
        ({"low": 1.0, "high": 1.0001, "dtype": np.float16}, "high", ValueError, "greater than low"),
        ({"low": 1.0, "high": 1.001, "dtype": BF16}, "high", ValueError,
         "greater than low"),
        ({"high": 1e6, "dtype": np.float16}, "high", ValueError, "overflows float16"),
        ({"low": -1e39, "high": 0.0, "dtype": np.float32}, "low", ValueError, "overflows"),
    ],
)
def test_uniform_parameter_errors(kw, param, exc, msg):
    with pytest.raises(exc, match=arg_error("uniform", param) + ".*" + re.escape(msg)):
        clr.uniform(3, **kw)


@pytest.mark.parametrize(
    "args,kw,param,exc,msg",
    [
        ((5, 5), {}, "high", ValueError, "must be greater than low"),
        ((5, 2), {}, "high", ValueError, "must be greater than low"),
        ((0,), {}, "low", ValueError, "must be positive when high is None"),
        ((-3,), {}, "low", ValueError, "must be positive when high is None"),
        ((0, 129), {"dtype": np.int8}, "high", ValueError, "out of bounds for int8"),
        ((-129, 0), {"dtype": np.int8}, "low", ValueError, "out of bounds for int8"),
        ((-1, 3), {"dtype": np.uint8}, "low", ValueError, "out of bounds for uint8"),
        ((257,), {"dtype": np.uint8}, "low", ValueError, "out of bounds for uint8"),
        ((0, 2**31 + 1), {"dtype": np.int32}, "high", ValueError, "out of bounds for int32"),
        ((0, 2**63 + 1), {}, "high", ValueError, "out of bounds for int64"),
        ((-(2**63) - 1, 0), {}, "low", ValueError, "out of bounds for int64"),
        ((0, 2**70), {}, "high", ValueError, "out of bounds for int64"),
        ((2**63, 2**63 + 5), {}, "low", ValueError, "out of bounds for int64"),
        ((2**64 + 3, 2**65), {}, "low", ValueError, "out of bounds for int64"),
        ((0, 2**63), {"dtype": np.int32}, "high", ValueError, "out of bounds for int32"),
        ((0, 2**64 + 1), {}, "high", ValueError, "out of bounds for int64"),
        ((-(2**70),), {}, "low", ValueError, "must be positive when high is None"),
        ((-(2**70), -(2**69)), {}, "low", ValueError, "out of bounds for int64"),
        ((5, -(2**70)), {}, "high", ValueError, "must be greater than low"),
        ((True, 3), {}, "low", TypeError, "expected an int"),
        ((1.5, 3), {}, "low", TypeError, "expected an int"),
        ((0, 3.0), {}, "high", TypeError, "expected an int"),
        ((0, "3"), {}, "high", TypeError, "expected an int"),
    ],
)
def test_integers_parameter_errors(args, kw, param, exc, msg):
    with pytest.raises(exc, match=arg_error("integers", param) + ".*" + re.escape(msg)):
        clr.integers(3, *args, **kw)


def test_integers_bounds_that_are_valid_reach_the_device_check():
    """One past the maximum is a valid exclusive high; so is the full int64 range."""
    valid = [
        ((0, 128), {"dtype": np.int8}),
        ((-128, 128), {"dtype": np.int8}),
        ((256,), {"dtype": np.uint8}),
        ((-(2**63), 2**63), {}),
        ((2**31,), {"dtype": np.int32}),
    ]
    for args, kw in valid:
        try:
            clr.integers(3, *args, seed=1, **kw)
        except cudalab.NoDeviceError:
            pass  # the arguments were accepted; only the device is missing


def test_integers_requires_low():
    with pytest.raises(TypeError, match="missing required argument 'low'"):
        core._random_integers(3)
    with pytest.raises(TypeError):
        clr.integers(3)  # Python-level signature


PRIVATE = {
    "normal": core._random_normal,
    "uniform": core._random_uniform,
    "integers": lambda *a, **kw: core._random_integers(*a[:1], 10, *a[1:], **kw),
}


@pytest.mark.parametrize("func", sorted(PRIVATE))
@pytest.mark.parametrize("param", ["seed", "offset"])
def test_private_seed_and_offset_are_checked(func, param):
    fn = PRIVATE[func]
    for value, exc, msg in [
        (-1, ValueError, "must be non-negative, got -1"),
        (-(2**70), ValueError, "must be non-negative"),
        (2**64, ValueError, r"must be less than 2\*\*64"),
        (1.0, TypeError, "expected an int, got float"),
        (True, TypeError, "expected an int, got bool"),
    ]:
        with pytest.raises(exc, match=arg_error(func, param) + ".*" + msg):
            fn(3, **{param: value})


def test_private_functions_accept_the_full_seed_and_offset_range():
    for fn in PRIVATE.values():
        try:
            fn(3, seed=2**64 - 1, offset=2**63)
        except cudalab.NoDeviceError:
            pass  # the arguments were accepted; only the device is missing


@pytest.mark.parametrize(
    "counter,key,exc,msg",
    [
        ((0, 0, 0), (0, 0), ValueError, "expected 4 words"),
        ((0, 0, 0, 0), (0,), ValueError, "expected 2 words"),
        ((0, 0, 0, 2**32), (0, 0), ValueError, "does not fit in 32 bits"),
        ((0, 0, 0, -1), (0, 0), ValueError, "non-negative"),
        ("abcd", (0, 0), TypeError, "expected a tuple or list"),
        ((0, 0, 0, 0), (0.5, 0), TypeError, "expected an int"),
    ],
)
def test_philox_kat_function_checks_arguments(counter, key, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)):
        core._philox4x32_10(counter, key)


def test_seed_function_validates():
    with pytest.raises(TypeError, match=arg_error("seed", "seed")):
        clr.seed(1.5)
    with pytest.raises(ValueError, match=arg_error("seed", "seed")):
        clr.seed(-5)


def test_seed_resets_the_default_offset():
    clr.seed(1234)
    assert (clr._default.key, clr._default.offset) == (1234, 0)
    clr._default.offset = 17
    clr.seed(1234)
    assert clr._default.offset == 0
    clr.seed()  # fresh entropy
    assert clr._default.offset == 0
    assert 0 <= clr._default.key < 2**64


def test_failed_calls_do_not_advance_the_default_generator():
    clr.seed(99)
    with pytest.raises(ValueError):
        clr.normal(3, std=-1.0)
    with pytest.raises(TypeError):
        clr.uniform("x")
    assert clr._default.offset == 0


def test_default_generator_advances_only_on_success():
    clr.seed(5)
    if cudalab.is_available():
        clr.uniform(3)
        clr.normal(3)
        assert clr._default.offset == 2
    else:
        with pytest.raises(cudalab.NoDeviceError, match="uniform"):
            clr.uniform(3)
        assert clr._default.offset == 0


def test_explicit_seed_leaves_the_default_generator_alone():
    clr.seed(7)
    try:
        clr.normal(3, seed=3)
    except cudalab.NoDeviceError:
        pass
    assert (clr._default.key, clr._default.offset) == (7, 0)


@no_gpu_only
def test_without_gpu_valid_calls_raise_no_device_error():
    for call, name in [
        (lambda: clr.normal(3, seed=1), "random.normal"),
        (lambda: clr.uniform(3, seed=1), "random.uniform"),
        (lambda: clr.integers(3, 5, seed=1), "random.integers"),
        (lambda: core._philox4x32_10((0, 0, 0, 0), (0, 0)), "_philox4x32_10"),
    ]:
        with pytest.raises(cudalab.NoDeviceError, match=re.escape(name + "()")):
            call()


def test_random_docstrings():
    for fn in (clr.normal, clr.uniform, clr.integers, clr.seed):
        assert fn.__doc__ and "Parameters" in fn.__doc__
    for fn in (core._random_normal, core._random_uniform, core._random_integers,
               core._philox4x32_10):
        assert fn.__text_signature__ is not None
