"""GPU tier: copyto(dst, src) against NumPy's np.copyto.

Every dtype pair NumPy's 'same_kind' rule allows, bit for bit; every layout
of dst and src (contiguous, strided, transposed; odd sizes, so the
vectorized path's tail and its unaligned fallback both run); broadcasting;
overlapping src and dst; the refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
from _support import (BF16, DTYPE_IDS, DTYPES, F16, F32, assert_arg_error, assert_bit_equal,
                      random_array, strided_views)

import cudalab

pytestmark = pytest.mark.gpu

SHAPE = (13, 37)


@pytest.mark.parametrize("dst_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("src_dtype", DTYPES, ids=DTYPE_IDS)
def test_every_dtype_pair(rng, src_dtype, dst_dtype):
    h = random_array(rng, SHAPE, src_dtype)
    dst = cudalab.full(SHAPE, 7, dtype=dst_dtype)
    try:
        expect = np.empty(SHAPE, dst_dtype)
        with np.errstate(over="ignore"):  # large ints to float16 give inf, as on the GPU
            np.copyto(expect, h, casting="same_kind")
    except TypeError:
        with assert_arg_error(TypeError, "copyto", "src", "same_kind"):
            cudalab.copyto(dst, cudalab.asarray(h))
        return
    assert cudalab.copyto(dst, cudalab.asarray(h)) is None
    assert_bit_equal(dst, expect)


@pytest.mark.parametrize("dtypes", [(F32, BF16), (F32, F16), (F16, F32), (F32, F32)],
                         ids=["f32_bf16", "f32_f16", "f16_f32", "f32_f32"])
def test_every_layout(rng, dtypes):
    src_dtype, dst_dtype = dtypes
    for s in strided_views(rng, SHAPE, src_dtype):
        for d in strided_views(rng, SHAPE, dst_dtype):
            before = d.device.get()
            cudalab.copyto(d.device, s.device)
            assert_bit_equal(d.device, s.host.astype(dst_dtype))
            assert before.shape == SHAPE


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1_000_003])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_flat_sizes_and_misaligned_starts(rng, n, offset):
    """The vectorized path (aligned, n // 4 vectors plus the tail) and the
    scalar fallback (a start that is not 4-element aligned)."""
    h = random_array(rng, n + offset, F32)
    src = cudalab.asarray(h)[offset:]
    dst_root = cudalab.full((n + 2 * offset,), 9, dtype=BF16)
    dst = dst_root[offset:offset + n]
    cudalab.copyto(dst, src)
    want = np.full(n + 2 * offset, 9, dtype=BF16)
    want[offset:offset + n] = h[offset:].astype(BF16)
    assert_bit_equal(dst_root, want)


def test_broadcasting(rng):
    row = random_array(rng, (1, 37), F32)
    col = random_array(rng, (13, 1), F32)
    vec = random_array(rng, (37,), F32)
    for h in (row, col, vec):
        dst = cudalab.empty(SHAPE, dtype=F16)
        cudalab.copyto(dst, cudalab.asarray(h))
        assert_bit_equal(dst, np.broadcast_to(h, SHAPE).astype(F16))
    with assert_arg_error(ValueError, "copyto", "src", "does not broadcast"):
        cudalab.copyto(cudalab.empty(SHAPE, dtype=F32), cudalab.asarray(random_array(rng, 13, F32)))
    with assert_arg_error(ValueError, "copyto", "src", "does not broadcast"):
        cudalab.copyto(cudalab.empty((37,), dtype=F32), cudalab.asarray(row))


def test_overlapping_src_and_dst(rng):
    """src a shifted view of dst's buffer: the result is as if src was read first."""
    h = random_array(rng, 100, F32)
    d = cudalab.asarray(h)
    cudalab.copyto(d[1:], d[:-1])
    want = h.copy()
    want[1:] = h[:-1]
    assert_bit_equal(d, want)
    d = cudalab.asarray(h)
    cudalab.copyto(d, d)  # exactly itself: unchanged
    assert_bit_equal(d, h)


def test_empty_and_refusals(rng):
    cudalab.copyto(cudalab.empty((0, 3), dtype=F32), cudalab.empty((0, 3), dtype=F32))
    with assert_arg_error(TypeError, "copyto", "src", "expected a cudalab.DeviceArray"):
        cudalab.copyto(cudalab.empty(3, dtype=F32), np.ones(3, np.float32))
    with assert_arg_error(TypeError, "copyto", "src", "same_kind"):
        cudalab.copyto(cudalab.empty(3, dtype=np.int32), cudalab.ones(3, dtype=F32))


def test_on_a_non_default_stream_and_profiled(rng):
    h = random_array(rng, SHAPE, F32)
    src = cudalab.asarray(h)
    dst = cudalab.empty(SHAPE, dtype=BF16)
    s = cudalab.Stream()
    with cudalab.profiler.profile() as prof, s:
        cudalab.copyto(dst, src)
    s.synchronize()
    assert_bit_equal(dst, h.astype(BF16))
    [ev] = [e for e in prof.events() if e.name == "copyto"]
    assert ev.bytes == h.size * (4 + 2)
