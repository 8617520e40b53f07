"""CPU tier: argument errors of pinned memory, non_blocking transfers and interop.

Every check here raises before any GPU call, so it runs without a device.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from _support import HAS_GPU, assert_arg_error, no_gpu_only

import cudalab


@pytest.mark.parametrize(
    ("shape", "exc", "match"),
    [
        ("x", TypeError, "^expected an int or a tuple of ints"),
        ((2, -1), ValueError, "^negative dimensions"),
        (1.5, TypeError, None),
        ((1,) * 9, ValueError, "^9 dimensions exceed"),
        (True, TypeError, None),
    ],
)
def test_pinned_empty_shape_errors(shape, exc, match):
    with assert_arg_error(exc, "pinned_empty", "shape", match=match):
        cudalab.pinned_empty(shape)


@pytest.mark.parametrize("dtype", ["complex64", "uint16", "not-a-dtype", object])
def test_pinned_empty_dtype_errors(dtype):
    with assert_arg_error(TypeError, "pinned_empty", "dtype"):
        cudalab.pinned_empty((2, 3), dtype)


def test_pinned_empty_missing_and_extra_arguments():
    with pytest.raises(TypeError, match="missing required argument 'shape'"):
        cudalab.pinned_empty()
    with pytest.raises(TypeError, match="unexpected keyword argument 'pin'"):
        cudalab.pinned_empty(3, pin=True)


@pytest.mark.parametrize("obj", [[1, 2], 3, None, memoryview(b"ab"), object()])
def test_is_pinned_rejects_non_ndarrays(obj):
    with assert_arg_error(TypeError, "is_pinned", "a", match=r"^expected a numpy\.ndarray"):
        cudalab.is_pinned(obj)


@pytest.mark.parametrize("obj", [object(), 3, [1.0, 2.0], "abc"])
def test_from_dlpack_rejects_non_producers(obj):
    with assert_arg_error(TypeError, "from_dlpack", "obj",
                          match="^expected an object with __dlpack__"):
        cudalab.from_dlpack(obj)


def test_from_dlpack_rejects_host_tensors():
    with pytest.raises(TypeError, match="host memory.*use cudalab.asarray"):
        cudalab.from_dlpack(np.arange(5, dtype=np.float32))


class _FakeProducer:
    """A DLPack producer on an unsupported device (ROCm = 10)."""

    def __dlpack__(self, stream=None, max_version=None):  # pragma: no cover - never called
        raise AssertionError("must not be asked for a capsule")

    def __dlpack_device__(self):
        return (10, 0)


def test_from_dlpack_rejects_non_cuda_devices():
    with pytest.raises(TypeError, match="DLPack device type 10, not a CUDA device"):
        cudalab.from_dlpack(_FakeProducer())


class _BadDevice:
    def __dlpack__(self, stream=None):  # pragma: no cover - never called
        raise AssertionError

    def __dlpack_device__(self):
        return "cuda"


def test_from_dlpack_bad_dlpack_device():
    with pytest.raises(TypeError, match=r"__dlpack_device__\(\) must return \(int, int\)"):
        cudalab.from_dlpack(_BadDevice())


class _CAI:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


_GOOD = dict(shape=(4,), typestr="<f4", data=(0x10000, False), version=3)


@pytest.mark.parametrize(
    ("change", "exc", "text"),
    [
        (dict(typestr="<c8"), TypeError, "unsupported __cuda_array_interface__ typestr"),
        (dict(typestr=">f4"), TypeError, "unsupported __cuda_array_interface__ typestr"),
        (dict(shape=[4]), TypeError, "['shape'] must be a tuple"),
        (dict(shape=(-1,)), ValueError, "negative extent"),
        (dict(data=0x10000), TypeError, "['data'] must be (int, bool)"),
        (dict(strides=(2,)), ValueError, "they must be multiples of the item size"),
        (dict(strides=(-6,)), ValueError, "they must be multiples of the item size"),
        (dict(strides=(4, 4)), ValueError, "'strides' has 2 entries for 1 dimensions"),
        (dict(mask=(0x20000, False)), TypeError, "masked arrays"),
        (dict(stream=0), ValueError, "0 is ambiguous"),
        (dict(stream="s"), TypeError, "expected None or an int stream handle"),
    ],
)
def test_asarray_cuda_array_interface_errors(change, exc, text):
    cai = dict(_GOOD)
    cai.update(change)
    with assert_arg_error(exc, "asarray", "obj", match=re.escape(text)):
        cudalab.asarray(_CAI(**cai))


def test_asarray_cuda_array_interface_missing_keys():
    with pytest.raises(ValueError, match="lacks 'shape', 'typestr' or 'data'"):
        cudalab.asarray(_CAI(shape=(3,), version=3))


def test_asarray_non_blocking_uses_truthiness():
    # Any object is accepted for non_blocking (its truth value is used); the
    # argument must not be what fails here.
    class Boom:
        def __bool__(self):
            raise ZeroDivisionError("truth")

    with pytest.raises(ZeroDivisionError):
        cudalab.asarray(np.zeros(3, np.float32), non_blocking=Boom())
    if not HAS_GPU:
        with pytest.raises(cudalab.NoDeviceError):
            cudalab.asarray(np.zeros(3, np.float32), non_blocking="x")


@no_gpu_only
def test_no_device_errors():
    with pytest.raises(cudalab.NoDeviceError, match="pinned_empty"):
        cudalab.pinned_empty(3)
    with pytest.raises(cudalab.NoDeviceError, match="is_pinned"):
        cudalab.is_pinned(np.zeros(3))
    with pytest.raises(cudalab.NoDeviceError, match="asarray"):
        cudalab.asarray(_CAI(**_GOOD))


def test_public_names():
    for name in ("pinned_empty", "is_pinned", "from_dlpack"):
        assert name in cudalab.__all__
        assert getattr(cudalab, name) is getattr(cudalab._core, name)
    assert hasattr(cudalab.DeviceArray, "__dlpack__")
    assert hasattr(cudalab.DeviceArray, "__dlpack_device__")
    assert "__cuda_array_interface__" in dir(cudalab.DeviceArray)
