"""GPU tier: edge cases of cudalab.models (issue 21).

* max_pool2d propagates NaN: a NaN anywhere in a window makes that output
  NaN, for every float dtype, on the vectorised path (channels a multiple of
  16 bytes) and the scalar one; against np.max over the windows and, where
  torch is installed, torch's max_pool2d.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
import cudalab.models as models
from cudalab.models import ops

pytestmark = pytest.mark.gpu

FLOATS = ("float32", "float16", "bfloat16", "float64")


# ---- max_pool2d and NaN ------------------------------------------------------------------------


def _with_nans(rng, shape, dtype):
    """(device array, its values as float64) with about 5% NaN, the rest random."""
    x = rng.standard_normal(shape)
    x[rng.random(shape) < 0.05] = np.nan
    d = cudalab.asarray(x, dtype=dtype)
    return d, d.astype("float64").get()


def _np_max_pool(x, kernel=3, stride=2, padding=1):
    """np.max over every window of -inf padded NHWC `x` (np.max propagates NaN)."""
    p = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)),
               constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(p, (kernel, kernel), axis=(1, 2))
    return win[:, ::stride, ::stride].max(axis=(-2, -1))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 13, 11, 5), (1, 9, 8, 64)], ids=["scalar", "vector"])
def test_max_pool2d_propagates_nan(rng, dtype, shape):
    d, x = _with_nans(rng, shape, dtype)
    want = _np_max_pool(x)
    assert np.isnan(want).any() and (~np.isnan(want)).any()  # both kinds of window
    got = ops.max_pool2d(d).astype("float64").get()
    np.testing.assert_array_equal(got, want)  # NaN where want has NaN, equal elsewhere
    np.testing.assert_array_equal(models.reference.max_pool(x, 3, 2, 1), want)


@pytest.mark.parametrize("position", range(9))
def test_max_pool2d_nan_at_every_window_position(position):
    """One NaN at each of the 9 places of a 3x3 window (stride 3, no overlap)."""
    x = np.arange(1, 2 * 9 * 9 * 8 + 1, dtype=np.float64).reshape(2, 9, 9, 8)
    ky, kx = divmod(position, 3)
    x[:, ky::3, kx::3, 1::2] = np.nan  # odd channels get a NaN in every window
    got = ops.max_pool2d(cudalab.asarray(x, dtype="float32"), kernel=3, stride=3,
                         padding=0).get()
    assert np.isnan(got[..., 1::2]).all()
    np.testing.assert_array_equal(got[..., ::2], _np_max_pool(x, 3, 3, 0)[..., ::2])


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool2d_matches_torch_with_nan(rng, dtype):
    torch = pytest.importorskip("torch")
    d, x = _with_nans(rng, (2, 12, 15, 16), dtype)
    got = ops.max_pool2d(d).astype("float64").get()
    t = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    want = torch.nn.functional.max_pool2d(t, 3, 2, 1).numpy().transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(got, want)
