"""Lesson 15 `timing`: four ways to time a GPU op, and the one that lies.

A large matmul is asynchronous: the call returns once the kernel is queued,
long before the GPU finishes it. The lesson times the same matmul with

* the host clock around the call alone (no synchronize): this measures only
  the launch, a small fraction of the real time;
* the host clock around the call and a synchronize;
* CUDA events recorded around the call on its stream;
* the tutorial's loop: many calls, one synchronize at the end, divided;
* cudalab.bench (CUDA events, warm-up, repeats, noise-based stop),

and puts every number beside the bench median. The result is checked against
NumPy in float64.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

import cudalab
from cudalab import _precision
from ..bench import host_clock, host_measurement
from . import _params as P
from .registry import LessonRun, lesson

# A method whose number is below this fraction of the bench median misses most
# of the work (it timed the launch, not the op).
MISLEADING_RATIO = 0.5
# A method agrees with the bench when within this fraction of its median.
AGREES_WITHIN = 0.10
# Rounds of the tutorial's loop (each `loop_calls` calls, one synchronize).
LOOP_ROUNDS = 3
# Result rows checked against float64 NumPy.
CHECK_ROWS = 32
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}

WHAT = {
    "host clock, no synchronize": "the launch only: the call returns before the GPU runs it",
    "host clock + synchronize": "launch, GPU work and the synchronize's wake-up",
    "CUDA events": "GPU time between two events on the op's stream",
    "loop, one synchronize": "the tutorial's benchmark_operation: throughput of queued calls",
    "cudalab.bench": "CUDA events, warm-up, repeats until the median is stable",
}


# The first call measured two ways: the lesson's first matmul of this size in
# this process (main thread), and the first on a fresh cuBLAS handle: cudalab
# keeps one handle (with a 32 MiB workspace and a plan cache) per thread, so a
# new thread's first matmul creates them. Neither pays what the process paid
# before (its context, cuBLAS's kernels already loaded).
FIRST_LESSON = "first call (this lesson)"
FIRST_HANDLE = "first call (fresh cuBLAS handle)"
FIRST_WHAT = {
    FIRST_LESSON: "host clock + synchronize around the lesson's first matmul of this size",
    FIRST_HANDLE: "host clock + synchronize around a new thread's first matmul: a new cuBLAS "
                  "handle, workspace and algorithm choice",
}
# A first call this many times the warmed time carries setup worth naming.
FIRST_CALL_SLOW = 1.5


# ---- pure decisions ---------------------------------------------------------------------


def first_call_text(what: str, first_s: float, warm_s: float) -> str:
    """What one un-warmed call's time says against the warmed median (host clock + synchronize)."""
    x = first_s / warm_s
    if x >= FIRST_CALL_SLOW:
        return (f"{what} took {first_s * 1e3:.2f} ms against a warmed {warm_s * 1e3:.3f} ms "
                f"({x:.1f}x): a single un-warmed timing measures the setup "
                f"({(first_s - warm_s) * 1e3:.2f} ms), not the op")
    return (f"{what} took {first_s * 1e3:.2f} ms against a warmed {warm_s * 1e3:.3f} ms "
            f"({x:.2f}x): the setup was already paid or is small beside this matmul")


def verdict(ratio: float) -> str:
    """What a method's ratio to the bench median says about it."""
    if ratio < MISLEADING_RATIO:
        return f"misses {1 - ratio:.0%} of the work: it timed the launch, not the op"
    if abs(ratio - 1.0) <= AGREES_WITHIN:
        return "agrees with the bench"
    if ratio > 1.0:
        return f"reads {ratio - 1:.0%} high: host-side overhead on top of the GPU time"
    return f"reads {1 - ratio:.0%} low"


# ---- the methods -------------------------------------------------------------------------


def _no_sync(fn: Callable[[], Any], samples: int) -> list[float]:
    """Host seconds around the call alone; the GPU is idle before each call (the
    synchronize is outside the timed region) and the work finishes after it."""
    times = []
    for _ in range(samples):
        cudalab.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    cudalab.synchronize()
    return times


def _events(fn: Callable[[], Any], samples: int) -> list[float]:
    """Seconds between CUDA events recorded around one call."""
    times = []
    for _ in range(samples):
        start, end = cudalab.Event(), cudalab.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return times


def _loop(fn: Callable[[], Any], calls: int) -> list[float]:
    """Per-call seconds of `calls` back-to-back calls and one synchronize, per round."""
    times = []
    for _ in range(LOOP_ROUNDS):
        cudalab.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        cudalab.synchronize()
        times.append((time.perf_counter() - t0) / calls)
    return times


def _first_in_thread(fn: Callable[[], Any], device: int) -> float:
    """Host seconds of fn() + synchronize as the first call of a new thread."""
    out: dict[str, Any] = {}

    def work() -> None:
        try:
            cudalab.set_device(device)
            t0 = time.perf_counter()
            fn()
            cudalab.synchronize()
            out["s"] = time.perf_counter() - t0
        except BaseException as exc:  # re-raised in the lesson's thread
            out["error"] = exc

    thread = threading.Thread(target=work, name="cudalab-timing-first-call")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["s"]


def _first_calls(r: LessonRun, fn: Callable[[], Any], first_s: float) -> None:
    """Record the two first calls beside the warmed host clock + synchronize."""
    handle_s = _first_in_thread(fn, cudalab.current_device())
    warm = r.measurements["host clock + synchronize"]
    for label, seconds in ((FIRST_LESSON, first_s), (FIRST_HANDLE, handle_s)):
        r.add(host_measurement([seconds], calls=1, label=label, host_time=False,
                               timer=FIRST_WHAT[label]), label)
        r.row(impl="cudalab", method=label, ms=seconds * 1e3, ratio_to_bench=seconds
              / r.measurements["cudalab.bench"].median, samples=1, what=FIRST_WHAT[label])
        text = first_call_text(label, seconds, warm.median)
        r.finding(text[0].upper() + text[1:], value=seconds / warm.median, unit="x", labels=(label, warm.label))


def _synced(fn: Callable[[], Any]) -> Callable[[], None]:
    def call() -> None:
        fn()
        cudalab.synchronize()

    return call


def _methods(r: LessonRun, impl: str, fn: Callable[[], Any], flops: float) -> dict[str, Any]:
    p = r.params
    n = p["samples"]
    suffix = "" if impl == "cudalab" else f" ({impl})"

    def host(label: str, times: list[float], calls: int, timer: str) -> Any:
        return r.add(host_measurement(times, calls=calls, label=label + suffix, timer=timer,
                                      host_time=False), label + suffix)

    out = {"cudalab.bench": r.measure("cudalab.bench" + suffix, fn, flops=flops, ceiling=None)}
    out["host clock, no synchronize"] = host("host clock, no synchronize", _no_sync(fn, n), 1,
                                             "host clock around the call, no synchronize")
    synced = host_clock({"synced": _synced(fn)}, n, r.timer.settings.warmup)["synced"]
    out["host clock + synchronize"] = host("host clock + synchronize", synced, 1,
                                           "host clock around the call and a synchronize")
    out["CUDA events"] = host("CUDA events", _events(fn, n), 1, "CUDA events around one call")
    out["loop, one synchronize"] = host(
        "loop, one synchronize", [t * p["loop_calls"] for t in _loop(fn, p["loop_calls"])],
        p["loop_calls"], "host clock around a loop of calls and one synchronize")
    for method, m in out.items():
        ratio = m.median / out["cudalab.bench"].median
        r.row(impl=impl, method=method, ms=m.median * 1e3, ratio_to_bench=ratio,
              samples=m.repeats, what=WHAT[method])
    return out


def _check(r: LessonRun, a: Any, b: Any, dtype: str) -> None:
    got = cudalab.matmul(a[:CHECK_ROWS], b, precision="highest").get().astype(np.float64)
    want = a[:CHECK_ROWS].get().astype(np.float64) @ b.get().astype(np.float64)
    r.check(f"{dtype} matmul, first {CHECK_ROWS} rows, vs NumPy float64",
            np.max(np.abs(got - want)) / np.max(np.abs(want)), TOLERANCE[dtype])


def _findings(r: LessonRun, ms: dict[str, Any]) -> None:
    bench = ms["cudalab.bench"]
    no_sync = ms["host clock, no synchronize"]
    ratio = no_sync.median / bench.median
    why = ("the call returns once the kernel is queued" if ratio < MISLEADING_RATIO else
           "the call waited for the GPU here (a synchronous op, or a full launch queue)")
    r.finding(f"without a synchronize the host clock reads {no_sync.median * 1e6:.1f} us for a "
              f"matmul the GPU runs in {bench.median * 1e3:.3f} ms ({ratio:.2%} of it): {why} "
              f"(the bench's enqueue time per call is {bench.host_time * 1e6:.1f} us); this "
              f"number {verdict(ratio)}", value=ratio, unit="x",
              labels=("host clock, no synchronize", "cudalab.bench"))
    for method in ("host clock + synchronize", "CUDA events", "loop, one synchronize"):
        m = ms[method]
        x = m.median / bench.median
        r.finding(f"{method}: {m.median * 1e3:.3f} ms, {x:.3f}x the bench median "
                  f"({(m.median - bench.median) * 1e6:+.1f} us): {verdict(x)}", value=x,
                  unit="x", labels=(method, "cudalab.bench"))
    r.claim("always synchronize before reading the host clock, or the timing is wrong",
            tutorial=None, measured=ratio, unit="x of the real time", held=ratio < MISLEADING_RATIO,
            why=f"unsynchronized: {no_sync.median * 1e6:.1f} us vs {bench.median * 1e3:.3f} ms")
    loop = ms["loop, one synchronize"].median / bench.median
    r.claim("the notebook's benchmark_operation (calls in a loop, one synchronize) times GPU "
            "work correctly", tutorial=None, measured=loop, unit="x of the bench median",
            held=abs(loop - 1.0) <= AGREES_WITHIN, why=verdict(loop))


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    if p["dtype"] not in TOLERANCE:
        raise ValueError(f"lesson 'timing': dtype must be one of {', '.join(TOLERANCE)}, "
                         f"got {p['dtype']!r}")
    P.ints("timing", p, "size", "samples", "loop_calls")


@lesson(15, "timing", title="Timing GPU work: host clock, synchronize, CUDA events, bench",
        seed="Colab notebook: benchmark_operation and summary item 9 (always synchronize for "
             "accurate timing); optimization guide: CUDA Synchronization Issues, Before "
             "Optimization",
        params={"size": 8192, "dtype": "float32", "samples": 20, "loop_calls": 20},
        quick_params={"size": 4096, "samples": 10, "loop_calls": 10},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    check_params(p)
    n, dtype = p["size"], p["dtype"]
    a = cudalab.random.normal((n, n), dtype=dtype, seed=15)
    b = cudalab.random.normal((n, n), dtype=dtype, seed=16)
    fn = functools.partial(cudalab.matmul, a, b, precision="highest")
    cudalab.synchronize()  # the inputs are made: time the matmul alone
    t0 = time.perf_counter()
    fn()
    cudalab.synchronize()
    first_s = time.perf_counter() - t0
    _check(r, a, b, dtype)
    ms = _methods(r, "cudalab", fn, 2.0 * n ** 3)
    _findings(r, ms)
    _first_calls(r, fn, first_s)
    torch = r.torch()
    if torch is not None:
        ta = torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype))
        with _precision.TorchTf32(torch, False):
            theirs = _methods(r, "torch", functools.partial(torch.matmul, ta, ta), 2.0 * n ** 3)
        x = theirs["host clock, no synchronize"].median / theirs["cudalab.bench"].median
        r.finding(f"PyTorch's matmul reads the same way: {x:.2%} of its bench median without a "
                  f"synchronize", value=x, unit="x",
                  labels=("host clock, no synchronize (torch)", "cudalab.bench (torch)"))


@run.plot
def plot(result: Any, ax: Any) -> None:
    impls = list(dict.fromkeys(x["impl"] for x in result.rows))
    methods = list(WHAT)
    y = np.arange(len(methods))
    height = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        by = {x["method"]: x["ms"] for x in result.rows if x["impl"] == impl}
        ax.barh(y + i * height, [by.get(m, float("nan")) for m in methods], height=height,
                label=impl)
    ax.set_yticks(y + height * (len(impls) - 1) / 2, methods)
    ax.set_xscale("log")
    ax.set_xlabel("time per matmul (ms, log scale)")
    ax.legend(fontsize=8)
