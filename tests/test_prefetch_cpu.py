"""CPU tier: cudalab.prefetch (the staging ring and the prefetcher) with a stand-in for the GPU.

The stand-in calls (streams, events, uploads that copy the host values) log
what the prefetcher asks for, so the order of uploads, event waits and
record_stream calls is checked without a device. Lesson 13 runs the same
mechanism (tests/test_lessons_d_cpu.py); the GPU side is in
tests/test_nn_loader_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_lessons_d_cpu as standin  # the logging stand-in for streams, events, uploads
from _support import assert_arg_error

from cudalab.prefetch import CUDALAB, CudalabCalls, Prefetcher, StagingRing


def _counting():
    made = []

    def allocate(shape, dtype):
        made.append(np.empty(shape, dtype))
        return made[-1]
    return made, allocate


def _log(api, kind):
    return [e for e in api.log if e[0] == kind]


# ---- StagingRing ---------------------------------------------------------------------------


@pytest.mark.parametrize("slots,exc", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                       (True, TypeError), ("2", TypeError)])
def test_ring_slots_checked(slots, exc):
    with assert_arg_error(exc, "StagingRing", "slots"):
        StagingRing([((2,), np.float32)], slots)


def test_ring_allocates_each_slot_once_on_first_use_and_hands_them_out_in_turn():
    made, allocate = _counting()
    ring = StagingRing([((3, 2), np.float32), ((3,), np.int64)], slots=3, allocate=allocate)
    assert made == [] and ring.allocations == 0  # nothing before the first acquire
    got = [ring.acquire() for _ in range(7)]
    assert len(made) == 6 and ring.allocations == 6
    assert [(a.shape, a.dtype, b.shape, b.dtype) for a, b in got[:1]] == [
        ((3, 2), np.float32, (3,), np.int64)]
    ids = [id(slot[0]) for slot in got]
    assert ids[:3] * 2 + ids[:1] == ids and len(set(ids)) == 3


def test_ring_waits_for_the_release_event_before_reusing_a_slot():
    log = []
    ring = StagingRing([((4,), np.float32)], slots=2, allocate=lambda s, d: np.empty(s, d))
    (a,) = ring.acquire()
    e = standin._FakeEvent(log)
    ring.release((7, a[1:3]), e)           # a view of the buffer, inside a tuple
    (b,) = ring.acquire()                   # the other slot: no wait
    assert not e.synced
    ring.release(np.empty(4, np.float32), standin._FakeEvent(log))  # not the ring's: ignored
    assert ring.acquire()[0] is a and e.synced  # back to slot 0: after its copy
    e.synced = False
    assert ring.acquire()[0] is b and ring.acquire()[0] is a and not e.synced  # waited once
    assert [x[0] for x in log] == ["sync"]


def test_ring_allocates_pinned_memory_by_default(monkeypatch):
    from cudalab import prefetch as feeding

    calls = []
    monkeypatch.setattr(feeding._core, "pinned_empty",
                        lambda shape, dtype: calls.append((shape, dtype)) or np.empty(shape, dtype))
    StagingRing([((5, 3), "float16")], 2).acquire()
    assert calls == [((5, 3), np.dtype(np.float16))]


# ---- Prefetcher ----------------------------------------------------------------------------


@pytest.mark.parametrize("ahead,exc", [(-1, ValueError), (1.0, TypeError), (False, TypeError)])
def test_prefetcher_ahead_checked(ahead, exc):
    with assert_arg_error(exc, "Prefetcher", "ahead"):
        Prefetcher([], ahead=ahead, calls=standin._FakeApi())


def test_default_calls_are_cudalabs():
    assert isinstance(CUDALAB, CudalabCalls) and CUDALAB.name == "cudalab"
    s = object()
    assert CUDALAB.stream(s) is s


@pytest.mark.parametrize("ahead", [1, 2, 5])
def test_prefetcher_keeps_ahead_uploads_in_flight_and_hands_them_out_in_order(ahead):
    api = standin._FakeApi()
    host = [np.full((2, 3), i, np.float32) for i in range(4)]
    it = Prefetcher(host, ahead=ahead, calls=api)
    assert len(_log(api, "upload")) == min(ahead, 4)  # started by the constructor
    got = []
    for k in range(4):
        got.append(next(it))
        assert len(_log(api, "upload")) == min(ahead + k + 1, 4)
    with pytest.raises(StopIteration):
        next(it)
    assert [g.get()[0, 0] for g in got] == [0, 1, 2, 3]
    assert api.sides == 1 and _log(api, "upload") == [("upload", True)] * 4
    # Copies run inside the side stream's context; the consumer waits for each one's
    # event (in order) and records each batch on its own stream.
    assert [e[1] for e in _log(api, "enter")] == ["side1"] * 4
    assert [w[2] for w in _log(api, "wait")] == [r[2] for r in _log(api, "record")]
    assert all(r[1] == "side1" for r in _log(api, "record"))
    assert _log(api, "record_stream") == [("record_stream", "consumer")] * 4


def test_prefetcher_uploads_the_arrays_of_a_tuple_and_passes_the_rest():
    api = standin._FakeApi()
    released = []
    batches = [(0, np.ones(3, np.float32), "a", np.zeros(2, np.int64)),
               [1, np.arange(2.0)], np.full(4, 5.0)]
    got = list(Prefetcher(batches, ahead=2, calls=api,
                          release=lambda host, event: released.append((host, event))))
    assert got[0][0] == 0 and got[0][2] == "a" and isinstance(got[0], tuple)
    assert np.array_equal(got[0][1].get(), np.ones(3)) and got[0][3].get().dtype == np.int64
    assert isinstance(got[1], list) and got[1][0] == 1
    assert np.array_equal(got[2].get(), np.full(4, 5.0))
    assert len(_log(api, "record_stream")) == 2 + 1 + 1  # every uploaded array
    # Each host batch is released with the event recorded after its copies.
    assert [h is b for (h, _), b in zip(released, batches)] == [True] * 3
    assert [e for _, e in released] == [r[2] for r in _log(api, "record")]


def test_prefetcher_refuses_a_batch_without_arrays_to_upload():
    with pytest.raises(TypeError, match="numpy.ndarray or a tuple"):
        Prefetcher([{"x": np.ones(2)}], calls=standin._FakeApi())


def test_prefetcher_with_nothing_to_load():
    api = standin._FakeApi()
    assert list(Prefetcher([], ahead=3, calls=api)) == []
    assert list(Prefetcher(iter([]), ahead=0, calls=api)) == []


def test_prefetcher_ahead_zero_uploads_synchronously_on_the_current_stream():
    api = standin._FakeApi()
    it = Prefetcher((np.full(2, i) for i in range(3)), ahead=0, calls=api,
                    release=lambda *a: pytest.fail("nothing to release"))
    assert api.log == []  # nothing before the first next()
    assert [b.get()[0] for b in it] == [0, 1, 2]
    assert api.sides == 0 and _log(api, "upload") == [("upload", False)] * 3
    assert _log(api, "wait") == [] and _log(api, "record_stream") == []


def test_prefetcher_with_a_ring_refills_a_buffer_only_after_its_copy():
    api = standin._FakeApi()
    made, allocate = _counting()
    ring = StagingRing([((2,), np.float64)], slots=3, allocate=allocate)

    def host_batches():
        for i in range(8):
            (buf,) = ring.acquire()
            buf[...] = i
            yield buf

    got = [b.get()[0] for b in Prefetcher(host_batches(), ahead=2, release=ring.release,
                                           calls=api)]
    assert got == list(range(8)) and len(made) == 3
    # Every refill (after the first round) follows the event of the copy that read it.
    records = [r[2] for r in _log(api, "record")]
    syncs = [e[1] for e in _log(api, "sync")]
    assert syncs == records[:8 - 3]


# ---- workers: host preparation in threads ----------------------------------------------------

import threading  # noqa: E402
import time  # noqa: E402

from cudalab.prefetch import WORKER_THREAD_NAME, HostWorkers  # noqa: E402


def _worker_threads():
    return [t for t in threading.enumerate() if t.name.startswith(WORKER_THREAD_NAME)]


@pytest.mark.parametrize("workers,exc", [(0, ValueError), (-2, ValueError), (2.0, TypeError),
                                         (True, TypeError)])
def test_host_workers_count_checked(workers, exc):
    with assert_arg_error(exc, "HostWorkers", "workers"):
        HostWorkers([], abs, workers)


def test_host_workers_prepare_checked():
    with assert_arg_error(TypeError, "HostWorkers", "prepare", "callable, got int"):
        HostWorkers([], 3, 1)


@pytest.mark.parametrize("workers,exc,match", [
    (-1, ValueError, ">= 0"), (1.5, TypeError, "int"), (None, TypeError, "int")])
def test_prefetcher_workers_checked(workers, exc, match):
    with assert_arg_error(exc, "Prefetcher", "workers", match):
        Prefetcher([], workers=workers, prepare=abs, calls=standin._FakeApi())


def test_prefetcher_workers_need_prepare_and_prepare_must_be_callable():
    with assert_arg_error(ValueError, "Prefetcher", "workers", r"workers=2 needs prepare="):
        Prefetcher([], workers=2, calls=standin._FakeApi())
    with assert_arg_error(TypeError, "Prefetcher", "prepare", "callable, got str"):
        Prefetcher([], prepare="x", calls=standin._FakeApi())


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_host_workers_keep_the_order_and_stay_at_most_workers_ahead(workers):
    read, lock, running, peak = [], threading.Lock(), [0], [0]
    rng = np.random.default_rng(workers)
    delays = rng.uniform(0, 2e-3, 20)  # later items often finish first

    def items():
        for i in range(20):
            read.append(i)
            yield i

    def prepare(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(delays[i])
        with lock:
            running[0] -= 1
        return i * i

    it = HostWorkers(items(), prepare, workers)
    assert len(read) == min(workers, 20)  # started at once, a bounded number
    got = []
    for k, value in enumerate(it):
        got.append(value)
        assert len(read) <= min(k + 1 + workers, 20)
    assert got == [i * i for i in range(20)] and peak[0] <= workers
    assert it.closed and _worker_threads() == []


def test_host_workers_run_in_parallel():
    barrier = threading.Barrier(3, timeout=10)  # passes only with 3 tasks running at once
    assert list(HostWorkers(range(6), lambda i: (barrier.wait(), i)[1], 3)) == list(range(6))


def test_host_workers_raise_a_failure_in_order_and_stop():
    def prepare(i):
        if i == 3:
            raise ZeroDivisionError("item 3")
        return i

    it = HostWorkers(range(10), prepare, 2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ZeroDivisionError, match="item 3"):
        next(it)
    assert it.closed and _worker_threads() == []
    with pytest.raises(StopIteration):
        next(it)


def test_host_workers_end_their_threads_when_closed_or_dropped():
    gate = threading.Event()
    it = HostWorkers(range(100), lambda i: gate.wait(10) and i, 4)
    assert len(_worker_threads()) == 4
    gate.set()
    assert next(it) == 0
    it.close()
    assert it.closed and _worker_threads() == []
    it.close()  # again: nothing to do
    it = HostWorkers(range(100), lambda i: i, 3)
    next(it)
    del it
    assert _worker_threads() == []


def test_host_workers_an_empty_source():
    it = HostWorkers([], abs, 2)
    assert list(it) == [] and it.closed


@pytest.mark.parametrize("ahead", [0, 1, 3])
@pytest.mark.parametrize("workers", [0, 1, 2, 4])
def test_prefetcher_with_workers_delivers_prepared_batches_in_order(ahead, workers):
    api = standin._FakeApi()
    got = Prefetcher(range(9), ahead=ahead, calls=api, workers=workers,
                     prepare=lambda i: (i, np.full(3, i, np.float32)))
    values = [(i, b.get()[0]) for i, b in got]
    assert values == [(i, float(i)) for i in range(9)]
    assert _log(api, "upload") == [("upload", ahead > 0)] * 9
    assert _worker_threads() == []


def test_prefetcher_raises_a_failed_batch_at_its_turn():
    def batches():
        yield np.ones(2)
        yield np.ones(2)
        raise OSError("disk gone")

    it = Prefetcher(batches(), ahead=3, calls=standin._FakeApi())  # all preloaded at once
    assert len([next(it), next(it)]) == 2
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_prefetcher_close_ends_its_workers():
    it = Prefetcher(range(50), ahead=1, calls=standin._FakeApi(), workers=3,
                    prepare=lambda i: np.full(2, i))
    next(it)
    assert _worker_threads()
    it.close()
    assert _worker_threads() == []
