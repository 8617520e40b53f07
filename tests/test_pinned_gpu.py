"""GPU tier: pinned host memory and asynchronous transfers."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import cudalab

pytestmark = pytest.mark.gpu

DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, ml_dtypes.bfloat16,
          np.float32, np.float64]


def _random(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(1, 100, size=shape).astype(dtype)
    return (rng.standard_normal(shape) + 3.0).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_pinned_empty_is_pinned_ndarray(dtype):
    p = cudalab.pinned_empty((37, 129), dtype)
    assert isinstance(p, np.ndarray)
    assert p.shape == (37, 129) and p.dtype == np.dtype(dtype)
    assert p.flags.c_contiguous and p.flags.writeable
    assert cudalab.is_pinned(p)
    assert cudalab.is_pinned(p[3:, 5::2])  # views of pinned memory are pinned
    assert not cudalab.is_pinned(np.empty((37, 129), dtype))


def test_pinned_defaults_and_int_shape():
    p = cudalab.pinned_empty(7)
    assert p.shape == (7,) and p.dtype == np.float32 and cudalab.is_pinned(p)
    e = cudalab.pinned_empty((0, 3))
    assert e.size == 0 and cudalab.is_pinned(e)
    assert not cudalab.is_pinned(np.zeros(0))


def test_pinned_memory_freed_with_array():
    # Repeatedly allocating 64 MiB would exhaust page-locked memory quickly if
    # blocks leaked; the base owner frees them when the array dies.
    for _ in range(40):
        p = cudalab.pinned_empty(16 * 1024 * 1024, np.float32)
        p[::4096] = 1.0
        base = p.base
        assert base is not None
        del p, base
    gc.collect()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(1,), (7,), (1000003,), (37, 129)])
def test_non_blocking_round_trip(rng, dtype, shape):
    src = cudalab.pinned_empty(shape, dtype)
    src[...] = _random(rng, shape, dtype)
    expected = src.copy()
    a = cudalab.asarray(src, non_blocking=True)
    back = cudalab.pinned_empty(shape, dtype)
    out = a.get(out=back, non_blocking=True)
    assert out is back
    cudalab.synchronize()
    np.testing.assert_array_equal(back.view(np.uint8), expected.view(np.uint8))


def test_non_blocking_from_pageable_is_synchronous(rng):
    src = rng.standard_normal(100001).astype(np.float32)
    a = cudalab.asarray(src, non_blocking=True)
    src[:] = 0  # safe: the pageable copy already finished
    assert np.array_equal(a.get(), a.get())
    assert a.get()[0] != 0 or a.get()[1] != 0
    out = np.empty_like(src)
    r = a.get(out=out, non_blocking=True)  # pageable out: synchronous
    assert r is out and np.count_nonzero(out) > 0


def test_non_blocking_keeps_source_alive(rng):
    src = cudalab.pinned_empty(1 << 20, np.float32)
    src[:] = rng.standard_normal(1 << 20).astype(np.float32)
    expected = src.copy()
    a = cudalab.asarray(src, non_blocking=True)
    del src
    gc.collect()  # the pending copy still reads valid memory
    np.testing.assert_array_equal(a.get(), expected)


def test_non_blocking_chain_with_compute(rng):
    x = rng.standard_normal((513, 257)).astype(np.float32)
    p = cudalab.pinned_empty(x.shape)
    p[...] = x
    a = cudalab.asarray(p, non_blocking=True)
    b = cudalab.add(a, 1.5)
    out = cudalab.pinned_empty(x.shape)
    b.get(out=out, non_blocking=True)
    cudalab.synchronize()
    ref = x.astype(np.float64) + 1.5
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-6


def test_get_out_layouts(rng):
    x = rng.standard_normal((37, 129)).astype(np.float32)
    a = cudalab.asarray(x)
    out = np.empty((37, 129), np.float32)
    assert a.get(out=out) is out
    np.testing.assert_array_equal(out, x)
    # Fortran-ordered device array into a C-contiguous out (compacted on device)
    t = a.T
    out_t = np.empty((129, 37), np.float32)
    t.get(out=out_t)
    np.testing.assert_array_equal(out_t, x.T)
    # ... and into an out with its own dense (Fortran) layout
    out_f = np.empty((129, 37), np.float32, order="F")
    t.get(out=out_f)
    np.testing.assert_array_equal(out_f, x.T)
    # strided view into a C-contiguous out
    v = a[1::3, ::2]
    out_v = np.empty(v.shape, np.float32)
    v.get(out=out_v, non_blocking=True)
    cudalab.synchronize()
    np.testing.assert_array_equal(out_v, x[1::3, ::2])


def test_get_out_errors():
    a = cudalab.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    with pytest.raises(TypeError, match=r"^get\(\) argument 'out': expected a numpy.ndarray"):
        a.get(out=[0] * 12)
    with pytest.raises(TypeError, match=r"^get\(\) argument 'out': dtype .* does not match"):
        a.get(out=np.empty((3, 4), np.float64))
    with pytest.raises(ValueError, match=r"^get\(\) argument 'out': shape \(4, 3\) does not"):
        a.get(out=np.empty((4, 3), np.float32))
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^get\(\) argument 'out': is read-only"):
        a.get(out=ro)
    with pytest.raises(ValueError, match=r"^get\(\) argument 'out': must be C-contiguous"):
        a.get(out=np.empty((3, 8), np.float32)[:, ::2])
    with pytest.raises(ValueError, match=r"^get\(\) argument 'out': must be C-contiguous"):
        a.get(out=np.empty((3, 4), np.float32, order="F"))
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        a.get(outt=None)
