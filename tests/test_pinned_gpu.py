"""GPU tier: pinned host memory and asynchronous transfers."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from _support import DTYPE_IDS, DTYPES, assert_arg_error, random_array, rel_err

import cudalab

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(1,), (7,), (1000003,), (37, 129)])
def test_non_blocking_round_trip(rng, dtype, shape):
    src = cudalab.pinned_empty(shape, dtype)
    src[...] = random_array(rng, shape, dtype)
    expected = src.copy()
    a = cudalab.asarray(src, non_blocking=True)
    back = cudalab.pinned_empty(shape, dtype)
    out = a.get(out=back, non_blocking=True)
    assert out is back
    cudalab.synchronize()
    np.testing.assert_array_equal(back.view(np.uint8), expected.view(np.uint8))


def test_non_blocking_from_pageable_is_synchronous(rng):
    src = random_array(rng, 100001, np.float32)
    a = cudalab.asarray(src, non_blocking=True)
    src[:] = 0  # safe: the pageable copy already finished
    assert np.array_equal(a.get(), a.get())
    assert a.get()[0] != 0 or a.get()[1] != 0
    out = np.empty_like(src)
    r = a.get(out=out, non_blocking=True)  # pageable out: synchronous
    assert r is out and np.count_nonzero(out) > 0


def test_non_blocking_keeps_source_alive(rng):
    src = cudalab.pinned_empty(1 << 20, np.float32)
    src[:] = random_array(rng, 1 << 20, np.float32)
    expected = src.copy()
    a = cudalab.asarray(src, non_blocking=True)
    del src
    gc.collect()  # the pending copy still reads valid memory
    np.testing.assert_array_equal(a.get(), expected)


def test_non_blocking_chain_with_compute(rng):
    x = random_array(rng, (513, 257), np.float32)
    p = cudalab.pinned_empty(x.shape)
    p[...] = x
    a = cudalab.asarray(p, non_blocking=True)
    b = cudalab.add(a, 1.5)
    out = cudalab.pinned_empty(x.shape)
    b.get(out=out, non_blocking=True)
    cudalab.synchronize()
    ref = x.astype(np.float64) + 1.5
    assert rel_err(out, ref) < 1e-6


def test_get_out_layouts(rng):
    x = random_array(rng, (37, 129), np.float32)
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
    with assert_arg_error(TypeError, "get", "out", match=r"^expected a numpy\.ndarray"):
        a.get(out=[0] * 12)
    with assert_arg_error(TypeError, "get", "out", match="^dtype .* does not match"):
        a.get(out=np.empty((3, 4), np.float64))
    with assert_arg_error(ValueError, "get", "out", match=r"^shape \(4, 3\) does not"):
        a.get(out=np.empty((4, 3), np.float32))
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    with assert_arg_error(ValueError, "get", "out", match="^is read-only"):
        a.get(out=ro)
    # Any writable layout is taken, as np.copyto would (test_negative_steps_gpu.py).
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    gappy = np.empty((3, 8), np.float32)[:, ::2]
    np.testing.assert_array_equal(a.get(out=gappy), want)
    fortran = np.empty((3, 4), np.float32, order="F")
    np.testing.assert_array_equal(a.get(out=fortran), want)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        a.get(outt=None)
