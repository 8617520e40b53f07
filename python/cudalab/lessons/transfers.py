"""Lesson 3 `transfers`: every trip to the host costs a latency plus PCIe bandwidth.

Two views of the same cost. First, a reduction: summing on the device and
fetching one scalar, against fetching the whole array and summing it in
NumPy. Then host <-> device copies over sizes from KiB to hundreds of MiB,
fitted as ``time = latency + bytes / bandwidth``: the latency is what a small
copy costs whatever its size, the bandwidth what a large one approaches.
Copies here use pageable host memory (ordinary NumPy arrays), staged by the
driver; pinned memory, which the ``h2d``/``d2h`` ceilings use, is lesson 11's.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

import cudalab

from ..bench import ceiling, host_clock, host_measurement
from .analysis import (MIB, claim_at_least, claim_within, fit_latency_bandwidth,
                        format_bytes_short)
from . import _params as P
from .registry import LessonRun, lesson

DIRECTIONS = ("h2d", "d2h")
# The tutorial: "each transfer incurs ~10 us latency", and for a 1000 x 1000
# float32 sum its T4 figures: 1.64 ms through the host vs 0.02 ms on the GPU (75.2x).
TUTORIAL_LATENCY_US = 10.0
TUTORIAL_REDUCTION_SPEEDUP = 75.2
# A fit whose largest relative residual exceeds this does not describe the
# sweep well (the finding says so).
FIT_RESIDUAL_OK = 0.25
# Relative error of a float32 device sum against NumPy's float64 sum, scaled
# by sum(|x|): float32 accumulation over ~1e6 terms in a tree.
SUM_TOLERANCE = 1e-5
REDUCTION_TIMER = "host clock: call returning the sum on the host"
# The tutorial's own timing: `seed_calls` calls in a loop, one synchronize at
# the end, and the device sum's scalar never fetched (its "good" case queues
# kernels; its "bad" case fetches the array, sums in NumPy and uploads the
# scalar). Rounds of that loop per case.
SEED_ROUNDS = 5
SEED_TIMER = "host clock around a loop of calls and one synchronize (the tutorial's method)"
SEED_DEVICE = "sum on device, no fetch (tutorial's loop)"
SEED_HOST = "get the array, sum in NumPy, upload the sum (tutorial's loop)"


def _reduction(r: LessonRun, n: int, torch: Any) -> list[dict[str, Any]]:
    x = cudalab.random.normal((n, n), seed=3)
    host = x.get()
    want = float(np.sum(host, dtype=np.float64))
    got = float(cudalab.sum(x).get())
    r.check(f"device sum of {n}x{n} float32 vs NumPy float64 (error / sum |x|)",
            abs(got - want) / float(np.sum(np.abs(host), dtype=np.float64)), SUM_TOLERANCE)
    cases = {"sum on device, get the scalar": lambda: float(cudalab.sum(x).get()),
             "get the array, sum in NumPy": lambda: float(x.get().sum())}
    if torch is not None:
        tx = torch.from_dlpack(x)
        cases["torch sum on device, .item()"] = lambda: tx.sum().item()
        cases["torch .cpu().numpy(), sum in NumPy"] = lambda: float(tx.cpu().numpy().sum())
    times = host_clock(cases, int(r.params["repeats"]), warmup=r.timer.settings.warmup)
    rows = []
    for name, t in times.items():
        m = r.add(host_measurement(t, calls=1, label=name, timer=REDUCTION_TIMER,
                                   host_time=False, metadata={"n": n}))
        impl = "torch" if name.startswith("torch") else "cudalab"
        rows.append({"part": "reduction", "impl": impl,
                     "case": name, "nbytes": 4 * n * n, "ms": m.median * 1e3, "gbps": None,
                     "pct_ceiling": None, "fit_ms": None})
    return rows


def _seed_loop(fn: Any, calls: int, sync: Any) -> Any:
    """A case of `calls` back-to-back calls of fn and one synchronize."""
    def run() -> None:
        for _ in range(calls):
            fn()
        sync()
    return run


def _seed_reduction(r: LessonRun, n: int, torch: Any) -> list[dict[str, Any]]:
    """The reduction timed the tutorial's way: a loop of calls, one synchronize, no fetch."""
    calls = int(r.params["seed_calls"])
    x = cudalab.random.normal((n, n), seed=3)
    cases = {SEED_DEVICE: _seed_loop(lambda: cudalab.sum(x), calls, cudalab.synchronize),
             SEED_HOST: _seed_loop(lambda: cudalab.asarray(np.asarray(x.get().sum())), calls,
                                   cudalab.synchronize)}
    if torch is not None:
        tx = torch.from_dlpack(x)
        sync = torch.cuda.synchronize
        cases["torch " + SEED_DEVICE] = _seed_loop(lambda: tx.sum(), calls, sync)
        cases["torch " + SEED_HOST] = _seed_loop(
            lambda: torch.tensor(tx.cpu().numpy().sum(), device=tx.device), calls, sync)
    times = host_clock(cases, SEED_ROUNDS, warmup=r.timer.settings.warmup)
    rows = []
    for name, t in times.items():
        m = r.add(host_measurement(t, calls=calls, label=name, timer=SEED_TIMER,
                                   host_time=False, metadata={"n": n, "calls": calls}))
        rows.append({"part": "reduction", "impl": "torch" if name.startswith("torch") else
                     "cudalab", "case": name, "nbytes": 4 * n * n, "ms": m.median * 1e3,
                     "gbps": None, "pct_ceiling": None, "fit_ms": None})
    return rows


def timing_method_text(loop_ratio: float, round_trip_ratio: float, calls: int) -> str:
    """What the two timings of the same reduction say (the tutorial's loop vs a round trip)."""
    if loop_ratio <= round_trip_ratio:
        return (f"the tutorial's loop ({calls} calls, one synchronize, no fetch) gives "
                f"{loop_ratio:.1f}x, no more than the {round_trip_ratio:.1f}x of a round trip "
                f"that fetches the scalar: the timing method does not inflate the ratio here")
    return (f"the tutorial's loop ({calls} calls, one synchronize, no fetch) gives "
            f"{loop_ratio:.1f}x against {round_trip_ratio:.1f}x for a round trip that fetches "
            f"the scalar: the loop times the device sum as queued launches (the host never "
            f"waits for a result, so launching overlaps the GPU's work and one synchronize "
            f"is shared by {calls} calls), so its ratio is "
            f"{loop_ratio / round_trip_ratio:.1f}x the one a program that uses the sum sees")


def _copies(r: LessonRun, nbytes: int, rng: np.random.Generator) -> None:
    host = rng.standard_normal(nbytes // 4, dtype=np.float32)
    dev = cudalab.asarray(host)
    out = np.empty_like(host)
    # Pageable copies synchronize: nothing to hold behind a spin kernel.
    timer = r.timer.replace(hold=False)
    size = format_bytes_short(nbytes)
    for direction, fn in (("h2d", lambda: cudalab.asarray(host)),
                          ("d2h", lambda: dev.get(out=out))):
        label = f"{direction} {size}"
        r.add(timer.measure(fn, bytes=float(nbytes), ceiling=direction, label=label,
                            metadata={"nbytes": nbytes, "memory": "pageable"}), label)
    r.check(f"{size}: host -> device -> host (pageable) is bit-exact",
            float(np.max(np.abs(out - host))), 0.0)


def _sweep(r: LessonRun, sizes: list[int]) -> tuple[list[dict[str, Any]], dict[str, tuple]]:
    rng = np.random.default_rng(4)
    for nbytes in sizes:
        _copies(r, nbytes, rng)
    rows, fits = [], {}
    for direction in DIRECTIONS:
        ms = [r.measurements[f"{direction} {format_bytes_short(s)}"] for s in sizes]
        latency, bandwidth, residual = fit_latency_bandwidth(sizes, [m.median for m in ms])
        fits[direction] = (latency, bandwidth, residual)
        for s, m in zip(sizes, ms):
            rows.append({"part": "sweep", "impl": "cudalab", "case": f"{direction} pageable",
                         "nbytes": s, "ms": m.median * 1e3, "gbps": m.gbps,
                         "pct_ceiling": m.percent_of_ceiling,
                         "fit_ms": (latency + s / bandwidth) * 1e3})
    return rows, fits


def _findings(r: LessonRun, n: int, fits: dict[str, tuple], sizes: list[int]) -> None:
    device = r.measurements["sum on device, get the scalar"]
    host = r.measurements["get the array, sum in NumPy"]
    ratio = host.median / device.median
    r.finding(f"Summing {n}x{n} float32 on the device and fetching the scalar takes "
              f"{device.median * 1e3:.3f} ms; fetching all {4 * n * n / MIB:.1f} MiB and summing "
              f"in NumPy {host.median * 1e3:.3f} ms ({ratio:.1f}x)", value=ratio, unit="x",
              labels=(device.label, host.label))
    for direction, (latency, bandwidth, residual) in fits.items():
        pinned = ceiling(direction).value
        labels = tuple(f"{direction} {format_bytes_short(s)}" for s in sizes)
        quality = ("the fit holds within "
                   f"{100 * residual:.0f}%" if residual <= FIT_RESIDUAL_OK else
                   f"the fit misses a point by {100 * residual:.0f}%: the copy is not one "
                   f"latency + one bandwidth over this range")
        r.finding(f"Pageable {direction}: {latency * 1e6:.1f} us latency + "
                  f"{bandwidth / 1e9:.1f} GB/s ({100 * bandwidth / pinned:.0f}% of the pinned "
                  f"ceiling, {pinned / 1e9:.1f} GB/s); below "
                  f"{format_bytes_short(max(latency * bandwidth, 0.0))} a copy is mostly "
                  f"latency; {quality}", value=bandwidth / 1e9, unit="GB/s", labels=labels)
    latency_us = fits["h2d"][0] * 1e6
    claim_within(r, "each transfer costs ~10 us of latency", TUTORIAL_LATENCY_US, latency_us,
                 "us", f"fitted pageable h2d latency {latency_us:.1f} us")
    claim_at_least(r, "keeping a reduction on the GPU is ~75x faster than going through the host",
                   TUTORIAL_REDUCTION_SPEEDUP, ratio, "x", f"{ratio:.1f}x for {n}x{n} float32")
    if SEED_DEVICE in r.measurements and SEED_HOST in r.measurements:
        _seed_finding(r, device, host)


def _seed_finding(r: LessonRun, device: Any, host: Any) -> None:
    """The tutorial's timing beside the round trip's, on the same reduction."""
    ratio = host.median / device.median
    loop_device, loop_host = r.measurements[SEED_DEVICE], r.measurements[SEED_HOST]
    loop_ratio = loop_host.median / loop_device.median
    calls = int(r.params["seed_calls"])
    r.finding(f"Timed the tutorial's way the device sum costs {loop_device.median * 1e6:.1f} us "
              f"per call and the host path {loop_host.median * 1e3:.3f} ms; "
              + timing_method_text(loop_ratio, ratio, calls), value=loop_ratio, unit="x",
              labels=(loop_device.label, loop_host.label, device.label, host.label))


# PyTorch's spelling of the reduction cases -> cudalab's (for versus_torch).
TORCH_TWINS = {"torch sum on device, .item()": "sum on device, get the scalar",
               "torch .cpu().numpy(), sum in NumPy": "get the array, sum in NumPy",
               "torch " + SEED_DEVICE: SEED_DEVICE, "torch " + SEED_HOST: SEED_HOST}


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("transfers", p, "size", "repeats", "seed_calls")
    P.int_lists("transfers", p, "sweep_kib")


@lesson(3, "transfers", title="Host round trips: latency plus PCIe bandwidth",
        seed="Colab notebook lesson 3 (CPU-GPU transfer optimization)",
        params={"size": 1000, "repeats": 30, "seed_calls": 100,
                "sweep_kib": (4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)},
        quick_params={"repeats": 10, "sweep_kib": (4, 64, 1024, 16384, 65536)},
        torch_twin=TORCH_TWINS.get,
        check=check_params)
def run(r: LessonRun) -> None:
    n = int(r.params["size"])
    sizes = sorted(int(k) * 1024 for k in r.params["sweep_kib"])
    rows = _reduction(r, n, r.torch())
    rows += _seed_reduction(r, n, r.torch())
    sweep_rows, fits = _sweep(r, sizes)
    for row in rows + sweep_rows:
        r.row(**row)
    _findings(r, n, fits, sizes)


@run.plot
def plot(result, ax) -> None:
    for direction, marker in zip(DIRECTIONS, ("o", "s")):
        rows = [x for x in result.rows if x["case"] == f"{direction} pageable"]
        mib = [x["nbytes"] / MIB for x in rows]
        ax.plot(mib, [x["ms"] for x in rows], marker, label=f"{direction} measured")
        ax.plot(mib, [x["fit_ms"] for x in rows], "-", label=f"{direction} latency + size / bw")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("copy size (MiB)")
    ax.set_ylabel("time per copy (ms)")
    ax.legend(fontsize=8)
