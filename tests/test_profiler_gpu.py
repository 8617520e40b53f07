"""GPU tier: cudalab.profiler on real ops — what it records, that its GPU
times add up to an independently event-timed total, the Chrome trace, user
ranges, side streams, CUDA graph capture, and that results stay correct."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import numpy as np
import pytest

import cudalab as cl
from cudalab import _core
from cudalab.profiler import profile, record_function
from _support import DOCS, F32, gelu_reference, random_array, rel_err, run_in_threads

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("no_profile_left_running")]

# CUDA events resolve about 0.5 us; comparisons of GPU timestamps allow this.
EVENT_SLACK_NS = 1_000


def ops_only(prof):
    return [e for e in prof.events() if e.kind == "op"]


# ---- the three-op script -------------------------------------------------------------


def test_three_op_script_matches_event_timed_total():
    n = 4096
    a = cl.random.normal((n, n), seed=7)  # float32, created before profiling

    def script():
        c = cl.matmul(a, a)
        d = c + a
        s = cl.sum(d)
        return c, d, s

    for _ in range(2):  # warm-up: cuBLAS handles and plans, pool memory
        script()
    cl.synchronize()

    start, end = cl.Event(enable_timing=True), cl.Event(enable_timing=True)
    with profile() as prof:
        start.record()
        c, d, s = script()
        end.record()
    end.synchronize()
    after_ns = time.monotonic_ns()
    total_ms = start.elapsed_time(end)

    events = prof.events()
    assert [e.name for e in events] == ["matmul", "add", "sum"]
    matmul, add, total = events
    for e in events:
        assert e.kind == "op" and e.dtype == "float32"
        assert e.device == cl.current_device() and e.stream == 0
        assert e.thread_id == threading.get_native_id()
        assert e.gpu_duration_ns is not None and e.gpu_duration_ns > 0
        assert e.host_end_ns > e.host_start_ns and not e.in_graph_capture
    assert matmul.input_shapes == ((n, n), (n, n)) and matmul.output_shape == (n, n)
    assert matmul.flops == 2 * n**3 and matmul.bytes == 3 * n * n * 4
    assert add.input_shapes == ((n, n), (n, n)) and add.output_shape == (n, n)
    assert add.bytes == 3 * n * n * 4 and add.flops == n * n
    assert total.input_shapes == ((n, n),) and total.output_shape == ()
    assert total.bytes == n * n * 4 + 4 and total.flops == n * n

    gpu_ms = sum(e.gpu_duration_ns for e in events) / 1e6
    assert abs(gpu_ms - total_ms) <= 0.10 * total_ms, (gpu_ms, total_ms)

    # The ops ran one after another on one stream: the GPU intervals follow
    # each other, and each starts after its host call began.
    unc = prof.gpu_clock_uncertainty_ns[cl.current_device()]
    assert 0 <= unc < 1_000_000
    for prev, nxt in zip(events, events[1:]):
        assert nxt.gpu_start_ns >= prev.gpu_end_ns - EVENT_SLACK_NS
    for e in events:
        assert e.gpu_start_ns >= e.host_start_ns - unc - EVENT_SLACK_NS
        assert e.gpu_end_ns <= after_ns + unc + EVENT_SLACK_NS

    # Profiling did not change the results.
    # (2e-3 also admits TF32, should an earlier test have left "high" precision set.)
    a_h = a.get().astype(np.float64)
    c_ref = a_h @ a_h
    assert rel_err(c.get(), c_ref) < 2e-3
    d_h = d.get().astype(np.float64)
    assert rel_err(d_h, c_ref + a_h) < 2e-3
    assert abs(float(s.get()) - d_h.sum()) <= 1e-5 * np.abs(d_h).sum()

    table = prof.key_averages().table(sort_by="gpu_time_total", row_limit=10)
    assert [line.split()[0] for line in table.splitlines()[2:5]] == ["matmul", "add", "sum"]
    assert table.splitlines()[-1].startswith("3 op calls; GPU time of all ops:")


# ---- the Chrome trace ----------------------------------------------------------------


def test_chrome_trace_parses_and_has_gpu_tracks(tmp_path, rng):
    x = cl.asarray(random_array(rng, (333, 517), F32))
    with profile() as prof:
        with record_function("block"):
            y = cl.exp(x) * 2.0
            z = cl.transpose(y)
            h = z.get()
    np.testing.assert_allclose(h, (np.exp(x.get().astype(np.float64)) * 2.0).T, rtol=1e-5)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    trace = doc["traceEvents"]
    for e in trace:
        assert {"name", "ph", "pid", "tid"} <= set(e), e
    complete = [e for e in trace if e["ph"] == "X"]
    for e in complete:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(e), e
        assert e["ts"] >= -1.0 and e["dur"] >= 0  # us since the profile began
    device = cl.current_device()
    gpu_pids = {e["pid"] for e in trace
                if e["ph"] == "M" and e["name"] == "process_name"
                and e["args"]["name"] == f"GPU {device}"}
    assert len(gpu_pids) == 1
    (gpu_pid,) = gpu_pids
    host_names = [e["name"] for e in complete if e["pid"] == os.getpid()]
    gpu_names = [e["name"] for e in complete if e["pid"] == gpu_pid]
    assert host_names == ["block", "exp", "mul", "transpose", "get"]
    assert sorted(gpu_names) == sorted(host_names)
    mul = next(e for e in complete if e["pid"] == os.getpid() and e["name"] == "mul")
    assert mul["args"]["input_shapes"] == [[333, 517]]  # the scalar is not an array operand
    assert mul["args"]["dtype"] == "float32" and mul["args"]["stream"] == "0x0"
    get = next(e for e in complete if e["pid"] == os.getpid() and e["name"] == "get")
    assert get["args"]["bytes"] == 333 * 517 * 4


# ---- record_function ----------------------------------------------------------------------


def test_record_function_range_contains_its_ops(rng):
    x = cl.asarray(random_array(rng, 100_003, F32))
    with profile() as prof:
        y = x + 1.0
        with record_function("inner block"):
            z = cl.sqrt(cl.abs(y))
            w = cl.sum(z)
        v = w * 3.0
    names = [e.name for e in prof.events()]
    assert names == ["add", "inner block", "abs", "sqrt", "sum", "mul"]
    rng_ev = next(e for e in prof.events() if e.kind == "range")
    assert rng_ev.device == cl.current_device() and rng_ev.stream == 0
    assert rng_ev.gpu_duration_ns is not None
    inside = [e for e in prof.events() if e.name in ("abs", "sqrt", "sum")]
    outside = [e for e in prof.events() if e.name in ("add", "mul")]
    for e in inside:
        assert rng_ev.host_start_ns <= e.host_start_ns <= e.host_end_ns <= rng_ev.host_end_ns
        assert e.gpu_start_ns >= rng_ev.gpu_start_ns - EVENT_SLACK_NS
        assert e.gpu_end_ns <= rng_ev.gpu_end_ns + EVENT_SLACK_NS
    for e in outside:
        assert e.host_end_ns <= rng_ev.host_start_ns or e.host_start_ns >= rng_ev.host_end_ns
    ref = np.sqrt(np.abs(x.get().astype(np.float64) + 1.0)).sum() * 3.0
    assert abs(float(v.get()) - ref) <= 1e-4 * abs(ref)
    rows = {(r.kind, r.name) for r in prof.key_averages()}
    assert ("range", "inner block") in rows
    assert "inner block" in prof.key_averages().table()


# ---- streams ---------------------------------------------------------------------------


def test_ops_on_a_side_stream_carry_that_stream(rng):
    x_h = random_array(rng, (257, 129), F32)
    x = cl.asarray(x_h)
    s = cl.Stream()
    s.wait_stream(cl.current_stream())
    with profile() as prof:
        with s:
            y = cl.relu(x) * 0.5
            with record_function("on side"):
                t = cl.sum(y, axis=0)
        s.synchronize()
        z = x - 1.0  # back on the legacy stream
    by_name = {e.name: e for e in prof.events()}
    for name in ("relu", "mul", "sum", "on side"):
        assert by_name[name].stream == s.cuda_stream != 0
        assert by_name[name].gpu_duration_ns is not None
    assert by_name["sub"].stream == 0
    np.testing.assert_allclose(t.get(), (np.maximum(x_h, 0) * 0.5).sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(z.get(), x_h - 1.0, rtol=1e-6)
    doc = json.loads(json.dumps(_trace(prof)))
    labels = {e["args"]["name"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name"}
    assert f"stream 0x{s.cuda_stream:x}" in labels and "legacy default stream" in labels


def _trace(prof):
    from cudalab.profiler import chrome_trace

    return chrome_trace(prof.events(), prof.start_ns)


# ---- CUDA graphs --------------------------------------------------------------------------


def test_profiling_during_graph_capture_keeps_the_graph_working(rng):
    x_h = random_array(rng, 4099, F32)
    x = cl.asarray(x_h)
    g = cl.CUDAGraph()
    with profile() as prof:
        with cl.graph(g):
            y = cl.tanh(x) * 2.0 + 1.0
        g.replay()
        first = y.get()
    np.testing.assert_allclose(first, np.tanh(x_h) * 2.0 + 1.0, rtol=1e-5, atol=1e-6)
    captured = [e for e in prof.events() if e.in_graph_capture]
    assert [e.name for e in captured] == ["tanh", "mul", "add"]
    for e in captured:
        assert e.gpu_duration_ns is None and e.gpu_start_ns is None
        assert e.stream != 0 and e.host_end_ns >= e.host_start_ns
    (replay,) = [e for e in prof.events() if e.name == "CUDAGraph.replay"]
    assert replay.gpu_duration_ns is not None and replay.stream == 0
    assert not replay.in_graph_capture
    # The table and trace cope with GPU-less rows.
    assert "tanh" in prof.key_averages().table()
    json.dumps(_trace(prof))

    # After the profile the graph still replays, on new input values.
    x += 1.0
    g.replay()
    np.testing.assert_allclose(y.get(), np.tanh(x_h + 1.0) * 2.0 + 1.0, rtol=1e-5, atol=1e-6)


def test_profile_started_inside_a_capture(rng):
    x_h = random_array(rng, 1000, F32)
    x = cl.asarray(x_h)
    g = cl.CUDAGraph()
    with cl.graph(g):
        with profile() as prof:
            y = x * 3.0
    g.replay()
    np.testing.assert_allclose(y.get(), x_h * 3.0, rtol=1e-6)
    (e,) = prof.events()
    assert e.name == "mul" and e.in_graph_capture and e.gpu_duration_ns is None


# ---- on and off ------------------------------------------------------------------------


def test_nothing_recorded_after_the_profile_ends(rng):
    x = cl.asarray(random_array(rng, 1000, F32))
    with profile() as prof:
        y = x + x
    assert not _core._profiler_is_enabled()
    before = prof.events()
    assert [e.name for e in before] == ["add"]
    z = y * 2.0
    z += 1.0
    _ = cl.sum(z).get()
    assert prof.events() == before
    with profile() as later:
        pass
    assert later.events() == []


def test_copies_fills_and_transfers_are_recorded(rng):
    x_h = random_array(rng, (65, 33), F32)
    with profile() as prof:
        x = cl.asarray(x_h)
        h = x.astype(np.float16)
        c = x.T.copy()
        k = cl.ascontiguousarray(x[:, ::2])
        f = cl.full((5, 7), 2.5)
        r = cl.random.uniform(1001, seed=3)
        back = h.get()
    by_name = {e.name: e for e in prof.events()}
    assert list(by_name) == ["asarray", "astype", "copy", "ascontiguousarray", "full",
                             "random.uniform", "get"]
    n = 65 * 33
    assert by_name["asarray"].bytes == n * 4 and by_name["asarray"].input_shapes == ()
    assert by_name["asarray"].output_shape == (65, 33)
    assert by_name["astype"].bytes == n * (4 + 2) and by_name["astype"].dtype == "float16"
    assert by_name["copy"].bytes == 2 * n * 4 and by_name["copy"].input_shapes == ((33, 65),)
    assert by_name["ascontiguousarray"].bytes == 2 * 65 * 17 * 4
    assert by_name["full"].bytes == 35 * 4 and by_name["full"].output_shape == (5, 7)
    assert by_name["random.uniform"].bytes == 1001 * 4
    assert by_name["get"].bytes == n * 2 and by_name["get"].dtype == "float16"
    for e in prof.events():
        assert e.gpu_duration_ns is not None and e.flops is None
    np.testing.assert_array_equal(back, x_h.astype(np.float16))
    np.testing.assert_array_equal(c.get(), x_h.T)
    np.testing.assert_array_equal(k.get(), x_h[:, ::2])
    assert (f.get() == 2.5).all() and r.shape == (1001,)


def test_nn_ops_are_recorded_under_public_names(rng):
    """nn.functional's ops are recorded as the public functions (linear, ...), not as the
    private entry points they call (_nn_linear, ...), which only their errors name."""
    from cudalab.nn import functional as F

    x = cl.asarray(random_array(rng, (16, 32), F32))
    w = cl.asarray(random_array(rng, (8, 32), F32))
    labels = cl.asarray(np.arange(16, dtype=np.int64) % 8)
    with profile() as prof:
        y = F.linear(x, w)
        F.linear_backward_input(y, w)
        F.linear_backward_weight(y, x)
        F.cross_entropy(y, labels)
    assert [e.name for e in ops_only(prof)] == [
        "linear", "linear_backward_input", "linear_backward_weight", "cross_entropy"]
    with pytest.raises(TypeError, match="_nn_linear"):
        _core._nn_linear(x, 1.0)


def test_failed_op_is_not_recorded(memory_baseline):
    total = cl.get_device_properties().total_memory
    # A limit 64 MiB above what is allocated now (earlier tests may hold some).
    cl.set_per_process_memory_fraction((memory_baseline + (64 << 20)) / total)
    with profile() as prof:
        with pytest.raises(cl.OutOfMemoryError):
            cl.zeros(total // 4, dtype=np.float32)  # the whole device, above the limit
        ok = cl.ones(10)
    assert [e.name for e in prof.events()] == ["ones"]
    assert (ok.get() == 1).all()


def test_threads_are_told_apart(rng):
    x = cl.asarray(random_array(rng, 5000, F32))
    ids = {}

    def work(tag):
        ids[tag] = threading.get_native_id()
        cl.neg(x).get()

    with profile() as prof:
        run_in_threads(work, 2)
    negs = [e for e in prof.events() if e.name == "neg"]
    assert sorted(e.thread_id for e in negs) == sorted(ids.values())


def test_nvtx_ranges_without_a_tool_change_nothing(rng):
    x_h = random_array(rng, 777, F32)
    x = cl.asarray(x_h)
    before = _core._nvtx_set_enabled(True)
    try:
        with record_function("nvtx range"):
            y = cl.gelu(x) + 1.0
        with profile() as prof:
            z = cl.sigmoid(y)
    finally:
        _core._nvtx_set_enabled(before)
    assert [e.name for e in prof.events()] == ["sigmoid"]
    ref = 1 / (1 + np.exp(-(gelu_reference(x_h) + 1.0)))
    np.testing.assert_allclose(z.get(), ref, rtol=1e-5)


# ---- the docs' example (docs/measuring.md) -----------------------------------------------------


def test_docs_profiling_example_runs(tmp_path, monkeypatch, capsys):
    page = (DOCS / "measuring.md").read_text()
    section = page.split("## Profiling", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/measuring.md (Profiling)", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "matmul" in out and "GPU total" in out
    json.loads((tmp_path / "trace.json").read_text())
