"""Lessons pinned, streams, prefetch and roofline: their pure logic, without a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _measuring, _overlap, roofline


# ---- overlap arithmetic ------------------------------------------------------------------

def test_overlap_full_partial_and_none():
    full = _overlap.overlap(2.0, 1.0, 2.0)  # the shorter task vanished entirely
    assert full.serialized == 3.0 and full.hidden == 1.0 and full.fraction == 1.0
    half = _overlap.overlap(2.0, 1.0, 2.5)
    assert half.hidden == pytest.approx(0.5) and half.fraction == pytest.approx(0.5)
    none = _overlap.overlap(1.0, 3.0, 4.0)
    assert none.hidden == 0.0 and none.fraction == 0.0
    worse = _overlap.overlap(1.0, 1.0, 2.5)  # overlapping cost time
    assert worse.hidden == pytest.approx(-0.5) and worse.fraction < 0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_overlap_rejects_non_positive_times(bad):
    with pytest.raises(ValueError, match="expected seconds > 0"):
        _overlap.overlap(bad, 1.0, 1.0)
    with pytest.raises(ValueError, match="'overlapped'"):
        _overlap.overlap(1.0, 1.0, bad)


def test_pipeline_bound_goes_from_the_sum_to_the_slowest_stage():
    stages = (3.0, 1.0, 2.0)
    assert _overlap.pipeline_bound(stages, 1) == pytest.approx(6.0)
    assert _overlap.pipeline_bound(stages, 2) == pytest.approx((6.0 + 3.0) / 2)
    assert _overlap.pipeline_bound(stages, 10_000) == pytest.approx(3.0, rel=1e-3)
    bounds = [_overlap.pipeline_bound(stages, c) for c in (1, 2, 4, 8, 16)]
    assert bounds == sorted(bounds, reverse=True)
    with pytest.raises(ValueError, match="'chunks'"):
        _overlap.pipeline_bound(stages, 0)
    with pytest.raises(ValueError, match="'stages'"):
        _overlap.pipeline_bound((), 2)
    with pytest.raises(ValueError, match="'stages'"):
        _overlap.pipeline_bound((1.0, -1.0), 2)


def test_rel_error_of_overlap_checks():
    want = np.array([1.0, -4.0, 2.0])
    assert _measuring.rel_error(want, want) == 0.0
    assert _measuring.rel_error(want + [0.0, 0.4, 0.0], want) == pytest.approx(0.1)
    assert _measuring.rel_error(np.zeros(2), np.zeros(3)) == math.inf
    assert _measuring.rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert _measuring.rel_error(np.float32(3.0), 2.0) == pytest.approx(0.5)


# ---- roofline -------------------------------------------------------------------------------

PEAK = 100e12   # FLOP/s
BW = 2e12       # B/s: ridge at 50 FLOP/B
LAUNCH = 5e-6   # s


def test_ridge_point_and_attainable():
    assert roofline.ridge_point(PEAK, BW) == pytest.approx(50.0)
    assert roofline.attainable(10.0, PEAK, BW) == pytest.approx(20e12)  # on the slope
    assert roofline.attainable(500.0, PEAK, BW) == pytest.approx(PEAK)  # on the flat roof
    assert roofline.attainable(50.0, PEAK, BW) == pytest.approx(PEAK)
    with pytest.raises(ValueError):
        roofline.ridge_point(0.0, BW)


def test_classify_overhead_first():
    # 1 us for a tiny add: within 3 launch times, whatever the intensity says.
    p = roofline.classify(1e-6, 4096.0, 12 * 4096.0, PEAK, BW, LAUNCH)
    assert p.regime == "overhead-bound" and "launch" in p.why
    # Exactly at the threshold still counts; just above it does not.
    at = roofline.classify(roofline.OVERHEAD_LAUNCHES * LAUNCH, 1e6, 1e9, PEAK, BW, LAUNCH)
    assert at.regime == "overhead-bound"
    above = roofline.classify(roofline.OVERHEAD_LAUNCHES * LAUNCH * 1.01, 1e6, 1e9, PEAK, BW,
                              LAUNCH)
    assert above.regime != "overhead-bound"


def test_classify_memory_bound_by_bandwidth_and_by_intensity():
    nbytes = 1.2e9
    fast = roofline.classify(nbytes / (0.9 * BW), nbytes / 12, nbytes, PEAK, BW, LAUNCH)
    assert fast.regime == "memory-bound" and "copy bandwidth" in fast.why
    assert fast.pct_of_bandwidth == pytest.approx(90.0)
    assert fast.intensity == pytest.approx(1 / 12)
    assert fast.pct_of_roof == pytest.approx(90.0)
    # A slow low-intensity kernel (20% of bandwidth) is still memory-bound: below the ridge.
    slow = roofline.classify(nbytes / (0.2 * BW), nbytes / 12, nbytes, PEAK, BW, LAUNCH)
    assert slow.regime == "memory-bound" and "below the ridge" in slow.why


def test_classify_compute_bound_by_peak_and_by_intensity():
    flops = 2.0 * 8192 ** 3
    nbytes = 3 * 8192 ** 2 * 2.0
    fast = roofline.classify(flops / (0.7 * PEAK), flops, nbytes, PEAK, BW, LAUNCH)
    assert fast.regime == "compute-bound" and "of peak" in fast.why
    assert fast.pct_of_peak == pytest.approx(70.0) and fast.roof == PEAK
    slow = roofline.classify(flops / (0.1 * PEAK), flops, nbytes, PEAK, BW, LAUNCH)
    assert slow.regime == "compute-bound" and "above the ridge" in slow.why


def test_classify_same_numbers_differ_by_device():
    # The same kernel is memory-bound on a GPU with little bandwidth and
    # compute-bound on one with little compute: the label follows the roofs.
    seconds, flops, nbytes = 1e-3, 2e10, 1e9  # intensity 20
    slow_memory = roofline.classify(seconds, flops, nbytes, 1000e12, 1.5e12, LAUNCH)
    slow_compute = roofline.classify(seconds, flops, nbytes, 30e12, 10e12, LAUNCH)
    assert slow_memory.regime == "memory-bound"
    assert slow_compute.regime == "compute-bound"


def test_classify_rejects_bad_numbers():
    with pytest.raises(ValueError):
        roofline.classify(0.0, 1.0, 1.0, PEAK, BW, LAUNCH)
    with pytest.raises(ValueError):
        roofline.classify(1.0, 1.0, 0.0, PEAK, BW, LAUNCH)


# ---- registration --------------------------------------------------------------------------

@pytest.mark.parametrize("name,number", [("pinned", 11), ("streams", 12), ("prefetch", 13),
                                         ("roofline", 16)])
def test_lessons_registered_with_plot(name, number):
    x = lessons.get(name)
    assert x.number == number and x.plot is not None
    assert set(x.quick_params) <= set(x.params)


# ---- prefetch: the loader and the prefetcher with a stand-in for the GPU -----------------

from cudalab.lessons import prefetch  # noqa: E402


class _FakeEvent:
    def __init__(self, log):
        self.log, self.synced = log, False

    def synchronize(self):
        self.synced = True
        self.log.append(("sync", self))


class _FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", self.name))
        return False

    def wait_event(self, event):
        self.log.append(("wait", self.name, event))

    def record_event(self):
        event = _FakeEvent(self.log)
        self.log.append(("record", self.name, event))
        return event


class _FakeBatch:
    """A device batch: the host values at upload time."""

    def __init__(self, host, log):
        self.values, self.log = host.copy(), log

    def record_stream(self, stream):
        self.log.append(("record_stream", stream.name))

    def get(self):
        return self.values


class _FakeApi:
    name = "fake"

    def __init__(self):
        self.log = []
        self.consumer = _FakeStream(self.log, "consumer")
        self.sides = 0

    def Stream(self):  # noqa: N802 - mirrors cudalab.Stream
        self.sides += 1
        return _FakeStream(self.log, f"side{self.sides}")

    def current_stream(self):
        return self.consumer

    def stream(self, s):
        return s

    def upload(self, host, non_blocking):
        self.log.append(("upload", non_blocking))
        return _FakeBatch(host, self.log)

    def record(self, s):
        return s.record_event()

    def synchronize(self):
        pass


def _source(batches=6):
    return prefetch.BatchSource(rows=8, features=5, batches=batches, pool=2, seed=3)


def test_batch_source_prepares_distinct_deterministic_batches():
    src = _source()
    b0, b1, b2 = src.expected(0), src.expected(1), src.expected(2)
    assert b0.dtype == np.float32 and b0.shape == (8, 5)
    assert np.array_equal(b0, src.expected(0))
    # pool of 2: batches 0 and 2 share raw rows but are shifted differently
    assert not np.array_equal(b0, b1) and not np.array_equal(b0, b2)
    raw = src.raw[0].astype(np.float32)
    assert np.array_equal(b0, (raw - np.float32(prefetch.MEAN)) * np.float32(prefetch.INV_STD))
    assert np.array_equal(b2, np.roll((raw - np.float32(prefetch.MEAN)) *
                                      np.float32(prefetch.INV_STD), 2, axis=1))


def _counting_staging():
    made = []

    def staging(shape):
        made.append(np.empty(shape, np.float32))
        return made[-1]
    return made, staging


def test_host_loader_allocates_its_staging_ring_once():
    src = _source()
    made, staging = _counting_staging()
    loader = prefetch.HostLoader(src, pinned=True, pinned_empty=staging)
    ptrs = [host.ctypes.data for _, host in loader]
    assert len(made) == prefetch.SLOTS and len(set(ptrs)) == prefetch.SLOTS
    assert ptrs[:prefetch.SLOTS] * (src.batches // prefetch.SLOTS) == ptrs  # round robin
    assert [i for i, _ in loader] == list(range(src.batches))
    assert len(made) == prefetch.SLOTS  # a new epoch reuses the ring
    pageable = prefetch.HostLoader(src, pinned=False)
    assert [i for i, _ in pageable] == list(range(src.batches))


def test_prefetcher_with_one_iterator_delivers_every_batch_in_order():
    src = _source()
    api = _FakeApi()
    loader = prefetch.HostLoader(src, pinned=True, pinned_empty=lambda s: np.empty(s, np.float32))
    got = list(prefetch.Prefetcher(loader, api))
    assert [i for i, _ in got] == list(range(src.batches))
    for k, (_, batch) in enumerate(got):
        assert np.array_equal(batch.get(), src.expected(k))
    assert prefetch._consumed(iter(got), src.batches, src) == (src.batches, 0)
    # Copies are non_blocking on the side stream; the consumer waits for each one's
    # event and records each batch on its own stream.
    uploads = [e for e in api.log if e[0] == "upload"]
    assert uploads == [("upload", True)] * src.batches
    waits = [e for e in api.log if e[0] == "wait"]
    records = [e for e in api.log if e[0] == "record"]
    assert [w[2] for w in waits] == [rec[2] for rec in records]
    recorded = [e for e in api.log if e[0] == "record_stream"]
    assert recorded == [("record_stream", "consumer")] * src.batches
    # Before a staging slot is refilled, the copy that read it has been waited for:
    # every refill after the first round of the ring.
    assert sum(1 for e in api.log if e[0] == "sync") == src.batches - prefetch.SLOTS


def test_prefetcher_that_restarts_its_iterator_repeats_the_first_batch():
    src = _source()
    api = _FakeApi()
    made, staging = _counting_staging()
    loader = prefetch.HostLoader(src, pinned=True, pinned_empty=staging)
    distinct, wrong = prefetch._consumed(prefetch.Prefetcher(loader, api, restart=True),
                                         src.batches, src)
    assert distinct == 1 and wrong == src.batches - 1
    # Each restart takes the next buffer of the loader's ring, after its copy.
    assert len(made) == prefetch.SLOTS
    assert sum(1 for e in api.log if e[0] == "sync") >= src.batches - prefetch.SLOTS


def test_synchronous_loading_uploads_blocking():
    src = _source(3)
    api = _FakeApi()
    got = list(prefetch.synchronous(prefetch.HostLoader(src, pinned=False), api))
    assert [i for i, _ in got] == [0, 1, 2]
    assert [e for e in api.log if e[0] == "upload"] == [("upload", False)] * 3


# ---- every lesson end to end on a NumPy stand-in for the GPU ------------------------------
# Not a measurement: it runs each lesson's Python (setup, rows, findings,
# claims, checks, JSON round trip and plot) with small parameters, so an error
# in that code shows here rather than on the one GPU run.

import json  # noqa: E402
import types  # noqa: E402
from unittest import mock  # noqa: E402

import cudalab  # noqa: E402
from cudalab.bench import Measurement  # noqa: E402
from cudalab.lessons import registry  # noqa: E402
from cudalab.lessons.result import LessonResult  # noqa: E402

_TINY = {
    "pinned": {"sizes_kib": (64, 256), "overlap_mib": 1},
    "streams": {"kernel_cols": 2048, "kernels": 4, "big_shape": (64, 64), "big_kernels": 2,
                "streams": (1, 2), "pipeline_mib": 1, "chunks": (1, 4), "repeats": 2},
    "prefetch": {"batches": 4, "rows": 64, "features": 32, "repeats": 2},
    "roofline": {"dtypes": ("float32", "float16"), "elements": 4096, "tiny_elements": 256,
                 "softmax_shape": (64, 64), "small_n": 16, "large_n": 64},
}


class _Event:
    def synchronize(self):
        pass


class _Stream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    def wait_event(self, event):
        assert isinstance(event, _Event)

    def wait_stream(self, stream):
        assert isinstance(stream, _Stream)

    def record_event(self):
        return _Event()


class _Array:
    """A DeviceArray stand-in holding a NumPy array."""

    def __init__(self, values):
        self.a = np.array(values)

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)

    def get(self, out=None, non_blocking=False):
        if out is None:
            return self.a.copy()
        assert out.shape == self.a.shape and out.dtype == self.a.dtype
        out[...] = self.a
        return out

    def record_stream(self, stream):
        assert isinstance(stream, _Stream)

    def reshape(self, *shape):
        view = _Array.__new__(_Array)  # shares memory, like DeviceArray.reshape
        view.a = self.a.reshape(*shape)
        return view


def _values(x):
    return x.a if isinstance(x, _Array) else x


def _into(out, values):
    if out is None:
        return _Array(values)
    # cudalab's out= must have the result's shape (no broadcasting into it).
    if out.a.shape != np.shape(values):
        raise ValueError(f"out has shape {out.a.shape} but the result has shape {np.shape(values)}")
    out.a[...] = values
    return out


def _dtype(d):
    return np.float32 if d is None else np.dtype(d)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _fake_gpu(monkeypatch):
    rng = np.random.default_rng(0)
    fake = {
        "asarray": lambda h, dtype=None, non_blocking=False: _Array(h),
        "pinned_empty": lambda shape, dtype=np.float32: np.empty(shape, dtype),
        "empty": lambda shape, dtype=None: _Array(np.empty(shape, _dtype(dtype))),
        "full": lambda shape, v, dtype=None: _Array(np.full(shape, v, _dtype(dtype))),
        "Stream": _Stream, "current_stream": _Stream, "synchronize": lambda: None,
        "current_device": lambda: 0,
        "get_device_properties": lambda d=None: types.SimpleNamespace(name="Fake GPU",
                                                                     async_engine_count=2),
        "add": lambda a, b, out=None: _into(out, _values(a) + _values(b)),
        "sum": lambda a: _Array(np.float32(_values(a).astype(np.float64).sum())),
        "softmax": lambda x, out=None: _into(out, _softmax(_values(x))),
        "matmul": lambda a, b, out=None, precision=None: _into(
            out, (_values(a).astype(np.float64) @ _values(b)).astype(_values(a).dtype)),
        "axpy": lambda alpha, x, y, out=None: _into(
            out, (alpha * _values(x) + y).astype(np.float32)),
        "tanh": lambda x, out=None: _into(out, np.tanh(_values(x))),
        "mul": lambda a, b, out=None: _into(out, _values(a) * _values(b)),
        "copyto": lambda dst, src: _into(dst, np.broadcast_to(_values(src), dst.shape)),
    }
    for name, fn in fake.items():
        monkeypatch.setattr(cudalab, name, fn)

    def normal(shape, mean=0.0, std=1.0, dtype=None, seed=None):
        d = np.float32 if dtype in (None, "tf32") else np.dtype(dtype)
        return _Array((mean + std * rng.standard_normal(shape)).astype(d))

    monkeypatch.setattr(cudalab.random, "normal", normal)
    from cudalab.bench import cases

    monkeypatch.setattr(cases, "_core", types.SimpleNamespace(
        pinned_empty=fake["pinned_empty"], full=fake["full"], asarray=fake["asarray"],
        current_device=lambda: 0))
    monkeypatch.setattr(cudalab._core, "current_device", lambda: 0)
    from cudalab import prefetch as feeding  # the shared loader mechanism calls _core

    monkeypatch.setattr(feeding, "_core", types.SimpleNamespace(
        pinned_empty=fake["pinned_empty"], asarray=fake["asarray"], Stream=_Stream,
        current_stream=_Stream, synchronize=fake["synchronize"]))
    monkeypatch.setattr(cudalab.devices, "get_device_properties", fake["get_device_properties"])

    def ceiling(name):
        value = {"copy": 3e12, "h2d": 50e9, "d2h": 50e9, "launch": 4e-6}.get(name, 60e12)
        unit = "s" if name == "launch" else "FLOP/s" if name.startswith("matmul") else "B/s"
        return types.SimpleNamespace(name=name, value=value, unit=unit)

    for name in ("pinned", "roofline"):
        monkeypatch.setattr(getattr(lessons, name), "ceiling", ceiling)

    def timed(fn, args, label, ceiling_name, flops, nbytes, description=None):
        fn(*args)
        c = ceiling(ceiling_name) if isinstance(ceiling_name, str) else None
        # host_time: a real Timer always reports the host's enqueue time per call.
        return Measurement(label=label, times=(0.9e-3, 1e-3, 1.1e-3), flops=flops, bytes=nbytes,
                           description=description, host_time=0.2e-3,
                           ceiling_name=c and c.name, ceiling_value=c and c.value,
                           ceiling_unit=c and c.unit)

    class Timer:
        settings = types.SimpleNamespace(warmup=0.0)
        hold = True

        def replace(self, **overrides):
            return self

        def measure(self, fn, *args, label=None, ceiling=None, flops=None, bytes=None,
                    description=None, **other):
            return timed(fn, args, label, ceiling, flops, bytes, description)

    def measure(self, label, fn, *args, ceiling=None, flops=None, bytes=None,
                description=None, **other):
        return self.add(timed(fn, args, label, ceiling, flops, bytes, description), label)

    monkeypatch.setattr(registry.LessonRun, "measure", measure)
    return Timer()


@pytest.mark.parametrize("name", list(_TINY))
def test_lesson_runs_on_a_numpy_stand_in(monkeypatch, name):
    timer = _fake_gpu(monkeypatch)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get(name)
    params = {**x.defaults(True), **_TINY[name]}
    r = registry.LessonRun(x, params, True)
    r.timer = timer
    x.function(r)
    assert r.rows and r.findings and r.claims and r.checks
    assert all(c.passed for c in r.checks)
    assert len({tuple(row) for row in r.rows}) == 1  # the same keys on every row
    result = LessonResult(
        lesson=x.name, number=x.number, title=x.title, seed=x.seed, params=params, quick=True,
        device={"name": "Fake GPU"}, env={}, measurements=dict(r.measurements),
        rows=tuple(r.rows), findings=tuple(r.findings), claims=tuple(r.claims),
        checks=tuple(r.checks), wall_seconds=0.0, created="2026-11-23T00:00:00+00:00")
    back = LessonResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.rows == result.rows and back.findings == result.findings
    assert x.name in result.table()
    ax = mock.MagicMock()
    ax.plot.return_value = [mock.MagicMock()]
    x.plot(result, ax)
