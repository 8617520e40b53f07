"""CPU tier: argument checking of softmax and log_softmax.

Every check here happens before the device is touched, so it behaves the same
with and without a GPU. The arguments that need no array (axis type, out type)
are checked before `a` itself; the checks against an array (dtype, axis range,
out's shape and dtype) are in the GPU tier, since an array needs a device.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from _support import arg_error, no_gpu_only

FUNCS = ["softmax", "log_softmax"]


@pytest.mark.parametrize("func", FUNCS)
def test_public_and_documented(func):
    f = getattr(cudalab, func)
    assert f is getattr(cudalab._core, func)
    assert func in cudalab.__all__
    assert f.__text_signature__ == "(a, axis=-1, out=None)"
    for section in ("Parameters\n----------", "Returns\n-------", "Raises\n------",
                    "Notes\n-----"):
        assert section in f.__doc__
    assert "float16, bfloat16, float32 or float64" in f.__doc__


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("bad", [np.ones(3, dtype=np.float32), [1.0, 2.0], 3.0, None])
def test_a_must_be_device_array(func, bad):
    with pytest.raises(TypeError, match=arg_error(func, "a") +
                       "expected a cudalab.DeviceArray, got .*cudalab.asarray"):
        getattr(cudalab, func)(bad)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("axis", ["0", 1.0, True, None, (0,), object()])
def test_axis_must_be_int(func, axis):
    with pytest.raises(TypeError, match=arg_error(func, "axis") + "expected an int"):
        getattr(cudalab, func)(np.ones(3), axis=axis)


@pytest.mark.parametrize("func", FUNCS)
def test_axis_huge_is_value_error(func):
    with pytest.raises(ValueError, match=arg_error(func, "axis") + ".*out of range"):
        getattr(cudalab, func)(np.ones(3), axis=-(2**80))


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("out", [np.zeros(3), 0, "out", [0.0, 0.0, 0.0]])
def test_out_must_be_device_array(func, out):
    with pytest.raises(TypeError, match=arg_error(func, "out") +
                       "expected a cudalab.DeviceArray or None, got"):
        getattr(cudalab, func)(np.ones(3), out=out)


@pytest.mark.parametrize("func", FUNCS)
def test_argument_order(func):
    """axis, then out, then a: the first bad one is named."""
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match=arg_error(func, "axis")):
        f("not an array", axis="x", out="not an array")
    with pytest.raises(TypeError, match=arg_error(func, "out")):
        f("not an array", axis=0, out="not an array")
    with pytest.raises(TypeError, match=arg_error(func, "a")):
        f("not an array", axis=-3, out=None)


@pytest.mark.parametrize("func", FUNCS)
def test_signature_errors(func):
    f = getattr(cudalab, func)
    with pytest.raises(TypeError, match="missing required argument 'a'"):
        f()
    with pytest.raises(TypeError, match="unexpected keyword argument 'dim'"):
        f(np.ones(3), dim=0)
    with pytest.raises(TypeError, match="at most 3 positional"):
        f(np.ones(3), -1, None, None)
    with pytest.raises(TypeError, match="multiple values for argument 'axis'"):
        f(np.ones(3), 0, axis=0)


@no_gpu_only
@pytest.mark.parametrize("func", FUNCS)
def test_positional_arguments_reach_the_array_check(func):
    with pytest.raises(TypeError, match=arg_error(func, "a")):
        getattr(cudalab, func)(np.float32(1.0), 0, None)
