"""Lessons 8-10 and 15 (profiling, cpu_vs_gpu, memory, timing) without a GPU: their pure logic,
and profiling end to end on a NumPy stand-in for the GPU, cudalab.nn and the profiler."""

from __future__ import annotations

import re

import pytest
from _support import REPO_ROOT

import cudalab
from cudalab import lessons
from cudalab.lessons import profiling
from cudalab.lessons import training as _training

ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "relu", "where"})


# ---- profiling: registration, parameters, the categories and the findings' wording ----------


def test_profiling_registered_with_plot_and_small_quick_params():
    x = lessons.get("profiling")
    assert x.number == 8 and x.plot is not None
    assert set(x.quick_params) <= set(x.params) and x.quick_params
    full, quick = x.defaults(False), x.defaults(True)
    assert profiling.check_params(full) == ((1024, 4096, 4096, 1024), "bf16")
    assert profiling.check_params(quick)[0] == (1024, 2048, 2048, 1024)
    # The quick step does under a third of the full step's GEMM work.
    flops = [_training.step_flops(profiling.check_params(p)[0], p["batch"]) for p in (full, quick)]
    assert flops[1] < flops[0] / 3


def _params(**over):
    return {**lessons.get("profiling").defaults(True), **over}


@pytest.mark.parametrize("over,match", [
    ({"precision": "fp8"}, "precision must be one of fp32, tf32, fp16, bf16"),
    ({"lr": 0}, r"lr must be a number in \(0, 1\)"),
    ({"steps": 0}, "steps must be an int >= 1"),
    ({"warmup_steps": 1.5}, "warmup_steps must be an int >= 1"),
    ({"top_ops": True}, "top_ops must be an int >= 1"),
    ({"hidden": ()}, "hidden must be a non-empty sequence"),
    ({"classes": 1}, "classes must be >= 2"),
])
def test_profiling_rejects_bad_params(over, match):
    with pytest.raises(ValueError, match=r"^lesson 'profiling': " + match):
        profiling.check_params(_params(**over))


def test_profiling_categories_name_ops_the_c_core_records():
    """Every nn op name a category lists is the public name an op frame records in csrc/
    (the private entry point, _nn_*, is only in errors), and no name is in two kinds."""
    source = "".join(f.read_text() for f in (REPO_ROOT / "csrc" / "ops").glob("*.c"))
    # lin_init / mt_init take the private name then the record; the others call
    # cl_op_record_as(op, record).
    recorded = set(re.findall(r'(?:lin|mt)_init\([^,]+, [^,]+, (?:"_nn_[a-z_]+"|func), "([a-z_]+)"',
                              source))
    recorded |= set(re.findall(r'cl_op_record_as\([^,]+, "([a-z_]+)"\)', source))
    named = profiling.GEMM_OPS | profiling.LOSS_OPS | profiling.OPTIMIZER_OPS
    assert len(recorded) >= 8 and recorded == named - {"matmul"}
    assert not any(n.startswith("_") for n in named)
    sets = (profiling.GEMM_OPS, profiling.LOSS_OPS, profiling.OPTIMIZER_OPS,
            profiling.REDUCTION_OPS, frozenset(cudalab._core._ELEMENTWISE_OPS))
    assert sum(len(x) for x in sets) == len(frozenset().union(*sets))  # no name in two kinds


@pytest.mark.parametrize("name,category", [
    ("linear", "gemm"), ("linear_backward_input", "gemm"),
    ("linear_backward_weight", "gemm"), ("matmul", "gemm"),
    ("cross_entropy", "loss"), ("adamw", "optimizer"), ("sgd", "optimizer"),
    ("unscale", "optimizer"), ("update_scale", "optimizer"),
    ("mul", "element-wise"), ("where", "element-wise"), ("sum", "reduction"),
    ("copy", "cast"), ("copyto", "cast"), ("_spin", "other")])
def test_op_category(name, category):
    assert profiling.op_category(name, ELEMENTWISE) == category


def test_category_shares_sum_to_one_and_split_by_kind():
    shares = profiling.category_shares(
        {"linear": 500, "linear_backward_weight": 100, "adamw": 150, "mul": 100,
         "cross_entropy": 50, "sum": 50, "copy": 50}, ELEMENTWISE)
    assert list(shares) == list(profiling.CATEGORIES)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares == pytest.approx({"gemm": 0.6, "loss": 0.05, "optimizer": 0.15, "cast": 0.05,
                                    "element-wise": 0.1, "reduction": 0.05, "other": 0.0})
    assert profiling.category_shares({}, ELEMENTWISE) == dict.fromkeys(profiling.CATEGORIES, 0.0)


def test_bottleneck_text_follows_the_threshold():
    t = profiling.GEMM_DOMINATES
    dominated = profiling.bottleneck_text({"gemm": t + 0.01, "optimizer": 0.2})
    assert dominated.startswith("GEMMs dominate") and f"at most {1 - t - 0.01:.0%}" in dominated
    low = profiling.bottleneck_text({"gemm": t - 0.01, "optimizer": 0.3, "element-wise": 0.19})
    assert low.startswith("GEMMs take only") and "first the optimizer ops (30%" in low


def test_optimizer_text_follows_the_threshold():
    t = profiling.OPTIMIZER_NOTABLE
    notable = profiling.optimizer_text(t, 25_178_112, 4096)
    assert "10.0% of the step" in notable and "all 25.2M parameters" in notable
    assert "spread that pass" in notable
    small = profiling.optimizer_text(t - 0.001, 2908, 4096)
    assert "at 4096 rows per step the GEMMs' work outweighs one pass over the 2,908" in small


def test_casts_text_names_the_casts_of_half_precisions_only():
    for precision in ("bf16", "fp16"):
        text = profiling.casts_text(0.081, precision)
        assert "8.1%" in text and f"into {precision} before the forward" in text
        assert "nothing is cast back" in text
    for precision in ("fp32", "tf32"):
        assert "nothing is cast" in profiling.casts_text(0.0, precision)


def test_launch_text_follows_the_threshold():
    bound = profiling.launch_text(2e-3, 1e-3, 23)
    assert "(23 ops)" in bound and "launch-bound" in bound and "CUDA graph" in bound
    gpu = profiling.launch_text(0.25e-3, 1e-3, 23.0)
    assert "GPU-bound" in gpu and "(25%)" in gpu
    r = profiling.LAUNCH_BOUND_RATIO
    assert "GPU-bound" in profiling.launch_text(r * 1e-3, 1e-3, 1)
    assert "launch-bound" in profiling.launch_text(1e-3, 0.0, 1)


def test_hold_text_says_whether_the_hold_outlasted_the_enqueueing():
    assert "no launch gaps" in profiling.hold_text(0.5e-3)
    assert "ran out 0.200 ms before" in profiling.hold_text(-0.2e-3)


def test_trace_counts():
    doc = {"traceEvents": [{"ph": "M", "name": "process_name"},
                           {"ph": "X", "cat": "op"}, {"ph": "X", "cat": "op"},
                           {"ph": "X", "cat": "gpu_op"}, {"ph": "X", "cat": "range"}]}
    assert profiling.trace_counts(doc) == (2, 1)


def test_profiling_hold_covers_the_enqueueing_and_is_capped():
    assert profiling.hold_seconds(1e-3, 10) == pytest.approx(profiling.HOLD_MARGIN * 1e-2 + 1e-3)
    assert profiling.hold_seconds(1.0, 100) == profiling.HOLD_MAX_S
    assert profiling.hold_seconds(0.0, 10) == pytest.approx(1e-3)


def test_profiling_rows_have_one_key_set():
    assert len(set(profiling.ROW_KEYS)) == len(profiling.ROW_KEYS)


# ---- cpu_vs_gpu ---------------------------------------------------------------------

from cudalab.lessons import cpu_vs_gpu  # noqa: E402


def test_cpu_matmul_size_fits_the_target_time():
    m = cpu_vs_gpu.SIZE_MULTIPLE
    # 1 TFLOP/s for 1 s: n^3 = 5e11 -> 7937 -> 7936 (a multiple of 64)
    assert cpu_vs_gpu.cpu_matmul_size(1e12, 8192, 1.0) == 7936
    assert cpu_vs_gpu.cpu_matmul_size(1e15, 8192, 1.0) == 8192        # fast: the full size
    assert cpu_vs_gpu.cpu_matmul_size(1e6, 8192, 1.0) == m            # slow: the floor
    assert cpu_vs_gpu.cpu_matmul_size(1e15, 100, 1.0) == 100          # never above the size
    n = cpu_vs_gpu.cpu_matmul_size(2e9, 8192, 0.5)                     # a float16-like rate
    assert n % m == 0 and 2 * n ** 3 / 2e9 <= 0.5 < 2 * (n + m) ** 3 / 2e9
    with pytest.raises(ValueError, match="rate must be > 0"):
        cpu_vs_gpu.cpu_matmul_size(0.0, 8192, 1.0)


def test_cpu_repeats_fit_the_budget_within_bounds():
    low = cpu_vs_gpu.MIN_CPU_REPEATS
    assert cpu_vs_gpu.cpu_repeats(0.001, 100, 8.0) == 100     # cheap: all iterations
    assert cpu_vs_gpu.cpu_repeats(0.5, 100, 8.0) == 16        # cut to the budget
    assert cpu_vs_gpu.cpu_repeats(20.0, 100, 8.0) == low      # slow: the floor
    assert cpu_vs_gpu.cpu_repeats(20.0, 2, 8.0) == 2          # never above iterations
    assert cpu_vs_gpu.cpu_repeats(0.0, 5, 1.0) == 5


@pytest.mark.parametrize("speedup, held, word", [(20.0, False, "below"), (50.0, True, "within"),
                                                 (100.0, True, "within"),
                                                 (400.0, True, "above")])
def test_speedup_verdict(speedup, held, word):
    got, why = cpu_vs_gpu.speedup_verdict(speedup)
    assert got is held and word in why and f"{speedup:.0f}x" in why


def test_cpu_threads_reports_a_count_and_its_source():
    n, source = cpu_vs_gpu.cpu_threads()
    assert isinstance(n, int) and n >= 1 and str(n) in source


# ---- memory -------------------------------------------------------------------------

from cudalab.lessons import memory  # noqa: E402


class FakePool:
    """Allocations against a byte limit; over it, OutOfMemoryError as cudalab raises it."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.peak, self.calls = limit, 0, 0, 0

    def alloc(self, nbytes: int) -> int:
        if self.used + nbytes > self.limit:
            raise cudalab.OutOfMemoryError(f"fake: {nbytes} bytes over the limit")
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        return nbytes

    def free(self, nbytes: int) -> None:
        self.used -= nbytes

    def ffn_step(self, rows: int, hidden: int) -> None:
        """The lesson's step: x, h, g alive, h freed, y; everything freed at the end,
        also when an allocation fails."""
        self.calls += 1
        held = []
        try:
            sizes = memory.ffn_bytes(rows, hidden)
            held.append(self.alloc(sizes["x"]))
            held.append(self.alloc(sizes["h"]))
            held.append(self.alloc(sizes["g"]))
            self.free(held.pop(1))
            held.append(self.alloc(sizes["y"]))
        finally:
            for n in held:
                self.free(n)


@pytest.mark.parametrize("budget_mib", [1, 40, 256, 511, 4096])
def test_bisection_on_a_fake_allocator_finds_the_models_batch(budget_mib):
    seq, hidden = 16, 256
    pool = FakePool(budget_mib << 20)
    fits = lambda b: memory.try_step(lambda: pool.ffn_step(b * seq, hidden))  # noqa: E731
    found, trials = memory.largest_fitting(fits)
    assert found == memory.predicted_largest_batch(budget_mib << 20, seq, hidden)
    assert pool.used == 0  # every OOM left the pool as it was
    assert len(trials) == pool.calls
    assert all(ok == (n <= found) for n, ok in trials)
    if found:
        pool.peak = 0
        pool.ffn_step(found * seq, hidden)
        assert pool.peak == memory.ffn_peak_bytes(found * seq, hidden)


def test_largest_fitting_edges():
    assert memory.largest_fitting(lambda n: False) == (0, [(1, False)])
    found, trials = memory.largest_fitting(lambda n: True, cap=100)
    assert found == 100 and trials[-1] == (100, True)
    found, trials = memory.largest_fitting(lambda n: n <= 37, start=8)
    assert found == 37 and len(trials) <= 2 + 2 * 37 .bit_length()
    found, _ = memory.largest_fitting(lambda n: n <= 5, start=8)  # start too big: bisect below
    assert found == 5
    with pytest.raises(ValueError, match="start <= cap"):
        memory.largest_fitting(lambda n: True, start=0)


def test_try_step_catches_only_out_of_memory():
    def oom():
        raise cudalab.OutOfMemoryError("no room")

    assert memory.try_step(oom) is False
    assert memory.try_step(lambda: 1) is True
    with pytest.raises(ValueError):
        memory.try_step(lambda: int("x"))


def test_ffn_memory_model():
    b = memory.ffn_bytes(10, 8)
    assert b == {"x": 320, "h": 1280, "g": 1280, "y": 320}
    assert memory.ffn_peak_bytes(10, 8) == 320 + 1280 + 1280  # x, h, g: h outweighs y
    assert memory.predicted_largest_batch(2880 * 3 + 2879, 10, 8) == 3


def test_linear_slope_and_limit_fraction():
    assert memory.linear_slope([16, 32, 64], [5 + 2 * 16, 5 + 2 * 32, 5 + 2 * 64]) == 2
    with pytest.raises(ValueError, match="two distinct"):
        memory.linear_slope([4, 4], [1, 2])
    assert memory.limit_fraction(100, 300, 1000) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="not below the device"):
        memory.limit_fraction(900, 200, 1000)


def test_release_share():
    assert memory.release_share(1000, 100, 100) == 1.0
    assert memory.release_share(1000, 550, 100) == pytest.approx(0.5)
    assert memory.release_share(100, 100, 100) == 1.0  # nothing cached


# ---- timing -------------------------------------------------------------------------

from cudalab.lessons import timing  # noqa: E402


@pytest.mark.parametrize("ratio, words", [(0.001, "misses 100%"), (0.3, "misses 70%"),
                                          (0.95, "agrees"), (1.08, "agrees"),
                                          (1.5, "reads 50% high"), (0.7, "reads 30% low")])
def test_timing_verdict(ratio, words):
    assert words in timing.verdict(ratio)


def test_timing_verdict_thresholds():
    assert "misses" in timing.verdict(timing.MISLEADING_RATIO - 1e-9)
    assert "misses" not in timing.verdict(timing.MISLEADING_RATIO)
    assert "agrees" in timing.verdict(1 + timing.AGREES_WITHIN - 1e-9)
    assert "agrees" not in timing.verdict(1 + timing.AGREES_WITHIN + 1e-6)


def test_timing_rows_describe_every_method():
    assert set(timing.WHAT) == {"host clock, no synchronize", "host clock + synchronize",
                                "CUDA events", "loop, one synchronize", "cudalab.bench"}


def test_times_text():
    assert cpu_vs_gpu.times(340.4) == "340x"
    assert cpu_vs_gpu.times(1.234) == "1.2x"
    assert cpu_vs_gpu.times(0.357) == "0.36x"



# ---- profiling end to end on a NumPy stand-in for the GPU, cudalab.nn and the profiler ---------
# Not a measurement: the stand-in nn (tests/test_lessons_f_cpu.py) trains for real in float64,
# so the lesson's NumPy checks mean something; each stand-in step also "runs" the ops a real
# cudalab.nn step records, on a fake GPU clock, and a fake profiler turns them into the
# profiler's events, so the table, rows, findings, trace and plot code all run.

import types  # noqa: E402

import test_lessons_d_cpu as standin  # noqa: E402  (the NumPy stand-in for cudalab's ops)
import test_lessons_f_cpu as nn_standin  # noqa: E402  (the NumPy stand-in for cudalab.nn)

from cudalab.lessons import registry  # noqa: E402
from cudalab.profiler import Profile, ProfilerEvent  # noqa: E402

# GPU microseconds per op of the stand-in step: ratios like a real bf16 step's.
_OP_US = {"linear": 60.0, "linear_backward_input": 60.0,
          "linear_backward_weight": 60.0, "cross_entropy": 8.0, "adamw": 40.0,
          "unscale": 10.0, "update_scale": 2.0, "copyto": 4.0, "div": 2.0}
_GAP_NS = 300     # between two ops on the fake GPU
_HOST_NS = 8_000  # host time to issue one op


def step_ops(layers, precision):
    """The op names a cudalab.nn train_step records, in order (see nn/layers.py, train.py)."""
    half = precision in ("fp16", "bf16")
    casts = ["copyto"] * (2 * layers + 1) if half else []  # weights, biases and the input
    ops = casts + ["linear"] * layers + ["cross_entropy"]
    for i in range(layers - 1, -1, -1):
        ops += ["linear_backward_weight"]  # float32 gradients: nothing to cast back
        ops += ["linear_backward_input"] if i > 0 else []
    if precision == "fp16":
        ops += ["copyto", "div", "unscale"]
    return ops + ["adamw"] + (["update_scale"] if precision == "fp16" else [])


class _FakeGpu:
    """A GPU clock and host clock (ns) that ops advance; a log of events while profiling."""

    def __init__(self):
        self.gpu = self.host = 0
        self.events = None

    def op(self, name, gpu_us):
        host0, self.host = self.host, self.host + _HOST_NS
        start = max(self.gpu, self.host)  # an op starts once queued and the stream is free
        duration = int(gpu_us * 1e3)
        self.gpu = start + duration + _GAP_NS
        if self.events is not None:
            self.events.append(ProfilerEvent(
                name=name, kind="op", device=0, stream=0, thread_id=1, host_start_ns=host0,
                host_end_ns=self.host, gpu_start_ns=start, gpu_duration_ns=duration,
                flops=10**9 if name.startswith("linear") else None, bytes=10**6))


def _fake_profiler(monkeypatch):
    gpu = _FakeGpu()

    class Event:
        def record(self):
            self.ns = gpu.gpu

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.ns - self.ns) / 1e6

    class FakeProfile:
        def __enter__(self):
            gpu.events = []
            return self

        def __exit__(self, *exc):
            self.done = Profile.from_events(gpu.events)
            gpu.events = None
            return False

        def __getattr__(self, name):  # events, key_averages, export_chrome_trace
            return getattr(self.done, name)

    class RecordFunction:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            self.start = gpu.host
            return self

        def __exit__(self, *exc):
            gpu.events.append(ProfilerEvent(name=self.name, kind="range", device=0, stream=0,
                                            thread_id=1, host_start_ns=self.start,
                                            host_end_ns=gpu.host))
            return False

    def spin(cycles):
        gpu.op("_spin", cycles / 1.98e9 * 1e6)

    def train_step(model, opt, x, labels, precision="fp32", scaler=None):
        loss = nn_standin._train_step(model, opt, x, labels, precision, scaler)
        for name in step_ops(len(model.layers), precision):
            gpu.op(name, _OP_US[name])
        return loss

    monkeypatch.setattr(cudalab, "Event", Event, raising=False)
    monkeypatch.setattr(cudalab.profiler, "profile", FakeProfile)
    monkeypatch.setattr(cudalab.profiler, "record_function", RecordFunction)
    monkeypatch.setattr(cudalab._core, "_spin", spin)
    monkeypatch.setattr(profiling.nn, "train_step", train_step)
    monkeypatch.setattr(profiling, "get_device_properties", lambda index: types.SimpleNamespace(
        name="Fake GPU", clock_rate_khz=1.98e6))
    return gpu


_TINY = {"in_features": 8, "hidden": (16, 16), "classes": 4, "batch": 32, "warmup_steps": 2,
         "steps": 3, "top_ops": 4}


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_profiling_runs_on_a_numpy_stand_in(monkeypatch, tmp_path, precision):
    """The shared end-to-end test (rows, checks, JSON round trip, plot) with nn and the
    profiler faked."""
    nn_standin._fake_nn(monkeypatch)
    _fake_profiler(monkeypatch)
    trace = tmp_path / "trace.json"
    monkeypatch.setitem(standin._TINY, "profiling",
                        {**_TINY, "precision": precision, "trace_path": str(trace)})
    standin.test_lesson_runs_on_a_numpy_stand_in(monkeypatch, "profiling")
    assert trace.exists()


def _run_profiling(monkeypatch, tmp_path, **over):
    timer = standin._fake_gpu(monkeypatch)
    nn_standin._fake_nn(monkeypatch)
    gpu = _fake_profiler(monkeypatch)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get("profiling")
    params = {**x.defaults(True), **_TINY, "trace_path": str(tmp_path / "t.json"), **over}
    r = registry.LessonRun(x, params, True)
    r.timer = timer
    x.function(r)
    return r, gpu


def test_profiling_stand_in_table_accounts_for_every_op(monkeypatch, tmp_path):
    r, _ = _run_profiling(monkeypatch, tmp_path, precision="fp16")
    assert {tuple(row) for row in r.rows} == {profiling.ROW_KEYS}
    ops = step_ops(3, "fp16")
    categories = {row["op"]: row for row in r.rows if row["kind"] == "category"}
    # Every category the step has, its calls per step and its share of the ops' GPU time.
    total = sum(_OP_US[n] for n in ops)
    # fp16: 7 casts in and the scaler's found_inf reset; 1 / scale
    for category, want in (("gemm", 8), ("loss", 1), ("optimizer", 3), ("cast", 8),
                           ("element-wise", 1)):
        row = categories[f"all {category} ops"]
        assert row["calls_per_step"] == want, category
        share = sum(_OP_US[n] for n in ops if profiling.op_category(
            n, frozenset(cudalab._core._ELEMENTWISE_OPS)) == category) / total
        assert row["gpu_pct"] == pytest.approx(100 * share, rel=1e-3), category
    assert "all reduction ops" not in categories  # a step with no reduction has no row
    op_rows = [row for row in r.rows if row["kind"] == "op"]
    assert len(op_rows) == 4 and op_rows[0]["op"] in profiling.GEMM_OPS
    assert [row["gpu_ms_per_step"] for row in op_rows] == sorted(
        (row["gpu_ms_per_step"] for row in op_rows), reverse=True)
    assert all(row["op"] != profiling.HOLD_OP for row in r.rows)
    for f in r.findings:
        assert set(f.labels) <= set(r.measurements), f


def test_profiling_stand_in_checks_and_findings(monkeypatch, tmp_path):
    r, _ = _run_profiling(monkeypatch, tmp_path)
    checks = {c.what: c for c in r.checks}
    assert all(c.passed for c in r.checks)
    grads = [c for c in checks if c.startswith("MLP gradient")]
    assert len(grads) == 2 * (len(profiling.CHECK_SIZES) - 1)
    assert all(checks[c].max_error < 1e-6 for c in grads)  # the stand-in is float64 inside
    assert any(c.startswith("AdamW step") for c in checks)
    match = next(c for c in r.checks if c.what.startswith("profiler op GPU time"))
    gaps = _GAP_NS * len(step_ops(3, "bf16")) / (1e3 * sum(_OP_US[n] for n in step_ops(3, "bf16"))
                                                   + _GAP_NS * len(step_ops(3, "bf16")))
    assert match.max_error == pytest.approx(gaps, rel=1e-3)  # the gaps are what the ops miss
    text = " ".join(f.text for f in r.findings)
    assert "no launch gaps" in text  # the hold outlasted the (fake) enqueueing
    # 86% of the stand-in's op time is GEMMs; its Timer says 0.2 ms of host time per 1 ms step
    assert "GEMMs dominate (86%)" in text and "GPU-bound" in text
