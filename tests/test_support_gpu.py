"""GPU tier: the device side of the shared test helpers in _support.py.

Device views made by strided_views / device_and_host / view_recipes have the
strides their host twins have and hold the same values, so an op test that
compares the two really feeds the op strided device inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import _support as S
import cudalab

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", S.DTYPES, ids=S.DTYPE_IDS)
@pytest.mark.parametrize("shape", [(7,), (37, 129), (3, 5, 7), (2, 0, 3)], ids=str)
def test_strided_views_match_on_the_device(rng, dtype, shape):
    pairs = S.strided_views(rng, shape, dtype)
    assert [p.name for p in pairs] == [v.name for v in S.layouts(shape)]
    for name, dev, host in pairs:
        assert isinstance(dev, cudalab.DeviceArray), name
        assert dev.shape == host.shape == shape
        assert dev.dtype == host.dtype == dtype
        if host.size:
            assert dev.strides == host.strides, name
            assert dev.is_contiguous == host.flags.c_contiguous, name
        S.assert_bit_equal(dev, host)


def test_device_and_host_layouts(rng):
    for layout in ("contiguous", "offset", "stepped", "transposed", "rotated"):
        dev, host = S.device_and_host(rng, (4, 6, 5), np.float32, layout=layout)
        assert dev.strides == host.strides
        S.assert_bit_equal(dev, host)
        assert layout == "contiguous" or dev.base is not None  # a view of its root


@settings(max_examples=40, deadline=None)
@given(view=S.view_recipes(max_extent=7))
def test_view_recipes_on_the_device(view):
    host = S.random_array(np.random.default_rng(0), view.root_shape, np.float16)
    dev = view(cudalab.asarray(host))
    assert dev.strides == view(host).strides
    S.assert_bit_equal(dev, view(host))


def test_comparisons_take_device_arrays(rng):
    x = S.random_array(rng, (33, 17), S.BF16)
    d = cudalab.asarray(x)
    S.assert_close(d, S.widen(x), S.BF16)
    S.assert_bit_equal(d.T, x.T)
    assert S.rel_err(d, x) == 0.0
    assert isinstance(S.to_host(d), np.ndarray)
    with pytest.raises(AssertionError):
        S.assert_close(d, S.widen(x) * 1.1)


def test_assert_arg_error_on_a_device_check():
    d = cudalab.zeros((2, 3), dtype=np.float32)
    with S.assert_arg_error(ValueError, "transpose", "method", match="'naive'"):
        cudalab.transpose(d, method="fast")
