"""Why the lesson pairs below parity with PyTorch are slower (issue 24, item 6).

docs/results.md lists the cudalab/PyTorch pairs of the lessons under 0.97x. For
each pair this script times both sides the lesson's way, then the variants
that decide the cause, and writes one JSON file and a table:

* timing: host clock around one unsynchronized 8192^2 float32 matmul (GPU idle
  before the call, as the lesson times it), beside: the call with out= (no
  allocation), behind a busy GPU, TF32, 1024^2, cuBLAS instead of cuBLASLt,
  and an allocation alone; plus the CUDA API calls (name, count, us per call)
  and kernels of one call of each, from torch.profiler (CUPTI sees every
  library's calls in the process).
* pinned: pageable 256 MiB upload/download, each library from its own NumPy
  buffer (the lesson's way) and from the other's, interleaved; uploads in
  chunks; host memcpy rates of the same buffers (the driver stages pageable
  copies through the CPU); their transparent huge pages. Pinned 64 KiB and
  1 MiB uploads, own and swapped buffers, torch into a preallocated tensor,
  and the copies' GPU durations and API calls from the profiler.
* inplace: the 2048^2 chain out of place / in place, then each op alone at
  2048^2 (L2-resident) and 8192^2 (DRAM) in GB/s, and the kernels' launch
  shapes and durations from the profiler.
* streams: one-block softmax over 2^18, 2^20, 2^22 elements (one kernel, CUDA
  events), the lesson's x32 on one and two streams, and the kernels' shapes.
* checkpointing: the 13-layer MLP step (tf32, batch 8192) of both libraries,
  and their kernels per step grouped as GEMM and other from the profiler.

Each probe is caught on its own: one that fails records its error and the
others still run. A probe is skipped once the time budget is spent.

    python benchmarks/parity_probe.py [--json PATH] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import require_gpu, torch_cuda  # noqa: E402

# The lessons' rule (cudalab.lessons.versus.PARITY): a ratio from here up is parity.
PARITY = 0.97
# Seconds the whole script may take; a probe that would start past it is skipped.
BUDGET_S = 140.0
MIB = 1 << 20
KIB = 1 << 10
# The profiler's event categories the summaries keep (kineto's chrome-trace names).
TRACE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")
# Kernel names longer than this are cut (templated names run to kilobytes).
NAME_CHARS = 110
# A kernel whose name holds one of these is a GEMM (cuBLAS / cuBLASLt / CUTLASS).
GEMM_MARKS = ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "sm80_")


# ---- pure functions: ratios, verdicts, trace summaries, the table (CPU-tested) ---------------


def speedup(ours: float | None, theirs: float | None) -> float | None:
    """PyTorch's time over cudalab's (above 1: cudalab faster); None when either is missing."""
    if ours is None or theirs is None or ours <= 0 or theirs <= 0:
        return None
    return theirs / ours


def verdict(ratio: float | None) -> str:
    """'parity' from PARITY up, 'slower' below it, '-' without a ratio."""
    if ratio is None:
        return "-"
    return "parity" if ratio >= PARITY else "slower"


def row(pair: str, variant: str, ours: float | None = None, theirs: float | None = None,
        unit: str = "us", note: str = "") -> dict[str, Any]:
    """One result: cudalab's and PyTorch's number for a variant (either may be None)."""
    r = speedup(ours, theirs) if unit in ("us", "ms", "s") else None
    return {"pair": pair, "variant": variant, "cudalab": ours, "torch": theirs, "unit": unit,
            "speedup": r, "verdict": verdict(r), "note": note}


def median_min(times: Sequence[float], scale: float = 1e6) -> tuple[float, float]:
    """(median, min) of `times` seconds, in `scale` units (microseconds by default)."""
    if not times:
        raise ValueError("median_min: no times")
    return statistics.median(times) * scale, min(times) * scale


def short_name(name: str, limit: int = NAME_CHARS) -> str:
    """A kernel or API name cut to `limit` characters (with '...' when cut)."""
    return name if len(name) <= limit else name[:limit - 3] + "..."


def is_gemm(name: str) -> bool:
    """Whether a kernel name is a GEMM library kernel."""
    low = name.lower()
    return any(mark in low for mark in GEMM_MARKS)


def summarize_trace(events: Iterable[Mapping[str, Any]], calls: int) -> dict[str, Any]:
    """The profiler's events of `calls` calls, grouped: per (category, name) the count and
    microseconds per call; kernels keep their grid, block and registers; plus the kernels'
    busy time against their span (first start to last end), which shows gaps between them.

    `events` are chrome-trace events (dicts with cat, name, ph, ts, dur, args).
    """
    if calls < 1:
        raise ValueError(f"summarize_trace: calls must be >= 1, got {calls}")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    k_start, k_end, k_busy = math.inf, -math.inf, 0.0
    for ev in events:
        cat = ev.get("cat")
        if cat not in TRACE_CATEGORIES or ev.get("ph") != "X":
            continue
        name, dur, ts = str(ev.get("name", "?")), float(ev.get("dur", 0.0)), float(ev.get("ts", 0))
        g = groups.setdefault((cat, name), {"category": cat, "name": short_name(name),
                                            "count": 0, "total_us": 0.0, "max_us": 0.0})
        g["count"] += 1
        g["total_us"] += dur
        g["max_us"] = max(g["max_us"], dur)
        if cat == "kernel":
            args = ev.get("args") or {}
            for key in ("grid", "block", "registers per thread", "shared memory"):
                if key in args:
                    g[key] = args[key]
            k_start, k_end, k_busy = min(k_start, ts), max(k_end, ts + dur), k_busy + dur
    items = sorted(groups.values(), key=lambda g: -g["total_us"])
    for g in items:
        g["per_call"] = g["count"] / calls
        g["us_per_call"] = g["total_us"] / calls
        g["mean_us"] = g["total_us"] / g["count"]
    kernels = [g for g in items if g["category"] == "kernel"]
    span = k_end - k_start if kernels else 0.0
    return {
        "calls": calls,
        "groups": items,
        "kernel_busy_us_per_call": k_busy / calls,
        "kernel_span_us_per_call": span / calls,
        "gemm_us_per_call": sum(g["total_us"] for g in kernels if is_gemm(g["name"])) / calls,
        "other_kernel_us_per_call": sum(g["total_us"] for g in kernels
                                        if not is_gemm(g["name"])) / calls,
        # Waits (cudaDeviceSynchronize, cudaStreamSynchronize...) measure the GPU, not the
        # call's host work: left out of the API total.
        "api_us_per_call": sum(g["total_us"] for g in items
                               if g["category"] in ("cuda_runtime", "cuda_driver")
                               and "Synchronize" not in g["name"]) / calls,
    }


def huge_page_kib(smaps: str, address: int) -> int | None:
    """AnonHugePages (KiB) of the mapping of /proc/<pid>/smaps text that holds `address`;
    None when no mapping does."""
    inside = False
    for line in smaps.splitlines():
        head = line.split(None, 1)[0] if line.strip() else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a text table: pair, variant, cudalab, torch, unit, speedup, verdict, note."""
    keys = ("pair", "variant", "cudalab", "torch", "unit", "speedup", "verdict", "note")
    cells = [[_cell(r.get(k)) for k in keys] for r in rows]
    widths = [max([len(k)] + [len(c[i]) for c in cells]) for i, k in enumerate(keys)]
    widths[-1] = len(keys[-1])  # the note runs on
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    return "\n".join(lines)


def run_probes(probes: Mapping[str, Callable[[], Mapping[str, Any]]], budget_s: float,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, dict[str, Any]]:
    """Run each probe in order; one that raises is recorded (status 'error', the traceback)
    and the next runs; probes starting after `budget_s` seconds are 'skipped'.

    A probe returns {"rows": [...], "details": {...}}; the result per probe adds status,
    seconds and error.
    """
    start = clock()
    out: dict[str, dict[str, Any]] = {}
    for name, probe in probes.items():
        t0 = clock()
        if t0 - start > budget_s:
            out[name] = {"status": "skipped", "seconds": 0.0, "rows": [], "details": {},
                         "error": f"time budget of {budget_s:g} s spent"}
            continue
        try:
            got = probe()
            out[name] = {"status": "ok", "rows": list(got.get("rows", [])),
                         "details": dict(got.get("details", {})), "error": None}
        except Exception as exc:  # noqa: BLE001 - one probe's failure must not stop the rest
            out[name] = {"status": "error", "rows": [], "details": {},
                         "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        out[name]["seconds"] = clock() - t0
    return out


# ---- GPU helpers ------------------------------------------------------------------------------


class Probe:
    """What every probe shares: cudalab, torch, a timer, the rows and details it collects,
    and `part`, which runs one piece and records its error without stopping the probe."""

    def __init__(self, cudalab: Any, torch: Any, pair: str) -> None:
        from cudalab.bench import Timer, get_preset

        self.cl, self.torch, self.pair = cudalab, torch, pair
        self.timer = Timer("default")
        self.quick = Timer("quick")
        self.warmup = get_preset("default").warmup
        self.rows: list[dict[str, Any]] = []
        self.details: dict[str, Any] = {}

    def add(self, variant: str, ours: float | None = None, theirs: float | None = None,
            unit: str = "us", note: str = "") -> None:
        self.rows.append(row(self.pair, variant, ours, theirs, unit, note))

    def part(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the probe's other parts still run
            self.details.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            self.rows.append(row(self.pair, name, note=f"ERROR {type(exc).__name__}: {exc}"))

    def sync(self) -> None:
        self.cl.synchronize()
        if self.torch is not None:
            self.torch.cuda.synchronize()

    def gpu_us(self, fn: Callable[[], Any], quick: bool = False, hold: bool = True) -> float:
        """Median GPU microseconds per call (cudalab.bench: CUDA events, warm-up, repeats)."""
        timer = self.quick if quick else self.timer
        if not hold:
            timer = timer.replace(hold=False)
        return timer.measure(fn, ceiling=None).median * 1e6

    def host_clock(self, cases: Mapping[str, Callable[[], Any]], repeats: int
                   ) -> dict[str, list[float]]:
        from cudalab.bench import host_clock

        return host_clock(cases, repeats, self.warmup)

    def trace(self, fn: Callable[[], Any], calls: int) -> dict[str, Any] | None:
        """The profiler's summary of `calls` calls of fn (None without torch)."""
        if self.torch is None:
            return None
        from torch.profiler import ProfilerActivity, profile

        fn()
        self.sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            self.sync()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        return summarize_trace(events, calls)

    def result(self) -> dict[str, Any]:
        return {"rows": self.rows, "details": self.details}


def _idle_host_times(cl: Any, cases: Mapping[str, Callable[[], Any]], repeats: int
                     ) -> dict[str, list[float]]:
    """Host seconds around each call alone, the GPU idle before it (the timing lesson's
    'host clock, no synchronize'), the cases interleaved round by round."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm: plans, handles, pools
        fn()
    for _ in range(repeats):
        for name, fn in cases.items():
            cl.synchronize()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    cl.synchronize()
    return times


def _busy_host_times(cl: Any, cases: Mapping[str, Callable[[], Any]], repeats: int
                     ) -> dict[str, list[float]]:
    """Host seconds of a call issued while the same call still runs on the GPU."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            cl.synchronize()
            fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    cl.synchronize()
    return times


# ---- the probes -------------------------------------------------------------------------------


def probe_timing(cl: Any, torch: Any) -> dict[str, Any]:
    from cudalab.nn import torch_twin as TT
    from cudalab.nn.precision import get_precision

    p = Probe(cl, torch, "timing: host clock around an unsynchronized matmul")
    n = 8192
    a = cl.random.normal((n, n), dtype="float32", seed=15)
    b = cl.random.normal((n, n), dtype="float32", seed=16)
    out = cl.empty((n, n))
    small_a, small_b = cl.random.normal((1024, 1024), seed=3), cl.random.normal((1024, 1024), seed=4)
    # matmul's precision names from the one table (cudalab.nn.precision).
    fp32 = get_precision("fp32").matmul_precision or "highest"
    tf32 = get_precision("tf32").matmul_precision
    ours = {
        "8192 fp32": lambda: cl.matmul(a, b, precision=fp32),
        "8192 fp32 out=": lambda: cl.matmul(a, b, out=out, precision=fp32),
        "8192 tf32": lambda: cl.matmul(a, b, precision=tf32),
        "1024 fp32": lambda: cl.matmul(small_a, small_b, precision=fp32),
        "alloc 256 MiB + free": lambda: cl.empty((n, n)),
    }
    theirs: dict[str, Callable[[], Any]] = {}
    if torch is not None:
        ta, tb, tout = torch.from_dlpack(a), torch.from_dlpack(b), torch.empty((n, n), device="cuda")
        tsa, tsb = torch.from_dlpack(small_a), torch.from_dlpack(small_b)
        on = TT.Tf32(torch, True)

        def with_tf32(f: Callable[[], Any]) -> Callable[[], Any]:
            def call() -> Any:
                with on:
                    return f()
            return call

        theirs = {
            "8192 fp32": lambda: torch.matmul(ta, tb),
            "8192 fp32 out=": lambda: torch.mm(ta, tb, out=tout),
            "8192 tf32": with_tf32(lambda: torch.matmul(ta, tb)),
            "1024 fp32": lambda: torch.matmul(tsa, tsb),
            "alloc 256 MiB + free": lambda: torch.empty((n, n), device="cuda"),
        }
    cases = {f"cudalab {k}": f for k, f in ours.items()}
    cases.update({f"torch {k}": f for k, f in theirs.items()})

    def idle() -> None:
        t = _idle_host_times(cl, cases, 15)
        p.details["idle_host_us"] = {k: median_min(v) for k, v in t.items()}
        for k in ours:
            o = median_min(t[f"cudalab {k}"])
            th = median_min(t[f"torch {k}"]) if f"torch {k}" in t else (None, None)
            p.add(f"GPU idle, {k}: median", o[0], th[0])
            p.add(f"GPU idle, {k}: min", o[1], th[1])

    def busy() -> None:
        keys = ("8192 fp32", "8192 fp32 out=")
        t = _busy_host_times(cl, {f"{impl} {k}": c[k] for impl, c in (("cudalab", ours),
                                                                        ("torch", theirs))
                                  for k in keys if k in c}, 10)
        for k in keys:
            th = t.get(f"torch {k}")
            p.add(f"GPU busy with the previous call, {k}: median", median_min(t[f"cudalab {k}"])[0],
                  median_min(th)[0] if th else None)

    def backend() -> None:
        from cudalab import _core  # the private backend switch, for benchmarks

        before = _core._set_matmul_backend("float32", "cublas")
        try:
            t = _idle_host_times(cl, {"cublas": ours["8192 fp32"]}, 15)
        finally:
            _core._set_matmul_backend("float32", before)
        p.add("GPU idle, 8192 fp32 through cublasGemmStridedBatchedEx (not Lt): median",
              median_min(t["cublas"])[0], p.details.get("idle_host_us", {}).get(
                  "torch 8192 fp32", (None,))[0], note="torch column: torch.matmul as above")

    def traces() -> None:
        def synced(f: Callable[[], Any]) -> Callable[[], None]:
            def call() -> None:
                cl.synchronize()
                f()
            return call

        for k in ("8192 fp32", "8192 fp32 out="):
            p.details[f"trace cudalab {k}"] = p.trace(synced(ours[k]), 5)
            if k in theirs:
                p.details[f"trace torch {k}"] = p.trace(synced(theirs[k]), 5)
            o, th = p.details[f"trace cudalab {k}"], p.details.get(f"trace torch {k}")
            if o is not None and th is not None:
                p.add(f"profiler, {k}: CUDA API us per call", o["api_us_per_call"],
                      th["api_us_per_call"], note="see details: calls by name")

    # torch's float32 matmuls in true fp32, as the lesson runs them.
    with TT.Tf32(torch, False) if torch is not None else contextlib.nullcontext():
        for name, fn in (("host time, GPU idle", idle), ("host time, GPU busy", busy),
                         ("cuBLAS backend", backend), ("profiler", traces)):
            p.part(name, fn)
    return p.result()


def _smaps() -> str:
    try:
        return Path("/proc/self/smaps").read_text()
    except OSError:
        return ""


def probe_pinned(cl: Any, torch: Any) -> dict[str, Any]:
    import numpy as np

    p = Probe(cl, torch, "pinned: host <-> device copies")
    count = 256 * MIB // 4
    mine, yours = np.empty(count, np.float32), np.empty(count, np.float32)
    mine[:] = 1.25
    yours[:] = 1.25
    dev = cl.full(count, 2.5, dtype="float32")
    target = f"cuda:{cl.current_device()}"

    def pageable() -> None:
        def up_cl(h: Any) -> Callable[[], None]:
            return lambda: (cl.asarray(h), cl.synchronize())

        def down_cl(h: Any) -> Callable[[], None]:
            return lambda: (dev.get(out=h), cl.synchronize())

        cases = {"h2d cudalab own": up_cl(mine), "d2h cudalab own": down_cl(mine),
                 "h2d cudalab other": up_cl(yours), "d2h cudalab other": down_cl(yours)}
        if torch is not None:
            tdev = torch.from_dlpack(dev)
            tm, ty = torch.from_numpy(mine), torch.from_numpy(yours)
            cases.update({
                "h2d torch own": lambda: (ty.to(target), torch.cuda.synchronize()),
                "d2h torch own": lambda: (ty.copy_(tdev), torch.cuda.synchronize()),
                "h2d torch other": lambda: (tm.to(target), torch.cuda.synchronize()),
                "d2h torch other": lambda: (tm.copy_(tdev), torch.cuda.synchronize()),
            })
        t = p.host_clock(cases, 5)
        ms = {k: median_min(v, 1e3)[0] for k, v in t.items()}
        p.details["pageable_256MiB_ms"] = ms
        for d in ("h2d", "d2h"):
            p.add(f"pageable 256 MiB {d}, each from its own buffer (the lesson's way)",
                  ms[f"{d} cudalab own"], ms.get(f"{d} torch own"), unit="ms")
            p.add(f"pageable 256 MiB {d}, buffers swapped", ms[f"{d} cudalab other"],
                  ms.get(f"{d} torch other"), unit="ms",
                  note="cudalab from torch's buffer, torch from cudalab's")
            p.add(f"pageable 256 MiB {d}, both from cudalab's buffer", ms[f"{d} cudalab own"],
                  ms.get(f"{d} torch other"), unit="ms")

    def chunks() -> None:
        for chunk_mib in (4, 32, 256):
            step = chunk_mib * MIB // 4

            def up(step: int = step) -> None:
                for i in range(0, count, step):
                    cl.asarray(mine[i:i + step])
                cl.synchronize()

            [t] = p.host_clock({"up": up}, 3).values()
            p.add(f"pageable 256 MiB h2d in {chunk_mib} MiB calls (cudalab)",
                  median_min(t, 1e3)[0], unit="ms")

    def host_side() -> None:
        sink = np.empty(count, np.float32)
        pinned = cl.pinned_empty(count, dtype=np.float32)
        for name, src in (("cudalab's buffer", mine), ("torch's buffer", yours)):
            for dst_name, dst in (("pageable", sink), ("pinned", pinned)):
                [t] = p.host_clock({"c": lambda: np.copyto(dst, src)}, 3).values()
                gbps = 256 * MIB / statistics.median(t) / 1e9
                p.add(f"host memcpy 256 MiB from {name} into {dst_name} memory", gbps,
                      unit="GB/s", note="the CPU side of a pageable copy")
        smaps = _smaps()
        for name, buf in (("cudalab's buffer", mine), ("torch's buffer", yours)):
            kib = huge_page_kib(smaps, buf.ctypes.data)
            p.add(f"transparent huge pages backing {name}", None if kib is None else kib / 1024,
                  unit="MiB")

    def small_pinned() -> None:
        from cudalab.bench import TransferCase

        for size_kib in (64, 1024):
            n = size_kib * KIB // 4
            prepared = TransferCase("h2d", "pinned", size_kib * KIB).prepare()
            o = prepared.measure(p.timer, label="ours").median * 1e6
            th = None
            if torch is not None:
                th = prepared.torch_twin(torch).measure(p.timer, label="torch").median * 1e6
            p.add(f"pinned {size_kib} KiB h2d, GPU time (the lesson's way)", o, th)
            cl_pinned = cl.pinned_empty(n, dtype=np.float32)
            cl_pinned[:] = 1.25
            if torch is None:
                continue
            t_pinned = torch.empty(n, dtype=torch.float32, pin_memory=True).fill_(1.25)
            t_dst = torch.empty(n, dtype=torch.float32, device="cuda")
            swapped_ours = p.gpu_us(lambda: cl.asarray(t_pinned.numpy(), non_blocking=True))
            swapped_theirs = p.gpu_us(lambda: torch.from_numpy(cl_pinned).to(
                target, non_blocking=True))
            p.add(f"pinned {size_kib} KiB h2d, buffers swapped", swapped_ours, swapped_theirs)
            into = p.gpu_us(lambda: t_dst.copy_(t_pinned, non_blocking=True))
            p.add(f"pinned {size_kib} KiB h2d, torch into a preallocated tensor", o, into,
                  note="no device allocation on torch's side")
            ours_t = p.trace(lambda: cl.asarray(cl_pinned, non_blocking=True), 50)
            theirs_t = p.trace(lambda: t_pinned.to(target, non_blocking=True), 50)
            p.details[f"trace pinned {size_kib} KiB cudalab"] = ours_t
            p.details[f"trace pinned {size_kib} KiB torch"] = theirs_t

            def memcpy_us(s: Mapping[str, Any]) -> float | None:
                got = [g for g in s["groups"] if g["category"] == "gpu_memcpy"]
                return sum(g["total_us"] for g in got) / max(sum(g["count"] for g in got), 1)

            if ours_t and theirs_t:
                p.add(f"pinned {size_kib} KiB h2d, the copy's own GPU duration (profiler)",
                      memcpy_us(ours_t), memcpy_us(theirs_t))
                p.add(f"pinned {size_kib} KiB h2d, CUDA API us per call (profiler)",
                      ours_t["api_us_per_call"], theirs_t["api_us_per_call"])
            arrays = [cl.asarray(cl_pinned, non_blocking=True) for _ in range(4)]
            tensors = [t_pinned.to(target, non_blocking=True) for _ in range(4)]
            p.details[f"device pointer % 4096, {size_kib} KiB"] = {
                "cudalab": [int(x.data_ptr()) % 4096 for x in arrays],
                "torch": [int(x.data_ptr()) % 4096 for x in tensors]}

    for name, fn in (("pageable 256 MiB", pageable), ("pageable chunks", chunks),
                     ("host memcpy", host_side), ("small pinned", small_pinned)):
        p.part(name, fn)
    return p.result()


def probe_inplace(cl: Any, torch: Any) -> dict[str, Any]:
    import numpy as np

    p = Probe(cl, torch, "inplace: element-wise chain")
    steps, scale, shift = 4, 0.5, 0.25  # the lesson's chain: y = relu(y * 0.5 + 0.25)

    def chains(x: Any, lib: Any, is_torch: bool) -> dict[str, Callable[[], Any]]:
        def out_of_place() -> Any:
            y = x
            for _ in range(steps):
                y = lib.relu(y * scale + shift)
            return y

        def in_place() -> Any:
            y = lib.mul(x, scale)
            for i in range(steps):
                if i:
                    lib.mul(y, scale, out=y)
                if is_torch:
                    y.add_(shift).relu_()
                else:
                    cl.add(y, shift, out=y)
                    cl.relu(y, out=y)
            return y
        return {"out-of-place": out_of_place, "in-place": in_place}

    rng = np.random.default_rng(5)
    host = {s: rng.standard_normal((s, s), dtype=np.float32) for s in (2048, 8192)}
    xs = {s: cl.asarray(h) for s, h in host.items()}
    txs = {s: torch.as_tensor(h, device="cuda") for s, h in host.items()} if torch else {}

    def chain_part() -> None:
        ours = chains(xs[2048], cl, False)
        theirs = chains(txs[2048], torch, True) if torch else {}
        for k in ours:
            p.add(f"2048^2 chain {k} (12 kernels), GPU time", p.gpu_us(ours[k]),
                  p.gpu_us(theirs[k]) if k in theirs else None)
        if torch is not None:
            for k in ours:
                o, th = p.trace(ours[k], 10), p.trace(theirs[k], 10)
                p.details[f"trace cudalab {k}"], p.details[f"trace torch {k}"] = o, th
                p.add(f"2048^2 chain {k}: kernels' busy time per chain (profiler)",
                      o["kernel_busy_us_per_call"], th["kernel_busy_us_per_call"])
                p.add(f"2048^2 chain {k}: first kernel start to last end (profiler)",
                      o["kernel_span_us_per_call"], th["kernel_span_us_per_call"],
                      note="span - busy = gaps between kernels")

    def ops_part() -> None:
        for s in (2048, 8192):
            x, y = xs[s], cl.empty((s, s))
            moved = 2.0 * x.nbytes
            # The chain's three ops as the out-of-place chain calls them (each allocates
            # its result; the allocation is host-side), and one in place.
            ops = {"mul by scalar": lambda: x * scale,
                   "add scalar": lambda: x + shift,
                   "relu": lambda: cl.relu(x),
                   "mul by scalar in place": lambda: cl.mul(y, 1.0, out=y)}
            tops: dict[str, Callable[[], Any]] = {}
            if torch is not None:
                tx, ty = txs[s], torch.empty((s, s), device="cuda")
                tops = {"mul by scalar": lambda: tx * scale,
                        "add scalar": lambda: tx + shift,
                        "relu": lambda: torch.relu(tx),
                        "mul by scalar in place": lambda: ty.mul_(1.0)}
            for k, f in ops.items():
                o = p.gpu_us(f, quick=True)
                th = p.gpu_us(tops[k], quick=True) if k in tops else None
                p.add(f"{s}^2 {k}: GPU time ({moved / MIB:.0f} MiB moved)", o, th,
                      note=f"GB/s cudalab {moved / o / 1e3:.0f}" +
                           (f", torch {moved / th / 1e3:.0f}" if th else ""))
            if torch is not None and s == 2048:
                for k in ("mul by scalar",):
                    p.details[f"trace op cudalab {s} {k}"] = p.trace(ops[k], 20)
                    p.details[f"trace op torch {s} {k}"] = p.trace(tops[k], 20)

    p.part("chains", chain_part)
    p.part("single ops", ops_part)
    return p.result()


def probe_streams(cl: Any, torch: Any) -> dict[str, Any]:
    p = Probe(cl, torch, "streams: one-block softmax")

    def one_kernel() -> None:
        for log2 in (18, 20, 22):
            cols = 1 << log2
            x, y = cl.random.normal((1, cols), seed=log2), cl.empty((1, cols))
            o = p.gpu_us(lambda: cl.softmax(x, out=y), quick=True)
            th = None
            if torch is not None:
                tx = torch.from_dlpack(x)
                th = p.gpu_us(lambda: torch.softmax(tx, dim=-1), quick=True)
            p.add(f"one row of 2^{log2} float32, one kernel: GPU time", o, th)
            if torch is not None and log2 == 20:
                p.details["trace cudalab 2^20"] = p.trace(lambda: cl.softmax(x, out=y), 5)
                p.details["trace torch 2^20"] = p.trace(lambda: torch.softmax(tx, dim=-1), 5)

    def lesson_way() -> None:
        cols, kernels = 1 << 20, 32
        pairs = [(cl.random.normal((1, cols), seed=i), cl.empty((1, cols)))
                 for i in range(kernels)]
        cl.synchronize()
        cases: dict[str, Callable[[], None]] = {}
        for count in (1, 2):
            streams = [cl.Stream() for _ in range(count)]

            def run(streams: list = streams) -> None:
                for i, (x, y) in enumerate(pairs):
                    with streams[i % len(streams)]:
                        cl.softmax(x, out=y)
                for s in streams:
                    s.synchronize()
            cases[f"cudalab {count}"] = run
            if torch is not None:
                tstreams = [torch.cuda.Stream() for _ in range(count)]
                inputs = [torch.from_dlpack(x) for x, _ in pairs]

                def trun(tstreams: list = tstreams, inputs: list = inputs) -> None:
                    for i, x in enumerate(inputs):
                        with torch.cuda.stream(tstreams[i % len(tstreams)]):
                            torch.softmax(x, dim=-1)
                    for s in tstreams:
                        s.synchronize()
                cases[f"torch {count}"] = trun
        t = p.host_clock(cases, 10)
        for count in (1, 2):
            th = t.get(f"torch {count}")
            p.add(f"one-block softmax x32 on {count} stream(s), host clock (the lesson's way)",
                  median_min(t[f"cudalab {count}"], 1e3)[0],
                  median_min(th, 1e3)[0] if th else None, unit="ms")

    p.part("one kernel", one_kernel)
    p.part("lesson way", lesson_way)
    return p.result()


def probe_checkpointing(cl: Any, torch: Any) -> dict[str, Any]:
    from cudalab import nn
    from cudalab.lessons import training as T
    from cudalab.nn import torch_twin as TT

    p = Probe(cl, torch, "checkpointing: MLP step, tf32, batch 8192")
    sizes = (1024,) + (2048,) * 12 + (16,)
    [(x, labels)] = T.teacher_batches(sizes, 8192, 1, 0)
    model = nn.MLP(sizes, "gelu", seed=0)
    opt = nn.AdamW(model.parameters(), lr=1e-4)
    ours = lambda: nn.train_step(model, opt, x, labels, "tf32")  # noqa: E731
    o = p.gpu_us(ours)
    th = None
    if torch is not None:
        tx, tl = TT.torch_batches(torch, [(x, labels)])[0]
        twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=0))
        topt = TT.torch_adamw(torch, twin.parameters(), 1e-4)
        ce = torch.nn.functional.cross_entropy

        def theirs() -> None:
            topt.zero_grad(set_to_none=True)
            ce(twin(tx), tl).backward()
            topt.step()

        with TT.Tf32(torch, True):
            theirs()  # torch makes AdamW's state during the first step
            th = p.gpu_us(theirs)
    p.add("plain step, GPU time (the lesson's way)", o, th)
    if torch is not None:
        o_t = p.trace(ours, 3)
        with TT.Tf32(torch, True):
            th_t = p.trace(theirs, 3)
        p.details["trace cudalab step"], p.details["trace torch step"] = o_t, th_t
        p.add("GEMM kernels per step (profiler)", o_t["gemm_us_per_call"], th_t["gemm_us_per_call"])
        p.add("other kernels per step (profiler)", o_t["other_kernel_us_per_call"],
              th_t["other_kernel_us_per_call"])
        p.add("gaps between kernels per step (profiler: span - busy)",
              o_t["kernel_span_us_per_call"] - o_t["kernel_busy_us_per_call"],
              th_t["kernel_span_us_per_call"] - th_t["kernel_busy_us_per_call"])
        for impl, s in (("cudalab", o_t), ("torch", th_t)):
            for g in [g for g in s["groups"] if g["category"] == "kernel"][:8]:
                p.add(f"{impl} kernel {g['name']}", g["us_per_call"] if impl == "cudalab" else None,
                      g["us_per_call"] if impl == "torch" else None,
                      note=f"{g['per_call']:.0f} per step, grid {g.get('grid')}, "
                           f"block {g.get('block')}")
    return p.result()


PROBES = {
    "timing": probe_timing,
    "pinned": probe_pinned,
    "inplace": probe_inplace,
    "streams": probe_streams,
    "checkpointing": probe_checkpointing,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="parity_probe.json", help="where the results go")
    parser.add_argument("--only", nargs="*", choices=sorted(PROBES), help="run only these")
    args = parser.parse_args(argv)
    try:
        require_gpu("parity_probe")
    except Exception as exc:  # noqa: BLE001 - NoDeviceError: say so and stop
        print(exc, file=sys.stderr)
        return 1
    import cudalab
    from cudalab.bench import machine_info

    torch = torch_cuda()
    chosen = {k: v for k, v in PROBES.items() if not args.only or k in args.only}
    started = time.perf_counter()
    results = run_probes({k: (lambda f=f: f(cudalab, torch)) for k, f in chosen.items()},
                         BUDGET_S)
    rows = [r for v in results.values() for r in v["rows"]]
    doc = {"kind": "parity_probe", "seconds": time.perf_counter() - started,
           "machine": machine_info(), "torch": None if torch is None else torch.__version__,
           "probes": results}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(format_table(rows))
    for name, v in results.items():
        print(f"{name}: {v['status']} in {v['seconds']:.1f} s"
              + (f"\n{v['error']}" if v["error"] else ""))
    print(f"wrote {args.json} ({doc['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
