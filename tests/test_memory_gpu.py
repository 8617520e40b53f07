"""GPU tier: the stream-ordered memory pool, its counters, limits and OOM handling.

Every test starts from ``memory_baseline`` (synchronize + empty_cache, yields
``memory_allocated()``) which also resets the per-process fraction to 1.0.
"""

from __future__ import annotations

import gc

import numpy as np
import psutil
import pytest
from _support import random_array

import cudalab
from cudalab.memory import STAT_KEYS

pytestmark = pytest.mark.gpu

GiB = 1 << 30
MiB = 1 << 20


def total_memory() -> int:
    return cudalab.mem_get_info()[1]


# ------------------------------------------------- allocated / reserved -----


def test_allocated_rises_by_1gib_and_returns_to_baseline(memory_baseline):
    """A 1 GiB array raises allocated by >= 1 GiB; del brings it back exactly."""
    base = memory_baseline
    a = cudalab.empty(GiB, dtype=np.uint8)
    assert a.nbytes == GiB
    held = cudalab.memory_allocated()
    assert held - base >= GiB
    assert cudalab.memory_reserved() >= held
    del a
    assert cudalab.memory_allocated() == base


def test_reserved_falls_after_empty_cache(memory_baseline):
    """Freed memory stays reserved until empty_cache() hands it back."""
    a = cudalab.empty(GiB, dtype=np.uint8)
    reserved_held = cudalab.memory_reserved()
    assert reserved_held >= cudalab.memory_allocated() >= GiB
    del a
    # the pool keeps the block cached (release threshold UINT64_MAX)
    assert cudalab.memory_reserved() >= cudalab.memory_allocated()
    cudalab.empty_cache()
    after = cudalab.memory_reserved()
    assert after < reserved_held
    assert after >= cudalab.memory_allocated() == memory_baseline


def test_peaks_track_and_reset(memory_baseline):
    """max_memory_* reach the 1 GiB point, persist after del, and reset to current."""
    base = memory_baseline
    cudalab.reset_peak_memory_stats()
    assert cudalab.max_memory_allocated() == cudalab.memory_allocated() == base
    a = cudalab.empty(GiB, dtype=np.uint8)
    held_alloc = cudalab.memory_allocated()
    held_res = cudalab.memory_reserved()
    assert cudalab.max_memory_allocated() >= held_alloc >= base + GiB
    assert cudalab.max_memory_reserved() >= held_res >= base + GiB
    del a
    # peaks survive the free
    assert cudalab.max_memory_allocated() >= base + GiB
    assert cudalab.max_memory_reserved() >= base + GiB
    cudalab.empty_cache()
    cudalab.reset_peak_memory_stats()
    assert cudalab.max_memory_allocated() == cudalab.memory_allocated()
    assert cudalab.max_memory_reserved() == cudalab.memory_reserved()
    assert cudalab.max_memory_allocated() < base + GiB


def test_memory_queries_accept_explicit_device(memory_baseline):
    """device=current_device() gives the same answers as the default."""
    dev = cudalab.current_device()
    a = cudalab.empty(MiB, dtype=np.uint8)
    assert cudalab.memory_allocated(dev) == cudalab.memory_allocated()
    assert cudalab.memory_reserved(device=dev) == cudalab.memory_reserved()
    assert cudalab.max_memory_allocated(dev) == cudalab.max_memory_allocated()
    del a


# ------------------------------------------------------------- queries ------


def test_mem_get_info(memory_baseline):
    """mem_get_info() is (free, total) with 0 < free <= total = device's total memory."""
    info = cudalab.mem_get_info()
    assert isinstance(info, tuple) and len(info) == 2
    free, total = info
    assert type(free) is int and type(total) is int
    assert 0 < free <= total
    props = cudalab._core._device_properties(cudalab.current_device())
    assert total == props["total_memory"]
    # holding 1 GiB lowers the driver's free figure by at least that much
    # (the pool reserves it from the driver)
    a = cudalab.empty(GiB, dtype=np.uint8)
    free_held, total_held = cudalab.mem_get_info()
    assert total_held == total
    assert free_held <= free - GiB
    del a


def test_memory_stats_keys_and_consistency(memory_baseline):
    """memory_stats() has every documented key and agrees with the getters."""
    stats = cudalab.memory_stats()
    assert isinstance(stats, dict)
    missing = [k for k in STAT_KEYS if k not in stats]
    assert not missing, f"memory_stats() lacks {missing}"
    for k in STAT_KEYS:
        assert isinstance(stats[k], (int, float)) and not isinstance(stats[k], bool), k
        if k != "fraction":
            assert isinstance(stats[k], int), k
            assert stats[k] >= 0, k
    total = total_memory()
    assert stats["allocated_bytes.all.current"] == cudalab.memory_allocated()
    assert stats["reserved_bytes.all.current"] == cudalab.memory_reserved()
    assert stats["allocated_bytes.all.peak"] == cudalab.max_memory_allocated()
    assert stats["reserved_bytes.all.peak"] == cudalab.max_memory_reserved()
    assert stats["device_total_bytes"] == total
    assert 0 < stats["device_free_bytes"] <= total
    assert stats["fraction"] == cudalab.get_per_process_memory_fraction() == 1.0
    assert stats["limit_bytes"] == total
    assert stats["allocation.all.current"] == (
        stats["allocation.all.allocated"] - stats["allocation.all.freed"]
    )


def test_memory_stats_count_allocations(memory_baseline):
    """allocation.all.allocated rises by exactly the number of arrays created;
    views allocate nothing; frees are counted."""
    before = cudalab.memory_stats()
    shapes = [(1000,), (37, 11), (3, 5, 7), (1 << 20,), (5,)]
    dtypes = [np.float32, np.int8, np.float64, np.uint8, np.int64]
    arrays = [cudalab.empty(s, dtype=dt) for s, dt in zip(shapes, dtypes, strict=True)]
    views = [a.T for a in arrays] + [a[1:] for a in arrays]
    mid = cudalab.memory_stats()
    k = len(arrays)
    assert mid["allocation.all.allocated"] - before["allocation.all.allocated"] == k
    assert mid["allocation.all.current"] - before["allocation.all.current"] == k
    requested = sum(a.nbytes for a in arrays)
    assert mid["requested_bytes.all.current"] - before["requested_bytes.all.current"] == requested
    assert mid["requested_bytes.all.peak"] >= mid["requested_bytes.all.current"]
    assert mid["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] >= requested
    del views, arrays
    gc.collect()
    after = cudalab.memory_stats()
    assert after["allocation.all.freed"] - before["allocation.all.freed"] == k
    assert after["allocation.all.current"] == before["allocation.all.current"]
    assert after["requested_bytes.all.current"] == before["requested_bytes.all.current"]
    assert cudalab.memory_allocated() == memory_baseline


# ----------------------------------------------------- fraction and OOM -----


def test_fraction_limit_raises_out_of_memory(memory_baseline, rng):
    """With fraction 0.1, allocating half the card raises a detailed OutOfMemoryError."""
    total = total_memory()
    cudalab.set_per_process_memory_fraction(0.1)
    assert cudalab.get_per_process_memory_fraction() == 0.1
    request = total // 2
    with pytest.raises(cudalab.OutOfMemoryError) as info:
        cudalab.empty(request, dtype=np.uint8)
    err = info.value
    assert isinstance(err, MemoryError)
    assert isinstance(err, cudalab.CudalabError)
    for name in ("requested", "allocated", "reserved", "free", "total", "limit", "device"):
        value = getattr(err, name)
        assert type(value) is int, (name, type(value))
    assert err.requested == request
    assert err.total == total
    assert abs(err.limit - 0.1 * total) <= 0.001 * total
    assert err.allocated == memory_baseline
    assert 0 < err.free <= total
    assert err.reserved >= err.allocated
    assert err.device == cudalab.current_device()
    msg = str(err)
    for word in ("Tried to allocate", "GiB", "allocated", "reserved"):
        assert word in msg, (word, msg)
    # catchable as the builtin MemoryError too
    with pytest.raises(MemoryError):
        cudalab.zeros(request, dtype=np.uint8)
    # nothing leaked, and allocations under the limit still work
    assert cudalab.memory_allocated() == memory_baseline
    h = random_array(rng, (1001, 7), np.float32)
    d = cudalab.asarray(h)
    assert d.get().tobytes() == h.tobytes()
    under = cudalab.empty(int(0.05 * total), dtype=np.uint8)
    assert under.nbytes == int(0.05 * total)
    del under, d
    assert cudalab.memory_allocated() == memory_baseline


def test_fraction_counts_live_arrays(memory_baseline):
    """The limit counts what is already allocated: two allocations that each fit
    alone but not together fail on the second."""
    total = total_memory()
    cudalab.set_per_process_memory_fraction(0.1)
    chunk = int(0.06 * total)
    a = cudalab.empty(chunk, dtype=np.uint8)
    with pytest.raises(cudalab.OutOfMemoryError) as info:
        cudalab.empty(chunk, dtype=np.uint8)
    assert info.value.requested == chunk
    assert info.value.allocated >= chunk
    del a
    b = cudalab.empty(chunk, dtype=np.uint8)  # fits again once a is gone
    del b
    assert cudalab.memory_allocated() == memory_baseline


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_get_per_process_memory_fraction_returns_what_was_set(memory_baseline, fraction):
    """get_per_process_memory_fraction() reports the last value set; stats agree."""
    cudalab.set_per_process_memory_fraction(fraction)
    assert cudalab.get_per_process_memory_fraction() == fraction
    stats = cudalab.memory_stats()
    assert stats["fraction"] == fraction
    assert abs(stats["limit_bytes"] - fraction * total_memory()) <= 0.001 * total_memory()


def test_100_consecutive_ooms_leave_the_process_working(memory_baseline, rng):
    """100 OOMs in a row each raise, leak nothing, are counted; then all works."""
    total = total_memory()
    cudalab.set_per_process_memory_fraction(1.0)
    ooms_before = cudalab.memory_stats()["num_ooms"]
    for i in range(100):
        with pytest.raises(cudalab.OutOfMemoryError) as info:
            cudalab.empty(2 * total, dtype=np.uint8)
        assert info.value.requested == 2 * total
        assert cudalab.memory_allocated() == memory_baseline, f"leak after OOM #{i + 1}"
    assert cudalab.memory_stats()["num_ooms"] - ooms_before == 100
    h = random_array(rng, (513, 255), np.float32)
    d = cudalab.asarray(h)
    assert d.get().tobytes() == h.tobytes()
    a = cudalab.empty(GiB, dtype=np.uint8)
    assert cudalab.memory_allocated() >= memory_baseline + GiB
    del a, d
    assert cudalab.memory_allocated() == memory_baseline


def test_oom_from_asarray_leaves_no_trace(memory_baseline):
    """An OOM while creating from host data (under a tiny limit) frees everything."""
    cudalab.set_per_process_memory_fraction(1e-6)
    h = np.ones(1 << 22, dtype=np.float32) * 1.5  # 16 MiB, above the tiny limit
    with pytest.raises(cudalab.OutOfMemoryError):
        cudalab.asarray(h)
    assert cudalab.memory_allocated() == memory_baseline


# ------------------------------------------------------- leaks and RSS ------


def test_100k_small_create_free_cycles_leak_nothing(memory_baseline):
    """100,000 create/free cycles leave allocated at baseline and host RSS flat."""
    for _ in range(10_000):  # warm-up
        a = cudalab.empty(256, dtype=np.float32)
        del a
    gc.collect()
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    allocs_before = cudalab.memory_stats()["allocation.all.allocated"]
    for _ in range(100_000):
        a = cudalab.empty(256, dtype=np.float32)
        del a
    gc.collect()
    rss_after = proc.memory_info().rss
    assert cudalab.memory_allocated() == memory_baseline
    assert cudalab.memory_stats()["allocation.all.allocated"] - allocs_before == 100_000
    assert rss_after - rss_before < 8 * MiB, f"host RSS grew by {(rss_after - rss_before) / MiB:.1f} MiB"


def test_views_keep_their_base_alive(memory_baseline, rng):
    """A view keeps the owner's memory alive after the owner's last reference goes."""
    h = random_array(rng, (1000, 257), np.float32)
    d = cudalab.asarray(h)
    v = d[1:]
    w = v[::3, 5:]  # view of a view
    held = cudalab.memory_allocated()
    assert held >= memory_baseline + h.nbytes
    del d
    gc.collect()
    assert cudalab.memory_allocated() == held
    # allocate and fill fresh memory: had the base been freed, it could land here
    other = cudalab.asarray(random_array(rng, (1000, 257), np.float32))
    assert v.get().tobytes() == h[1:].tobytes()
    assert w.get().tobytes() == np.ascontiguousarray(h[1:][::3, 5:]).tobytes()
    del other
    del v
    gc.collect()
    assert cudalab.memory_allocated() == held  # w still holds the root
    assert w.get().tobytes() == np.ascontiguousarray(h[1:][::3, 5:]).tobytes()
    del w
    gc.collect()
    assert cudalab.memory_allocated() == memory_baseline
