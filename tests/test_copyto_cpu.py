"""CPU tier: copyto's argument checks that need no device array."""

from __future__ import annotations

import numpy as np
import pytest
from _support import assert_arg_error

import cudalab


def test_dst_must_be_a_device_array():
    with assert_arg_error(TypeError, "copyto", "dst", "expected a cudalab.DeviceArray"):
        cudalab.copyto(np.zeros(3), np.zeros(3))


def test_both_arguments_are_required():
    with pytest.raises(TypeError, match="copyto"):
        cudalab.copyto(np.zeros(3))


def test_exported_with_numpys_signature():
    assert "copyto" in cudalab.__all__
    assert cudalab.copyto.__text_signature__ == "(dst, src)"
