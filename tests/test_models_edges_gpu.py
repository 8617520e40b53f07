"""GPU tier: edge cases of cudalab.models (issue 21).

* max_pool2d propagates NaN: a NaN anywhere in a window makes that output
  NaN, for every float dtype, on the vectorised path (channels a multiple of
  16 bytes) and the scalar one; against np.max over the windows and, where
  torch is installed, torch's max_pool2d;
* ResNet50.forward on a contiguous but misaligned input (``batch[1:]`` of
  36 x 36 images: 15552 bytes per image, not a multiple of 256) gives what a
  fresh copy gives; a misaligned or strided ``out`` is written too; the same
  inside a user's CUDA graph capture, whose workspace survives the LRU;
* the per-shape LRU: with max_cached_shapes, older shapes' workspaces are
  freed (memory_allocated drops); a GraphedForward keeps replaying after its
  shape was dropped.
"""

from __future__ import annotations

import gc

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


# ---- ResNet50: misaligned input and out ---------------------------------------------------------

SIZE = 36  # 36 * 36 * 3 * 4 = 15552 bytes per image: batch[1:] is 64-byte aligned only


@pytest.fixture(scope="module")
def state():
    return models.init_weights(seed=5, random_stats=True)


@pytest.fixture(scope="module")
def fp32(state):
    return models.resnet50(state, precision="fp32")


def _batch(seed, n):
    return np.random.default_rng(seed).standard_normal((n, SIZE, SIZE, 3), dtype=np.float32)


def test_forward_of_a_misaligned_view_equals_a_fresh_copy(fp32):
    h = _batch(1, 4)
    d = cudalab.asarray(h)
    view = d[1:]
    assert view.is_contiguous and view.data_ptr % 256 != 0
    want = fp32(cudalab.asarray(h[1:])).get()
    np.testing.assert_array_equal(fp32(view).get(), want)
    np.testing.assert_array_equal(fp32.forward(view).get(), want)
    np.testing.assert_array_equal(d.get(), h)  # the input is not touched


@pytest.mark.parametrize("kind", ["misaligned", "strided"])
def test_forward_into_an_out_that_is_not_a_slot(fp32, kind):
    h = _batch(2, 3)
    want = fp32(cudalab.asarray(h)).get()
    if kind == "misaligned":
        big = cudalab.zeros((4, 1000), dtype="float32")
        out = big[1:]  # 4000 bytes in: 32-byte aligned only
        assert out.is_contiguous and out.data_ptr % 256 != 0
    else:
        big = cudalab.zeros((3, 2000), dtype="float32")
        out = big[:, ::2]
        assert not out.is_contiguous
    assert fp32.forward(cudalab.asarray(h), out=out) is out
    np.testing.assert_array_equal(out.get(), want)
    rest = big.get()[:1] if kind == "misaligned" else big.get()[:, 1::2]
    assert (rest == 0).all()  # nothing written outside out
    view = cudalab.asarray(np.concatenate([h[:1], h]))[1:]  # both misaligned at once
    assert fp32.forward(view, out=out) is out
    np.testing.assert_array_equal(out.get(), want)


def test_captured_forward_of_a_misaligned_view(state):
    """The copy to an aligned buffer is captured too; the model keeps the graph's
    workspace although the LRU drops its shape."""
    model = models.resnet50(state, precision="fp32", max_cached_shapes=1)
    h = _batch(3, 3)
    d = cudalab.asarray(h)
    view, out = d[1:], cudalab.zeros((2, 1000), dtype="float32")
    want = model(cudalab.asarray(h[1:])).get()  # compiles outside the capture
    g = cudalab.CUDAGraph()
    with cudalab.graph(g):
        model(view, out=out)
    model(cudalab.asarray(_batch(4, 5)))  # another shape: (2, 36, 36) leaves the LRU
    assert model.cached_shapes == [(5, SIZE, SIZE)]
    g.replay()
    np.testing.assert_array_equal(out.get(), want)
    h2 = _batch(5, 3)
    cudalab.copyto(d, cudalab.asarray(h2))  # new values at the captured address
    g.replay()
    np.testing.assert_array_equal(out.get(), model(cudalab.asarray(h2[1:])).get())
    model.release()


# ---- ResNet50: the per-shape LRU ----------------------------------------------------------------


def _allocated() -> int:
    gc.collect()
    cudalab.synchronize()
    return cudalab.memory_allocated()


def test_lru_frees_the_workspaces_of_dropped_shapes(state):
    model = models.resnet50(state, precision="fp32", max_cached_shapes=1)
    assert model.max_cached_shapes == 1 and model.max_cached_bytes is None
    # 64 x 64: the batch-32 workspace (about 45 MB) dwarfs the batch-1 one (1.4 MB).
    big = cudalab.asarray(np.random.default_rng(6).standard_normal((32, 64, 64, 3),
                                                                   dtype=np.float32))
    small = cudalab.asarray(np.random.default_rng(7).standard_normal((1, 64, 64, 3),
                                                                     dtype=np.float32))
    model(small)  # cuBLAS's per-stream workspace exists from here on
    model.release()
    base = _allocated()
    model(big)
    with_big = _allocated() - base
    assert with_big >= model.workspace_bytes(32, 64, 64)
    model(small)  # drops batch 32 first, then allocates batch 1
    with_small = _allocated() - base
    assert model.cached_shapes == [(1, 64, 64)]
    assert model.workspace_bytes(1, 64, 64) <= with_small < with_big / 4
    model.max_cached_shapes = 3
    for n in (2, 3, 4):
        model(cudalab.asarray(_batch(n, n)))
    assert model.cached_shapes == [(n, SIZE, SIZE) for n in (2, 3, 4)]
    assert model.cached_bytes == sum(model.workspace_bytes(n, SIZE, SIZE) for n in (2, 3, 4))
    model.max_cached_bytes = model.workspace_bytes(4, SIZE, SIZE)
    assert model.cached_shapes == [(4, SIZE, SIZE)]
    model.release()
    assert _allocated() - base < with_small


def test_default_keeps_four_shapes(state):
    model = models.resnet50(state, precision="fp32")
    assert model.max_cached_shapes == models.resnet.DEFAULT_MAX_CACHED_SHAPES == 4
    for n in range(1, 7):
        model(cudalab.asarray(_batch(n, n)))
    assert model.cached_shapes == [(n, SIZE, SIZE) for n in (3, 4, 5, 6)]
    model.release()


def test_graphed_forward_survives_its_shape_leaving_the_lru(state):
    model = models.resnet50(state, precision="fp32", max_cached_shapes=1)
    graphed = model.capture(2, SIZE, SIZE)
    x = cudalab.asarray(_batch(8, 2))
    want = model(x).get()
    model(cudalab.asarray(_batch(9, 3)))  # drops (2, 36, 36) from the model
    assert model.cached_shapes == [(3, SIZE, SIZE)]
    np.testing.assert_array_equal(graphed(x).get(), want)
