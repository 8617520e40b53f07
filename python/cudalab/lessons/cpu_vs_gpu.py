"""Lesson 9 `cpu_vs_gpu`: NumPy on the CPU against cudalab on the GPU.

The same three kinds of work on both sides: a matrix multiply per dtype
(compute-bound), an element-wise add and a full sum (memory-bound). Rates
are compared, GFLOP/s for the GEMMs and GB/s for the memory-bound ops, so
the speedup means the same thing whatever size each side ran at. NumPy's
float16 GEMM has no BLAS behind it and would take hours at GPU sizes, so a
CPU case that is slow gets a smaller matrix (chosen from a timed probe to fit
a time budget), stated in the `cpu_size` column. The CPU is timed with the
host clock, the GPU with CUDA events; the guide's "50-100x for matrix
multiplication" is compared with what this machine measures. `iterations`
caps the timed repeats on both sides: the GPU harness stops earlier once its
median is stable, the CPU once `cpu_seconds` per case are spent (at least
three calls); the repeats taken are in the rows.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Mapping

import numpy as np

import cudalab
from cudalab import _precision
from ..bench import host_clock, host_measurement
from . import _params as P
from .registry import LessonRun, lesson

# The guide's expected matmul speedup range.
CLAIM_LOW, CLAIM_HIGH = 50.0, 100.0
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


def _cpu_measurement(r: LessonRun, label: str, fn: Callable[[], Any], *, flops: float,
                     nbytes: float, estimate: float | None = None) -> Any:
    """Time `fn` on the host: up to `iterations` calls within `cpu_seconds`; `estimate`
    (seconds per call) saves a sizing call when a probe already gave it."""
    p = r.params
    if estimate is None:
        estimate = min(_cpu_time(label, fn, 1))
    repeats = cpu_repeats(estimate, p["iterations"], p["cpu_seconds"])
    times = _cpu_time(label, fn, repeats)
    m = host_measurement(times, calls=1, label=label, timer="host clock (NumPy on the CPU)",
                         description="NumPy on the CPU", bytes=nbytes, host_time=False)
    return r.add(dataclasses.replace(m, flops=float(flops)), label)


# ---- the lesson ------------------------------------------------------------------------


def _gpu_timer(r: LessonRun) -> Any:
    iterations = r.params["iterations"]
    return r.timer.replace(max_repeats=iterations,
                           min_repeats=min(iterations, r.timer.settings.min_repeats))


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
    r.row(op=op, dtype=dtype, cpu_size=cpu_size,
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


def _findings(r: LessonRun, threads: int, source: str) -> None:
    matmul = {x["dtype"]: x for x in r.rows if x["op"] == "matmul" and x["speedup"] is not None}
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
    for x in r.rows:
        if x["op"] in ("add", "sum"):
            r.finding(f"{x['op']} (memory-bound): GPU {x['gpu_gbps']:.0f} GB/s vs CPU "
                      f"{x['cpu_gbps']:.1f} GB/s: {times(x['speedup'])}, the ratio of memory "
                      f"bandwidths rather than of FLOP rates", value=x["speedup"], unit="x",
                      labels=(f"{x['op']} gpu", f"{x['op']} cpu"))
    r.finding(f"CPU side: NumPy {np.__version__}, {source}", value=threads, unit="threads")
    if "float32" in matmul:
        x = matmul["float32"]
        held, why = speedup_verdict(x["speedup"])
        r.claim(f"matrix multiplication runs {CLAIM_LOW:.0f}-{CLAIM_HIGH:.0f}x faster on the GPU",
                tutorial=CLAIM_HIGH, measured=x["speedup"], unit="x", held=held,
                why=f"float32 {why} (CPU: {threads} threads)")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    unknown = [d for d in p["dtypes"] if d not in MATMUL_TOLERANCE]
    if unknown:
        raise ValueError(f"lesson 'cpu_vs_gpu': dtypes {unknown} are not among "
                         f"{', '.join(MATMUL_TOLERANCE)}")
    P.ints("cpu_vs_gpu", p, "matrix_size", "iterations")
    P.numbers("cpu_vs_gpu", p, "cpu_seconds")


@lesson(9, "cpu_vs_gpu", title="NumPy on the CPU vs cudalab on the GPU",
        seed="step-by-step guide: cpu_vs_gpu_benchmark.py (--matrix-size 8192 --iterations 100, "
             "expected speedups 50-100x for matrix multiplication)",
        params={"matrix_size": 8192, "iterations": 100, "dtypes": ("float64", "float32", "float16"),
                "cpu_seconds": 8.0},
        quick_params={"matrix_size": 1024, "iterations": 10, "cpu_seconds": 0.5},
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


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = result.rows
    labels = [f"{x['op']} {x['dtype']}" for x in rows]
    y = np.arange(len(rows))
    cpu = [x["cpu_gflops"] if x["op"] == "matmul" else x["cpu_gbps"] for x in rows]
    gpu = [x["gpu_gflops"] if x["op"] == "matmul" else x["gpu_gbps"] for x in rows]
    ax.barh(y - 0.2, [float("nan") if v is None else v for v in cpu], height=0.4,
            label="CPU (NumPy)")
    ax.barh(y + 0.2, gpu, height=0.4, label="GPU (cudalab)")
    ax.set_yticks(y, labels)
    ax.set_xscale("log")
    ax.set_xlabel("rate: GFLOP/s (matmul) or GB/s (add, sum), log scale")
    for i, x in enumerate(rows):
        if x["speedup"] is not None:
            ax.annotate(f"{x['speedup']:.0f}x", (gpu[i], i + 0.2), fontsize=8,
                        xytext=(3, -3), textcoords="offset points")
    ax.legend(fontsize=8)
