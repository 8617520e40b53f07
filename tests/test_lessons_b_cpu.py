"""The pure logic of lessons 4 batching, 5 inplace, 7 access_patterns and 14 graphs,
without a GPU: finding and claim decisions from given numbers, break-even points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _measuring, access_patterns, batching, graphs, inplace


# ---- shared helpers -----------------------------------------------------------------


def test_rel_error_scales_by_the_reference():
    ref = np.array([1.0, -4.0, 2.0])
    assert _measuring.rel_error(ref, ref) == 0.0
    assert _measuring.rel_error(ref + [0.0, 0.4, 0.0], ref) == pytest.approx(0.1)
    assert _measuring.rel_error(np.ones(2), np.ones(3)) == math.inf
    assert _measuring.rel_error(np.full(2, 0.5), np.zeros(2)) == 0.5


def test_pick_by_margin():
    texts = ("up {x:.1f}", "down {inv:.1f}", "same {x:.2f}")
    assert _measuring.pick(2.0, 1.5, *texts) == "up 2.0"
    assert _measuring.pick(0.5, 1.5, *texts) == "down 2.0"
    assert _measuring.pick(1.2, 1.5, *texts) == "same 1.20"


def test_ratio_and_random_array():
    assert _measuring.ratio(6.0, 2.0) == 3.0
    assert _measuring.ratio(1.0, 0.0) == math.inf
    x = _measuring.random_array(3, (4, 5))
    assert x.dtype == np.float32 and x.shape == (4, 5) and np.all(x != 0)
    np.testing.assert_array_equal(x, _measuring.random_array(3, (4, 5)))


# ---- 4 batching ---------------------------------------------------------------------


def test_batching_is_registered_with_its_params():
    x = lessons.get("batching")
    assert x.number == 4 and x.plot is not None
    assert set(x.params) == {"batch", "sizes"}
    assert len(x.quick_params["sizes"]) < len(x.params["sizes"])


def test_batching_finding_names_the_winner():
    text = batching.compare_methods(64, loop_s=50e-6, batched_s=5e-6, graph_s=10e-6)
    assert "10.0x faster than the loop" in text and "graph-replayed loop is 5.0x" in text
    text = batching.compare_methods(1024, loop_s=100e-6, batched_s=95e-6, graph_s=99e-6)
    assert "about the same" in text and "changes little" in text
    text = batching.compare_methods(512, loop_s=10e-6, batched_s=30e-6, graph_s=10e-6)
    assert "the loop is 3.0x faster" in text
    text = batching.compare_methods(64, loop_s=10e-6, batched_s=5e-6, graph_s=40e-6)
    assert "graph-replayed loop is 4.0x slower" in text


def test_batching_launch_overhead_never_negative():
    assert batching.launch_overhead(12e-6, 2e-6) == pytest.approx(10e-6)
    assert batching.launch_overhead(2e-6, 12e-6) == 0.0


def test_batching_reference_size_is_the_tutorials_or_closest():
    assert batching._reference_size((64, 256, 1024)) == 256
    assert batching._reference_size((512, 1024)) == 512
    assert batching._reference_size((64, 512)) == 64


# ---- 5 inplace ----------------------------------------------------------------------


def test_inplace_is_registered_with_its_params():
    x = lessons.get("inplace")
    assert x.number == 5 and x.plot is not None
    assert set(x.params) == {"sizes", "steps"}


def test_inplace_allocator_cost_per_extra_allocation():
    assert inplace.allocator_cost(30e-6, 10e-6, 13, 1) == pytest.approx(20e-6 / 12)
    assert inplace.allocator_cost(10e-6, 30e-6, 13, 1) is None  # not slower
    assert inplace.allocator_cost(30e-6, 10e-6, 1, 1) is None  # no extra allocations


def test_inplace_speed_finding_follows_the_threshold():
    assert "1.50x faster" in inplace.speed_finding(256, 1.5, 2e-6)
    assert "2.00 us per allocation" in inplace.speed_finding(256, 1.5, 2e-6)
    assert "same time" in inplace.speed_finding(8192, 1.01, None)
    assert "slower" in inplace.speed_finding(8192, 0.8, None)


def test_inplace_memory_finding_follows_the_threshold():
    mib = 2**20
    assert "3.00x the in-place" in inplace.memory_finding(2048, 48 * mib, 16 * mib)
    assert "peak alike" in inplace.memory_finding(2048, 17 * mib, 16 * mib)


def test_inplace_chains_match_numpy_reference_logic():
    # The NumPy reference applies relu(y * SCALE + SHIFT) `steps` times in float32.
    x = np.array([[-3.0, 1.0], [2.0, -0.1]], dtype=np.float32)
    y = inplace._numpy_chain(x, 2)
    one = np.maximum(x * 0.5 + 0.25, 0)
    np.testing.assert_allclose(y, np.maximum(one * 0.5 + 0.25, 0))
    assert y.dtype == np.float32


def test_inplace_pool_use_counts_peak_and_allocations():
    state = {"allocated": 100, "peak": 100, "count": 7}

    def fn():
        state["peak"] = 160
        state["count"] += 3
        return object()

    def reset():
        state["peak"] = state["allocated"]

    peak, allocs = inplace._pool_use(fn, lambda: state["allocated"], lambda: state["peak"],
                                     reset, lambda: state["count"], lambda: None)
    assert (peak, allocs) == (60, 3)


# ---- 7 access_patterns --------------------------------------------------------------


def test_break_even_uses():
    # copy 10, strided 3 per use, contiguous 1 per use: 10 + n < 3n from n = 6.
    assert _measuring.break_even_uses(10.0, 3.0, 1.0) == 6
    assert _measuring.break_even_uses(0.5, 3.0, 1.0) == 1
    assert _measuring.break_even_uses(10.0, 1.0, 1.0) is None
    assert _measuring.break_even_uses(10.0, 1.0, 2.0) is None
    n = _measuring.break_even_uses(7.3, 2.2, 0.9)
    assert 7.3 + n * 0.9 < n * 2.2 and not 7.3 + (n - 1) * 0.9 < (n - 1) * 2.2


def test_access_patterns_is_registered_with_its_params():
    x = lessons.get("access_patterns")
    assert x.number == 7 and x.plot is not None
    assert set(x.params) == {"size", "steps"}
    assert set(access_patterns.TRANSPOSE_METHODS) == {
        "naive", "coalesced_write", "tiled", "tiled_padded", "best"}


def test_access_patterns_fix_finding_counts_the_copy():
    # The tutorial's case: the view sum is fast, copy + sum is slower.
    text = access_patterns.fix_finding(view_s=0.27e-3, fix_s=1.32e-3, copy_s=1.0e-3,
                                       contiguous_s=0.32e-3)
    assert "4.89x slower once the copy is counted" in text
    assert "never pays off" in text
    # A slow strided op: the copy pays for itself even on one use.
    text = access_patterns.fix_finding(view_s=3e-3, fix_s=1.5e-3, copy_s=1e-3,
                                       contiguous_s=0.5e-3)
    assert "2.00x faster even counting the copy" in text and "used 1 times" in text
    text = access_patterns.fix_finding(view_s=1.0e-3, fix_s=1.05e-3, copy_s=0.8e-3,
                                       contiguous_s=0.25e-3)
    assert "about the same" in text and "used 2 times" in text


def test_access_patterns_stride_finding():
    text = access_patterns.stride_finding([1, 8, 32], [3000.0, 700.0, 200.0])
    assert "15.0x less" in text and "x[:, ::32]" in text
    assert "keep their useful bandwidth" in access_patterns.stride_finding([1, 4], [3000, 2500])


# ---- 14 graphs ----------------------------------------------------------------------


def test_graphs_is_registered_with_its_params():
    x = lessons.get("graphs")
    assert x.number == 14 and x.plot is not None
    assert set(x.params) == {"ks", "elements", "captures"}
    assert tuple(x.params["ks"]) == (1, 4, 16, 64, 256)
    assert len(x.quick_params["ks"]) < len(x.params["ks"])


def test_graphs_one_use_break_even_k():
    ks = (1, 16, 256)
    # Capture + one replay costs more than eager at every K: a graph used once never wins.
    assert graphs.one_use_break_even_k(ks, [60e-6, 150e-6, 1.5e-3], [5e-6, 80e-6, 1.3e-3]) is None
    # It wins from K=256 on.
    assert graphs.one_use_break_even_k(ks, [60e-6, 150e-6, 1.0e-3], [5e-6, 80e-6, 1.3e-3]) == 256


def test_graphs_break_even_replays_from_costs():
    # Capture 100 us, eager 64 ops x 5 us = 320 us, replay 64 x 1 us = 64 us: saving 256 us
    # per use, so the first replay already pays.
    assert _measuring.break_even_uses(100e-6, 320e-6, 64e-6) == 1
    # Capture 1 ms, saving 4 us per use: 251 replays.
    assert _measuring.break_even_uses(1e-3, 9e-6, 5e-6) == 251
    assert graphs.per_op_change(5.0) == "5.0x less"
    assert graphs.per_op_change(0.5) == "2.0x more"
    text = graphs.break_even_text((1, 64), (None, 3))
    assert text.endswith("K=1: never, K=64: 3")


def test_graphs_numpy_chain_matches_the_op_sequence():
    x = np.array([2.0, -1.0], dtype=np.float32)
    # K=4: y = x*0.5; y += x; y *= 0.75; y -= 0.125
    want = ((x * 0.5 + x) * 0.75) - 0.125
    np.testing.assert_allclose(graphs._numpy_chain(x, 4), want)
    np.testing.assert_allclose(graphs._numpy_chain(x, 1), x * 0.5)


def test_graphs_chain_issues_k_ops():
    calls = []

    class Recorder:
        def __getattr__(self, name):
            return lambda *args, out=None: calls.append(name)

    for k in (1, 2, 7, 64):
        calls.clear()
        graphs._chain_ops(Recorder(), "x", "y", k)
        assert len(calls) == k and calls[0] == "mul"


# ---- every lesson's run() end to end on a NumPy stand-in ------------------------------
# The GPU tier runs the real thing; this catches flow errors (names, row keys, findings
# resting on recorded labels, checks, the plot) without a GPU.


class _HostArray(np.ndarray):
    """A NumPy array with DeviceArray's get()."""

    def get(self):
        return np.array(self)


def _fake_cudalab():
    import types

    count = {"allocs": 0}

    def new(a):
        count["allocs"] += 1
        return np.asarray(a).view(_HostArray)

    def ufunc(f):
        return lambda a, b, out=None: f(a, b, out=out) if out is not None else new(f(a, b))

    class Graph:
        def replay(self):
            pass  # the work ran eagerly during "capture"

    class GraphContext:
        def __init__(self, g):
            self.g = g

        def __enter__(self):
            return self.g

        def __exit__(self, *exc):
            return False

    def relu(a, out=None):
        return np.maximum(a, np.float32(0), out=out) if out is not None else new(np.maximum(a, 0))

    fake = types.SimpleNamespace(
        asarray=lambda a: new(np.array(a)),
        empty=lambda shape, dtype="float32": new(np.empty(shape, dtype)),
        empty_like=lambda a: new(np.empty_like(a)),
        ascontiguousarray=lambda a: new(np.ascontiguousarray(a)),
        transpose=lambda a, method="best": new(np.ascontiguousarray(a.T)),
        matmul=lambda a, b, out=None, precision=None: (
            np.matmul(a, b, out=out) if out is not None else new(np.matmul(a, b))),
        sum=lambda a, axis=None: new(np.sum(a, axis=axis)),
        mul=ufunc(np.multiply), add=ufunc(np.add), sub=ufunc(np.subtract), relu=relu,
        synchronize=lambda: None, CUDAGraph=Graph, graph=GraphContext,
        memory_allocated=lambda: 0, max_memory_allocated=lambda: 4 * count["allocs"],
        reset_peak_memory_stats=lambda: None,
        memory_stats=lambda: {"allocation.all.allocated": count["allocs"]},
    )
    return fake


class _TorchArray(_HostArray):
    """A NumPy array with the few torch.Tensor methods the lessons call."""

    def cpu(self):
        return self

    def numpy(self):
        return np.array(self)

    def t(self):
        return self.T

    def contiguous(self):
        return np.ascontiguousarray(self).view(_TorchArray)

    def mul(self, s):
        return np.multiply(self, s).view(_TorchArray)

    def mul_(self, s):
        return np.multiply(self, s, out=self)

    def add_(self, s):
        return np.add(self, s, out=self)

    def relu_(self):
        return np.maximum(self, np.float32(0), out=self)


def _fake_torch():
    """A NumPy stand-in for the torch calls the lessons make (tensors as _TorchArray)."""
    import contextlib
    import types

    base = _fake_cudalab()

    def new(a):
        return np.asarray(a).view(_TorchArray)

    def op(f):
        return lambda a, b, out=None: f(a, b, out=out) if out is not None else new(f(a, b))

    cuda = types.SimpleNamespace(
        synchronize=lambda: None, memory_allocated=lambda: 0,
        max_memory_allocated=lambda: 0, reset_peak_memory_stats=lambda: None,
        memory_stats=lambda: {"allocation.all.allocated": 0},
        CUDAGraph=base.CUDAGraph, graph=lambda g: contextlib.nullcontext(g))
    return types.SimpleNamespace(
        as_tensor=lambda a, device=None: new(np.array(a)),
        empty_like=lambda a: new(np.empty_like(a)),
        mm=op(np.matmul), bmm=op(np.matmul), mul=op(np.multiply), add=op(np.add),
        sub=op(np.subtract), relu=lambda a: new(np.maximum(a, np.float32(0))),
        sum=lambda a, dim: new(np.sum(a, axis=dim)), cuda=cuda,
        backends=types.SimpleNamespace(cuda=types.SimpleNamespace(
            matmul=types.SimpleNamespace(allow_tf32=True))))


@pytest.fixture(params=[False, True], ids=["no_torch", "fake_torch"])
def fake_backend(monkeypatch, request):
    import types

    from cudalab.lessons import registry
    from _support import fake_measurement

    fake = _fake_cudalab()
    rng = np.random.default_rng(0)
    for module in (batching, inplace, access_patterns, graphs):
        monkeypatch.setattr(module, "cudalab", fake)
    monkeypatch.setattr(_measuring, "_core", fake)

    def host_clock(cases, repeats, warmup):
        return {name: [fn() or float(rng.uniform(1e-5, 1e-3)) for _ in range(3)]
                for name, fn in cases.items()}

    def host_measurement(times, *, calls, label, **kw):
        return fake_measurement(label, median=float(np.median(times)) / calls)

    for module in (_measuring, graphs):
        monkeypatch.setattr(module, "host_clock", host_clock)
        monkeypatch.setattr(module, "host_measurement", host_measurement)
    launch = types.SimpleNamespace(value=2.5e-6)
    for module in (batching, graphs):
        monkeypatch.setattr(module, "ceiling", lambda name: launch)

    def measure(self, label, fn, *args, flops=None, bytes=None, ceiling="auto", **kw):
        fn(*args)
        copy = ceiling == "copy"
        return self.add(fake_measurement(
            label, median=float(rng.uniform(1e-6, 1e-3)), flops=flops, bytes=bytes,
            ceiling_name="copy" if copy else None, ceiling_value=3e12 if copy else None,
            ceiling_unit="B/s" if copy else None), label)

    monkeypatch.setattr(registry.LessonRun, "measure", measure)
    torch = _fake_torch() if request.param else None
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: torch))
    return registry


@pytest.mark.parametrize("name", ["batching", "inplace", "access_patterns", "graphs"])
def test_lesson_flow_on_a_numpy_stand_in(fake_backend, name):
    x = lessons.get(name)
    params = x.defaults(True)
    if name == "batching":
        params["sizes"] = (16, 24)
    elif name == "inplace":
        params["sizes"] = (32, 48)
    elif name == "access_patterns":
        params["size"] = 64
    r = fake_backend.LessonRun(x, params, quick=True)
    x.function(r)
    assert r.rows and r.findings and r.claims and r.checks
    assert all(c.passed for c in r.checks)
    impls = {row["impl"] for row in r.rows}
    assert impls == ({"cudalab", "torch"} if r.torch() is not None else {"cudalab"})
    keys = set(r.rows[0])
    assert all(set(row) == keys for row in r.rows)
    for f in r.findings:
        assert set(f.labels) <= set(r.measurements)

    class Ax:
        def __getattr__(self, attr):
            return lambda *args, **kwargs: None

    x.plot(types_result(r), Ax())


def types_result(r):
    """The bits of a LessonResult the plots read."""
    import types

    return types.SimpleNamespace(rows=tuple(r.rows), measurements=r.measurements)
