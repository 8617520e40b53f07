"""CPU tier: argument checking of sum, mean, max, min and argmax.

Every check here happens before the device is touched, so it behaves the same
with and without a GPU. Arguments that need no array (axis type, dtype, out)
are checked before `a` itself; range checks against the array's shape are in
the GPU tier (an array needs a device).
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from _support import arg_error

OPS = ["sum", "mean", "max", "min", "argmax"]


@pytest.mark.parametrize("op", OPS)
def test_public_and_documented(op):
    f = getattr(cudalab, op)
    assert f is getattr(cudalab._core, op)
    assert op in cudalab.__all__
    assert f.__doc__ and "Parameters" in f.__doc__ and "Returns" in f.__doc__
    assert f.__text_signature__.startswith("(a, axis=None, keepdims=False")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [np.ones(3, dtype=np.float32), [1.0, 2.0], 3.0, None])
def test_a_must_be_device_array(op, bad):
    with pytest.raises(TypeError, match=arg_error(op, "a") + "expected a cudalab.DeviceArray"):
        getattr(cudalab, op)(bad)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis", ["0", 1.0, True, object()])
def test_axis_must_be_int(op, axis):
    with pytest.raises(TypeError, match=arg_error(op, "axis") + "expected an int"):
        getattr(cudalab, op)(np.ones(3), axis=axis)


@pytest.mark.parametrize("op", OPS)
def test_axis_sequence_of_several_rejected(op):
    with pytest.raises(TypeError, match=arg_error(op, "axis") + ".*sequence of 2 axes"):
        getattr(cudalab, op)(np.ones(3), axis=(0, 1))
    with pytest.raises(TypeError, match=arg_error(op, "axis")):
        getattr(cudalab, op)(np.ones(3), axis=())
    with pytest.raises(TypeError, match=arg_error(op, "axis") + "expected an int"):
        getattr(cudalab, op)(np.ones(3), axis=("x",))


@pytest.mark.parametrize("op", OPS)
def test_axis_huge_is_value_error(op):
    with pytest.raises(ValueError, match=arg_error(op, "axis") + ".*out of range"):
        getattr(cudalab, op)(np.ones(3), axis=2**80)


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("dtype", ["complex64", "uint64", "float128-not-a-dtype", object])
def test_bad_dtype(op, dtype):
    with pytest.raises(TypeError, match=arg_error(op, "dtype")):
        getattr(cudalab, op)(np.ones(3), dtype=dtype)


@pytest.mark.parametrize("op", ["max", "min", "argmax"])
def test_no_dtype_parameter(op):
    with pytest.raises(TypeError, match="unexpected keyword argument 'dtype'"):
        getattr(cudalab, op)(np.ones(3), dtype="float32")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("out", [np.zeros(()), 0, "out"])
def test_out_must_be_device_array(op, out):
    with pytest.raises(TypeError, match=arg_error(op, "out") +
                       "expected a cudalab.DeviceArray or None, got .*cudalab.asarray"):
        getattr(cudalab, op)(np.ones(3), out=out)


@pytest.mark.parametrize("op", OPS)
def test_keepdims_truthiness_errors_propagate(op):
    class Bad:
        def __bool__(self):
            raise RuntimeError("no truth value")

    with pytest.raises(RuntimeError, match="no truth value"):
        getattr(cudalab, op)(np.ones(3), keepdims=Bad())


@pytest.mark.parametrize("op", OPS)
def test_signature_errors(op):
    f = getattr(cudalab, op)
    with pytest.raises(TypeError, match="missing required argument 'a'"):
        f()
    with pytest.raises(TypeError, match="unexpected keyword argument 'axes'"):
        f(np.ones(3), axes=0)
    with pytest.raises(TypeError, match="at most"):
        f(np.ones(3), None, False, None, None, None)
    with pytest.raises(TypeError, match="multiple values for argument 'axis'"):
        f(np.ones(3), 0, axis=0)


def test_valid_non_array_arguments_reach_the_array_check():
    """Well-formed axis/keepdims/dtype/out pass through to the 'a' check."""
    for op in OPS:
        kwargs = {"axis": -1, "keepdims": 1, "out": None}
        if op in ("sum", "mean"):
            kwargs["dtype"] = "bfloat16"
        with pytest.raises(TypeError, match=arg_error(op, "a")):
            getattr(cudalab, op)("not an array", **kwargs)
        with pytest.raises(TypeError, match=arg_error(op, "a")):
            getattr(cudalab, op)("not an array", axis=(0,), keepdims=[])


@pytest.mark.parametrize("op", OPS)
def test_signature_and_docstring_sections(op):
    """Each function's text signature and numpydoc sections come from the op table."""
    f = getattr(cudalab, op)
    dtype = "dtype=None, " if op in ("sum", "mean") else ""
    assert f.__text_signature__ == f"(a, axis=None, keepdims=False, {dtype}out=None)"
    doc = f.__doc__
    assert ("dtype : dtype-like" in doc) == (op in ("sum", "mean"))
    for section in ("Parameters\n----------", "Returns\n-------"):
        assert section in doc
    if op in ("max", "min", "argmax"):
        assert "Raises\n------\nValueError" in doc
    else:
        assert "bit-identical" in doc
