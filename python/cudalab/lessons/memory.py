"""Lesson 10 `memory`: what a batch of activations costs, and what happens at the limit.

The workload is the feed-forward block of a transformer layer in float32,
``y = gelu(x @ w1) @ w2`` with ``x`` of ``batch * seq_len`` rows. For each
batch size the lesson reads the pool's counters (allocated, reserved, peak)
and compares the peak with a model of which arrays are alive at once; it
follows one step allocation by allocation (a memory timeline), shows what
``empty_cache()`` gives back, and then puts a per-process memory limit a
little above current use (so nothing fills the real GPU) and finds the
largest batch that fits by bisection, recovering from each
``OutOfMemoryError``. Memory must return to its baseline after every step
and after every OOM; the limit is always restored.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import cudalab
from . import _params as P
from .registry import LessonRun, lesson

MIB = 1 << 20
# Bytes per element (float32) and the feed-forward expansion.
ITEMSIZE = 4
FFN_MULT = 4
# Measured peak above the baseline vs the model of live arrays: relative bound
# (the pool may round allocations up; nothing else should be allocated).
PEAK_MODEL_TOLERANCE = 0.05
# Timeline samples vs the bytes of live arrays, relative to the step's peak.
TIMELINE_TOLERANCE = 0.02
# Largest batch found under the limit vs the model's prediction (relative).
BISECTION_TOLERANCE = 0.05
# empty_cache() "releases the cache" when it hands back at least this share of
# what the pool held beyond the live arrays (chunks shared with live arrays stay).
RELEASED_SHARE = 0.9


# ---- pure logic -------------------------------------------------------------------------


def ffn_bytes(rows: int, hidden: int) -> dict[str, int]:
    """Bytes of x, h (= x w1), g (= gelu(h)) and y (= g w2) for `rows` rows."""
    small, wide = rows * hidden * ITEMSIZE, rows * hidden * FFN_MULT * ITEMSIZE
    return {"x": small, "h": wide, "g": wide, "y": small}


def ffn_peak_bytes(rows: int, hidden: int) -> int:
    """Bytes alive at the step's peak: x and h and g while gelu runs; h is freed
    when gelu returns, so y is allocated beside x and g only."""
    b = ffn_bytes(rows, hidden)
    return b["x"] + max(b["h"] + b["g"], b["g"] + b["y"])


def predicted_largest_batch(budget: int, seq_len: int, hidden: int) -> int:
    """The largest batch whose step peak fits in `budget` bytes (the model is linear)."""
    return budget // ffn_peak_bytes(seq_len, hidden)


def largest_fitting(fits: Callable[[int], bool], start: int = 1,
                    cap: int = 1 << 24) -> tuple[int, list[tuple[int, bool]]]:
    """The largest n in [0, cap] with ``fits(n)``, for `fits` true up to some n and
    false above it: doubling from `start` until a failure, then bisection.

    Returns (n, trials), trials as (n tried, fitted) in order; n is 0 when
    nothing from 1 up fits.
    """
    trials: list[tuple[int, bool]] = []

    def probe(n: int) -> bool:
        ok = bool(fits(n))
        trials.append((n, ok))
        return ok

    if start < 1 or cap < start:
        raise ValueError(f"largest_fitting(): need 1 <= start <= cap, got {start}, {cap}")
    lo, hi = 0, start
    if probe(start):
        lo, hi = start, None
        while hi is None:
            if lo == cap:
                return lo, trials
            n = min(2 * lo, cap)
            if probe(n):
                lo = n
            else:
                hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, trials


def linear_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (needs two distinct xs)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        raise ValueError("linear_slope(): needs at least two distinct x values")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def release_share(reserved_before: int, reserved_after: int, allocated: int) -> float:
    """Share of the cached memory (reserved beyond allocated) that empty_cache() handed
    back; 1.0 when nothing was cached."""
    cached = reserved_before - allocated
    return 1.0 if cached <= 0 else (reserved_before - reserved_after) / cached


def limit_fraction(in_use: int, budget: int, total: int) -> float:
    """The memory fraction that leaves `budget` bytes above `in_use` of `total`."""
    fraction = (in_use + budget) / total
    if not 0 < fraction < 1:
        raise ValueError(f"a limit of {budget / MIB:.0f} MiB above {in_use / MIB:.0f} MiB in "
                         f"use is not below the device's {total / MIB:.0f} MiB")
    return fraction


# ---- the GPU side ---------------------------------------------------------------------


def ffn(x: Any, w1: Any, w2: Any) -> Any:
    return cudalab.matmul(cudalab.gelu(cudalab.matmul(x, w1)), w2)


def _mib(n: float) -> float:
    return n / MIB


def _counters() -> tuple[int, int, int]:
    """(allocated, reserved, peak allocated) of the current device's pool."""
    return (cudalab.memory_allocated(), cudalab.memory_reserved(),
            cudalab.max_memory_allocated())


def _row(r: LessonRun, section: str, step: str, batch: int | None, *, model: int | None,
         fits: bool | None = None, step_ms: float | None = None, t_ms: float | None = None,
         torch_peak: int | None = None, counters: tuple[int, int, int] | None = None) -> None:
    allocated, reserved, peak = _counters() if counters is None else counters
    r.row(section=section, step=step, batch=batch, allocated_mib=_mib(allocated),
          reserved_mib=_mib(reserved), peak_mib=_mib(peak),
          cached_mib=_mib(reserved - allocated), model_mib=None if model is None else _mib(model),
          fits=fits, step_ms=step_ms, t_ms=t_ms,
          torch_peak_mib=None if torch_peak is None else _mib(torch_peak))


def _sweep(r: LessonRun, w: tuple, base: int) -> list[tuple[int, int]]:
    """Peak above the baseline per batch; checks the model and the return to baseline."""
    p = r.params
    seq, hidden = p["seq_len"], p["hidden"]
    peaks = []
    for batch in p["batch_sizes"]:
        rows = batch * seq
        cudalab.synchronize()
        cudalab.reset_peak_memory_stats()
        x = cudalab.random.normal((rows, hidden), seed=10)
        y = ffn(x, *w)
        cudalab.synchronize()
        counters = _counters()  # before timing: the timer keeps a result alive
        peak = counters[2] - base
        model = ffn_peak_bytes(rows, hidden)
        r.check(f"batch {batch}: peak above baseline vs the live-array model (relative)",
                abs(peak - model) / model, PEAK_MODEL_TOLERANCE)
        m = r.measure(f"ffn batch {batch}", ffn, x, *w,
                      flops=2.0 * 2 * rows * hidden * hidden * FFN_MULT, ceiling=None)
        _row(r, "batch sweep", f"batch {batch}, step done, x and y alive", batch,
             model=base + model, step_ms=m.median * 1e3, torch_peak=_torch_peak(r, rows, hidden),
             counters=counters)
        peaks.append((batch, peak))
        del x, y
        cudalab.synchronize()
        r.check(f"batch {batch}: memory_allocated() back to the baseline after del (bytes)",
                abs(cudalab.memory_allocated() - base), 0)
    return peaks


def _timeline(r: LessonRun, w: tuple, base: int) -> list[tuple[str, int]]:
    """One step, allocation by allocation: allocated after each line, against live bytes."""
    p = r.params
    rows = p["batch_sizes"][0] * p["seq_len"]
    live: dict[str, Any] = {}
    samples: list[tuple[str, int]] = []
    t0 = time.perf_counter()
    worst = 0.0

    def sample(label: str) -> None:
        nonlocal worst
        cudalab.synchronize()  # frees are stream-ordered: read the counters after the GPU
        expected = base + sum(a.nbytes for a in live.values())
        worst = max(worst, abs(cudalab.memory_allocated() - expected))
        samples.append((label, cudalab.memory_allocated() - base))
        _row(r, "timeline", label, p["batch_sizes"][0], model=expected,
             t_ms=(time.perf_counter() - t0) * 1e3)

    cudalab.reset_peak_memory_stats()
    sample("start")
    live["x"] = cudalab.random.normal((rows, p["hidden"]), seed=11)
    sample("x = random.normal(...)")
    live["h"] = cudalab.matmul(live["x"], w[0])
    sample("h = x @ w1")
    live["g"] = cudalab.gelu(live["h"])
    sample("g = gelu(h)")
    del live["h"]
    sample("del h")
    live["y"] = cudalab.matmul(live["g"], w[1])
    sample("y = g @ w2")
    del live["g"]
    sample("del g")
    live.clear()
    sample("del x, y")
    r.check("timeline: memory_allocated() minus the bytes of live arrays, relative to the "
            "step's peak", worst / ffn_peak_bytes(rows, p["hidden"]), TIMELINE_TOLERANCE)
    return samples


def _empty_cache(r: LessonRun) -> tuple[int, int, int]:
    """(reserved before, reserved after, driver free memory gained)."""
    cudalab.synchronize()
    reserved, free = cudalab.memory_reserved(), cudalab.mem_get_info()[0]
    _row(r, "empty_cache", "before empty_cache()", None, model=None)
    cudalab.empty_cache()
    _row(r, "empty_cache", "after empty_cache()", None, model=None)
    return reserved, cudalab.memory_reserved(), cudalab.mem_get_info()[0] - free


def _fits_under_limit(r: LessonRun, w: tuple, base: int) -> Callable[[int], bool]:
    p = r.params

    def fits(batch: int) -> bool:
        rows = batch * p["seq_len"]
        cudalab.reset_peak_memory_stats()
        ok = try_step(lambda: ffn(cudalab.random.normal((rows, p["hidden"]), seed=12), *w))
        cudalab.synchronize()
        _row(r, "limit bisection", f"trial batch {batch}: {'fits' if ok else 'OOM'}", batch,
             model=base + ffn_peak_bytes(rows, p["hidden"]), fits=ok)
        return ok

    return fits


def try_step(step: Callable[[], Any]) -> bool:
    """Run `step`, dropping its result; False when it raised OutOfMemoryError."""
    try:
        step()
    except cudalab.OutOfMemoryError:
        return False  # the arrays it held are freed as the exception goes
    return True


def _bisect(r: LessonRun, w: tuple, base: int) -> tuple[int, int, int, int]:
    """(largest batch, model's, trials, OOMs) under a limit of limit_mib above current use."""
    p = r.params
    stats = cudalab.memory_stats()
    budget = int(p["limit_mib"] * MIB)
    fraction = limit_fraction(int(stats["requested_bytes.all.current"]), budget,
                              int(stats["device_total_bytes"]))
    previous = cudalab.get_per_process_memory_fraction()
    ooms = stats["num_ooms"]
    cudalab.set_per_process_memory_fraction(fraction)
    try:
        found, trials = largest_fitting(_fits_under_limit(r, w, base))
    finally:
        cudalab.set_per_process_memory_fraction(previous)
    r.check("memory fraction restored after the limit experiment",
            abs(cudalab.get_per_process_memory_fraction() - previous), 0.0)
    r.check("memory_allocated() back to the baseline after every OOM (bytes)",
            abs(cudalab.memory_allocated() - base), 0)
    model = predicted_largest_batch(budget, p["seq_len"], p["hidden"])
    r.check(f"largest batch under a {p['limit_mib']} MiB limit vs the model's {model} (relative)",
            abs(found - model) / max(model, 1), BISECTION_TOLERANCE)
    return found, model, len(trials), cudalab.memory_stats()["num_ooms"] - ooms


def _torch_peak(r: LessonRun, rows: int, hidden: int) -> int | None:
    torch = r.torch()
    if torch is None:
        return None
    w1 = torch.randn(hidden, hidden * FFN_MULT, device="cuda")
    w2 = torch.randn(hidden * FFN_MULT, hidden, device="cuda")
    x = torch.randn(rows, hidden, device="cuda")
    step = lambda: torch.nn.functional.gelu(x @ w1) @ w2  # noqa: E731
    step()  # cuBLAS workspace and allocator warm-up
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base + x.nbytes  # x counted as in ours
    del y, x, w1, w2
    return peak


def _findings(r: LessonRun, peaks: list, samples: list, cache: tuple, limit: tuple) -> None:
    p = r.params
    labels = tuple(f"ffn batch {b}" for b in p["batch_sizes"])
    per_sample = ffn_peak_bytes(p["seq_len"], p["hidden"])
    if len(peaks) >= 2:
        slope = linear_slope([b for b, _ in peaks], [v for _, v in peaks])
        r.finding(f"the step's peak grows by {_mib(slope):.2f} MiB per sample (the model of "
                  f"live arrays says {_mib(per_sample):.2f}): activations scale linearly with "
                  f"the batch", value=_mib(slope), unit="MiB/sample", labels=labels)
    times = {x["batch"]: x["step_ms"] for x in r.rows if x["section"] == "batch sweep"}
    first, last = p["batch_sizes"][0], p["batch_sizes"][-1]
    gain = (last / times[last]) / (first / times[first])
    r.finding(f"throughput goes from {first / times[first] * 1e3:.0f} to "
              f"{last / times[last] * 1e3:.0f} samples/s between batch {first} and {last} "
              f"({gain:.2f}x) while memory grows {last / first:.0f}x", value=gain, unit="x",
              labels=(f"ffn batch {first}", f"ffn batch {last}"))
    top = max(samples, key=lambda s: s[1])
    r.finding(f"in one step (batch {first}) memory peaks at {_mib(top[1]):.1f} MiB above the "
              f"baseline after '{top[0]}': x, h and g are alive together; h is freed before "
              f"y is allocated", value=_mib(top[1]), unit="MiB")
    before, after, gained = cache
    r.finding(f"with only the weights alive the pool still held {_mib(before):.1f} MiB; "
              f"empty_cache() "
              f"returned {_mib(before - after):.1f} MiB to the driver (its free memory rose by "
              f"{_mib(gained):.0f} MiB)", value=_mib(before - after), unit="MiB")
    found, model, trials, ooms = limit
    r.finding(f"under a limit of {p['limit_mib']} MiB above current use the largest batch that "
              f"fits is {found} (model: {model}), found in {trials} trials; each of the {ooms} "
              f"OutOfMemoryErrors left memory at its baseline", value=found, unit="batch")
    released = release_share(before, after, cudalab.memory_allocated()) >= RELEASED_SHARE
    r.claim("empty_cache() releases cached memory to other processes, not memory held by live "
            "arrays", tutorial=None, measured=_mib(before - after), unit="MiB", held=released,
            why=f"reserved went from {_mib(before):.0f} to {_mib(after):.0f} MiB with "
                f"{_mib(cudalab.memory_allocated()):.0f} MiB allocated")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    sizes = tuple(p["batch_sizes"])
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"lesson 'memory': batch_sizes must be positive ints, got {sizes!r}")
    P.ints("memory", p, "seq_len", "hidden", "limit_mib")


@lesson(10, "memory", title="Activation memory per batch, the pool, and the OOM limit",
        seed="step-by-step guide: memory_management.py (--batch-sizes 16,32,64,128); "
             "optimization guide: GPU Memory Management, Memory Fraction Control, Out of Memory",
        params={"batch_sizes": (16, 32, 64, 128), "seq_len": 256, "hidden": 1024,
                "limit_mib": 512},
        quick_params={"batch_sizes": (8, 16, 32), "seq_len": 128, "limit_mib": 256},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    check_params(p)
    hidden = p["hidden"]
    w = (cudalab.random.normal((hidden, hidden * FFN_MULT), std=hidden ** -0.5, seed=1),
         cudalab.random.normal((hidden * FFN_MULT, hidden), std=(hidden * FFN_MULT) ** -0.5,
                               seed=2))
    ffn(cudalab.random.normal((8, hidden), seed=3), *w)  # the matmul workspace, once per thread
    cudalab.synchronize()
    base = cudalab.memory_allocated()
    peaks = _sweep(r, w, base)
    samples = _timeline(r, w, base)
    cache = _empty_cache(r)
    limit = _bisect(r, w, base)
    _findings(r, peaks, samples, cache, limit)


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = [x for x in result.rows if x["section"] == "timeline"]
    steps = range(len(rows))
    ax.step(steps, [x["allocated_mib"] for x in rows], where="mid", label="allocated")
    ax.step(steps, [x["reserved_mib"] for x in rows], where="mid", label="reserved")
    ax.plot(steps, [x["model_mib"] for x in rows], "k:", label="live arrays (model)")
    ax.set_xticks(list(steps), [x["step"] for x in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8, loc="upper left")
    sweep = [x for x in result.rows if x["section"] == "batch sweep"]
    if sweep:
        inset = ax.inset_axes([0.68, 0.55, 0.3, 0.4])
        inset.plot([x["batch"] for x in sweep], [x["peak_mib"] for x in sweep], "o-",
                   label="peak")
        inset.plot([x["batch"] for x in sweep], [x["model_mib"] for x in sweep], "k:",
                   label="model")
        inset.set_xlabel("batch", fontsize=7)
        inset.set_ylabel("peak MiB", fontsize=7)
        inset.tick_params(labelsize=6)
