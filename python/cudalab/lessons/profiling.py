"""Lesson 8 `profiling`: where the time of a training step goes.

A real :mod:`cudalab.nn` training step runs under ``cudalab.profiler.profile()``:
an MLP's forward pass (cuBLASLt GEMMs with the bias and GELU fused in), the
fused softmax cross-entropy and its gradient, the backward GEMMs (the GELU
derivative and the bias gradients fused in), and one fused multi-tensor AdamW
step over every parameter, in the precision asked for (bf16 by default: the
float32 master weights are cast in, and the weight gradients leave the GEMMs
in float32; fp16 adds a loss scaler's unscale and update). The lesson shows the
busiest ops and the share of GPU time per kind of op (GEMM, loss, optimizer,
cast, element-wise, reduction), says whether the GEMMs dominate, what the optimizer costs and
whether the host or the GPU sets the pace, writes a Chrome trace, and checks
that the profiler's op total matches the same steps timed whole with CUDA
events (a profile is only useful if it accounts for the time), and that the
step's loss, gradients and AdamW update equal a float64 NumPy step's.
PyTorch runs the same MLP from the same weights on the same batch beside it.

Every cudalab op and ``record_function`` range is also an NVTX range (domain
``cudalab``) when Nsight Systems or Nsight Compute is attached. The lesson
says whether ``nsys`` and ``ncu`` are on the PATH and the command to use;
with ``nsys=True`` (off by default) it runs a tiny training step under
``nsys profile`` in a subprocess and reports the kernels ``nsys stats`` saw.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn
from cudalab.nn import reference

from ..bench import Measurement
from ..devices import get_device_properties
from ..profiler import OP_CATEGORIES
from ..nn import torch_twin as TT
from . import training as T
from ._measuring import rel_error
from . import _params as P
from .registry import LessonRun, lesson

# Op names as the profiler records them, by kind (cudalab.profiler.OP_CATEGORIES: the nn
# ops under their public names, the op tables' element-wise ops and reductions).
GEMM_OPS = frozenset(OP_CATEGORIES["gemm"])
LOSS_OPS = frozenset(OP_CATEGORIES["loss"])
OPTIMIZER_OPS = frozenset(OP_CATEGORIES["optimizer"])
REDUCTION_OPS = frozenset(OP_CATEGORIES["reduction"])
# Copies, with or without a change of dtype (cudalab.nn casts through copyto).
CAST_OPS = frozenset(OP_CATEGORIES["cast"])
CATEGORIES = ("gemm", "loss", "optimizer", "cast", "element-wise", "reduction", "other")
# The hold's spin kernel: the profiler records it like any op, but it is not part of the step.
HOLD_OP = "_spin"

# The profiler's op GPU time per step must be within this fraction of the step
# timed whole with CUDA events: more means the table misses or double-counts work.
PROFILE_MATCH_TOLERANCE = 0.15
# GEMMs at or above this share of GPU time "dominate": the step is bound by matmul
# throughput and faster element-wise code would buy little.
GEMM_DOMINATES = 0.5
# An optimizer share at or above this is worth a sentence: its one pass over every
# parameter, grad and moment does not shrink with the batch.
OPTIMIZER_NOTABLE = 0.1
# Host time per step above this multiple of its GPU time: Python issues the ops
# slower than the GPU runs them (launch-bound).
LAUNCH_BOUND_RATIO = 1.0
# The profiled steps are queued behind a spin kernel lasting this many times
# their unprofiled enqueue time (the profiler slows enqueueing), at most HOLD_MAX_S.
HOLD_MARGIN = 4.0
HOLD_MAX_S = 0.5

# The step checked against float64 NumPy: true float32 GEMMs, an odd batch, and layer
# sizes that are multiples of 8 (what cuBLASLt's fused epilogues need, see nn.Linear) but
# of no power of two above it, so no GEMM tile fits exactly.
CHECK_BATCH = 67
CHECK_SIZES = (40, 88, 56, 24)
CHECK_LR = 1e-3
# float32 (full-precision GEMM) loss and gradients against float64: relative error bound.
GRAD_TOLERANCE = 1e-4
# One float32 AdamW update against float64 from the same gradients (max |diff| / max |param|).
ADAMW_TOLERANCE = 1e-5
# PyTorch's first loss against ours (same weights, same batch), per precision.
TORCH_LOSS_TOL = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 3e-2}
# fp16's loss scaler starts where PyTorch's does; the scale grows after this many clean steps.
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000

# Nsight: the command lines the lesson shows, and the optional run under nsys.
NSYS_COMMAND = ("nsys profile -t cuda,nvtx -o cudalab_profiling "
                "python -m cudalab lesson profiling --quick")
NCU_COMMAND = ('ncu --nvtx --nvtx-include "cudalab@train step/" -c 20 -o cudalab_kernels '
               "python -m cudalab lesson profiling --quick")
# nsys stats report names: current releases first, then the names before 2023.
KERNEL_REPORTS = ("cuda_gpu_kern_sum", "gpukernsum")
NSYS_TIMEOUT_S = 300
# The tiny step profiled under nsys: CHECK_SIZES, a few steps each in a "train step" range.
NSYS_STEPS = 3
NSYS_SCRIPT = f"""\
import cudalab, numpy as np
from cudalab import nn
from cudalab.profiler import record_function
sizes = {CHECK_SIZES!r}
model = nn.MLP(sizes, "gelu", seed=0)
opt = nn.AdamW(model.parameters(), lr=1e-3)
rng = np.random.default_rng(0)
x = cudalab.asarray(rng.standard_normal(({CHECK_BATCH}, sizes[0])).astype(np.float32))
labels = cudalab.asarray(rng.integers(0, sizes[-1], {CHECK_BATCH}))
for _ in range({NSYS_STEPS}):
    with record_function("train step"):
        nn.train_step(model, opt, x, labels, "fp32")
cudalab.synchronize()
"""

ROW_KEYS = ("kind", "impl", "op", "category", "calls_per_step", "gpu_ms_per_step", "gpu_pct",
            "host_ms_per_step", "tflops", "gbps")


# ---- what the profile says (pure functions, tested on the CPU) -----------------------------


def op_category(name: str, elementwise: frozenset[str]) -> str:
    """One of `CATEGORIES` for an op name."""
    for category, names in (("gemm", GEMM_OPS), ("loss", LOSS_OPS),
                            ("optimizer", OPTIMIZER_OPS), ("cast", CAST_OPS),
                            ("element-wise", elementwise),
                            ("reduction", REDUCTION_OPS)):
        if name in names:
            return category
    return "other"


def category_shares(gpu_ns: Mapping[str, float], elementwise: frozenset[str]) -> dict[str, float]:
    """Fraction of the total GPU time per category (every one of `CATEGORIES`)."""
    total = float(sum(gpu_ns.values()))
    shares = dict.fromkeys(CATEGORIES, 0.0)
    if total <= 0:
        return shares
    for name, ns in gpu_ns.items():
        shares[op_category(name, elementwise)] += ns / total
    return shares


def bottleneck_text(shares: Mapping[str, float]) -> str:
    """What the category shares say about the step (threshold GEMM_DOMINATES)."""
    gemm = shares.get("gemm", 0.0)
    if gemm >= GEMM_DOMINATES:
        return (f"GEMMs dominate ({gemm:.0%}): the step is bound by matmul throughput; making "
                f"every other op free would save at most {1.0 - gemm:.0%}")
    rest = {k: v for k, v in shares.items() if k != "gemm"}
    name = max(rest, key=rest.get) if rest else "other"
    return (f"GEMMs take only {gemm:.0%}: the memory-bound ops are the place to optimise, "
            f"first the {name} ops ({rest.get(name, 0.0):.0%}: fusion, fewer passes)")


def count_text(n: int) -> str:
    """25.2M, or 2,908 below a million."""
    return f"{n / 1e6:.1f}M" if n >= 1_000_000 else f"{n:,}"


def optimizer_text(share: float, parameters: int, batch: int) -> str:
    """What the optimizer's share means (threshold OPTIMIZER_NOTABLE)."""
    head = f"the optimizer takes {share:.1%} of the step"
    if share >= OPTIMIZER_NOTABLE:
        return (head + f": AdamW reads and writes all {count_text(parameters)} parameters, their "
                f"grads and two moments once a step whatever the batch, so more rows per step "
                f"(or gradient accumulation) spread that pass over more samples")
    return (head + f": at {batch} rows per step the GEMMs' work outweighs one pass over the "
            f"{count_text(parameters)} parameters")


def casts_text(share: float, precision: str) -> str:
    """What the casts' share is in a step of `precision` (cudalab.nn casts with copyto)."""
    if nn.PRECISIONS[precision].is_half:
        return (f"casts take {share:.1%}: in {precision} they copy the float32 master weights "
                f"(and the float32 input batch) into {precision} before the forward pass; the "
                f"weight gradients leave the GEMMs in float32, so nothing is cast back, and an "
                f"optimizer that also wrote the {precision} weight copies would save this pass")
    return (f"casts take {share:.1%}: in {precision} the GEMMs read the float32 master weights "
            f"and write the float32 gradients directly, so nothing is cast")


def launch_text(host_s: float, gpu_s: float, ops: float) -> str:
    """Launch-bound or GPU-bound, from host and GPU time per step (threshold LAUNCH_BOUND_RATIO)."""
    head = (f"issuing one step ({ops:.0f} ops) takes {host_s * 1e3:.3f} ms on the host vs "
            f"{gpu_s * 1e3:.3f} ms on the GPU")
    if gpu_s <= 0 or host_s > LAUNCH_BOUND_RATIO * gpu_s:
        return (head + ": launch-bound, Python issues the ops slower than the GPU runs them; a "
                "CUDA graph (nn.Trainer(graph=True)) issues the whole step in one launch")
    return (head + f" ({host_s / gpu_s:.0%}): GPU-bound, the host runs ahead and the GPU never "
            f"waits for it")


def hold_text(gap_s: float) -> str:
    """Whether the hold outlasted the enqueueing: `gap_s` is the first op's GPU start minus
    the last step's host end (negative: the GPU began before the host had queued it all)."""
    if gap_s >= 0:
        return (f"the GPU began the first step {gap_s * 1e3:.3f} ms after the host had queued "
                f"the last: the steps ran back to back, with no launch gaps")
    return (f"the hold ran out {-gap_s * 1e3:.3f} ms before the host had queued every step: "
            f"launch gaps may count in the window")


def hold_seconds(host_per_step: float, steps: int) -> float:
    """How long to hold the stream so `steps` profiled steps are all queued before
    the first runs: HOLD_MARGIN times their unprofiled enqueue time plus 1 ms, capped."""
    return min(HOLD_MAX_S, HOLD_MARGIN * host_per_step * steps + 1e-3)


def trace_counts(doc: Mapping[str, Any]) -> tuple[int, int]:
    """(host op events, GPU op events) in a Chrome trace document."""
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    return (sum(e.get("cat") == "op" for e in events),
            sum(e.get("cat") == "gpu_op" for e in events))


def nsight_text(tools: Mapping[str, str | None]) -> str:
    """Which Nsight tools are on the PATH (name -> path or None), and how to use them."""
    nsys, ncu = tools.get("nsys"), tools.get("ncu")
    found = [f"{name} at {path}" for name, path in (("nsys", nsys), ("ncu", ncu)) if path]
    head = ("Nsight: " + (", ".join(found) + " found" if found else "neither nsys nor ncu is on "
                          "the PATH") + ". ")
    ranges = ("every cudalab op (linear, cross_entropy, adamw, ...) and every record_function "
              "range ('train step') is an NVTX range of the 'cudalab' domain once a tool is "
              "attached")
    how = (f"the timeline of the same step: `{NSYS_COMMAND}` ({ranges}); one kernel's "
           f"metrics: `{NCU_COMMAND}`")
    return head + ("Run " if found else "With Nsight installed, ") + how


def kernel_summary(text: str) -> tuple[int, int, float] | None:
    """(kernel names, launches, total GPU ns) from `nsys stats` CSV output, or None.

    The CSV table may follow other lines (nsys prints what it processes); its header
    holds 'Instances' and 'Total Time (ns)'.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if "Instances" in line and "Total Time" in line), None)
    if start is None:
        return None
    rows = list(csv.DictReader(line for line in lines[start:] if line.strip()))
    total_key = next((k for k in rows[0] if k.startswith("Total Time")), None) if rows else None
    if total_key is None:
        return None
    try:
        launches = sum(int(float(r["Instances"])) for r in rows)
        total = sum(float(r[total_key]) for r in rows)
    except (TypeError, ValueError, KeyError):
        return None
    return len(rows), launches, total


def check_params(p: Mapping[str, Any]) -> tuple[tuple[int, ...], str]:
    """(the MLP's sizes, the precision) from the params; ValueError on a bad one."""
    sizes = T.check_sizes("profiling", p)
    T.check_positive("profiling", p, "batch", "warmup_steps", "steps", "top_ops")
    if p["precision"] not in nn.PRECISIONS:
        raise ValueError(f"lesson 'profiling': precision must be one of "
                         f"{', '.join(nn.PRECISIONS)}, got {p['precision']!r}")
    lr = p["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise ValueError(f"lesson 'profiling': lr must be a number in (0, 1), got {lr!r}")
    trace = p["trace_path"]
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise ValueError(f"lesson 'profiling': trace_path must be None or a path, got {trace!r}")
    P.bools("profiling", p, "nsys")
    P.seed("profiling", p)
    return sizes, p["precision"]


# ---- the step and its checks ---------------------------------------------------------------


class Training:
    """The profiled MLP, its AdamW (and GradScaler for fp16) and its one batch."""

    def __init__(self, p: Mapping[str, Any], sizes: tuple[int, ...], x: Any, labels: Any) -> None:
        self.precision = p["precision"]
        self.model = nn.MLP(sizes, "gelu", seed=p["seed"])
        self.opt = nn.AdamW(self.model.parameters(), lr=p["lr"])
        self.scaler = (nn.GradScaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL)
                       if nn.PRECISIONS[self.precision].needs_scaler else None)
        self.x, self.labels = x, labels

    def step(self) -> Any:
        return nn.train_step(self.model, self.opt, self.x, self.labels, self.precision,
                             self.scaler)

    def parameters(self) -> int:
        return sum(int(np.prod(q.value.shape)) for q in self.model.parameters())


def _check_step(r: LessonRun, rng: np.random.Generator) -> None:
    """One float32 train_step at small odd sizes against float64 NumPy: the loss, every
    gradient (at the weights before the step) and the AdamW update (from the GPU's grads)."""
    model = nn.MLP(CHECK_SIZES, "gelu", seed=r.params["seed"] + 1)
    opt = nn.AdamW(model.parameters(), lr=CHECK_LR)
    x = rng.standard_normal((CHECK_BATCH, CHECK_SIZES[0])).astype(np.float32)
    labels = rng.integers(0, CHECK_SIZES[-1], CHECK_BATCH)
    before = reference.mlp_params(model)
    loss = nn.train_step(model, opt, cudalab.asarray(x), cudalab.asarray(labels), "fp32")
    want_loss, want = reference.loss_and_grads(before, x, labels, "gelu")
    r.check(f"MLP {'-'.join(map(str, CHECK_SIZES))} on {CHECK_BATCH} rows: fp32 loss vs NumPy "
            f"float64", rel_error(loss.get(), want_loss), GRAD_TOLERANCE)
    update = 0.0
    for i, layer in enumerate(model.layers):
        for j, (q, name) in enumerate(((layer.weight, "weight"), (layer.bias, "bias"))):
            got = q.grad.get()
            r.check(f"MLP gradient {i}.{name} {'x'.join(map(str, got.shape))} vs NumPy float64",
                    rel_error(got, want[i][j]), GRAD_TOLERANCE)
            beta1, beta2 = opt.betas
            step, _, _ = reference.adamw_step(before[i][j], got, 0.0, 0.0, 1, CHECK_LR,
                                              (beta1, beta2), opt.eps, opt.weight_decay)
            update = max(update, rel_error(q.value.get(), step))
    r.check(f"AdamW step of all {2 * len(model.layers)} parameters vs NumPy float64 from the "
            f"same gradients (max over parameters)", update, ADAMW_TOLERANCE)


def _warm_up(r: LessonRun, training: Training) -> float:
    """The warm-up steps (buffers, cuBLASLt plans, the pool); the first step's loss."""
    losses = [training.step() for _ in range(r.params["warmup_steps"])]
    values = np.array([float(x.get()) for x in losses])
    r.check(f"non-finite losses in {len(values)} warm-up steps",
            int(np.count_nonzero(~np.isfinite(values))), 0)
    return float(values[0])


def _profile(r: LessonRun, step: Callable[[], Any], host_per_step: float) -> tuple[Any, float]:
    """Profile `steps` steps queued behind a spin kernel, so they run back to back and
    two CUDA events around them time the same work the profiler breaks down."""
    steps = r.params["steps"]
    step()
    cudalab.synchronize()
    index = cudalab.current_device()
    props = get_device_properties(index)
    clock_hz = props.clock_rate_khz * 1e3
    start, end = cudalab.Event(), cudalab.Event()
    with cudalab.profiler.profile() as prof:
        cudalab._core._spin(int(hold_seconds(host_per_step, steps) * clock_hz))
        start.record()
        for _ in range(steps):
            with cudalab.profiler.record_function("train step"):
                step()
        end.record()
        end.synchronize()
    window = start.elapsed_time(end) * 1e-3
    r.add(Measurement(label="profiled steps", times=(window / steps,), number_per_run=steps,
                      device=props.name, device_index=index,
                      description="CUDA events around the profiled steps",
                      metadata={"timer": "CUDA events around all profiled steps"}))
    return prof, window / steps


# ---- rows and findings -----------------------------------------------------------------------


def _rate(keys: Sequence[Any], field: str, unit: float) -> float | None:
    """Sum of `field` over `keys` that have it, per second of their GPU time, in `unit`s."""
    pairs = [(getattr(k, field), k.gpu_time_total_ns) for k in keys
             if getattr(k, field) is not None and k.gpu_time_total_ns]
    ns = sum(t for _, t in pairs)
    return sum(v for v, _ in pairs) / (ns * 1e-9) / unit if ns > 0 else None


def _op_rows(r: LessonRun, table: list, total_ns: int, elementwise: frozenset[str]) -> None:
    steps = r.params["steps"]
    for k in table[:r.params["top_ops"]]:
        r.row(kind="op", impl="cudalab", op=k.name, category=op_category(k.name, elementwise),
              calls_per_step=k.calls / steps, gpu_ms_per_step=k.gpu_time_total_ns / steps / 1e6,
              gpu_pct=100.0 * k.gpu_time_total_ns / total_ns,
              host_ms_per_step=k.host_time_total_ns / steps / 1e6,
              tflops=k.tflop_per_s, gbps=k.gb_per_s)
    for category in CATEGORIES:
        keys = [k for k in table if op_category(k.name, elementwise) == category]
        if not keys:
            continue
        ns = sum(k.gpu_time_total_ns for k in keys)
        r.row(kind="category", impl="cudalab", op=f"all {category} ops", category=category,
              calls_per_step=sum(k.calls for k in keys) / steps,
              gpu_ms_per_step=ns / steps / 1e6, gpu_pct=100.0 * ns / total_ns,
              host_ms_per_step=sum(k.host_time_total_ns for k in keys) / steps / 1e6,
              tflops=_rate(keys, "flops", 1e12), gbps=_rate(keys, "bytes", 1e9))


def _step_row(r: LessonRun, impl: str, m: Any) -> None:
    r.row(kind="step", impl=impl, op="whole step (bench, CUDA events)", category="whole step",
          calls_per_step=1.0, gpu_ms_per_step=m.median * 1e3, gpu_pct=None,
          host_ms_per_step=None if m.host_time is None else m.host_time * 1e3,
          tflops=m.tflops, gbps=None)


def _match_findings(r: LessonRun, prof: Any, per_step: float, event_step: float,
                    m: Any) -> float:
    """The profiler's total against the CUDA events (checked), and against the bench."""
    ratio = per_step / event_step
    r.check("profiler op GPU time vs the same profiled steps timed whole with CUDA events "
            "(|ratio - 1|)", abs(ratio - 1.0), PROFILE_MATCH_TOLERANCE)
    events = prof.events()
    ranges = [e for e in events if e.kind == "range"]
    first = min((e.gpu_start_ns for e in events
                 if e.kind == "op" and e.name != HOLD_OP and e.gpu_start_ns is not None),
                default=None)
    held = "" if first is None or not ranges else "; " + hold_text(
        (first - max(e.host_end_ns for e in ranges)) * 1e-9)
    r.finding(f"the profiler's ops add up to {per_step * 1e3:.3f} ms of GPU time per step, "
              f"{ratio:.1%} of the {event_step * 1e3:.3f} ms two CUDA events measure around "
              f"the same steps" + held, value=ratio, unit="x", labels=("profiled steps",))
    x = m.median / event_step
    how = (f"within {PROFILE_MATCH_TOLERANCE:.0%}: profiling hardly changes the GPU time"
           if abs(x - 1.0) <= PROFILE_MATCH_TOLERANCE else
           "the profiler's two events per op, or a GPU clock that differs between a short "
           "burst and sustained load, make the difference")
    r.finding(f"cudalab.bench times the unprofiled step at {m.median * 1e3:.3f} ms, {x:.3f}x "
              f"the profiled one: {how}", value=x, unit="x", labels=("train step",
                                                                      "profiled steps"))
    return ratio


def _breakdown_findings(r: LessonRun, prof: Any, table: list, elementwise: frozenset[str],
                        training: Training, m: Any) -> Any:
    """The top op and the category shares; the optimizer; host vs GPU time per step."""
    steps = r.params["steps"]
    total_ns = sum(k.gpu_time_total_ns for k in table)
    shares = category_shares({k.name: k.gpu_time_total_ns for k in table}, elementwise)
    top = table[0]
    parts = ", ".join(f"{c} {shares[c]:.1%}" for c in CATEGORIES if shares[c] > 0)
    r.finding(f"{top.name} is the top op ({100.0 * top.gpu_time_total_ns / total_ns:.1f}% of "
              f"GPU time, {top.calls / steps:g} calls per step); by kind: {parts}. "
              + bottleneck_text(shares), value=100.0 * shares["gemm"], unit="%",
              labels=("profiled steps",))
    r.finding(optimizer_text(shares["optimizer"], training.parameters(), r.params["batch"]),
              value=100.0 * shares["optimizer"], unit="%", labels=("profiled steps",))
    r.finding(casts_text(shares["cast"], training.precision),
              value=100.0 * shares["cast"], unit="%", labels=("profiled steps",))
    ops = sum(k.calls for k in table) / steps
    ranges = [e for e in prof.events() if e.kind == "range"]
    profiled = sum(e.host_duration_ns for e in ranges) / max(len(ranges), 1) * 1e-9
    r.finding(launch_text(m.host_time, m.median, ops) + f"; under the profiler issuing a step "
              f"took {profiled * 1e3:.3f} ms (its two events and record per op)",
              value=m.host_time / m.median, unit="x", labels=("train step",))
    if m.percent_of_ceiling is not None:
        r.finding(f"the step's GEMM FLOPs over its time: {m.tflops:.1f} TFLOP/s, "
                  f"{m.percent_of_ceiling:.0f}% of this GPU's measured {m.ceiling_name} peak",
                  value=m.percent_of_ceiling, unit="%", labels=("train step",))
    return top


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


def _trace_path(p: Mapping[str, Any]) -> str:
    if p["trace_path"] is not None:
        return os.fspath(p["trace_path"])
    return os.path.join(tempfile.mkdtemp(prefix="cudalab_profiling_"), "train_step_trace.json")


# ---- the lesson ----------------------------------------------------------------------------


@lesson(8, "profiling", title="Profiling an MLP training step",
        seed="Colab notebook lesson 8 (Performance Profiling; its example crashes in backward); "
             "optimization guide: PyTorch Profiler with CUDA",
        params={"in_features": 1024, "hidden": (4096, 4096), "classes": 1024, "batch": 4096,
                "precision": "bf16", "lr": 1e-4, "warmup_steps": 3, "steps": 10, "top_ops": 10,
                "trace_path": None, "nsys": False, "seed": 0},
        quick_params={"hidden": (2048, 2048), "steps": 3},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    sizes, precision = check_params(p)
    _check_step(r, np.random.default_rng(8))

    [(x, labels)] = T.teacher_batches(sizes, p["batch"], 1, p["seed"])
    training = Training(p, sizes, x, labels)
    first_loss = _warm_up(r, training)
    flops = T.step_flops(sizes, p["batch"])
    ceiling = None if r.quick else T.MATMUL_CEILINGS[precision]
    m = r.measure("train step", training.step, flops=flops, ceiling=ceiling,
                  description=f"one {precision} training step (CUDA events)")
    prof, event_step = _profile(r, training.step, m.host_time)

    elementwise = frozenset(OP_CATEGORIES["element-wise"])
    table = [k for k in prof.key_averages().sorted("gpu_time_total")
             if k.kind == "op" and k.gpu_time_total_ns and k.name != HOLD_OP]
    total_ns = sum(k.gpu_time_total_ns for k in table)
    _op_rows(r, table, total_ns, elementwise)
    _step_row(r, "cudalab", m)

    ratio = _match_findings(r, prof, total_ns / p["steps"] * 1e-9, event_step, m)
    top = _breakdown_findings(r, prof, table, elementwise, training, m)
    _trace_findings(r, prof, _trace_path(p))
    r.claim("the profiler shows which ops take the time (the tutorial's example crashed before "
            "printing its table)", tutorial=None,
            measured=100.0 * top.gpu_time_total_ns / total_ns, unit="% (top op)",
            held=abs(ratio - 1.0) <= PROFILE_MATCH_TOLERANCE,
            why=f"its op total is {ratio:.1%} of the independently timed step; the top op is "
                f"{top.name}")
    torch = r.torch()
    if torch is not None:
        _torch_step(r, torch, sizes, (x, labels), first_loss, m)
    _nsight(r)


def _nsight(r: LessonRun) -> None:
    """Which Nsight tools exist; with nsys=True, a tiny step under nsys and its kernels."""
    tools = {name: shutil.which(name) for name in ("nsys", "ncu")}
    r.finding(nsight_text(tools))
    if not r.params["nsys"]:
        return
    if tools["nsys"] is None:
        r.finding("nsys=True but nsys is not on the PATH: nothing was run under it")
        return
    r.finding(_run_nsys(tools["nsys"]))


def _run_nsys(nsys: str) -> str:
    """Profile NSYS_SCRIPT under nsys in a subprocess; what `nsys stats` says of its kernels."""
    folder = tempfile.mkdtemp(prefix="cudalab_nsys_")
    script = os.path.join(folder, "tiny_step.py")
    with open(script, "w") as f:
        f.write(NSYS_SCRIPT)
    report = os.path.join(folder, "tiny_step")
    profile = [nsys, "profile", "-t", "cuda,nvtx", "--force-overwrite", "true", "-o", report,
               sys.executable, script]
    try:
        subprocess.run(profile, capture_output=True, text=True, check=True,
                       timeout=NSYS_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nsys profile of a tiny training step failed ({type(exc).__name__}: {exc})"
    for name in KERNEL_REPORTS:
        try:
            done = subprocess.run([nsys, "stats", "--report", name, "--format", "csv",
                                   "--output", "-", report + ".nsys-rep"],
                                  capture_output=True, text=True, check=True,
                                  timeout=NSYS_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            continue
        summary = kernel_summary(done.stdout)
        if summary is not None:
            kinds, launches, total_ns = summary
            return (f"under nsys, {NSYS_STEPS} fp32 training steps of the MLP "
                    f"{'-'.join(map(str, CHECK_SIZES))} on {CHECK_BATCH} rows ran {launches} "
                    f"kernels ({kinds} distinct) for {total_ns * 1e-3:.1f} us of GPU time "
                    f"(`nsys stats --report {name}`); the report is {report}.nsys-rep, its "
                    f"NVTX ranges are the ops and the 'train step' ranges")
    return (f"nsys profiled the tiny step ({report}.nsys-rep) but `nsys stats` gave no "
            f"kernel table this lesson could read (tried {', '.join(KERNEL_REPORTS)})")


def _torch_step(r: LessonRun, torch: Any, sizes: tuple[int, ...], batch: tuple[Any, Any],
                first_loss: float, ours: Any) -> None:
    """PyTorch trains the same MLP (same initial weights, same batch): its first loss is
    checked against ours, its step timed the same way."""
    p = r.params
    precision = p["precision"]
    twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=p["seed"]))
    opt = TT.torch_adamw(torch, twin.parameters(), p["lr"])
    scaler = (TT.torch_grad_scaler(torch, INIT_SCALE, GROWTH_INTERVAL)
              if nn.PRECISIONS[precision].needs_scaler else None)
    step = TT.torch_train_step(torch, twin, opt, scaler, precision)
    [(tx, tl)] = TT.torch_batches(torch, [batch])
    with TT.Tf32(torch, precision == "tf32"):
        theirs = float(step(tx, tl))
        r.check(f"torch's first {precision} loss vs cudalab's (same weights, same batch)",
                abs(theirs - first_loss) / abs(first_loss), TORCH_LOSS_TOL[precision])
        m = r.measure("train step torch", step, tx, tl, flops=ours.flops,
                      ceiling=ours.ceiling_name,
                      description=f"one PyTorch {precision} training step (CUDA events)")
    _step_row(r, "torch", m)
    fused = "fused" if opt.defaults.get("fused") else "unfused"
    autocast = "" if precision in ("fp32", "tf32") else f"autocast {precision}, "
    r.finding(f"PyTorch ({autocast}{fused} AdamW) runs the same step in {m.median * 1e3:.3f} ms, "
              f"{m.median / ours.median:.2f}x cudalab's time", value=m.median / ours.median,
              unit="x", labels=("train step", "train step torch"))


@run.plot
def plot(result: Any, ax: Any) -> None:
    colors = {"gemm": "tab:blue", "loss": "tab:purple", "optimizer": "tab:red",
              "cast": "tab:orange", "element-wise": "tab:olive", "reduction": "tab:green",
              "other": "tab:gray"}
    rows = [x for x in result.rows if x["kind"] == "op"]
    share = {x["category"]: x["gpu_pct"] for x in result.rows if x["kind"] == "category"}
    for category, color in colors.items():  # one bar series per kind of op, for the legend
        mine = [(i, x["gpu_ms_per_step"]) for i, x in enumerate(rows) if x["category"] == category]
        if mine:
            ax.barh([i for i, _ in mine], [v for _, v in mine], color=color,
                    label=f"{category} {share.get(category, 0.0):.0f}% of GPU time")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([x["op"] for x in rows], fontsize=8)
    ax.invert_yaxis()  # the busiest op on top
    steps = {x["impl"]: x["gpu_ms_per_step"] for x in result.rows if x["kind"] == "step"}
    if steps:
        ax.set_title("whole step: " + ", ".join(f"{k} {v:.3f} ms" for k, v in steps.items()),
                     fontsize=9, loc="right")
    ax.set_xlabel(f"GPU time per step (ms), {result.params['precision']}")
    ax.legend(fontsize=8)
