"""CPU tier (issue 21): what of reversed views, empty out= and get(out=) can be
checked without a device.

A DeviceArray needs a GPU, so the behaviour itself is tested in
test_negative_steps_gpu.py. Here: a __cuda_array_interface__ with negative
strides passes the argument checks (they run before any GPU call) while
strides that are not whole items are still refused, and the docstrings say
what the API now does.
"""

from __future__ import annotations

import re

import pytest
from _support import HAS_GPU, assert_arg_error

import cudalab


class _CAI:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


# A made-up address: with a GPU the import stops at "host memory", without one
# at NoDeviceError; either way after the strides were accepted.
_BASE = dict(typestr="<f4", data=(0x10000 + 4096, False), version=3)


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((4,), (-4,)), ((3, 5), (-20, 4)), ((3, 5), (20, -8)), ((2, 3, 4), (-48, 16, -4)),
     ((3, 1), (-4, -400))],
    ids=repr,
)
def test_cai_import_takes_negative_strides(shape, strides):
    cai = dict(_BASE, shape=shape, strides=strides)
    expected = TypeError if HAS_GPU else cudalab.NoDeviceError
    with pytest.raises(expected) as info:
        cudalab.asarray(_CAI(**cai))
    assert "strides" not in str(info.value)
    if HAS_GPU:
        assert "host memory" in str(info.value)


@pytest.mark.parametrize("strides", [(-6,), (6,), (-2,), (-1,)], ids=repr)
def test_cai_import_still_wants_whole_items(strides):
    cai = dict(_BASE, shape=(4,), strides=strides)
    with assert_arg_error(ValueError, "asarray", "obj",
                          match=re.escape("they must be multiples of the item size")):
        cudalab.asarray(_CAI(**cai))


def test_docstrings_describe_negative_steps():
    doc = cudalab.DeviceArray.__doc__
    assert "positive steps" not in doc
    assert "a[::-1] is a view" in doc
    assert "negative" in cudalab.DeviceArray.strides.__doc__
    assert "negative" in cudalab.DeviceArray.__cuda_array_interface__.__doc__
    assert "negative" in cudalab.DeviceArray.__dlpack__.__doc__
    assert "negative" in cudalab.from_dlpack.__doc__
    assert "c[::-1]" in cudalab.matmul.__doc__
    assert "an empty array of the right shape always is" in cudalab.matmul.__doc__


def test_get_docstring_takes_any_out_layout():
    doc = cudalab.DeviceArray.get.__doc__
    assert "any strides" in doc
    assert "C-contiguous (or with this array's own" not in doc
