"""Lesson 9 `cpu_vs_gpu`: NumPy on the CPU against cudalab on the GPU.

Four parts, each with the same work on both sides:

* Peak rates. A matrix multiply per dtype (compute-bound), an element-wise
  add and a full sum (memory-bound), compared as rates (GFLOP/s, GB/s), so
  the speedup means the same thing whatever size each side ran at. NumPy's
  float16 GEMM has no BLAS behind it and would take hours at GPU sizes, so a
  slow CPU case gets a smaller matrix (chosen from a timed probe to fit a time
  budget), stated in the `cpu_size` column. The CPU is timed with the host
  clock, the GPU with CUDA events; the guide's "50-100x for matrix
  multiplication" is compared with what this machine measures.
  `iterations` caps the timed repeats on both sides: the GPU harness stops
  earlier once its median is stable, the CPU once `cpu_seconds` per case are
  spent (at least three calls).
* The crossover. Matmul and add from tiny (16x16) to large, per dtype, timed
  the way a caller who needs the result waits: the host clock around the
  GPU call and a synchronize, with the data already on the device, and again
  with the upload and the download around it (a round trip). Below the size
  where the GPU starts winning (interpolated on a log scale) its time sits on
  a floor, a 1-element op and a synchronize, measured too: the overhead
  regime, where "CUDA is slower than the CPU for a tiny model".
* A training step: cudalab.nn's MLP, forward, loss, backward and an SGD
  update, against the same step in float32 NumPy (the guide: "training
  10-50x faster").
* A convolution: ResNet-50's 3x3 layer2.1.conv2 in NHWC, im2col + matmul in
  NumPy against cudalab's im2col + GEMM, and PyTorch's conv2d on the CPU and
  on the GPU where it is installed (the guide: "convolution 30-60x").

The CPU's figures depend on its cores and its BLAS; both are recorded in a
finding.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import _precision
from cudalab import nn
from ..bench import host_clock, host_measurement
from ..nn import reference
from . import _numpy_side as NS
from . import _params as P
from . import training as T
from ._measuring import rel_error
from .registry import LessonRun, lesson

# The guide's expected speedup ranges: matrix multiplication, convolution, model training.
CLAIM_LOW, CLAIM_HIGH = 50.0, 100.0
CONV_CLAIM_LOW, CONV_CLAIM_HIGH = 30.0, 60.0
TRAIN_CLAIM_LOW, TRAIN_CLAIM_HIGH = 10.0, 50.0
# Dtypes NumPy can multiply (bfloat16 runs on the GPU only).
CPU_DTYPES = ("float64", "float32", "float16")
# GPU result vs float64 NumPy, max error relative to the largest |reference| entry:
# float64 and float32 accumulate in their own precision, float16 and bfloat16
# round their result to 11 and 8 significant bits.
MATMUL_TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
# Sums of positive float32 values: relative error bound (fp32 pairwise/tree sums).
SUM_TOLERANCE = 1e-4
# CPU sizing: probe until one call takes this long, keep sizes a multiple of this.
PROBE_SECONDS = 0.02
SIZE_MULTIPLE = 64
# Rows checked against float64 NumPy (a full float64 GEMM at 8192 costs seconds).
CHECK_ROWS = 64
MIN_CPU_REPEATS = 3

# ---- the crossover sweep
# Ops swept (a GEMM and an element-wise add, both n x n) and the dtypes both sides run.
SWEEP_OPS = ("matmul", "add")
SWEEP_DTYPES = ("float32", "float64")
# The largest n swept: NumPy's float64 GEMM at 4096 already takes a quarter second.
SWEEP_MAX_SIZE = 4096
# Host-clock repeats of one sweep case at most (tiny cases fill their budget fast).
SWEEP_MAX_REPEATS = 200
# A GPU time within this factor of the floor (1-element op + synchronize) is "at the floor".
FLAT_FACTOR = 2.0

# ---- the training step and the convolution
# The MLP's learning rate (plain SGD on both sides: one pass over the weights per step)
# and the seed of its weights, data and the conv's operands.
TRAIN_LR = 0.01
SEED = 9
# GPU precisions of the step: true fp32 (NumPy's arithmetic) and bf16 (mixed precision).
TRAIN_PRECISIONS = ("fp32", "bf16")
# The fp32 GPU step vs the float32 NumPy step: the loss (relative) and every gradient
# (max |diff| / max |NumPy|): the same float32 sums in other orders.
TRAIN_LOSS_TOL = 1e-4
TRAIN_GRAD_TOL = 1e-3
# ResNet-50's 3x3 layer timed (28x28x128 -> 28x28x128, stride 1) and the largest batch.
CONV_LAYER = "layer2.1.conv2"
CONV_MAX_BATCH = 256
# GPU conv precisions, their dtype names in labels, and their tolerance vs float64 NumPy
# (TF32 keeps 10 mantissa bits of each operand).
CONV_PRECISIONS = {"fp32": "float32", "tf32": "tf32"}
CONV_TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2}
# The CPU training step and CPU convolutions each get this share of `cpu_seconds`.
STEP_CPU_SHARE = 0.25


# ---- pure decisions ---------------------------------------------------------------


def cpu_matmul_size(rate: float, matrix_size: int, target_s: float) -> int:
    """The largest multiple of SIZE_MULTIPLE <= matrix_size whose GEMM takes about
    `target_s` at `rate` FLOP/s (at least SIZE_MULTIPLE, or matrix_size if smaller)."""
    if rate <= 0:
        raise ValueError(f"cpu_matmul_size(): rate must be > 0, got {rate}")
    n = int((target_s * rate / 2.0) ** (1.0 / 3.0)) // SIZE_MULTIPLE * SIZE_MULTIPLE
    return min(matrix_size, max(SIZE_MULTIPLE, n))


def cpu_repeats(seconds_per_call: float, iterations: int, budget_s: float) -> int:
    """Timed CPU calls: `iterations`, cut to fit `budget_s` but at least MIN_CPU_REPEATS
    (never more than `iterations`)."""
    fit = int(budget_s / max(seconds_per_call, 1e-9))
    return max(1, min(iterations, max(MIN_CPU_REPEATS, fit)))


def times(x: float) -> str:
    """A ratio as text: '340x', '35x', '1.2x', '0.36x'."""
    return f"{x:.0f}x" if x >= 10 else f"{x:.2g}x"


def speedup_verdict(speedup: float, low: float = CLAIM_LOW,
                    high: float = CLAIM_HIGH) -> tuple[bool, str]:
    """Whether "the GPU is `low`-`high`x faster" holds, and how the measured value sits."""
    span = f"{low:.0f}-{high:.0f}x"
    if speedup < low:
        return False, f"{times(speedup)}: below the claimed {span}"
    if speedup <= high:
        return True, f"{times(speedup)}: within the claimed {span}"
    return True, f"{times(speedup)}: above the claimed {span}; the claim understates this GPU"


def crossover(sizes: Sequence[float], cpu_s: Sequence[float],
              gpu_s: Sequence[float]) -> tuple[str, float | None]:
    """Where the GPU starts winning for good, from times at ascending `sizes`.

    ("between", n): the CPU is faster at the last size before a run of GPU wins
    that lasts to the largest size; n is where the time ratio crosses 1,
    interpolated linearly in log(size) and log(cpu / gpu) between the two
    sizes. ("below", sizes[0]): the GPU wins at every size. ("never", None):
    the CPU wins at the largest size. A tie counts as the CPU's.
    """
    if not sizes or not len(sizes) == len(cpu_s) == len(gpu_s):
        raise ValueError(f"crossover(): sizes and times must be non-empty and of one length, "
                         f"got {len(sizes)}, {len(cpu_s)}, {len(gpu_s)}")
    logs = [math.log(c / g) for c, g in zip(cpu_s, gpu_s)]  # > 0: the GPU wins
    if logs[-1] <= 0:
        return "never", None
    i = len(logs) - 1
    while i > 0 and logs[i - 1] > 0:
        i -= 1
    if i == 0:
        return "below", float(sizes[0])
    lo, hi = logs[i - 1], logs[i]
    t = -lo / (hi - lo)
    return "between", math.exp(math.log(sizes[i - 1])
                               + t * (math.log(sizes[i]) - math.log(sizes[i - 1])))


def at_floor(sizes: Sequence[int], gpu_s: Sequence[float], floor_s: float,
             factor: float = FLAT_FACTOR) -> int | None:
    """The largest size up to which every GPU time is within `factor` x `floor_s`
    (None when the smallest size is already above it)."""
    last = None
    for n, t in zip(sizes, gpu_s):
        if t > factor * floor_s:
            break
        last = n
    return last


def crossover_phrase(kind: str, n: float | None, sizes: Sequence[int]) -> str:
    """`crossover`'s answer as words: 'from n~181', 'at every n from 16', 'at no n up to 2048'."""
    if kind == "between":
        return f"from n~{n:.0f}"
    if kind == "below":
        return f"at every n from {sizes[0]}"
    return f"at no n up to {sizes[-1]}"


def regime_text(op: str, dtype: str, sizes: Sequence[int], cpu_s: Sequence[float],
                gpu_s: Sequence[float], trip_s: Sequence[float], floor_s: float) -> str:
    """One sentence on where the GPU wins (on the device, and with the round trip) and
    what the GPU's time is made of below that size."""
    kind, n = crossover(sizes, cpu_s, gpu_s)
    trip_kind, trip_n = crossover(sizes, cpu_s, trip_s)
    text = (f"{op} {dtype}: the GPU wins {crossover_phrase(kind, n, sizes)} with the data on "
            f"the device (host clock, synchronized), {crossover_phrase(trip_kind, trip_n, sizes)} "
            f"with the upload and download included")
    flat = at_floor(sizes, gpu_s, floor_s)
    us = 1e6
    if flat is None:
        return (text + f"; at n={sizes[0]} the GPU already takes {gpu_s[0] * us:.1f} us, "
                       f"{gpu_s[0] / floor_s:.1f}x the {floor_s * us:.1f} us floor")
    text += (f"; up to n={flat} the GPU's time stays within {FLAT_FACTOR:g}x of the "
             f"{floor_s * us:.1f} us floor (a 1-element op + synchronize: launch and sync "
             f"overhead, not work) while NumPy takes {cpu_s[0] * us:.1f} us at n={sizes[0]}")
    if kind == "between" and n is not None and n <= flat * 2:
        text += ": the CPU wins exactly where the GPU is overhead-bound"
    return text


def tiny_verdict(speedups: Mapping[str, float], size: int) -> tuple[bool, str]:
    """Whether the CPU beats the GPU on every case at the smallest size (`speedups`: case ->
    CPU time / GPU time there), and why."""
    cpu_wins = sorted(k for k, s in speedups.items() if s < 1)
    text = (f"at n={size} NumPy wins {len(cpu_wins)} of {len(speedups)} cases "
            f"(GPU/CPU time: " + ", ".join(f"{k} {1 / s:.2g}x" for k, s in speedups.items())
            + ")")
    return len(cpu_wins) == len(speedups), text


def blas_text(config: Mapping[str, Any] | None) -> str:
    """NumPy's BLAS from ``np.show_config(mode="dicts")``: 'BLAS scipy-openblas 0.3.27'."""
    blas = ((config or {}).get("Build Dependencies") or {}).get("blas") or {}
    name = blas.get("name")
    if not name:
        return "an unknown BLAS"
    version = blas.get("version")
    return f"BLAS {name}" + (f" {version}" if version else "")


def cpu_threads() -> tuple[int, str]:
    """(threads, how it is known): BLAS threads from threadpoolctl when importable,
    else the CPUs this process may run on."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        pass
    else:
        blas = [x for x in threadpool_info() if x.get("user_api") == "blas"]
        if blas:
            n = int(blas[0]["num_threads"])
            return n, f"{n} BLAS threads ({blas[0].get('internal_api', '?')}, threadpoolctl)"
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n, f"{n} CPUs available (BLAS thread count not known without threadpoolctl)"


def numpy_blas() -> str:
    """`blas_text` of this NumPy's build configuration."""
    try:
        config = np.show_config(mode="dicts")
    except Exception:  # an older NumPy without mode="dicts": the BLAS stays unnamed
        config = None
    return blas_text(config if isinstance(config, dict) else None)


# ---- CPU side ------------------------------------------------------------------------


def _cpu_time(label: str, fn: Callable[[], Any], repeats: int) -> list[float]:
    return host_clock({label: fn}, repeats, 0.0)[label]


def _probe_rate(dtype: str, matrix_size: int, rng: np.random.Generator) -> float:
    """FLOP/s of NumPy's GEMM in `dtype`, from sizes doubled until a call is measurable."""
    n = min(256, matrix_size)
    while True:
        a = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
        t = min(_cpu_time("probe", lambda: a @ a, 1))
        if t >= PROBE_SECONDS or n >= matrix_size:
            return 2.0 * n ** 3 / t
        n = min(matrix_size, 2 * n)


def _with_flops(m: Any, flops: float | None) -> Any:
    return m if flops is None else dataclasses.replace(m, flops=float(flops))


def _cpu_measurement(r: LessonRun, label: str, fn: Callable[[], Any], *, flops: float,
                     nbytes: float | None = None, estimate: float | None = None,
                     budget: float | None = None,
                     description: str = "NumPy on the CPU") -> Any:
    """Time `fn` on the host: up to `iterations` calls within `budget` seconds (default
    `cpu_seconds`); `estimate` (seconds per call) saves a sizing call when known."""
    p = r.params
    if estimate is None:
        estimate = min(_cpu_time(label, fn, 1))
    budget = p["cpu_seconds"] if budget is None else budget
    repeats = cpu_repeats(estimate, p["iterations"], budget)
    times = _cpu_time(label, fn, repeats)
    m = host_measurement(times, calls=1, label=label, timer=f"host clock ({description})",
                         description=description, bytes=nbytes, host_time=False)
    return r.add(_with_flops(m, flops), label)


def _host_case(r: LessonRun, label: str, fn: Callable[[], Any], *, description: str,
               flops: float | None = None, nbytes: float | None = None) -> Any:
    """Host-clock time of `fn` (which returns only once its result is ready), repeated to
    fill `sweep_seconds` (3 to SWEEP_MAX_REPEATS calls) after three untimed calls."""
    fn()  # lazy work: cuBLAS handles and heuristics, pool growth
    t0 = time.perf_counter()
    fn()
    estimate = time.perf_counter() - t0
    repeats = cpu_repeats(estimate, SWEEP_MAX_REPEATS, r.params["sweep_seconds"])
    m = host_measurement(_cpu_time(label, fn, repeats), calls=1, label=label,
                         timer=f"host clock ({description})", description=description,
                         bytes=nbytes, host_time=False)
    return r.add(_with_flops(m, flops), label)


# ---- the lesson: peak rates ----------------------------------------------------------


def _gpu_timer(r: LessonRun) -> Any:
    iterations = r.params["iterations"]
    return r.timer.replace(max_repeats=iterations,
                           min_repeats=min(iterations, r.timer.settings.min_repeats))


def _loop_timer(r: LessonRun) -> Any:
    """CUDA events around back-to-back calls, never held behind a spin kernel: the time
    per call of a loop that issues them from Python, launch gaps included."""
    return _gpu_timer(r).replace(hold=False)


def _check_matmul(r: LessonRun, dtype: str, a: np.ndarray) -> None:
    """The GPU GEMM of the CPU's inputs, first rows vs float64 NumPy."""
    g = cudalab.asarray(a, dtype=dtype)
    got = cudalab.matmul(g, g, precision="highest")[:CHECK_ROWS].get().astype(np.float64)
    a64 = g.get().astype(np.float64)
    want = a64[:CHECK_ROWS] @ a64
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    r.check(f"{dtype} GPU matmul ({a.shape[0]}^2, first {CHECK_ROWS} rows) vs NumPy float64",
            err, MATMUL_TOLERANCE[dtype])


def _matmul_row(r: LessonRun, dtype: str, rng: np.random.Generator) -> None:
    p = r.params
    n = p["matrix_size"]
    g = cudalab.random.normal((n, n), dtype=dtype, seed=9)
    matmul = functools.partial(cudalab.matmul, precision="highest")  # no TF32 for float32
    gpu = r.add(_gpu_timer(r).measure(matmul, g, g, flops=2.0 * n ** 3, ceiling=None,
                                      label=f"matmul {dtype} gpu"))
    cpu, nc = None, None
    if dtype in CPU_DTYPES:
        rate = _probe_rate(dtype, n, rng)
        nc = cpu_matmul_size(rate, n, p["cpu_seconds"] / MIN_CPU_REPEATS)
        a = rng.standard_normal((nc, nc), dtype=np.float32).astype(dtype)
        cpu = _cpu_measurement(r, f"matmul {dtype} cpu", lambda: a @ a, flops=2.0 * nc ** 3,
                               nbytes=3.0 * nc * nc * a.itemsize, estimate=2.0 * nc ** 3 / rate)
        _check_matmul(r, dtype, a)
    else:
        a = rng.standard_normal((min(n, 512),) * 2, dtype=np.float32)
        _check_matmul(r, dtype, a)
    torch_gflops = _torch_matmul(r, dtype, n)
    _row(r, "matmul", dtype, cpu, nc, gpu, n, gflops=True, torch_gflops=torch_gflops)


def _row(r: LessonRun, op: str, dtype: str, cpu: Any, cpu_size: int | None, gpu: Any,
         gpu_size: int, *, gflops: bool, torch_gflops: float | None = None) -> None:
    def rate(m: Any) -> float | None:
        if m is None:
            return None
        return m.tflops * 1e3 if gflops else m.gbps

    speedup = None if cpu is None else rate(gpu) / rate(cpu)
    r.row(part="rate", op=op, dtype=dtype, cpu_size=cpu_size,
          cpu_ms=None if cpu is None else cpu.median * 1e3,
          cpu_gflops=None if cpu is None else cpu.tflops * 1e3,
          cpu_gbps=None if cpu is None else cpu.gbps,
          cpu_repeats=None if cpu is None else cpu.repeats,
          gpu_size=gpu_size, gpu_ms=gpu.median * 1e3, gpu_gflops=gpu.tflops * 1e3,
          gpu_gbps=gpu.gbps, gpu_repeats=gpu.repeats, speedup=speedup,
          speedup_of="GFLOP/s" if gflops else "GB/s", torch_gpu_gflops=torch_gflops)


def _torch_matmul(r: LessonRun, dtype: str, n: int) -> float | None:
    torch = r.torch()
    if torch is None:
        return None
    x = torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype))
    with _precision.TorchTf32(torch, False):  # float32 at full precision, as ours
        m = r.add(_gpu_timer(r).measure(torch.matmul, x, x, flops=2.0 * n ** 3, ceiling=None,
                                        label=f"matmul {dtype} torch"))
    return m.tflops * 1e3


def _memory_rows(r: LessonRun, rng: np.random.Generator) -> None:
    """An element-wise add and a full sum, float32, matrix_size^2 elements on both sides."""
    n = r.params["matrix_size"]
    a = rng.uniform(0.5, 1.5, (n, n)).astype(np.float32)  # positive: the sum does not cancel
    b = rng.uniform(0.5, 1.5, (n, n)).astype(np.float32)
    c = np.empty_like(a)
    ga, gb = cudalab.asarray(a), cudalab.asarray(b)
    gc = cudalab.empty_like(ga)
    size = 4.0 * n * n
    cpu = _cpu_measurement(r, "add cpu", lambda: np.add(a, b, out=c), flops=n * n,
                           nbytes=3 * size)
    gpu = r.add(_gpu_timer(r).measure(functools.partial(cudalab.add, out=gc), ga, gb,
                                      flops=n * n, bytes=3 * size, ceiling=None,
                                      label="add gpu"))
    r.check("GPU add vs NumPy (max abs error)", np.max(np.abs(gc.get() - (a + b))), 0.0)
    _row(r, "add", "float32", cpu, n, gpu, n, gflops=False)
    cpu = _cpu_measurement(r, "sum cpu", lambda: np.sum(a), flops=n * n, nbytes=size)
    gpu = r.add(_gpu_timer(r).measure(cudalab.sum, ga, flops=n * n, bytes=size, ceiling=None,
                                      label="sum gpu"))
    want = np.sum(a, dtype=np.float64)
    r.check("GPU sum vs NumPy float64 (relative)", abs(float(cudalab.sum(ga).get()) - want)
            / want, SUM_TOLERANCE)
    _row(r, "sum", "float32", cpu, n, gpu, n, gflops=False)


# ---- the lesson: the crossover sweep ---------------------------------------------------


def _floor(r: LessonRun) -> tuple[float, float]:
    """(a 1-element add + synchronize, the same with upload and download): the least a
    caller waits for any GPU result, on the device and in a round trip."""
    host = np.ones(1, dtype=np.float32)
    one = cudalab.asarray(host)

    def tiny() -> None:
        cudalab.add(one, one)
        cudalab.synchronize()

    def tiny_trip() -> Any:
        return cudalab.add(cudalab.asarray(host), cudalab.asarray(host)).get()

    m = _host_case(r, "floor: 1-element add + synchronize", tiny,
                   description="cudalab, data on the device, + synchronize")
    trip = _host_case(r, "floor: 1-element round trip", tiny_trip,
                      description="upload, cudalab, download")
    r.row(part="floor", op="1-element add", dtype="float32", gpu_size=1,
          gpu_ms=m.median * 1e3, gpu_roundtrip_ms=trip.median * 1e3)
    return m.median, trip.median


def _sweep_label(op: str, dtype: str, n: int) -> str:
    return f"sweep {op} {dtype} n={n}"


def _sweep_point(r: LessonRun, op: str, dtype: str, n: int,
                 rng: np.random.Generator) -> tuple[float, float, float, float]:
    """(CPU, GPU on the device, GPU round trip) seconds at size n, and the round trip's
    error against NumPy (matmul: relative, first CHECK_ROWS rows vs float64; add: max abs)."""
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    ga, gb = cudalab.asarray(a), cudalab.asarray(b)
    if op == "matmul":
        gpu_op = functools.partial(cudalab.matmul, precision="highest")  # no TF32
        cpu_op: Callable[[], Any] = lambda: a @ b
        flops, nbytes = 2.0 * n ** 3, None
    else:
        gpu_op = cudalab.add
        cpu_op = lambda: a + b
        flops, nbytes = float(n * n), 3.0 * n * n * a.itemsize

    def on_device() -> None:
        gpu_op(ga, gb)
        cudalab.synchronize()

    def round_trip() -> np.ndarray:
        return gpu_op(cudalab.asarray(a), cudalab.asarray(b)).get()

    got = round_trip()
    if op == "matmul":
        rows = min(n, CHECK_ROWS)
        err = rel_error(got[:rows], a[:rows].astype(np.float64) @ b.astype(np.float64))
    else:
        err = float(np.max(np.abs(got - (a + b))))
    label = _sweep_label(op, dtype, n)
    cpu = _host_case(r, f"{label} cpu", cpu_op, description="NumPy on the CPU", flops=flops,
                     nbytes=nbytes)
    gpu = _host_case(r, f"{label} gpu", on_device, flops=flops, nbytes=nbytes,
                     description="cudalab, data on the device, + synchronize")
    trip = _host_case(r, f"{label} gpu round trip", round_trip, flops=flops, nbytes=nbytes,
                      description="upload, cudalab, download")
    r.row(part="sweep", op=op, dtype=dtype, cpu_size=n, cpu_ms=cpu.median * 1e3,
          cpu_repeats=cpu.repeats, gpu_size=n, gpu_ms=gpu.median * 1e3,
          gpu_repeats=gpu.repeats, speedup=cpu.median / gpu.median,
          speedup_of="time (host clock, synchronized)", gpu_roundtrip_ms=trip.median * 1e3,
          roundtrip_speedup=cpu.median / trip.median)
    return cpu.median, gpu.median, trip.median, err


def _sweep(r: LessonRun, floor_s: float) -> None:
    p = r.params
    sizes = sorted(p["sweep_sizes"])
    rng = np.random.default_rng(SEED)
    smallest: dict[str, float] = {}
    for dtype in p["sweep_dtypes"]:
        for op in SWEEP_OPS:
            points = [_sweep_point(r, op, dtype, n, rng) for n in sizes]
            cpu, gpu, trip, errors = (list(x) for x in zip(*points))
            tolerance = MATMUL_TOLERANCE[dtype] if op == "matmul" else 0.0
            r.check(f"sweep {op} {dtype}, round trip at n={sizes[0]}..{sizes[-1]} "
                    f"({len(sizes)} sizes) vs NumPy "
                    + ("float64, relative" if op == "matmul" else "(max abs error)"),
                    max(errors), tolerance)
            kind, n = crossover(sizes, cpu, gpu)
            first, last = _sweep_label(op, dtype, sizes[0]), _sweep_label(op, dtype, sizes[-1])
            r.finding(regime_text(op, dtype, sizes, cpu, gpu, trip, floor_s), value=n,
                      unit="n", labels=(f"{first} cpu", f"{first} gpu", f"{last} cpu",
                                        f"{last} gpu", f"{last} gpu round trip",
                                        "floor: 1-element add + synchronize"))
            smallest[f"{op} {dtype}"] = cpu[0] / gpu[0]
    held, why = tiny_verdict(smallest, sizes[0])
    r.claim("for a tiny workload the GPU is slower than the CPU: launch and synchronize "
            "overhead outweighs the work", tutorial=None, measured=max(smallest.values()),
            unit="x", held=held, why=f"{why}; GPU floor {floor_s * 1e6:.1f} us")


# ---- the lesson: a training step ---------------------------------------------------------


def _training(r: LessonRun, threads: int) -> None:
    """cudalab.nn.train_step (fp32 and bf16) vs the same SGD step in float32 NumPy."""
    p = r.params
    sizes, batch = tuple(int(s) for s in p["mlp_sizes"]), int(p["mlp_batch"])
    [(x, labels)] = T.teacher_batches(sizes, batch, 1, SEED)
    hx, hl = x.get(), labels.get()
    flops = T.step_flops(sizes, batch)
    gpu, params, want = {}, None, None
    for prec in TRAIN_PRECISIONS:
        model = nn.MLP(sizes, "gelu", seed=SEED)
        opt = nn.SGD(model.parameters(), lr=TRAIN_LR)
        if prec == "fp32":  # the first step from the initial weights, checked below
            params = [(w.astype(np.float32), b.astype(np.float32))
                      for w, b in reference.mlp_params(model)]
            loss = float(nn.train_step(model, opt, x, labels, prec).get())
            want = (loss, [q.grad.get() for q in model.parameters()])
        step = functools.partial(nn.train_step, model, opt, x, labels, prec)
        gpu[prec] = r.add(_loop_timer(r).measure(
            step, flops=flops, ceiling=None, label=f"mlp step {prec} gpu",
            description="one cudalab.nn.train_step, back to back (CUDA events)"))
    assert params is not None and want is not None
    t0 = time.perf_counter()
    loss, grads = NS.train_step(params, hx, hl, TRAIN_LR)
    first = time.perf_counter() - t0
    r.check("MLP step: GPU fp32 loss vs NumPy float32 (relative)",
            abs(want[0] - loss) / abs(loss), TRAIN_LOSS_TOL)
    ours = [g for pair in grads for g in pair]
    r.check(f"MLP step: GPU fp32 gradients vs NumPy float32 (max relative difference over "
            f"{len(ours)} parameters)",
            max(rel_error(g, w) for g, w in zip(want[1], ours)), TRAIN_GRAD_TOL)
    cpu = _cpu_measurement(r, "mlp step float32 cpu",
                           lambda: NS.train_step(params, hx, hl, TRAIN_LR), flops=flops,
                           estimate=first, budget=p["cpu_seconds"] * STEP_CPU_SHARE)
    for prec, m in gpu.items():
        r.row(part="train", op="mlp step", dtype=prec, cpu_size=batch, cpu_ms=cpu.median * 1e3,
              cpu_gflops=cpu.tflops * 1e3, cpu_repeats=cpu.repeats, gpu_size=batch,
              gpu_ms=m.median * 1e3, gpu_gflops=m.tflops * 1e3, gpu_repeats=m.repeats,
              speedup=cpu.median / m.median, speedup_of="time per step")
    fp32 = cpu.median / gpu["fp32"].median
    others = ", ".join(f"{k} {times(cpu.median / m.median)}" for k, m in gpu.items()
                       if k != "fp32")
    shape = "-".join(map(str, sizes))
    r.finding(f"MLP {shape} training step (batch {batch}, SGD): NumPy float32 "
              f"{cpu.median * 1e3:.1f} ms ({cpu.tflops * 1e3:.0f} GFLOP/s), cudalab fp32 "
              f"{gpu['fp32'].median * 1e3:.2f} ms ({gpu['fp32'].tflops * 1e3:.0f} GFLOP/s): "
              f"{times(fp32)}" + (f"; {others}" if others else ""), value=fp32, unit="x",
              labels=("mlp step float32 cpu", *(m.label for m in gpu.values())))
    held, why = speedup_verdict(fp32, TRAIN_CLAIM_LOW, TRAIN_CLAIM_HIGH)
    r.claim(f"model training runs {TRAIN_CLAIM_LOW:.0f}-{TRAIN_CLAIM_HIGH:.0f}x faster on the "
            f"GPU", tutorial=TRAIN_CLAIM_HIGH, measured=fp32, unit="x", held=held,
            why=f"fp32 step {why}" + (f" ({others})" if others else "")
                + f"; MLP {shape}, batch {batch}, CPU: NumPy float32 on {threads} threads")


# ---- the lesson: a convolution -----------------------------------------------------------


def _conv(r: LessonRun, threads: int) -> None:
    """ResNet-50's CONV_LAYER, NHWC: NumPy im2col + matmul vs cudalab im2col + GEMM (fp32,
    tf32), and torch's conv2d on the CPU and the GPU where torch is installed."""
    from ..models import arch, ops

    p = r.params
    c = next(x for x in arch.RESNET50 if getattr(x, "name", None) == CONV_LAYER)
    batch = int(p["conv_batch"])
    shapes = arch.tensor_shapes(batch)
    m = int(np.prod(shapes[c.dst][:3]))
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal(shapes[c.src], dtype=np.float32)
    w = rng.standard_normal((c.cout, c.k_padded), dtype=np.float32) * np.float32(
        math.sqrt(2.0 / c.k))
    w[:, c.k:] = 0  # im2col's padding columns are zero; so are the weights they meet
    b = rng.uniform(-0.1, 0.1, c.cout).astype(np.float32)
    geometry = (c.kh, c.kw, c.stride, c.padding, c.relu)
    want = NS.conv3x3(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                      *geometry)
    flops = 2.0 * m * c.k * c.cout
    budget = p["cpu_seconds"] * STEP_CPU_SHARE

    xg, wg, bg = cudalab.asarray(x), cudalab.asarray(w), cudalab.asarray(b)
    cols = cudalab.empty((m, c.k_padded), dtype="float32")
    out = cudalab.empty((m, c.cout), dtype="float32")
    gpu = {}
    for prec, name in CONV_PRECISIONS.items():
        def layer(prec: str = prec) -> None:
            ops.im2col(xg, c.kh, c.kw, c.stride, c.padding, k_padded=c.k_padded, out=cols)
            ops.conv_gemm(cols, wg, bg, relu=c.relu, out=out, precision=prec)

        layer()
        r.check(f"{CONV_LAYER}: GPU im2col + GEMM ({prec}) vs NumPy float64",
                rel_error(out.get(), want), CONV_TOLERANCE[prec])
        gpu[prec] = r.add(_loop_timer(r).measure(
            layer, flops=flops, ceiling=None, label=f"conv {name} gpu",
            description=f"cudalab im2col + GEMM ({prec}), back to back (CUDA events)"))

    t0 = time.perf_counter()
    got = NS.conv3x3(x, w, b, *geometry)
    first = time.perf_counter() - t0
    r.check(f"{CONV_LAYER}: NumPy float32 im2col + matmul vs float64", rel_error(got, want),
            CONV_TOLERANCE["fp32"])
    cpu = _cpu_measurement(r, "conv float32 cpu", lambda: NS.conv3x3(x, w, b, *geometry),
                           flops=flops, estimate=first, budget=budget)
    theirs = _torch_conv(r, c, x, w, b, want, flops, budget)
    for prec, name in CONV_PRECISIONS.items():
        g = gpu[prec]
        t_gpu = theirs.get(prec)
        r.row(part="conv", op=f"conv {c.kh}x{c.kw} {CONV_LAYER}", dtype=name, cpu_size=batch,
              cpu_ms=cpu.median * 1e3, cpu_gflops=cpu.tflops * 1e3, cpu_repeats=cpu.repeats,
              gpu_size=batch, gpu_ms=g.median * 1e3, gpu_gflops=g.tflops * 1e3,
              gpu_repeats=g.repeats, speedup=cpu.median / g.median, speedup_of="time",
              torch_gpu_gflops=None if t_gpu is None else t_gpu.tflops * 1e3,
              torch_cpu_ms=None if "cpu" not in theirs else theirs["cpu"].median * 1e3)
    fp32 = cpu.median / gpu["fp32"].median
    tf32 = cpu.median / gpu["tf32"].median
    what = (f"{CONV_LAYER} ({c.kh}x{c.kw}, {c.cin}->{c.cout}, {shapes[c.src][1]}x"
            f"{shapes[c.src][2]}, batch {batch}, NHWC)")
    text = (f"{what}: NumPy im2col + matmul {cpu.median * 1e3:.1f} ms, cudalab fp32 "
            f"{gpu['fp32'].median * 1e3:.3f} ms ({times(fp32)}), tf32 "
            f"{gpu['tf32'].median * 1e3:.3f} ms ({times(tf32)})")
    labels = ["conv float32 cpu", "conv float32 gpu", "conv tf32 gpu"]
    torch_ratio = ""
    if "cpu" in theirs:
        tc = theirs["cpu"]
        text += (f"; torch on the CPU ({theirs['threads']} threads) {tc.median * 1e3:.1f} ms, "
                 f"{times(tc.median / gpu['fp32'].median)} slower than cudalab fp32")
        labels.append(tc.label)
        if "fp32" in theirs:
            ratio = tc.median / theirs["fp32"].median
            text += f", torch CPU vs torch CUDA fp32 {times(ratio)}"
            torch_ratio = f"; torch's own CPU vs CUDA fp32: {times(ratio)}"
            labels.append(theirs["fp32"].label)
    r.finding(text, value=fp32, unit="x", labels=tuple(labels))
    held, why = speedup_verdict(fp32, CONV_CLAIM_LOW, CONV_CLAIM_HIGH)
    r.claim(f"convolution runs {CONV_CLAIM_LOW:.0f}-{CONV_CLAIM_HIGH:.0f}x faster on the GPU",
            tutorial=CONV_CLAIM_HIGH, measured=fp32, unit="x", held=held,
            why=f"fp32 {why} (tf32 {times(tf32)}){torch_ratio}; {CONV_LAYER}, batch {batch}, "
                f"CPU: NumPy on {threads} threads")


def _torch_conv(r: LessonRun, c: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray,
                want: np.ndarray, flops: float, budget: float) -> dict[str, Any]:
    """torch.nn.functional.conv2d + ReLU, channels-last, on the CPU (host clock) and on
    the GPU (fp32 and TF32 cuDNN); {} without torch."""
    torch = r.torch()
    if torch is None:
        return {}
    F = torch.nn.functional
    # NHWC memory seen as NCHW with channels-last strides: no copy.
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
    wk = np.ascontiguousarray(w[:, :c.k].reshape(c.cout, c.kh, c.kw, c.cin))
    wt = torch.from_numpy(wk).permute(0, 3, 1, 2)
    bt = torch.from_numpy(b)

    def layer(xs: Any, ws: Any, bs: Any) -> Any:
        y = F.conv2d(xs, ws, bs, stride=c.stride, padding=c.padding)
        return torch.relu(y) if c.relu else y

    with torch.no_grad():
        got = layer(xt, wt, bt).permute(0, 2, 3, 1).reshape(-1, c.cout).numpy()
        r.check(f"{CONV_LAYER}: torch CPU conv2d vs NumPy float64", rel_error(got, want),
                CONV_TOLERANCE["fp32"])
        out: dict[str, Any] = {"threads": torch.get_num_threads()}
        out["cpu"] = _cpu_measurement(r, "conv float32 torch-cpu", lambda: layer(xt, wt, bt),
                                      flops=flops, budget=budget,
                                      description="torch conv2d on the CPU")
        xc, wc, bc = xt.cuda(), wt.cuda(), bt.cuda()
        for prec, name in CONV_PRECISIONS.items():
            with _precision.TorchTf32(torch, prec == "tf32", cudnn=True):
                out[prec] = r.add(_loop_timer(r).measure(
                    layer, xc, wc, bc, flops=flops, ceiling=None, label=f"conv {name} torch",
                    description=f"torch conv2d on the GPU ({prec})"))
    return out


# ---- findings, parameters, the run ---------------------------------------------------------


def _findings(r: LessonRun, threads: int, source: str) -> None:
    rates = [x for x in r.rows if x.get("part") == "rate"]
    matmul = {x["dtype"]: x for x in rates if x["op"] == "matmul" and x["speedup"] is not None}
    for dtype, x in matmul.items():
        size = ("" if x["cpu_size"] == x["gpu_size"] else
                f" (CPU at {x['cpu_size']}^2, GPU at {x['gpu_size']}^2)")
        r.finding(f"{dtype} matmul: GPU {x['gpu_gflops']:.0f} GFLOP/s vs CPU "
                  f"{x['cpu_gflops']:.1f} GFLOP/s on {threads} threads: {times(x['speedup'])}"
                  f"{size}", value=x["speedup"], unit="x",
                  labels=(f"matmul {dtype} gpu", f"matmul {dtype} cpu"))
    if "float16" in matmul and "float32" in matmul:
        h, f = matmul["float16"], matmul["float32"]
        slow = f["cpu_gflops"] / h["cpu_gflops"]
        r.finding(f"NumPy's float16 GEMM runs {times(slow)} slower than its float32 one (no BLAS "
                  f"for half precision), while the GPU's float16 GEMM runs "
                  f"{times(h['gpu_gflops'] / f['gpu_gflops'])} its float32 rate",
                  value=slow, unit="x", labels=("matmul float16 cpu", "matmul float32 cpu",
                                                "matmul float16 gpu", "matmul float32 gpu"))
    for x in rates:
        if x["op"] in ("add", "sum"):
            r.finding(f"{x['op']} (memory-bound): GPU {x['gpu_gbps']:.0f} GB/s vs CPU "
                      f"{x['cpu_gbps']:.1f} GB/s: {times(x['speedup'])}, the ratio of memory "
                      f"bandwidths rather than of FLOP rates", value=x["speedup"], unit="x",
                      labels=(f"{x['op']} gpu", f"{x['op']} cpu"))
    r.finding(f"CPU side: NumPy {np.__version__} with {numpy_blas()}, {source}, "
              f"os.cpu_count() = {os.cpu_count()}: every CPU figure here depends on this "
              f"host's cores and BLAS", value=threads, unit="threads")
    if "float32" in matmul:
        x = matmul["float32"]
        held, why = speedup_verdict(x["speedup"])
        r.claim(f"matrix multiplication runs {CLAIM_LOW:.0f}-{CLAIM_HIGH:.0f}x faster on the GPU",
                tutorial=CLAIM_HIGH, measured=x["speedup"], unit="x", held=held,
                why=f"float32 {why} (CPU: {threads} threads)")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    name = "cpu_vs_gpu"
    unknown = [d for d in p["dtypes"] if d not in MATMUL_TOLERANCE]
    if unknown:
        raise ValueError(f"lesson 'cpu_vs_gpu': dtypes {unknown} are not among "
                         f"{', '.join(MATMUL_TOLERANCE)}")
    P.ints(name, p, "matrix_size", "iterations", "mlp_batch", "conv_batch")
    P.numbers(name, p, "cpu_seconds", "sweep_seconds")
    P.int_lists(name, p, "sweep_sizes")
    sizes = list(p["sweep_sizes"])
    if len(sizes) < 2 or len(set(sizes)) != len(sizes) or max(sizes) > SWEEP_MAX_SIZE:
        raise ValueError(f"lesson 'cpu_vs_gpu': sweep_sizes must be at least 2 distinct sizes "
                         f"<= {SWEEP_MAX_SIZE}, got {p['sweep_sizes']!r}")
    P.among(name, p, "sweep_dtypes", SWEEP_DTYPES)
    P.int_lists(name, p, "mlp_sizes")
    if len(p["mlp_sizes"]) < 2 or p["mlp_sizes"][-1] < 2:
        raise ValueError(f"lesson 'cpu_vs_gpu': mlp_sizes must be at least (in_features, "
                         f"classes) with classes >= 2, got {p['mlp_sizes']!r}")
    if p["conv_batch"] > CONV_MAX_BATCH:
        raise ValueError(f"lesson 'cpu_vs_gpu': conv_batch must be an int in 1..{CONV_MAX_BATCH}, "
                         f"got {p['conv_batch']!r}")


@lesson(9, "cpu_vs_gpu", title="NumPy on the CPU vs cudalab on the GPU",
        seed="step-by-step guide: cpu_vs_gpu_benchmark.py (--matrix-size 8192 --iterations 100, "
             "expected speedups 50-100x for matrix multiplication, 30-60x for convolution, "
             "10-50x for model training); troubleshooting table: CUDA slower than CPU for a "
             "tiny model",
        params={"matrix_size": 8192, "iterations": 100, "dtypes": ("float64", "float32", "float16"),
                "cpu_seconds": 8.0, "sweep_sizes": (16, 32, 64, 128, 256, 512, 1024, 2048),
                "sweep_dtypes": SWEEP_DTYPES, "sweep_seconds": 0.05,
                "mlp_sizes": (1024, 4096, 4096, 16), "mlp_batch": 1024, "conv_batch": 32},
        quick_params={"matrix_size": 1024, "iterations": 10, "cpu_seconds": 0.5,
                      "sweep_sizes": (16, 128, 1024), "sweep_dtypes": ("float32",),
                      "sweep_seconds": 0.01, "mlp_sizes": (256, 512, 512, 16), "mlp_batch": 256,
                      "conv_batch": 2},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    check_params(p)
    rng = np.random.default_rng(9)
    threads, source = cpu_threads()
    for dtype in p["dtypes"]:
        _matmul_row(r, dtype, rng)
    _memory_rows(r, rng)
    _findings(r, threads, source)
    floor_s, _ = _floor(r)
    _sweep(r, floor_s)
    _training(r, threads)
    _conv(r, threads)


@run.plot
def plot(result: Any, ax: Any) -> None:
    """The crossover: time per call against n, NumPy and the GPU (on the device and in a
    round trip), for the first swept dtype, with the floor."""
    sweep = [x for x in result.rows if x.get("part") == "sweep"]
    if not sweep:
        return
    dtype = "float32" if any(x["dtype"] == "float32" for x in sweep) else sweep[0]["dtype"]
    for op, color in zip(SWEEP_OPS, ("C0", "C1")):
        rows = [x for x in sweep if x["op"] == op and x["dtype"] == dtype]
        n = [x["cpu_size"] for x in rows]
        ax.plot(n, [x["cpu_ms"] * 1e3 for x in rows], "o-", color=color,
                label=f"{op}: NumPy (CPU)")
        ax.plot(n, [x["gpu_ms"] * 1e3 for x in rows], "s--", color=color,
                label=f"{op}: GPU + synchronize")
        ax.plot(n, [x["gpu_roundtrip_ms"] * 1e3 for x in rows], "^:", color=color,
                label=f"{op}: GPU round trip")
    for x in result.rows:
        if x.get("part") == "floor":
            ax.axhline(x["gpu_ms"] * 1e3, color="gray", lw=0.8,
                       label="floor: 1-element op + synchronize")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"n ({dtype}; matmul n x n x n, add n x n)")
    ax.set_ylabel("time per call (us, host clock)")
    ax.legend(fontsize=7)
