"""Lesson 8 `profiling`: where the time of a training step goes.

A two-layer MLP (matmul, bias, ReLU, matmul, squared-error loss) runs its
forward pass and a hand-written backward pass with cudalab ops: the weight
gradients are matmuls with `.T` views, the ReLU gradient is a `where` on the
activation, the bias gradients are sums over the batch axis. The step runs
under `cudalab.profiler.profile()`; the lesson shows the busiest ops, the
share of GPU time spent in GEMMs, element-wise ops and reductions, writes a
Chrome trace, and checks two things: the gradients against NumPy in float64,
and the profiler's op total against the step timed as a whole with CUDA
events (the profiler's table is only useful if it accounts for the time).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import types
from typing import Any, Mapping

import numpy as np

import cudalab
from ..bench import Measurement
from ..devices import get_device_properties
from .registry import LessonRun, lesson

# Op names by kind; element-wise ops are the op table's names.
GEMM_OPS = frozenset({"matmul"})
REDUCTION_OPS = frozenset({"sum", "mean", "max", "min", "argmax", "softmax", "log_softmax"})

# The profiler's op GPU time per step must be within this fraction of the step
# timed whole with CUDA events: more means the table misses or double-counts work.
PROFILE_MATCH_TOLERANCE = 0.15
# GEMMs at or above this share of GPU time "dominate": the step is compute-bound
# and faster element-wise code would buy little.
GEMM_DOMINATES = 0.5
# Host time per step above this multiple of its GPU time: Python issues ops
# slower than the GPU runs them (launch-bound).
LAUNCH_BOUND_RATIO = 1.0
# The profiled steps are queued behind a spin kernel lasting this many times
# their unprofiled enqueue time (the profiler slows enqueueing), at most HOLD_MAX_S.
HOLD_MARGIN = 4.0
HOLD_MAX_S = 0.5
# float32 (full-precision GEMM) gradients against float64: relative error bound.
GRAD_TOLERANCE = 1e-4
# Sizes of the gradient check: small and odd, so no tile fits exactly.
CHECK_SIZES = (67, 45, 93, 21)


# ---- the MLP, written once for any array library ----------------------------------


def mlp_step(ops: Any, x: Any, y: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> tuple:
    """Forward and backward of ``loss = sum((relu(x w1 + b1) w2 + b2 - y)**2) / (2 batch)``.

    `ops` provides ``matmul``, ``relu``, ``sum(a, axis=None)`` and
    ``where(cond, a, b)`` (cond nonzero); arrays need ``.T``, ``+ - *`` and
    ``shape``. Returns ``(loss, (dw1, db1, dw2, db2), h)``.
    """
    batch = x.shape[0]
    h = ops.relu(ops.matmul(x, w1) + b1)
    diff = ops.matmul(h, w2) + b2 - y
    loss = ops.sum(diff * diff) * (0.5 / batch)
    dout = diff * (1.0 / batch)
    dw2 = ops.matmul(h.T, dout)
    db2 = ops.sum(dout, axis=0)
    dz1 = ops.where(h, ops.matmul(dout, w2.T), 0.0)  # ReLU passes gradient where h > 0
    dw1 = ops.matmul(x.T, dz1)
    db1 = ops.sum(dz1, axis=0)
    return loss, (dw1, db1, dw2, db2), h


def numpy_ops() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        matmul=np.matmul, relu=lambda a: np.maximum(a, 0.0),
        sum=lambda a, axis=None: np.sum(a, axis=axis),
        where=lambda c, a, b: np.where(c != 0, a, b))


def cudalab_ops() -> types.SimpleNamespace:
    # Full float32 precision whatever the process-wide TF32 setting is.
    return types.SimpleNamespace(
        matmul=functools.partial(cudalab.matmul, precision="highest"), relu=cudalab.relu,
        sum=lambda a, axis=None: cudalab.sum(a, axis=axis), where=cudalab.where)


def torch_ops(torch: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        matmul=torch.matmul, relu=torch.relu,
        sum=lambda a, axis=None: torch.sum(a) if axis is None else torch.sum(a, dim=axis),
        where=lambda c, a, b: torch.where(c != 0, a, b))


def mlp_inputs(rng: np.random.Generator, batch: int, d_in: int, hidden: int,
               d_out: int) -> list[np.ndarray]:
    """x, y, w1, b1, w2, b2 in float32, weights scaled so activations stay O(1)."""
    def normal(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return [normal((batch, d_in), 1.0), normal((batch, d_out), 1.0),
            normal((d_in, hidden), d_in ** -0.5), normal((hidden,), 0.1),
            normal((hidden, d_out), hidden ** -0.5), normal((d_out,), 0.1)]


def step_flops(batch: int, d_in: int, hidden: int, d_out: int) -> int:
    """FLOPs of the step's five matmuls: two forward, three backward (no gradient for x)."""
    return 2 * (2 * batch * d_in * hidden + 3 * batch * hidden * d_out)


# ---- what the profile says ------------------------------------------------------


def op_category(name: str, elementwise: frozenset[str]) -> str:
    """``"gemm"``, ``"element-wise"``, ``"reduction"`` or ``"other"``."""
    if name in GEMM_OPS:
        return "gemm"
    if name in elementwise:
        return "element-wise"
    if name in REDUCTION_OPS:
        return "reduction"
    return "other"


def category_shares(gpu_ns: Mapping[str, float], elementwise: frozenset[str]) -> dict[str, float]:
    """Fraction of the total GPU time per category, from GPU time per op name."""
    total = float(sum(gpu_ns.values()))
    shares = {"gemm": 0.0, "element-wise": 0.0, "reduction": 0.0, "other": 0.0}
    if total <= 0:
        return shares
    for name, ns in gpu_ns.items():
        shares[op_category(name, elementwise)] += ns / total
    return shares


def bottleneck_text(shares: Mapping[str, float]) -> str:
    """What the category shares say about the step (threshold GEMM_DOMINATES)."""
    gemm = shares.get("gemm", 0.0)
    rest = 1.0 - gemm
    if gemm >= GEMM_DOMINATES:
        return (f"GEMMs dominate ({gemm:.0%}): the step is bound by matmul throughput; "
                f"making every other op free would save at most {rest:.0%}")
    return (f"GEMMs take only {gemm:.0%}: the memory-bound element-wise and reduction ops "
            f"({rest:.0%}) are the place to optimise (fusion, fewer passes)")


def trace_counts(doc: Mapping[str, Any]) -> tuple[int, int]:
    """(host op events, GPU op events) in a Chrome trace document."""
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    return (sum(e.get("cat") == "op" for e in events),
            sum(e.get("cat") == "gpu_op" for e in events))


# ---- the lesson ----------------------------------------------------------------------


def _check_gradients(r: LessonRun, rng: np.random.Generator) -> None:
    host = mlp_inputs(rng, *CHECK_SIZES)
    loss, grads, h = mlp_step(cudalab_ops(), *[cudalab.asarray(a) for a in host])
    mask = h.get() > 0  # the GPU's own ReLU mask: a z1 within rounding of 0 cannot flip it
    ref_ops = numpy_ops()
    ref_ops.relu = lambda a: np.where(mask, a, 0.0)
    ref_loss, ref_grads, _ = mlp_step(ref_ops, *[a.astype(np.float64) for a in host])
    names = ("dW1", "db1", "dW2", "db2")
    for name, got, want in zip(names, grads, ref_grads):
        err = np.max(np.abs(got.get() - want)) / max(np.max(np.abs(want)), 1e-30)
        r.check(f"MLP gradient {name} ({'x'.join(map(str, want.shape))}) vs NumPy float64",
                err, GRAD_TOLERANCE)
    r.check("MLP loss vs NumPy float64", abs(float(loss.get()) - ref_loss) / abs(ref_loss),
            GRAD_TOLERANCE)


def hold_seconds(host_per_step: float, steps: int) -> float:
    """How long to hold the stream so `steps` profiled steps are all queued before
    the first runs: HOLD_MARGIN times their unprofiled enqueue time plus 1 ms, capped."""
    return min(HOLD_MAX_S, HOLD_MARGIN * host_per_step * steps + 1e-3)


def _profile(r: LessonRun, args: list, host_per_step: float) -> Any:
    """Profile `steps` steps queued behind a spin kernel, so they run back to back and
    two CUDA events around them time the same work the profiler breaks down."""
    steps = r.params["steps"]
    ops = cudalab_ops()
    mlp_step(ops, *args)  # warm: cuBLAS handles and the pool
    cudalab.synchronize()
    clock_hz = get_device_properties(cudalab.current_device()).clock_rate_khz * 1e3
    start, end = cudalab.Event(), cudalab.Event()
    with cudalab.profiler.profile() as prof:
        cudalab._core._spin(int(hold_seconds(host_per_step, steps) * clock_hz))
        start.record()
        for _ in range(steps):
            with cudalab.profiler.record_function("mlp step"):
                mlp_step(ops, *args)
        end.record()
        end.synchronize()
    window = start.elapsed_time(end) * 1e-3
    index = cudalab.current_device()
    r.add(Measurement(label="profiled steps", times=(window / steps,), number_per_run=steps,
                      device=cudalab.get_device_properties(index).name, device_index=index,
                      description="CUDA events around the profiled steps",
                      metadata={"timer": "CUDA events around all profiled steps"}))
    return prof, window / steps


def _trace_path(p: Mapping[str, Any]) -> str:
    if p["trace_path"] is not None:
        return os.fspath(p["trace_path"])
    return os.path.join(tempfile.mkdtemp(prefix="cudalab_profiling_"), "mlp_step_trace.json")


def _op_rows(r: LessonRun, table: list, op_total_ns: int, steps: int,
             elementwise: frozenset[str]) -> None:
    for k in table[:r.params["top_ops"]]:
        r.row(impl="cudalab", op=k.name, category=op_category(k.name, elementwise),
              calls_per_step=k.calls / steps, gpu_ms_per_step=k.gpu_time_total_ns / steps / 1e6,
              gpu_pct=100.0 * k.gpu_time_total_ns / op_total_ns,
              host_ms_per_step=k.host_time_total_ns / steps / 1e6,
              tflops=k.tflop_per_s, gbps=k.gb_per_s)


def _step_row(r: LessonRun, impl: str, label: str, m: Any) -> None:
    r.row(impl=impl, op=label, category="whole step", calls_per_step=1.0,
          gpu_ms_per_step=m.median * 1e3, gpu_pct=None, host_ms_per_step=m.host_time * 1e3,
          tflops=m.tflops, gbps=None)


def _trace_findings(r: LessonRun, prof: Any, path: str) -> None:
    prof.export_chrome_trace(path)
    with open(path) as f:
        host_ops, gpu_ops = trace_counts(json.load(f))
    ops = [e for e in prof.events() if e.kind == "op"]
    timed = sum(1 for e in ops if e.gpu_duration_ns is not None)
    r.check("Chrome trace holds one host event per op and one GPU event per timed op "
            "(count difference)", abs(host_ops - len(ops)) + abs(gpu_ops - timed), 0)
    r.finding(f"Chrome trace written to {path}: {host_ops} host and {gpu_ops} GPU op events "
              f"(open it in ui.perfetto.dev or chrome://tracing)", value=host_ops, unit="events")


def _breakdown_findings(r: LessonRun, prof: Any, table: list, per_step: float,
                        elementwise: frozenset[str]) -> Any:
    """What the table says: the top op, the category shares, host vs GPU time per step."""
    steps = r.params["steps"]
    op_total_ns = sum(k.gpu_time_total_ns for k in table)
    shares = category_shares({k.name: k.gpu_time_total_ns for k in table}, elementwise)
    top = table[0]
    r.finding(f"{top.name} is the top op ({100.0 * top.gpu_time_total_ns / op_total_ns:.1f}% of "
              f"GPU time, {top.calls // steps} calls per step); GEMM {shares['gemm']:.1%}, "
              f"element-wise {shares['element-wise']:.1%}, reductions {shares['reduction']:.1%}. "
              + bottleneck_text(shares), value=100.0 * shares["gemm"], unit="%",
              labels=("profiled steps",))

    step_events = [e for e in prof.events() if e.kind == "range"]
    host_s = sum(e.host_duration_ns for e in step_events) / max(len(step_events), 1) * 1e-9
    bound = ("launch-bound: Python issues the ops slower than the GPU runs them"
             if host_s > LAUNCH_BOUND_RATIO * per_step else
             "GPU-bound: the host runs ahead and the GPU stays busy")
    r.finding(f"issuing one profiled step takes {host_s * 1e3:.3f} ms on the host vs "
              f"{per_step * 1e3:.3f} ms on the GPU: {bound}", value=host_s / per_step, unit="x",
              labels=("profiled steps",))
    return top


@lesson(8, "profiling", title="Profiling an MLP training step",
        seed="Colab notebook lesson 8 (Performance Profiling; its example crashes in backward); "
             "optimization guide: PyTorch Profiler with CUDA",
        params={"batch": 4096, "d_in": 1024, "hidden": 4096, "d_out": 1024, "steps": 10,
                "top_ops": 8, "trace_path": None},
        quick_params={"batch": 2048, "d_in": 512, "hidden": 2048, "d_out": 512, "steps": 3})
def run(r: LessonRun) -> None:
    p = r.params
    rng = np.random.default_rng(8)
    _check_gradients(r, rng)

    sizes = (p["batch"], p["d_in"], p["hidden"], p["d_out"])
    host = mlp_inputs(rng, *sizes)
    args = [cudalab.asarray(a) for a in host]
    flops = step_flops(*sizes)
    m = r.measure("mlp step", mlp_step, cudalab_ops(), *args, flops=flops, ceiling=None)
    prof, event_step = _profile(r, args, m.host_time)

    elementwise = frozenset(cudalab._core._elementwise_functions())
    # The hold's spin kernel (a private op, "_spin") is not part of the step.
    table = [k for k in prof.key_averages().sorted("gpu_time_total")
             if k.kind == "op" and k.gpu_time_total_ns and not k.name.startswith("_")]
    op_total_ns = sum(k.gpu_time_total_ns for k in table)
    steps = p["steps"]
    _op_rows(r, table, op_total_ns, steps, elementwise)
    _step_row(r, "cudalab", "whole step (bench, CUDA events)", m)

    per_step = op_total_ns / steps * 1e-9
    ratio = per_step / event_step
    r.check("profiler op GPU time vs the same profiled steps timed whole with CUDA events "
            "(|ratio - 1|)", abs(ratio - 1.0), PROFILE_MATCH_TOLERANCE)
    r.finding(f"the profiler's ops add up to {per_step * 1e3:.3f} ms of GPU time per step, "
              f"{ratio:.1%} of the {event_step * 1e3:.3f} ms two CUDA events measure around "
              f"the same steps: the table accounts for the step's time", value=ratio, unit="x",
              labels=("profiled steps",))
    x = m.median / event_step
    how = (f"within {PROFILE_MATCH_TOLERANCE:.0%}: profiling hardly changes the GPU time"
           if abs(x - 1.0) <= PROFILE_MATCH_TOLERANCE else
           "the profiler's two events per op, or a GPU clock that differs between a short "
           "burst and sustained load, make the difference")
    r.finding(f"cudalab.bench times the unprofiled step at {m.median * 1e3:.3f} ms, {x:.3f}x "
              f"the profiled one: {how}", value=x, unit="x", labels=("mlp step", "profiled steps"))

    top = _breakdown_findings(r, prof, table, per_step, elementwise)
    _trace_findings(r, prof, _trace_path(p))

    r.claim("the profiler shows which ops take the time (the tutorial's example crashed before "
            "printing its table)", tutorial=None, measured=100.0 * top.gpu_time_total_ns
            / op_total_ns, unit="% (top op)", held=abs(ratio - 1.0) <= PROFILE_MATCH_TOLERANCE,
            why=f"its op total is {ratio:.1%} of the independently timed step; the top op is "
                f"{top.name}")
    _torch_step(r, host, flops, m)


def _torch_step(r: LessonRun, host: list, flops: int, ours: Any) -> None:
    torch = r.torch()
    if torch is None:
        return
    args = [torch.from_numpy(a).cuda() for a in host]
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # full fp32, as ours
    try:
        m = r.measure("mlp step torch", mlp_step, torch_ops(torch), *args, flops=flops,
                      ceiling=None)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    _step_row(r, "torch", "whole step (bench, CUDA events)", m)
    r.finding(f"PyTorch runs the same step in {m.median * 1e3:.3f} ms, "
              f"{m.median / ours.median:.2f}x cudalab's time", value=m.median / ours.median,
              unit="x", labels=("mlp step", "mlp step torch"))


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = [x for x in result.rows if x["impl"] == "cudalab" and x["gpu_pct"] is not None]
    colors = {"gemm": "tab:blue", "element-wise": "tab:orange", "reduction": "tab:green",
              "other": "tab:gray"}
    names = [x["op"] for x in rows][::-1]
    values = [x["gpu_ms_per_step"] for x in rows][::-1]
    ax.barh(names, values, color=[colors[x["category"]] for x in rows][::-1])
    from matplotlib.patches import Patch

    shown = {x["category"] for x in rows}
    step = next((x for x in result.rows if x["impl"] == "cudalab" and x["gpu_pct"] is None), None)
    if step is not None:
        ax.set_title(f"whole step: {step['gpu_ms_per_step']:.3f} ms", fontsize=9, loc="right")
    ax.set_xlabel("GPU time per step (ms)")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items() if k in shown],
              fontsize=8)
