"""GPU tier: zero-copy interop (DLPack, CUDA Array Interface) with PyTorch and CuPy.

A write through one side must be read through the other, and memory must
live as long as any side holds it.
"""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest
from _support import cupy_device, random_array, torch_cuda

import cudalab

pytestmark = pytest.mark.gpu


# ---- our own export/import, no third party ---------------------------------


def test_cuda_array_interface_export(rng):
    a = cudalab.asarray(random_array(rng, (37, 129), np.float32))
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (37, 129)
    assert cai["typestr"] == "<f4"
    assert cai["descr"] == [("", "<f4")]
    assert cai["data"] == (a.data_ptr, False)
    assert cai["strides"] is None
    assert cai["stream"] == 1  # legacy default stream
    t = a.T.__cuda_array_interface__
    assert t["strides"] == (4, 129 * 4)
    assert t["data"][0] == a.data_ptr


def test_cuda_array_interface_bfloat16_refused():
    a = cudalab.zeros(3, ml_dtypes.bfloat16)
    with pytest.raises(AttributeError, match="bfloat16 has no type string"):
        a.__cuda_array_interface__
    assert not hasattr(a, "__cuda_array_interface__")


def test_dlpack_device():
    a = cudalab.zeros(3)
    assert a.__dlpack_device__() == (2, a.device)


def test_self_round_trip_through_cai_and_capsule(rng):
    x = random_array(rng, (37, 129), np.float32)
    a = cudalab.asarray(x)

    class Holder:  # exposes only the CUDA Array Interface
        def __init__(self, arr):
            self.arr = arr
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    h = Holder(a[2:, ::3])
    v = cudalab.asarray(h)
    assert v.base is h and v.data_ptr == a[2:, ::3].data_ptr
    np.testing.assert_array_equal(v.get(), x[2:, ::3])

    cap = a.__dlpack__()
    w = cudalab.from_dlpack(cap)
    assert w.data_ptr == a.data_ptr and w.shape == a.shape and w.strides == a.strides
    cudalab.add(w, 1, out=w)
    np.testing.assert_array_equal(a.get(), x + 1)
    with pytest.raises(ValueError, match="DLPack capsule was already consumed"):
        cudalab.from_dlpack(cap)


def test_dlpack_versioned_and_arguments(rng):
    a = cudalab.asarray(random_array(rng, (5, 6), np.float32))
    cap = a.__dlpack__(max_version=(1, 0))
    v = cudalab.from_dlpack(cap)
    np.testing.assert_array_equal(v.get(), a.get())
    c = cudalab.from_dlpack(a.__dlpack__(max_version=(1, 0), copy=True))
    assert c.data_ptr != a.data_ptr
    np.testing.assert_array_equal(c.get(), a.get())
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(1, 0))
    with pytest.raises(ValueError, match="0 is ambiguous"):
        a.__dlpack__(stream=0)
    a.__dlpack__(stream=-1)  # no synchronization requested: fine
    assert cudalab.from_dlpack(a) is a


def test_unconsumed_capsule_releases_the_array(memory_baseline):
    a = cudalab.empty(1 << 20)
    held = cudalab.memory_allocated()
    cap = a.__dlpack__()
    del a
    gc.collect()
    assert cudalab.memory_allocated() == held  # the capsule keeps it
    del cap
    gc.collect()
    cudalab.synchronize()
    assert cudalab.memory_allocated() == memory_baseline


# ---- PyTorch ------------------------------------------------------------------


@pytest.fixture
def torch():
    return torch_cuda()


def test_torch_reads_and_writes_our_memory(torch, rng):
    x = random_array(rng, (37, 129), np.float32)
    a = cudalab.asarray(x)
    t = torch.from_dlpack(a)
    assert t.data_ptr() == a.data_ptr and t.is_cuda
    t.add_(1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.get(), x + 1)
    # non-contiguous export
    tt = torch.from_dlpack(a.T)
    assert tt.stride() == (1, 129)
    np.testing.assert_array_equal(tt.cpu().numpy(), (x + 1).T)
    # CAI path too
    tc = torch.as_tensor(a[1::2], device="cuda")
    assert tc.data_ptr() == a[1::2].data_ptr


def test_we_read_and_write_torch_memory(torch, rng):
    x = random_array(rng, (37, 129), np.float32)
    t = torch.from_numpy(x).cuda()
    for imported in (cudalab.from_dlpack(t), cudalab.asarray(t)):
        assert imported.data_ptr == t.data_ptr()
        cudalab.add(imported, 1, out=imported)
    torch.cuda.synchronize()
    # Two float32 increments, rounded after each (x + 2 can differ in the last bit).
    np.testing.assert_array_equal(t.cpu().numpy(), (x + 1) + 1)
    # CAI import of a strided torch view
    class CAIOnly:
        def __init__(self, tensor):
            self.t = tensor
            self.__cuda_array_interface__ = tensor.__cuda_array_interface__

    v = cudalab.asarray(CAIOnly(t[::2, 3:]))
    np.testing.assert_array_equal(v.get(), ((x + 1) + 1)[::2, 3:])


def test_torch_producer_deleted_data_stays_valid(torch, rng):
    x = random_array(rng, (37, 129), np.float32)
    t = torch.from_numpy(x).cuda()
    a = cudalab.from_dlpack(t)
    v = a[3:, 1::2]
    del t, a
    gc.collect()
    torch.cuda.empty_cache()
    junk = torch.full((4096, 4096), 7.0, device="cuda")  # would reuse freed memory
    np.testing.assert_array_equal(v.get(), x[3:, 1::2])
    del junk


def test_torch_consumer_keeps_our_memory(torch, memory_baseline, rng):
    x = random_array(rng, (1000, 1000), np.float32)
    a = cudalab.asarray(x)
    held = cudalab.memory_allocated()
    t = torch.from_dlpack(a)
    del a
    gc.collect()
    assert cudalab.memory_allocated() == held
    np.testing.assert_array_equal(t.cpu().numpy(), x)
    del t
    gc.collect()
    cudalab.synchronize()
    assert cudalab.memory_allocated() == memory_baseline


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "uint8", "int32", "int64",
                                   "float64", "bool"])
def test_torch_dtypes_round_trip(torch, dtype, rng):
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = (rng.standard_normal(1001) * 10).astype(np_dtype)
    a = cudalab.asarray(x)
    t = torch.from_dlpack(a)
    assert t.dtype == getattr(torch, dtype)
    back = cudalab.from_dlpack(t)
    assert back.dtype == a.dtype and back.data_ptr == a.data_ptr
    np.testing.assert_array_equal(back.get().view(np.uint8), x.view(np.uint8))
    if dtype == "bfloat16":
        t.mul_(2)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(a.get().astype(np.float32),
                                      (x.astype(np.float32) * 2))


def test_torch_cpu_tensor_refused_by_from_dlpack(torch):
    with pytest.raises(TypeError, match="use cudalab.asarray"):
        cudalab.from_dlpack(torch.ones(3))
    a = cudalab.asarray(torch.ones(3))  # asarray copies host tensors
    np.testing.assert_array_equal(a.get(), np.ones(3, np.float32))


def test_torch_side_stream_is_ordered(torch, rng):
    # torch writes on a side stream; our import passes our (legacy) stream to
    # __dlpack__, so torch makes it wait before our add reads the data.
    x = random_array(rng, (2048, 2048), np.float32)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.from_numpy(x).cuda(non_blocking=False)
        for _ in range(20):
            t.mul_(1.0)
        t.add_(1)
        a = cudalab.from_dlpack(t)
    b = cudalab.add(a, 0)
    np.testing.assert_array_equal(b.get(), x + 1)
    s.synchronize()


def test_torch_pinned_memory_is_pinned(torch):
    p = torch.empty(1000, pin_memory=True).numpy()
    assert cudalab.is_pinned(p)


# ---- CuPy ---------------------------------------------------------------------


@pytest.fixture
def cupy():
    return cupy_device()


def test_cupy_both_ways_cai(cupy, rng):
    x = random_array(rng, (37, 129), np.float32)
    a = cudalab.asarray(x)
    c = cupy.asarray(a)  # CAI import by CuPy
    assert c.data.ptr == a.data_ptr
    c += 1
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(a.get(), x + 1)
    g = cupy.asarray(x)
    b = cudalab.asarray(g)  # DLPack first (CuPy has both)
    assert b.data_ptr == g.data.ptr
    cudalab.add(b, 1, out=b)
    cudalab.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(g), x + 1)


def test_cupy_both_ways_dlpack(cupy, rng):
    x = random_array(rng, (37, 129), np.float32)
    a = cudalab.asarray(x)
    c = cupy.from_dlpack(a)
    assert c.data.ptr == a.data_ptr
    c *= 2
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(a.get(), x * 2)
    g = cupy.asarray(x)
    b = cudalab.from_dlpack(g)
    del g
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    np.testing.assert_array_equal(b.get(), x)
