"""GPU tier: streams, events, stream-safe frees (record_stream), threads and
CUDA graphs. Every result is checked against NumPy on random data.

Pattern used for side streams (as with torch.cuda): inputs are created on the
default stream, the side stream waits for it (wait_stream), work runs inside
``with s:``, and the host reads results after s.synchronize() (or get()
inside the block, which orders on the current stream)."""

from __future__ import annotations

import gc
import re
import threading

import numpy as np
import pytest
from _support import assert_arg_error, random_array, rel_err, run_in_threads

import cudalab as cl
from cudalab import CUDAGraph, Event, Stream

pytestmark = pytest.mark.gpu


def long_work(n=2048, reps=4):
    """Enqueue a few milliseconds of matmuls on the current stream."""
    a = cl.asarray(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32) / n**0.5)
    out = a
    for _ in range(reps):
        out = cl.matmul(a, out)
    return out


# ---- Stream basics ----------------------------------------------------------


def test_stream_attributes_and_identity():
    s = Stream()
    assert s.device == cl.current_device()
    assert s.priority == 0
    assert isinstance(s.cuda_stream, int) and s.cuda_stream != 0
    assert s == s and hash(s) == hash(s)
    t = Stream()
    assert s != t
    d = cl.current_stream()
    assert d.cuda_stream == 0
    assert d == cl.default_stream() and hash(d) == hash(cl.default_stream())
    assert "cuda_stream=0x" in repr(s)


def test_stream_priority_range():
    lo = Stream(priority=-1)  # every CUDA GPU since Kepler has >= 2 levels
    assert lo.priority == -1
    with assert_arg_error(ValueError, "Stream", "priority", match="^must be in"):
        Stream(priority=1)
    with assert_arg_error(ValueError, "Stream", "priority"):
        Stream(priority=-100)


def test_stream_device_argument():
    s = Stream(device=0)
    assert s.device == 0
    with assert_arg_error(ValueError, "Stream", "device", match="^device"):
        Stream(device=cl.device_count())


def test_stream_query_and_synchronize():
    s = Stream()
    assert s.query() is True
    s.wait_stream(cl.current_stream())
    with s:
        y = long_work(reps=8)
    s.synchronize()
    assert s.query() is True
    assert np.isfinite(y.get()).all()


def test_stream_wait_stream_orders_work(rng):
    x_h = random_array(rng, 1 << 20, np.float32)
    x = cl.asarray(x_h)
    s1, s2 = Stream(), Stream()
    s1.wait_stream(cl.current_stream())
    with s1:
        long_work()  # delay s1, so that s2 would run first without the wait
        y = cl.zeros(x.shape, np.float32)
        for _ in range(20):
            y += x
    s2.wait_stream(s1)
    with s2:
        z = y * 0.5
        got = z.get()  # get() orders on the current stream
    np.testing.assert_allclose(got, x_h * 10, rtol=1e-5)


def test_stream_wait_event(rng):
    x_h = random_array(rng, 100003, np.float32)
    x = cl.asarray(x_h)
    s1, s2 = Stream(), Stream()
    s1.wait_stream(cl.current_stream())
    with s1:
        long_work()
        y = x + 1.0
        ev = s1.record_event()
    assert isinstance(ev, Event)
    s2.wait_event(ev)
    with s2:
        got = (y * 2.0).get()
    np.testing.assert_allclose(got, (x_h + 1.0) * 2.0, rtol=1e-6)


def test_wait_and_record_argument_errors():
    s = Stream()
    with assert_arg_error(TypeError, "wait_event", "event", match="^expected an Event"):
        s.wait_event(s)
    with assert_arg_error(TypeError, "wait_stream", "stream", match="^expected a Stream"):
        s.wait_stream(Event())
    with pytest.raises(ValueError, match="never recorded"):
        s.wait_event(Event())
    with assert_arg_error(TypeError, "record_event", "event"):
        s.record_event(5)
    with assert_arg_error(TypeError, "record", "stream"):
        Event().record(stream=1)


# ---- current stream ---------------------------------------------------------


def test_with_stream_sets_and_restores():
    s1, s2 = Stream(), Stream()
    assert cl.current_stream().cuda_stream == 0
    with s1 as entered:
        assert entered is s1
        assert cl.current_stream() is s1
        with s2:
            assert cl.current_stream() is s2
            with s1:  # the same stream entered twice
                assert cl.current_stream() is s1
            assert cl.current_stream() is s2
        assert cl.current_stream() is s1
    assert cl.current_stream().cuda_stream == 0


def test_with_stream_restores_on_exception():
    s = Stream()
    with pytest.raises(ZeroDivisionError):
        with s:
            assert cl.current_stream() is s
            1 / 0
    assert cl.current_stream().cuda_stream == 0
    with cl.stream(s):
        assert cl.current_stream() == s
    assert cl.current_stream() == cl.default_stream()


def test_arrays_allocated_on_current_stream(rng):
    x_h = random_array(rng, 4097, np.float32)
    s = Stream()
    with s:
        x = cl.asarray(x_h)
        y = cl.exp(x)
        got = y.get()
    np.testing.assert_allclose(got, np.exp(x_h), rtol=1e-6)
    del s, x, y  # the stream dies before or with its arrays: no crash
    gc.collect()
    cl.synchronize()


def test_current_stream_is_per_thread():
    s = Stream()
    seen = {}

    def worker():
        seen["before"] = cl.current_stream().cuda_stream
        t = Stream()
        with t:
            seen["inside"] = cl.current_stream() == t

    with s:
        th = threading.Thread(target=worker)
        th.start()
        th.join()
        assert cl.current_stream() is s
    assert seen == {"before": 0, "inside": True}


def test_threads_with_own_streams_get_correct_results(rng):
    n_threads, n = 6, 200_003
    inputs = [random_array(rng, n, np.float32) for _ in range(n_threads)]
    results = [None] * n_threads
    barrier = threading.Barrier(n_threads)

    def worker(i):
        x = cl.asarray(inputs[i])
        s = Stream()
        s.wait_stream(cl.current_stream())
        barrier.wait()
        with s:
            y = x * 2.0 + float(i)
            for _ in range(30):
                y += x
            z = cl.sum(y)
            results[i] = (y.get(), float(z.get()))

    run_in_threads(worker, n_threads)
    for i in range(n_threads):
        ref = inputs[i].astype(np.float64) * 32.0 + i
        assert rel_err(results[i][0], ref) < 1e-5
        assert abs(results[i][1] - ref.sum()) <= 1e-4 * np.abs(ref).sum()


# ---- events -----------------------------------------------------------------


def test_event_timing_orders_and_is_positive():
    start, mid, end = Event(), Event(), Event()
    start.record()
    long_work(reps=4)
    mid.record()
    long_work(reps=4)
    end.record(cl.current_stream())
    t1 = start.elapsed_time(mid)
    t2 = start.elapsed_time(end)
    assert 0.0 < t1 < t2
    assert mid.elapsed_time(end) > 0.0
    assert end.query() is True
    end.synchronize()


def test_event_on_side_stream_and_blocking():
    s = Stream()
    e0, e1 = Event(blocking=True), Event(blocking=True)
    s.wait_stream(cl.current_stream())
    e0.record(s)
    with s:
        long_work()
    e1.record(s)
    e1.synchronize()
    assert e1.query() and s.query()
    assert e0.elapsed_time(e1) > 0.0


def test_event_errors():
    plain = Event(enable_timing=False)
    timed = Event()
    timed.record()
    plain.record()
    with pytest.raises(ValueError, match="enable_timing=False"):
        plain.elapsed_time(timed)
    with assert_arg_error(ValueError, "elapsed_time", "end", match="enable_timing"):
        timed.elapsed_time(plain)
    with pytest.raises(ValueError, match="never recorded"):
        Event().elapsed_time(timed)
    with assert_arg_error(ValueError, "elapsed_time", "end", match="never recorded"):
        timed.elapsed_time(Event())
    with assert_arg_error(TypeError, "elapsed_time", "end", match="^expected an Event"):
        timed.elapsed_time(1.0)
    assert Event(enable_timing="x").query() is True  # truthiness; unrecorded: done
    assert "never recorded" in repr(Event())


# ---- stream-safe frees ------------------------------------------------------


def test_record_stream_arguments(rng):
    x = cl.asarray(random_array(rng, 10, np.float32))
    with assert_arg_error(TypeError, "record_stream", "stream"):
        x.record_stream(0)
    s = Stream()
    assert x.record_stream(s) is None
    assert x[2:].record_stream(s) is None  # views record on the owner
    x.record_stream(cl.default_stream())


def test_free_while_another_stream_reads(rng):
    """del x while a long matmul on s2 still reads it; refill the freed memory
    on the default stream; s2's result must still be right."""
    n = 2048
    s2 = Stream()
    for it in range(4):
        x_h = (random_array(rng, (n, n), np.float32) / n**0.5).astype(np.float32)
        x = cl.asarray(x_h)
        s2.wait_stream(cl.current_stream())
        with s2:
            for _ in range(6):  # several ms of reads of x on s2
                y = cl.matmul(x, x)
        del x
        junk = [cl.full((n, n), np.nan, np.float32) for _ in range(3)]
        s2.synchronize()
        ref = x_h.astype(np.float64) @ x_h.astype(np.float64)
        assert rel_err(y.get(), ref) < 1e-5, it
        del junk, y


def test_free_of_side_stream_array_used_on_default(rng):
    """The mirror case: allocated on s, read on the default stream, freed."""
    n = 1 << 22
    s = Stream()
    x_h = random_array(rng, n, np.float32)
    with s:
        x = cl.asarray(x_h)
        s.synchronize()
    cl.current_stream().wait_stream(s)
    long_work()
    y = x * 3.0  # reads x on the default stream (recorded there)
    del x
    with s:
        junk = [cl.full(n, np.inf, np.float32) for _ in range(3)]
    np.testing.assert_allclose(y.get(), x_h * 3.0, rtol=1e-6)
    s.synchronize()
    del junk


def test_many_streams_overflow_free_is_safe(rng):
    x_h = random_array(rng, 1 << 16, np.float32)
    x = cl.asarray(x_h)
    outs = []
    streams = [Stream() for _ in range(7)]  # more than the recorded-stream slots
    for s in streams:
        s.wait_stream(cl.current_stream())
        with s:
            outs.append(x + 1.0)
    del x
    gc.collect()
    for s, o in zip(streams, outs):
        with s:
            np.testing.assert_allclose(o.get(), x_h + 1.0, rtol=1e-6)


# ---- CUDA graphs ------------------------------------------------------------


def _chain(x, y):
    """100 small elementwise ops (in place on y), some with temporaries."""
    for i in range(100):
        if i % 4 == 0:
            y += x
        elif i % 4 == 1:
            y *= 0.75
        elif i % 4 == 2:
            y -= 0.125
        else:
            y = cl.add(y, x * 0.5)  # a temporary, freed inside the capture
    return y


def test_graph_replay_matches_eager(rng):
    x_h = random_array(rng, 1024, np.float32)
    x = cl.asarray(x_h)
    eager = _chain(x, x * 1.0).get()

    g = CUDAGraph()
    with cl.graph(g) as captured:
        assert captured is g and g.capturing
        assert cl.current_stream().cuda_stream != 0
        y = _chain(x, x * 1.0)
    assert cl.current_stream().cuda_stream == 0
    assert g.captured and not g.capturing
    g.replay()
    np.testing.assert_array_equal(y.get(), eager)
    g.replay()
    np.testing.assert_array_equal(y.get(), eager)

    # New input values: replay recomputes from them.
    x += 1.0
    eager2 = _chain(x, x * 1.0).get()
    g.replay()
    np.testing.assert_array_equal(y.get(), eager2)
    assert not np.array_equal(eager, eager2)

    with pytest.raises(RuntimeError, match="still alive"):
        g.reset()
    del y
    gc.collect()
    g.reset()
    assert not g.captured
    with cl.graph(g):  # capture again after reset
        z = x * 2.0
    g.replay()
    np.testing.assert_allclose(z.get(), (x_h + 1.0) * 2.0, rtol=1e-6)


def test_graph_on_given_stream_and_replay_on_side_stream(rng):
    x_h = random_array(rng, 1000, np.float32)
    x = cl.asarray(x_h)
    g, cap = CUDAGraph(), Stream()
    with cl.graph(g, stream=cap):
        assert cl.current_stream() is cap
        y = cl.relu(x) + 1.0
    s = Stream()
    s.wait_stream(cl.current_stream())
    with s:
        g.replay()
        got = y.get()
    np.testing.assert_allclose(got, np.maximum(x_h, 0) + 1.0, rtol=1e-6)


def test_graph_legacy_stream_refused():
    g = CUDAGraph()
    with pytest.raises(ValueError, match="legacy default stream"):
        cl.graph(g, stream=cl.default_stream())
    with pytest.raises(ValueError, match="legacy default stream"):
        g.capture_begin(cl.default_stream())
    assert cl.current_stream().cuda_stream == 0


@pytest.mark.parametrize("bad", ["synchronize", "get", "stream_sync"])
def test_uncapturable_op_raises_and_stream_stays_usable(rng, bad):
    x_h = random_array(rng, 777, np.float32)
    x = cl.asarray(x_h)
    g, cap = CUDAGraph(), Stream()
    with pytest.raises(cl.CudalabError):
        with cl.graph(g, stream=cap):
            y = x + 1.0
            if bad == "synchronize":
                cl.synchronize()
            elif bad == "get":
                y.get()
            else:
                cap.synchronize()
    assert not g.capturing and not g.captured
    assert cl.current_stream().cuda_stream == 0
    # The capture stream and the default stream work after the failure.
    with cap:
        np.testing.assert_allclose((x * 2.0).get(), x_h * 2.0, rtol=1e-6)
    np.testing.assert_allclose((x - 1.0).get(), x_h - 1.0, rtol=1e-6)
    # And the same CUDAGraph captures fine afterwards.
    with cl.graph(g):
        z = x + 3.0
    g.replay()
    np.testing.assert_allclose(z.get(), x_h + 3.0, rtol=1e-6)


# Calls CUDA would refuse while this thread captures (and would invalidate the
# capture for): cudalab refuses them first, so a caught error leaves the capture
# intact. Arguments: an array, the capture stream, a recorded timing event.
REFUSED_WHILE_CAPTURING = {
    "synchronize": lambda x, cap, ev: cl.synchronize(),
    "Stream.synchronize": lambda x, cap, ev: cap.synchronize(),
    "Stream.query": lambda x, cap, ev: cap.query(),
    "Event.synchronize": lambda x, cap, ev: ev.synchronize(),
    "Event.query": lambda x, cap, ev: ev.query(),
    "elapsed_time": lambda x, cap, ev: ev.elapsed_time(ev),
    "get": lambda x, cap, ev: x.get(),
    "asnumpy": lambda x, cap, ev: cl.asnumpy(x),
    "asarray": lambda x, cap, ev: cl.asarray(np.ones(5, dtype=np.float32)),
    "empty_cache": lambda x, cap, ev: cl.empty_cache(),
    "pinned_empty": lambda x, cap, ev: cl.pinned_empty(4),
}


@pytest.mark.parametrize("op", sorted(REFUSED_WHILE_CAPTURING))
def test_capture_refuses_unsafe_calls_and_stays_valid(rng, op):
    x_h = random_array(rng, 1001, np.float32)
    x = cl.asarray(x_h)
    ev = Event()
    ev.record()
    ev.synchronize()
    g, cap = CUDAGraph(), Stream()
    with cl.graph(g, stream=cap):
        y = x * 2.0
        with pytest.raises(cl.CudalabError,
                           match=rf"^{re.escape(op)}\(\): .*while this thread captures"):
            REFUSED_WHILE_CAPTURING[op](x, cap, ev)
        z = y + 1.0
    assert g.captured
    x += 0.5  # replay reads x's values now
    g.replay()
    np.testing.assert_allclose(z.get(), (x_h + 0.5) * 2.0 + 1.0, rtol=1e-6)


def test_capture_takes_pinned_async_copies(rng):
    n = 513
    x_h = random_array(rng, n, np.float32)
    src, out = cl.pinned_empty(n), cl.pinned_empty(n)
    src[:] = x_h
    out[:] = np.nan
    g = CUDAGraph()
    with cl.graph(g):
        d = cl.asarray(src, non_blocking=True)
        (d * 3.0).get(out=out, non_blocking=True)
    assert np.isnan(out).all()  # captured, not run
    g.replay()
    cl.synchronize()
    np.testing.assert_allclose(out, x_h * 3.0, rtol=1e-6)
    src[:] = -x_h  # the graph reads the pinned source at each replay
    g.replay()
    cl.synchronize()
    np.testing.assert_allclose(out, -x_h * 3.0, rtol=1e-6)


def test_replay_out_of_order_raises_cudalab_error(rng):
    x = cl.asarray(random_array(rng, 64, np.float32))
    g = CUDAGraph()
    with pytest.raises(cl.CudalabError, match=r"^replay\(\): nothing captured yet"):
        g.replay()
    with cl.graph(g):
        with pytest.raises(cl.CudalabError, match=r"^replay\(\): the graph is still capturing"):
            g.replay()
        y = x + 1.0
    g.replay()
    np.testing.assert_allclose(y.get(), x.get() + 1.0, rtol=1e-6)
    # A capture that failed leaves nothing to replay.
    h = CUDAGraph()
    with pytest.raises(ZeroDivisionError), cl.graph(h):
        x * 2.0
        raise ZeroDivisionError
    with pytest.raises(cl.CudalabError, match="nothing captured yet"):
        h.replay()


def test_graph_errors_inside_block_propagate_unchanged(rng):
    x = cl.asarray(random_array(rng, 10, np.float32))
    g = CUDAGraph()
    with pytest.raises(KeyError):
        with cl.graph(g):
            x + 1.0
            raise KeyError("mine")
    assert not g.captured
    assert cl.current_stream().cuda_stream == 0


def address(a):
    return a.__cuda_array_interface__["data"][0]


@pytest.mark.parametrize("keep", [False, True])
def test_graph_temporaries_and_later_allocations(rng, keep):
    """A temporary freed during capture, then a smaller array made in the same
    capture (the cross-entropy pattern of issue 21: a reduced loss's scratch,
    then a 'none' loss). Freed inside the graph, CUDA may give both one
    address; kept, each has its own. Either way every replay is right."""
    x = cl.asarray(random_array(rng, 37, np.float32))
    g = CUDAGraph(keep_temporaries=keep)
    with cl.graph(g):
        scratch = x * 2.0  # a temporary of the capture
        scratch_at = address(scratch)
        total = cl.sum(scratch)
        del scratch
        later = x + 1.0
    assert g.keep_temporaries is keep
    if keep:
        assert address(later) != scratch_at
    for shift in (0.0, 3.0):
        cl.add(x, shift, out=x)
        g.replay()
        host = x.get()
        np.testing.assert_allclose(total.get(), (host * 2.0).sum(dtype=np.float64), rtol=1e-5)
        np.testing.assert_allclose(later.get(), host + 1.0, rtol=1e-6)
    del later, total
    g.reset()


def test_graph_memory_released(rng):
    x = cl.asarray(random_array(rng, 1 << 16, np.float32))
    cl.synchronize()
    for _ in range(3):
        g = CUDAGraph()
        with cl.graph(g):
            y = x * 2.0
        g.replay()
        assert y.get().shape == (1 << 16,)
        del y, g
        gc.collect()
    cl.synchronize()
