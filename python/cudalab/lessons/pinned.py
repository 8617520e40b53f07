"""Lesson 11 `pinned`: pinned vs pageable host memory, and copies that overlap host work.

The GPU's copy engines read and write host memory directly (DMA) only when
it is page-locked. From ordinary (pageable) NumPy memory the driver first
copies through a pinned bounce buffer of its own, so the transfer is
slower and the call waits for it. From pinned memory
(``cudalab.pinned_empty``) the copy runs at the link's speed and, with
``non_blocking=True``, returns at once: the host can do other work (here a
NumPy computation) while the bytes move. The lesson measures both over
sizes against the measured pinned ceilings ``h2d`` / ``d2h``, then how much
host work a non_blocking copy hides, and checks every copy bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

import cudalab
from cudalab.bench import TransferCase, ceiling, host_clock, host_measurement

from ._overlap import overlap
from . import _params as P
from .registry import LessonRun, lesson

KIB = 1024
MIB = 1 << 20

# Pinned at least this many times pageable at the largest size: the claim
# "pinned memory transfers faster" holds.
PINNED_FASTER = 1.2
# A non_blocking copy that hides at least this fraction of the shorter of
# (copy, host work) has overlapped them.
HIDDEN_ENOUGH = 0.5
# A copy below this percentage of the pinned ceiling is dominated by its
# fixed cost (latency), not by bandwidth.
LATENCY_BOUND_PCT = 50.0
# Host links at least this many times slower than device memory: the
# notebook's "PCIe is a bottleneck" point holds (T4: ~16 vs ~1500 GB/s).
LINK_GAP_HOLDS = 10.0
TUTORIAL_LINK_GAP = 1500.0 / 16.0
# The notebook's "each transfer pays ~10 us of latency": holds while the
# smallest pinned copy here costs at most twice that.
TUTORIAL_LATENCY_US = 10.0
LATENCY_HOLDS_US = 2 * TUTORIAL_LATENCY_US
# Timed rounds of the overlap cases (host clock).
OVERLAP_REPEATS = 10

ROW_KEYS = ("part", "case", "direction", "memory", "impl", "size_kib", "ms", "gbps",
            "pct_of_ceiling", "hidden_ms", "hidden_fraction")


def _row(r: LessonRun, **fields: Any) -> None:
    """One row with every key of the lesson (None where it does not apply)."""
    unknown = set(fields) - set(ROW_KEYS)
    if unknown:
        raise ValueError(f"pinned: unknown row keys {sorted(unknown)}")
    r.row(**{k: fields.get(k) for k in ROW_KEYS})


def _host_buffer(n: int, pinned: bool) -> np.ndarray:
    return cudalab.pinned_empty(n, dtype=np.float32) if pinned else np.empty(n, np.float32)


def _copies_mismatch(rng: np.random.Generator, n: int) -> int:
    """Elements that differ (bit for bit) after host -> device -> host, pinned and pageable."""
    values = rng.standard_normal(n, dtype=np.float32)
    wrong = 0
    for pinned in (True, False):
        src, dst = _host_buffer(n, pinned), _host_buffer(n, pinned)
        src[:] = values
        dst[:] = np.nan  # an element the copy misses stays NaN and differs
        d = cudalab.asarray(src, non_blocking=pinned)
        d.get(out=dst, non_blocking=pinned)
        cudalab.synchronize()
        wrong += int(np.count_nonzero(dst.view(np.uint32) != values.view(np.uint32)))
    return wrong


def _sweep(r: LessonRun, torch: Any) -> dict[tuple[str, str, int], Any]:
    """Time every (size, direction, memory); rows; returns the measurements by key."""
    out = {}
    for size_kib in r.params["sizes_kib"]:
        for direction in ("h2d", "d2h"):
            for memory in ("pinned", "pageable"):
                prepared = TransferCase(direction, memory, size_kib * KIB).prepare()
                label = f"{direction} {memory} {size_kib} KiB"
                m = r.add(prepared.measure(r.timer, label=label, ceiling=direction), label)
                out[(direction, memory, size_kib)] = m
                _row(r, part="sweep", case=label, direction=direction, memory=memory,
                     impl="cudalab", size_kib=size_kib, ms=m.median * 1e3, gbps=m.gbps,
                     pct_of_ceiling=m.percent_of_ceiling)
                if torch is not None:
                    t = r.add(prepared.torch_twin(torch).measure(
                        r.timer, label=f"torch {label}", description="torch",
                        ceiling=direction), f"torch {label}")
                    _row(r, part="sweep", case=f"torch {label}", direction=direction,
                         memory=memory, impl="torch", size_kib=size_kib, ms=t.median * 1e3,
                         gbps=t.gbps, pct_of_ceiling=t.percent_of_ceiling)
    return out


def _overlap_cases(n: int, rng: np.random.Generator, torch: Any) -> dict[str, Callable[[], Any]]:
    """The host-clock cases: copy alone, work alone, and the two issued together."""
    pinned, pageable = _host_buffer(n, True), _host_buffer(n, False)
    pinned[:] = pageable[:] = rng.standard_normal(n, dtype=np.float32)
    src = rng.standard_normal(n, dtype=np.float32)
    dst = np.empty_like(src)

    def work_on(count: int) -> Callable[[], None]:
        def work() -> None:  # the host's own computation: NumPy, no GPU
            np.multiply(src[:count], 1.5, out=dst[:count])
            np.sqrt(np.abs(dst[:count]), out=dst[:count])
        return work

    def copy(host: np.ndarray, non_blocking: bool) -> None:
        cudalab.asarray(host, non_blocking=non_blocking)
        cudalab.synchronize()

    # Size the host work to take about as long as the pinned copy, where overlap pays most.
    cudalab.synchronize()
    [copy_s] = host_clock({"copy": lambda: copy(pinned, False)}, 3, warmup=0.0).values()
    [full_s] = host_clock({"work": work_on(n)}, 3, warmup=0.0).values()
    count = int(min(n, max(4096, n * float(np.median(copy_s)) / float(np.median(full_s)))))
    work = work_on(count)

    def together(host: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            cudalab.asarray(host, non_blocking=True)  # returns at once only when pinned
            work()
            cudalab.synchronize()
        return run

    cases = {
        "work alone": work,
        "pinned copy alone": lambda: copy(pinned, False),
        "pinned non_blocking copy + work": together(pinned),
        "pageable copy alone": lambda: copy(pageable, False),
        "pageable non_blocking copy + work": together(pageable),
    }
    if torch is not None:
        cases.update(_torch_overlap_cases(torch, pinned, pageable, work))
    return cases


def _torch_overlap_cases(torch: Any, pinned: np.ndarray, pageable: np.ndarray,
                         work: Callable[[], None]) -> dict[str, Callable[[], None]]:
    """The same overlap cases through PyTorch (its own pinned memory, so it knows it is pinned)."""
    target = f"cuda:{cudalab.current_device()}"
    t_pinned = torch.empty(pinned.shape[0], dtype=torch.float32, pin_memory=True)
    t_pinned.copy_(torch.from_numpy(pinned))
    t_pageable = torch.from_numpy(pageable)

    def t_copy(host: Any) -> Callable[[], None]:
        def run() -> None:
            host.to(target)
            torch.cuda.synchronize()
        return run

    def t_together(host: Any) -> Callable[[], None]:
        def run() -> None:
            host.to(target, non_blocking=True)
            work()
            torch.cuda.synchronize()
        return run

    return {
        "torch pinned copy alone": t_copy(t_pinned),
        "torch pinned non_blocking copy + work": t_together(t_pinned),
        "torch pageable copy alone": t_copy(t_pageable),
        "torch pageable non_blocking copy + work": t_together(t_pageable),
    }


def _overlap_part(r: LessonRun, rng: np.random.Generator, torch: Any) -> dict[str, Any]:
    """Host time of copy and work alone and overlapped; rows; the Overlap per variant."""
    n = r.params["overlap_mib"] * MIB // 4
    cases = _overlap_cases(n, rng, torch)
    times = host_clock(cases, OVERLAP_REPEATS, warmup=r.timer.settings.warmup)
    m = {name: r.add(host_measurement(
            t, calls=1, label=f"overlap: {name}", host_time=False,
            bytes=None if name == "work alone" else 4.0 * n,
            timer="host clock around the call + synchronize"), f"overlap: {name}")
         for name, t in times.items()}
    work_s = m["work alone"].median
    _row(r, part="overlap", case="work alone", impl="numpy", ms=work_s * 1e3)
    results = {}
    for prefix, impl in (("", "cudalab"), ("torch ", "torch")):
        for memory in ("pinned", "pageable"):
            alone = m.get(f"{prefix}{memory} copy alone")
            both = m.get(f"{prefix}{memory} non_blocking copy + work")
            if alone is None or both is None:
                continue
            o = overlap(alone.median, work_s, both.median)
            results[f"{prefix}{memory}"] = o
            _row(r, part="overlap", case=f"{memory} copy alone", direction="h2d",
                 memory=memory, impl=impl, size_kib=4 * n // KIB, ms=alone.median * 1e3,
                 gbps=alone.gbps)
            _row(r, part="overlap", case=f"{memory} non_blocking copy + work", direction="h2d",
                 memory=memory, impl=impl, size_kib=4 * n // KIB, ms=both.median * 1e3,
                 hidden_ms=o.hidden * 1e3, hidden_fraction=o.fraction)
    return results


def _findings(r: LessonRun, sweep: dict, hidden: dict) -> None:
    sizes = r.params["sizes_kib"]
    big, small = max(sizes), min(sizes)
    ratios = {}
    for direction in ("h2d", "d2h"):
        pin, page = sweep[(direction, "pinned", big)], sweep[(direction, "pageable", big)]
        ratios[direction] = ratio = page.median / pin.median
        r.finding(f"{direction} of {big} KiB: pinned {pin.gbps:.1f} GB/s, pageable "
                  f"{page.gbps:.1f} GB/s ({ratio:.2f}x from pinning)", value=ratio, unit="x",
                  labels=(pin.label, page.label))
    h2d_ratio = ratios["h2d"]
    tiny = sweep[("h2d", "pinned", small)]
    pct = tiny.percent_of_ceiling or 0.0
    verdict = ("its fixed cost dominates, not bandwidth" if pct < LATENCY_BOUND_PCT
               else "already near the link's bandwidth")
    r.finding(f"A pinned h2d copy of {small} KiB takes {tiny.median * 1e6:.1f} us, "
              f"{pct:.0f}% of the h2d ceiling: {verdict}", value=pct, unit="%",
              labels=(tiny.label,))
    tiny_us = tiny.median * 1e6
    r.claim("Each transfer pays about 10 us of latency, so small copies are latency-bound",
            tutorial=TUTORIAL_LATENCY_US, measured=tiny_us, unit="us",
            held=tiny_us <= LATENCY_HOLDS_US,
            why=f"a {small} KiB pinned copy takes {tiny_us:.1f} us here, {pct:.0f}% of the "
                f"h2d ceiling (holds up to {LATENCY_HOLDS_US:g} us)")
    r.claim("Pinned (page-locked) memory makes host-to-device copies faster", tutorial=None,
            measured=h2d_ratio, unit="x", held=h2d_ratio >= PINNED_FASTER,
            why=f"{h2d_ratio:.2f}x at {big} KiB (holds from {PINNED_FASTER}x)")
    pin, page = hidden["pinned"], hidden["pageable"]
    labels = ("overlap: work alone", "overlap: pinned copy alone",
              "overlap: pinned non_blocking copy + work")
    r.finding(f"A non_blocking copy from pinned memory hid {pin.hidden * 1e3:.2f} ms of "
              f"{pin.serialized * 1e3:.2f} ms copy + host work ({pin.fraction:.0%} of the "
              f"shorter); from pageable memory it hid {page.hidden * 1e3:.2f} ms "
              f"({page.fraction:.0%}): "
              + ("non_blocking=True from pageable memory still waits for the copy"
                 if page.fraction < HIDDEN_ENOUGH else "pageable copies overlapped here too"),
              value=pin.fraction,
              unit="fraction", labels=labels)
    r.claim("A non_blocking copy returns at once, so host work runs while it transfers",
            tutorial=None, measured=pin.fraction, unit="fraction",
            held=pin.fraction >= HIDDEN_ENOUGH,
            why=f"{pin.fraction:.0%} of the shorter task hidden (holds from "
                f"{HIDDEN_ENOUGH:.0%}); pageable: {page.fraction:.0%}")


def _link_claim(r: LessonRun) -> None:
    copy, h2d = ceiling("copy"), ceiling("h2d")
    gap = copy.value / h2d.value
    r.claim("Host-device copies are far slower than device memory (T4: ~16 vs ~1500 GB/s)",
            tutorial=TUTORIAL_LINK_GAP, measured=gap, unit="x", held=gap >= LINK_GAP_HOLDS,
            why=f"device copy {copy.value / 1e9:.0f} GB/s vs pinned h2d "
                f"{h2d.value / 1e9:.1f} GB/s here")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.int_lists("pinned", p, "sizes_kib")
    P.ints("pinned", p, "overlap_mib")
    P.seed("pinned", p)


@lesson(11, "pinned", title="Pinned vs pageable host memory, and non_blocking copies",
        seed="Guide 'PyTorch CUDA optimization': Pinned Memory, Asynchronous GPU Operations "
             "(non_blocking transfers); Colab notebook lessons 1 and 3 (PCIe vs GPU memory "
             "bandwidth, per-transfer latency)",
        params={"sizes_kib": (64, 1024, 16384, 262144), "overlap_mib": 256, "seed": 0},
        quick_params={"sizes_kib": (64, 16384), "overlap_mib": 32},
        check=check_params)
def run(r: LessonRun) -> None:
    rng = np.random.default_rng(r.params["seed"])
    torch = r.torch()
    for size_kib in r.params["sizes_kib"]:
        wrong = _copies_mismatch(rng, size_kib * KIB // 4)
        r.check(f"{size_kib} KiB host -> device -> host, pinned and pageable: elements that "
                f"differ bit for bit", wrong, 0)
    sweep = _sweep(r, torch)
    hidden = _overlap_part(r, rng, torch)
    _findings(r, sweep, hidden)
    _link_claim(r)


@run.plot
def plot(result: Any, ax: Any) -> None:
    sweep = [row for row in result.rows if row["part"] == "sweep"]
    for impl, style in (("cudalab", "-"), ("torch", ":")):
        for direction in ("h2d", "d2h"):
            for memory, marker in (("pinned", "o"), ("pageable", "s")):
                pts = sorted((row["size_kib"], row["gbps"]) for row in sweep
                             if row["impl"] == impl and row["direction"] == direction
                             and row["memory"] == memory)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker,
                            label=f"{impl} {direction} {memory}")
    for name in ("h2d", "d2h"):
        m = next((m for m in result.measurements.values() if m.ceiling_name == name), None)
        if m is not None and m.ceiling_value:
            ax.axhline(m.ceiling_value / 1e9, color="gray", linestyle="--" if name == "h2d"
                       else "-.", linewidth=0.8, label=f"{name} ceiling (pinned)")
    ax.set_xscale("log")
    ax.set_xlabel("transfer size (KiB)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.legend(fontsize=7)
