"""Lesson 0 `context`: what a CUDA context and a cuBLAS handle cost in device memory.

Before the first byte of your data reaches the GPU, the process pays for its
CUDA context (the driver's per-process state on the device), for the kernel
modules its first op loads, and for the cuBLAS handle and workspace its first
matmul creates. None of it comes from the memory pool, so
``memory_allocated()`` shows none of it: only the driver sees it.

The lesson starts a fresh Python process for each reading and watches it from
this one through the driver (``mem_get_info``): free memory before the child
starts, then after each of the child's stages (context, first op, first
matmul), while the child waits. The child also reports its own pool counters
and how long each stage took.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping

import cudalab

from ..bench import host_measurement
from .analysis import MIB
from . import _params as P
from .registry import LessonRun, lesson

STAGES = ("context", "first op", "first matmul")
IMPLS = ("cudalab", "torch")
# The tutorial: "CUDA kernels consume 1-2 GB regardless of model size".
CLAIM_LOW_MIB, CLAIM_HIGH_MIB = 1024.0, 2048.0
# A pool counter below this after the first op still "shows none of" the
# overhead: the op's own tiny array is all it counts.
POOL_SEES_NOTHING_MIB = 1.0
# Free memory within this of the pre-child reading after the child's exit:
# the driver gave the whole context back (other processes may move it a little).
RETURNED_MIB = 16.0
# Seconds the parent waits for a child stage (a cold driver can take seconds).
CHILD_TIMEOUT_S = 120.0
# The driver's module loading modes (CUDA_MODULE_LOADING): EAGER loads every
# kernel of every module when the context is made (the only mode before CUDA
# 11.7); LAZY loads a kernel on its first launch (opt-in from 11.7, the
# default since 12.2). The tutorial's figure predates or ignores LAZY.
LOADING = ("EAGER", "LAZY")
# EAGER holding at least this much more than LAZY: module loading matters.
LOADING_MATTERS_MIB = 64.0

# The child process: each stage, then a JSON line, then wait for the parent's
# newline so the parent can read the driver's free memory at that point.
CHILD = r"""
import json, sys, time
impl, dev = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
if impl == "torch":
    import torch
    def context():
        torch.cuda.set_device(dev)
        return torch.cuda.mem_get_info(dev)
    def first_op():
        y = torch.full((1024,), 1.5, device=f"cuda:{dev}") + 1.0
        torch.cuda.synchronize(dev)
        return y
    def first_matmul():
        a = torch.full((64, 64), 0.5, device=f"cuda:{dev}")
        c = torch.mm(a, a)
        torch.cuda.synchronize(dev)
        return c
    info = lambda: torch.cuda.mem_get_info(dev)
    pool = lambda: (torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev))
    value = lambda x: float(x.reshape(-1)[0].item())
else:
    import cudalab as cl
    def context():
        cl.set_device(dev)
        return cl.mem_get_info(dev)
    def first_op():
        y = cl.add(cl.full(1024, 1.5, dtype="float32"), 1.0)
        cl.synchronize(dev)
        return y
    def first_matmul():
        a = cl.full((64, 64), 0.5, dtype="float32")
        c = cl.matmul(a, a)
        cl.synchronize(dev)
        return c
    info = lambda: cl.mem_get_info(dev)
    pool = lambda: (cl.memory_allocated(dev), cl.memory_reserved(dev))
    value = lambda x: float(x.get().reshape(-1)[0])
import_s = time.perf_counter() - t0
keep = []
for stage, fn in (("context", context), ("first op", first_op), ("first matmul", first_matmul)):
    t = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t
    free, total = info()
    allocated, reserved = pool()
    keep.append(out)
    record = {"stage": stage, "seconds": seconds, "free": free, "total": total,
              "allocated": allocated, "reserved": reserved, "import_s": import_s,
              "value": None if stage == "context" else value(out)}
    print(json.dumps(record), flush=True)
    sys.stdin.readline()
"""

# What the child's first op and first matmul must compute: 1.5 + 1 and
# 64 products of 0.5 * 0.5.
EXPECTED = {"first op": 2.5, "first matmul": 16.0}


def _child_env() -> dict[str, str]:
    """This environment, with cudalab's own location first on the path."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(cudalab.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _read_stage(proc: subprocess.Popen, impl: str, errors: Any) -> dict[str, Any]:
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        proc.wait()
        errors.seek(0)
        text = errors.read()[-2000:]
        raise RuntimeError(f"lesson 'context': the {impl} child process ended early:\n{text}")
    return json.loads(line)


def run_child(impl: str, device: int, loading: str | None = None) -> dict[str, Any]:
    """run_child(impl, device, loading=None) -> dict

    One fresh process of `impl` ("cudalab" or "torch"): its stage records,
    each with ``outside_free`` (free memory this process saw while the child
    waited there), the free memory before it started and after it ended, and
    its wall time from spawn to exit. `loading` ("EAGER" or "LAZY") sets the
    child's CUDA_MODULE_LOADING; None leaves this process's environment.
    """
    env = _child_env()
    if loading is not None:
        env["CUDA_MODULE_LOADING"] = loading
    # The child's stderr goes to a file: a chatty child cannot fill a pipe and stall.
    with tempfile.TemporaryFile("w+") as errors:
        baseline = cudalab.mem_get_info(device)[0]
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, impl, str(device)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                text=True, env=env)
        stages = _stages(proc, impl, device, errors)
        wall = time.perf_counter() - start
    return {"impl": impl, "loading": loading, "baseline_free": baseline, "stages": stages,
            "wall_s": wall, "after_free": cudalab.mem_get_info(device)[0]}


def _stages(proc: subprocess.Popen, impl: str, device: int, errors: Any) -> list[dict[str, Any]]:
    """Read the child's stages, taking the driver's free memory at each; wait for its exit."""
    stages = []
    try:
        for _ in STAGES:
            record = _read_stage(proc, impl, errors)
            record["outside_free"] = cudalab.mem_get_info(device)[0]
            stages.append(record)
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.wait(timeout=CHILD_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    return stages


def stage_rows(run: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """stage_rows(run, index) -> list of dict

    The table rows of one child run: per stage, the device memory the driver
    shows in use by the child (from outside), what that stage added, and the
    child's own pool counters, all in MiB.
    """
    rows, previous = [], 0.0
    for s in run["stages"]:
        driver = (run["baseline_free"] - s["outside_free"]) / MIB
        rows.append({"impl": run["impl"], "run": index, "stage": s["stage"],
                     "driver_mib": driver, "added_mib": driver - previous,
                     "allocated_mib": s["allocated"] / MIB, "reserved_mib": s["reserved"] / MIB,
                     "ms": s["seconds"] * 1e3, "import_ms": s["import_s"] * 1e3})
        previous = driver
    return rows


def consistency_errors(run: dict[str, Any]) -> list[str]:
    """consistency_errors(run) -> list of str

    What is inconsistent in one child run's readings: free memory outside
    [0, total], a total that changes, a driver-seen use outside [0, total].
    """
    errors = []
    totals = {s["total"] for s in run["stages"]}
    if len(totals) != 1:
        errors.append(f"total memory changed between stages: {sorted(totals)}")
    for s in run["stages"]:
        total = s["total"]
        for key in ("free", "outside_free"):
            if not 0 <= s[key] <= total:
                errors.append(f"{s['stage']}: {key} {s[key]} outside [0, {total}]")
        used = run["baseline_free"] - s["outside_free"]
        if not 0 <= used <= total:
            errors.append(f"{s['stage']}: driver-seen use {used} outside [0, {total}]")
        if s["reserved"] < s["allocated"]:
            errors.append(f"{s['stage']}: reserved {s['reserved']} < allocated {s['allocated']}")
    return errors


def claim_verdict(total_mib: float) -> tuple[bool, str]:
    """claim_verdict(total_mib) -> (held, why) for "1-2 GB before any data"."""
    if CLAIM_LOW_MIB <= total_mib <= CLAIM_HIGH_MIB:
        return True, f"{total_mib:.0f} MiB lies in 1-2 GiB"
    side = "below" if total_mib < CLAIM_LOW_MIB else "above"
    return False, f"{total_mib:.0f} MiB is {side} 1-2 GiB on this GPU and driver"


def loading_verdict(eager_mib: float, lazy_mib: float) -> tuple[bool, str]:
    """loading_verdict(eager_mib, lazy_mib) -> (explains, text)

    Whether eager module loading explains the tutorial's 1-2 GB, from the
    device memory a process holds after its first matmul under
    CUDA_MODULE_LOADING=EAGER and =LAZY.
    """
    extra = eager_mib - lazy_mib
    both = f"EAGER {eager_mib:.0f} MiB, LAZY {lazy_mib:.0f} MiB"
    if extra < LOADING_MATTERS_MIB:
        return False, (f"module loading does not explain the tutorial's 1-2 GB: {both} "
                       f"({extra:+.0f} MiB)")
    if eager_mib >= CLAIM_LOW_MIB and lazy_mib < CLAIM_LOW_MIB:
        return True, (f"eager module loading explains the tutorial's 1-2 GB: {both}; the "
                      f"{extra:.0f} MiB difference is kernels loaded before any is used")
    return False, (f"eager module loading adds {extra:.0f} MiB ({both}) but "
                   + ("LAZY is already at 1 GiB or more" if lazy_mib >= CLAIM_LOW_MIB else
                      "EAGER stays below 1 GiB") + ": it explains only part of the gap")


def _median_stage(rows: list[dict[str, Any]], impl: str, stage: str, key: str) -> float:
    return statistics.median(r[key] for r in rows if r["impl"] == impl and r["stage"] == stage)


def _check(r: LessonRun, runs: list[dict[str, Any]]) -> None:
    errors = [e for x in runs for e in consistency_errors(x)]
    r.check("free <= total, 0 <= driver-seen use <= total, reserved >= allocated at every stage"
            + (f" ({errors[0]})" if errors else ""), len(errors), 0)
    first = [x["stages"][0]["allocated"] for x in runs]
    r.check("memory_allocated() is 0 bytes before any array (each impl, each run)", max(first), 0)
    for stage, want in EXPECTED.items():
        got = [s["value"] for x in runs for s in x["stages"] if s["stage"] == stage]
        r.check(f"the child's {stage} computes {want}", max(abs(g - want) for g in got) / want, 0.0)


def _measure(r: LessonRun, runs: list[dict[str, Any]], impl: str) -> None:
    mine = [x for x in runs if x["impl"] == impl]
    for i, stage in enumerate(STAGES):
        times = [x["stages"][i]["seconds"] for x in mine]
        r.add(host_measurement(times, calls=1, label=f"{stage} ({impl})", host_time=False,
                               timer=f"host clock in a fresh process, one call per process "
                                     f"({stage}, synchronized)"))
    r.add(host_measurement([x["wall_s"] for x in mine], calls=1, label=f"process ({impl})",
                           host_time=False, timer="host clock from spawn to exit"))


def _findings(r: LessonRun, rows: list[dict[str, Any]], impls: list[str]) -> None:
    ours = {s: _median_stage(rows, "cudalab", s, "added_mib") for s in STAGES}
    total = _median_stage(rows, "cudalab", "first matmul", "driver_mib")
    alloc = _median_stage(rows, "cudalab", "first op", "allocated_mib")
    ctx_ms = r.measurements["context (cudalab)"].median * 1e3
    import_ms = _median_stage(rows, "cudalab", "context", "import_ms")
    r.finding(f"Before any data, the driver shows {total:.0f} MiB in use by the process: "
              f"{ours['context']:.0f} MiB for the CUDA context, {ours['first op']:.0f} MiB more "
              f"after the first op (its kernels, the pool's first block) and "
              f"{ours['first matmul']:.0f} MiB after the first matmul (cuBLAS handle and "
              f"workspace); memory_allocated() after the first op reports {alloc * MIB:.0f} bytes "
              f"(its own array)",
              value=total, unit="MiB", labels=("context (cudalab)", "first matmul (cudalab)"))
    r.finding(f"Creating the context took {ctx_ms:.0f} ms, the first op "
              f"{r.measurements['first op (cudalab)'].median * 1e3:.1f} ms and the first matmul "
              f"{r.measurements['first matmul (cudalab)'].median * 1e3:.1f} ms (importing "
              f"cudalab: {import_ms:.0f} ms): one-time costs that a benchmark's warm-up must "
              f"absorb", value=ctx_ms, unit="ms",
              labels=("context (cudalab)", "first op (cudalab)", "first matmul (cudalab)"))
    if "torch" in impls:
        theirs = _median_stage(rows, "torch", "first matmul", "driver_mib")
        r.finding(f"PyTorch's process holds {theirs:.0f} MiB at the same point "
                  f"({theirs / total:.2f}x cudalab's) while torch.cuda.memory_allocated() shows "
                  f"{_median_stage(rows, 'torch', 'first matmul', 'allocated_mib') * MIB:.0f} "
                  f"bytes", value=theirs, unit="MiB",
                  labels=("first matmul (torch)", "first matmul (cudalab)"))
    held, why = claim_verdict(total)
    r.claim("CUDA's own overhead takes 1-2 GB of device memory before any data",
            tutorial=(CLAIM_LOW_MIB + CLAIM_HIGH_MIB) / 2, measured=total, unit="MiB",
            held=held, why=why)
    r.claim("memory_allocated() shows none of that overhead (T4: 0.0 MB)", tutorial=0.0,
            measured=alloc, unit="MiB", held=alloc < POOL_SEES_NOTHING_MIB,
            why=f"the pool counts {alloc * MIB:.0f} bytes (the op's own array) against "
                f"{total:.0f} MiB the driver sees")


def _loading(r: LessonRun, runs: list[dict[str, Any]], impls: list[str]) -> None:
    """Rows, measurements and findings of the EAGER / LAZY children (one of each per impl)."""
    totals: dict[str, dict[str, float]] = {}
    for impl in impls:
        mine = {x["loading"]: x for x in runs if x["impl"] == impl}
        if set(mine) != set(LOADING):
            continue
        totals[impl] = {}
        for mode, one in mine.items():
            rows = stage_rows(one, 0)
            for row in rows:
                r.row(**row, loading=mode)
            totals[impl][mode] = rows[-1]["driver_mib"]
            r.add(host_measurement([one["stages"][0]["seconds"]], calls=1,
                                   label=f"context ({impl}, {mode})", host_time=False,
                                   timer=f"host clock in a fresh process with "
                                         f"CUDA_MODULE_LOADING={mode}"))
        eager, lazy = (stage_rows(mine[m], 0) for m in LOADING)
        r.finding(f"{impl} with CUDA_MODULE_LOADING=EAGER: {eager[0]['driver_mib']:.0f} MiB "
                  f"after the context, {eager[-1]['driver_mib']:.0f} MiB after the first "
                  f"matmul (context made in {eager[0]['ms']:.0f} ms); with LAZY: "
                  f"{lazy[0]['driver_mib']:.0f} MiB, {lazy[-1]['driver_mib']:.0f} MiB "
                  f"({lazy[0]['ms']:.0f} ms)",
                  value=eager[-1]["driver_mib"] - lazy[-1]["driver_mib"], unit="MiB", labels=(f"context ({impl}, EAGER)", f"context ({impl}, LAZY)"))
    if not totals:
        return
    # The tutorial's number is PyTorch's: judge with PyTorch's children where they ran.
    impl = "torch" if "torch" in totals else "cudalab"
    explains, text = loading_verdict(totals[impl]["EAGER"], totals[impl]["LAZY"])
    r.finding(f"{impl}: {text}", value=totals[impl]["EAGER"], unit="MiB",
              labels=(f"context ({impl}, EAGER)", f"context ({impl}, LAZY)"))
    r.claim("the 1-2 GB overhead is constant and unavoidable, whatever the module loading mode",
            tutorial=(CLAIM_LOW_MIB + CLAIM_HIGH_MIB) / 2, measured=totals[impl]["LAZY"],
            unit="MiB", held=not explains and totals[impl]["LAZY"] >= CLAIM_LOW_MIB,
            why=f"{impl}: {text}")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("context", p, "runs")
    P.bools("context", p, "torch", "loading", "loading_torch")


@lesson(0, "context", title="The memory and time a CUDA context costs before any data",
        seed="Colab notebook lesson 0 (GPU memory baseline: CUDA overhead)",
        params={"runs": 3, "torch": True, "loading": True, "loading_torch": True},
        quick_params={"runs": 1, "loading": False, "loading_torch": False},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    device = cudalab.current_device()
    impls = ["cudalab"] + (["torch"] if p["torch"] and r.torch() is not None else [])
    runs = [run_child(impl, device) for _ in range(int(p["runs"])) for impl in impls]
    rows = []
    for impl in impls:
        for i, one in enumerate(x for x in runs if x["impl"] == impl):
            rows += stage_rows(one, i)
    for row in rows:
        r.row(**row, loading=None)
    _check(r, runs)
    for impl in impls:
        _measure(r, runs, impl)
    _findings(r, rows, impls)
    back = statistics.median((x["baseline_free"] - x["after_free"]) / MIB for x in runs)
    text = ("the driver took it all back with the process" if abs(back) <= RETURNED_MIB
            else f"{back:.0f} MiB was not yet back when the child's exit was seen")
    r.finding(f"After the child exits, free memory is within {back:.0f} MiB of where it was "
              f"before it started: {text}", value=back, unit="MiB", labels=("process (cudalab)",))
    if p["loading"]:
        # One child per mode and impl; torch's EAGER child loads all of its
        # kernels (seconds), so quick runs leave torch out.
        loading_impls = [i for i in impls if i == "cudalab" or p["loading_torch"]]
        loading_runs = [run_child(i, device, mode) for i in loading_impls for mode in LOADING]
        errors = [e for x in loading_runs for e in consistency_errors(x)]
        r.check("EAGER / LAZY children: free <= total, 0 <= driver-seen use <= total"
                + (f" ({errors[0]})" if errors else ""), len(errors), 0)
        got = [(s["value"], EXPECTED[s["stage"]]) for x in loading_runs for s in x["stages"]
               if s["stage"] in EXPECTED]
        r.check("EAGER / LAZY children compute the same first op and first matmul",
                max(abs(g - w) / w for g, w in got), 0.0)
        _loading(r, loading_runs, loading_impls)


@run.plot
def plot(result, ax) -> None:
    rows = [x for x in result.rows if x["run"] == 0 and x.get("loading") is None]
    impls = [i for i in IMPLS if any(x["impl"] == i for x in rows)]
    bottoms = [0.0] * len(impls)
    for stage in STAGES:
        added = [next((x["added_mib"] for x in rows if x["impl"] == i and x["stage"] == stage), 0.0)
                 for i in impls]
        ax.bar(impls, added, bottom=bottoms, label=f"{stage} (driver)")
        bottoms = [b + a for b, a in zip(bottoms, added)]
    pool = [next(x["allocated_mib"] for x in rows if x["impl"] == i and x["stage"] == STAGES[-1])
            for i in impls]
    ax.scatter(impls, pool, color="black", marker="x", zorder=3, label="memory_allocated()")
    ax.set_ylabel("device memory in use (MiB)")
    ax.legend(fontsize=8)
