"""GPU tier: eight Python threads driving cudalab at once (issue 21, item 4).

* Eight threads (five with a stream of their own, three sharing one) start
  together and, for several rounds, allocate, run element-wise ops,
  reductions and matmul on their stream and check every result against NumPy.
  Each round also frees arrays across streams: allocated on one stream, read
  on another, marked with record_stream and deleted while that stream may
  still be reading, the memory refilled at once. Afterwards (threads joined,
  everything synchronized) memory_allocated() is back to its baseline.
* Eight threads reduce one shared array (and views of it) concurrently, each
  on its own stream: every result is right and the array is unchanged.
* Eight threads wait in blocking calls (Stream/Event/device synchronize, get(),
  asarray from pageable memory) while their streams are busy, and another
  Python thread keeps running meanwhile: none of those waits holds the GIL.

Threads start together at a Barrier, are joined against a deadline (a stuck
thread fails the test instead of hanging it), and an exception in any thread
is raised in the test.

The memory baseline: the test's own thread has made its cuBLAS handle and
workspace before the baseline is read (the ``probe`` fixture). Each worker
thread's handle holds a 32 MiB workspace until the thread ends and the next
matmul releases it (csrc/ops/matmul_plan.c), so the check runs a small
matmul, collects garbage and synchronizes, retrying briefly while the ended
threads' handles reach that queue.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import cudalab as cl
from _support import BF16, F16, F32, F64, assert_bit_equal, assert_close, random_array, widen
from cudalab import _core

pytestmark = pytest.mark.gpu

N_THREADS = 8
OWN_STREAMS = 5  # threads 0..4 have a stream each; threads 5..7 share one
ROUNDS = 4
BARRIER_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 180.0
BUSY_S = 0.3  # how long a spin kernel keeps a stream busy in the GIL test
THREAD_DTYPES = [F32, F64, F16, BF16]


# ================================================================= helpers


def run_threads(target, count: int, *, barrier: threading.Barrier | None = None,
                timeout: float = JOIN_TIMEOUT_S) -> None:
    """run_threads(target, count, *, barrier=None, timeout=JOIN_TIMEOUT_S)

    Call ``target(i)`` for i in range(count), each in its own (daemon)
    thread, all started before any is joined. Fails the test if a thread is
    still running `timeout` seconds later (a deadlock must not hang the run).
    An exception in a thread breaks `barrier` (so the others stop waiting
    there) and is raised here; a thread's own error is reported before the
    BrokenBarrierErrors it caused in the others.
    """
    errors: list[BaseException | None] = [None] * count

    def run(i):
        try:
            target(i)
        except BaseException as exc:  # reported in the calling thread
            errors[i] = exc
            if barrier is not None:
                barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), name=f"worker-{i}", daemon=True)
               for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        pytest.fail(f"threads still running after {timeout:.0f} s (deadlock?): {stuck}")
    failed = [(i, e) for i, e in enumerate(errors) if e is not None]
    if failed:
        failed.sort(key=lambda item: isinstance(item[1], threading.BrokenBarrierError))
        i, first = failed[0]
        raise AssertionError(f"{len(failed)} of {count} threads failed; thread {i}: "
                             f"{first!r}") from first


@pytest.fixture
def probe():
    """Two tiny operands, with this thread's cuBLAS handle and workspace already made."""
    p = cl.asarray(np.ones((2, 2), dtype=np.float32))
    cl.matmul(p, p)
    gc.collect()
    cl.synchronize()
    return p


def assert_back_to_baseline(baseline: int, probe, timeout: float = 10.0) -> None:
    """memory_allocated() returns to `baseline` once pending frees have run.

    A matmul releases the cuBLAS workspaces of ended threads (their handles
    are queued when the OS thread exits, which may be just after join()
    returns): so matmul, collect, synchronize, and retry for a while."""
    deadline = time.monotonic() + timeout
    while True:
        cl.matmul(probe, probe)  # its result dies at once
        gc.collect()
        cl.synchronize()
        now = cl.memory_allocated()
        if now == baseline or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert now == baseline, (f"{now - baseline} bytes still allocated after the threads ended: "
                             f"{cl.memory_stats()}")


def positive(rng, shape, dtype) -> np.ndarray:
    """Random data in [0.5, 1.5): sums and products without cancellation."""
    return random_array(rng, shape, dtype, low=0.5, high=1.5)


# ============================================== own and shared streams


def compute_round(rng, dtype, s: cl.Stream) -> None:
    """Allocate, compute (element-wise, reductions, matmul) and read back on `s`;
    compare with NumPy."""
    xh = positive(rng, (67, 129), dtype)
    yh = positive(rng, (129,), dtype)
    wh = positive(rng, (129, 33), dtype)
    with s:  # allocations, copies and kernels all on s; get() waits for s
        x, y, w = cl.asarray(xh), cl.asarray(yh), cl.asarray(wh)
        z = cl.add(cl.mul(x, 2.0), y)  # y broadcast over the rows
        e = cl.exp(cl.neg(x))
        rows = cl.sum(z, axis=1)
        top = cl.max(z, axis=0)
        idx = cl.argmax(z, axis=1)
        p = cl.matmul(z, w)
        got = {"z": z.get(), "e": e.get(), "rows": rows.get(), "top": top.get(),
               "idx": idx.get(), "p": p.get()}
    x64, y64, w64 = widen(xh), widen(yh), widen(wh)
    assert_close(got["z"], 2.0 * x64 + y64, dtype)
    assert_close(got["e"], np.exp(-x64), dtype)
    z64 = widen(got["z"])  # the device's own z: max and argmax of it are exact
    assert_close(got["rows"], z64.sum(axis=1), dtype)
    np.testing.assert_array_equal(widen(got["top"]), z64.max(axis=0))
    np.testing.assert_array_equal(got["idx"], z64.argmax(axis=1))
    assert_close(got["p"], z64 @ w64, dtype)


def cross_stream_frees(rng, dtype, s: cl.Stream, side: cl.Stream) -> None:
    """Arrays freed on one stream while another may still read them.

    a: allocated on s, read by matmuls on `side`, deleted, its memory refilled
    on s at once: the free must wait for side's reads (record_stream). b: the
    mirror, allocated on `side` and reduced on s."""
    n = 256
    ah, bh = positive(rng, (n, n), dtype), positive(rng, (n, 97), dtype)
    with s:
        a = cl.asarray(ah)
    side.wait_stream(s)  # side reads a only after its upload
    with side:
        prods = [cl.matmul(a, a) for _ in range(3)]  # a few ms of reads of a on side
    a.record_stream(side)  # ops record it too; the explicit call must be harmless
    del a  # back to the pool on s, after side's work enqueued so far
    with s:
        junk = cl.full((n, n), -3.0, dtype=dtype)  # likely a's memory again

    with side:
        b = cl.asarray(bh)
    s.wait_stream(side)
    with s:
        col = cl.sum(b, axis=0)  # reads b on s (recorded by the op)
    del b  # back to the pool on side, after s's reduction
    with side:
        junk2 = cl.full((n, 97), -5.0, dtype=dtype)

    ref = widen(ah) @ widen(ah)
    with side:
        for p in prods:
            assert_close(p.get(), ref, dtype)
        assert (widen(junk2.get()) == -5.0).all()
    with s:
        assert_close(col.get(), widen(bh).sum(axis=0), dtype)
        assert (widen(junk.get()) == -3.0).all()


def test_threads_with_own_and_shared_streams(probe):
    baseline = cl.memory_allocated()
    own = [cl.Stream() for _ in range(OWN_STREAMS)]
    shared = cl.Stream()
    streams = own + [shared] * (N_THREADS - OWN_STREAMS)
    sides = [cl.Stream() for _ in range(N_THREADS)]
    barrier = threading.Barrier(N_THREADS, timeout=BARRIER_TIMEOUT_S)

    def worker(i):
        rng = np.random.default_rng(1000 + i)
        dtype = THREAD_DTYPES[i % len(THREAD_DTYPES)]
        barrier.wait()  # all threads start their work together
        for _ in range(ROUNDS):
            compute_round(rng, dtype, streams[i])
            cross_stream_frees(rng, dtype, streams[i], sides[i])

    run_threads(worker, N_THREADS, barrier=barrier)
    assert_back_to_baseline(baseline, probe)
    del own, shared, streams, sides  # the streams outlive every array that used them


# ======================================================= one shared array


REDUCTIONS = ["sum", "mean", "max", "min", "argmax"]


def test_threads_reduce_one_shared_array(probe):
    """Eight threads read one array (and views of it) concurrently on their own
    streams. Freeing it afterwards waits for more streams than an array records
    (four): the overflow path, a device synchronize."""
    baseline = cl.memory_allocated()
    rng = np.random.default_rng(7)
    xh = positive(rng, (301, 257), F32)
    x = cl.asarray(xh)  # on the default stream; asarray waits for the copy
    views = {"x": (x, xh), "T": (x.T, xh.T), "sliced": (x[1::2, 3:], xh[1::2, 3:])}
    streams = [cl.Stream() for _ in range(N_THREADS)]
    barrier = threading.Barrier(N_THREADS, timeout=BARRIER_TIMEOUT_S)

    def worker(i):
        s = streams[i]
        s.wait_stream(cl.default_stream())  # x's upload comes first (asarray waited already)
        barrier.wait()
        for r in range(12):
            op = REDUCTIONS[(i + r) % len(REDUCTIONS)]
            axis = (None, 0, 1, -1)[(i + r) % 4]
            name = list(views)[(i + 2 * r) % len(views)]
            dv, hv = views[name]
            with s:
                got = getattr(cl, op)(dv, axis=axis).get()
            want = getattr(np, op)(hv.astype(np.float64), axis=axis)
            if op in ("sum", "mean"):
                assert_close(got, want, F32)
            else:
                np.testing.assert_array_equal(widen(got), want, err_msg=f"{op} {name} axis={axis}")

    run_threads(worker, N_THREADS, barrier=barrier)
    assert_bit_equal(x, xh)  # read-only: unchanged
    del x, views
    assert_back_to_baseline(baseline, probe)
    del streams


# ========================================================== the GIL


def test_blocking_calls_in_threads_let_python_run(probe):
    """Every thread makes its stream busy for BUSY_S, then waits in a blocking
    call; a ticker thread must keep counting during each of those waits."""
    baseline = cl.memory_allocated()
    cycles = int(BUSY_S * cl.get_device_properties().clock_rate_khz * 1e3)
    host = np.ones(1 << 20, dtype=np.float32)  # pageable: asarray waits for its copy
    waits = [
        ("Stream.synchronize", lambda s, a: s.synchronize()),
        ("Event.synchronize", lambda s, a: s.record_event().synchronize()),
        ("get", lambda s, a: a.get()),
        ("asarray", lambda s, a: cl.asarray(host)),
        ("synchronize", lambda s, a: cl.synchronize()),
    ]
    streams = [cl.Stream() for _ in range(N_THREADS)]
    barrier = threading.Barrier(N_THREADS, timeout=BARRIER_TIMEOUT_S)
    ticks = 0
    stop = threading.Event()

    def tick():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    seen = [None] * N_THREADS

    def worker(i):
        name, wait = waits[i % len(waits)]
        s = streams[i]
        with s:
            a = cl.asarray(np.arange(1, 1001, dtype=np.float32))
            barrier.wait()
            _core._spin(cycles)  # keeps s busy for about BUSY_S
            t0, before = time.perf_counter(), ticks
            wait(s, a)
            seen[i] = (name, time.perf_counter() - t0, ticks - before)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        run_threads(worker, N_THREADS, barrier=barrier)
    finally:
        stop.set()
        ticker.join(5)
    for name, waited, during in seen:
        # The call really waited (else it proves nothing), and Python ran meanwhile.
        assert waited > BUSY_S / 3, f"{name} returned after {waited:.3f} s: it did not wait"
        assert during > 10, f"{name}: the ticker ran {during} times in {waited:.3f} s"
    assert_back_to_baseline(baseline, probe)
