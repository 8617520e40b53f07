"""Lesson 12 `streams`: independent work on several streams, and the copy/compute/copy pipeline.

Work on one stream runs in order; work on different streams may run at the
same time. That helps in two cases measured here. Kernels too small to fill
the GPU (a softmax over one long row runs on one block, so one SM) run side
by side on idle SMs when they are issued on several streams, while kernels
that fill the GPU gain nothing. And a stream of chunks through host ->
device copy, compute and device -> host copy overlaps the three stages on
the two copy engines and the SMs when consecutive chunks go to different
streams (pinned host memory, non_blocking copies). The pipeline is compared
with the bound its stage times allow, and every result is checked.

Timing is the host clock around calls that return once every stream is
done: the events of `r.measure` live on one stream, and this lesson's work
spreads over several.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

import cudalab
from cudalab.bench import host_clock, host_measurement

from ._measuring import rel_error
from ._overlap import pipeline_bound
from . import _params as P
from .registry import LessonRun, lesson

MIB = 1 << 20
# N streams at least this many times faster than one on one-block kernels:
# "work on separate streams runs in parallel" holds.
STREAMS_HELP = 1.5
# The 3-stream pipeline at least this many times faster than 1 stream at the
# same chunk count: "streams overlap computation and transfers" holds.
PIPELINE_HELPS = 1.3
# The pipeline check compares every CHECK_STRIDE-th element (all chunks are covered).
CHECK_STRIDE = 97
PIPELINE_STREAMS = 3
TOLERANCE = 1e-5
TIMER = "host clock around the whole call (it returns with every stream synchronized)"
# The guide's StreamPipeline runs each model on a side stream without making
# that stream wait for the input, which the caller produced on the current
# stream. The race part reproduces it: an upload (then a copy into place) on
# the current stream, a kernel reading the result on a side stream, with and
# without side.wait_stream(current). Trials of each; the worst is reported.
RACE_TRIALS = 3
SENTINEL = 1e30

ROW_KEYS = ("part", "case", "kernel", "streams", "chunks", "impl", "ms", "per_kernel_us",
            "speedup", "bound_ms", "pct_of_bound")


def _row(r: LessonRun, **fields: Any) -> None:
    r.row(**{k: fields.get(k) for k in ROW_KEYS})


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    w = np.exp(x - x.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def _spread(pairs: list, streams: list, op: Callable[[Any, Any], Any]) -> Callable[[], None]:
    """A call that issues op(x, y) for each pair, round-robin over `streams`, and waits."""
    def run() -> None:
        for i, (x, y) in enumerate(pairs):
            with streams[i % len(streams)]:
                op(x, y)
        for s in streams:
            s.synchronize()
    return run


def _torch_spread(torch: Any, inputs: list, count: int) -> Callable[[], None]:
    streams = [torch.cuda.Stream() for _ in range(count)]

    def run() -> None:
        out = []
        for i, x in enumerate(inputs):
            with torch.cuda.stream(streams[i % count]):
                out.append(torch.softmax(x, dim=-1))
        for s in streams:
            s.synchronize()
    return run


def _concurrency(r: LessonRun, torch: Any) -> dict[tuple[str, str, int], Any]:
    """One-block and full-GPU softmax kernels on 1..N streams; rows; checks."""
    p = r.params
    small = [(cudalab.random.normal((1, p["kernel_cols"]), seed=i),
              cudalab.empty((1, p["kernel_cols"]))) for i in range(p["kernels"])]
    big_x = cudalab.random.normal(tuple(p["big_shape"]), seed=1000)
    big = [(big_x, cudalab.empty(tuple(p["big_shape"]))) for _ in range(p["big_kernels"])]
    cudalab.synchronize()  # inputs made on the default stream are ready for every stream
    softmax = lambda x, y: cudalab.softmax(x, out=y)  # noqa: E731
    cases = {}
    for kernel, pairs in (("one-block", small), ("full-GPU", big)):
        for count in p["streams"]:
            streams = [cudalab.Stream() for _ in range(count)]
            cases[(kernel, "cudalab", count)] = _spread(pairs, streams, softmax)
            if torch is not None:
                inputs = [torch.from_dlpack(x) for x, _ in pairs]
                cases[(kernel, "torch", count)] = _torch_spread(torch, inputs, count)
    sizes = {"one-block": len(small), "full-GPU": len(big)}
    names = {(kernel, impl, count): f"{kernel} softmax x{sizes[kernel]}, {count} stream(s)"
                                    + (" (torch)" if impl == "torch" else "")
             for kernel, impl, count in cases}
    times = host_clock({names[k]: fn for k, fn in cases.items()}, p["repeats"],
                       warmup=r.timer.settings.warmup)
    m = {k: r.add(host_measurement(times[names[k]], calls=1, label=names[k], host_time=False,
                                   timer=TIMER), names[k]) for k in cases}
    for (kernel, impl, count), x in m.items():
        base = m[(kernel, impl, min(p["streams"]))]
        _row(r, part="concurrency", case=names[(kernel, impl, count)], kernel=kernel,
             streams=count, impl=impl, ms=x.median * 1e3,
             per_kernel_us=x.median / sizes[kernel] * 1e6, speedup=base.median / x.median)
    err = max(rel_error(y.get(), _softmax_ref(x.get())) for x, y in small)
    r.check(f"{len(small)} one-block softmax outputs vs float64 NumPy", err, TOLERANCE)
    want = _softmax_ref(big_x.get())
    err = max(rel_error(y.get(), want) for _, y in (big[0], big[-1]))
    r.check("full-GPU softmax outputs (first, last) vs float64 NumPy", err, TOLERANCE)
    return m


# ---- the pipeline -------------------------------------------------------------------------


def _compute(d: Any, passes: int) -> Any:
    y = cudalab.axpy(2.0, d, 1.0)
    for _ in range(passes):
        cudalab.tanh(y, out=y)
    return y


def _compute_ref(x: np.ndarray, passes: int) -> np.ndarray:
    y = 2.0 * x.astype(np.float64) + 1.0
    for _ in range(passes):
        y = np.tanh(y)
    return y


def pipeline(streams: list, host_in: np.ndarray, host_out: np.ndarray, chunks: int,
             passes: int) -> None:
    """host_out = tanh^passes(2 host_in + 1), chunk by chunk, round-robin over `streams`.

    Both host arrays are pinned, so the copies are asynchronous. Each chunk's
    device arrays are dropped as soon as its work is issued: their memory
    returns to the pool in stream order, after the work queued before the
    free, so the next chunk on that stream may reuse it safely.
    """
    n = host_in.shape[0]
    step = n // chunks
    for i in range(chunks):
        part = slice(i * step, n if i == chunks - 1 else (i + 1) * step)
        with streams[i % len(streams)]:
            d = cudalab.asarray(host_in[part], non_blocking=True)
            y = _compute(d, passes)
            y.get(out=host_out[part], non_blocking=True)
    for s in streams:
        s.synchronize()


def _stage_times(r: LessonRun, host_in: np.ndarray, host_out: np.ndarray) -> list[float]:
    """GPU seconds of each stage over the whole array on one stream (CUDA events)."""
    passes, nbytes = r.params["compute_passes"], host_in.nbytes
    d = cudalab.asarray(host_in)
    y = _compute(d, passes)
    h2d = r.measure("pipeline stage: h2d", lambda: cudalab.asarray(host_in, non_blocking=True),
                    bytes=nbytes, ceiling="h2d")
    comp = r.measure("pipeline stage: compute", _compute, d, passes,
                     bytes=(2 + 2 * passes) * nbytes)
    d2h = r.measure("pipeline stage: d2h", lambda: y.get(out=host_out, non_blocking=True),
                    bytes=nbytes, ceiling="d2h")
    return [h2d.median, comp.median, d2h.median]


def _pipeline_part(r: LessonRun, rng: np.random.Generator) -> dict[int, float]:
    p = r.params
    n = p["pipeline_mib"] * MIB // 4
    host_in = cudalab.pinned_empty(n, dtype=np.float32)
    host_in[:] = rng.standard_normal(n, dtype=np.float32)
    host_out = cudalab.pinned_empty(n, dtype=np.float32)
    stages = _stage_times(r, host_in, host_out)
    variants = {1: [cudalab.Stream()], PIPELINE_STREAMS: [cudalab.Stream()
                                                          for _ in range(PIPELINE_STREAMS)]}
    want = _compute_ref(host_in[::CHECK_STRIDE], p["compute_passes"])
    for count, streams in variants.items():
        host_out[:] = np.nan  # an element the pipeline misses stays NaN and fails the check
        pipeline(streams, host_in, host_out, max(p["chunks"]), p["compute_passes"])
        r.check(f"pipeline on {count} stream(s), {max(p['chunks'])} chunks vs float64 NumPy "
                f"(every {CHECK_STRIDE}th element)",
                rel_error(host_out[::CHECK_STRIDE], want), TOLERANCE)
    cases = {(c, s): (lambda c=c, s=s: pipeline(variants[s], host_in, host_out, c,
                                                 p["compute_passes"]))
             for c in p["chunks"] for s in variants}
    label = {k: f"pipeline {k[0]} chunks, {k[1]} stream(s)" for k in cases}
    times = host_clock({label[k]: fn for k, fn in cases.items()}, p["repeats"],
                       warmup=r.timer.settings.warmup)
    m = {k: r.add(host_measurement(times[label[k]], calls=1, label=label[k], host_time=False,
                                   bytes=2.0 * host_in.nbytes, timer=TIMER), label[k])
         for k in cases}
    speedups = {}
    for (c, s), x in m.items():
        bound = pipeline_bound(stages, c) if s > 1 else sum(stages)
        speedups.setdefault(c, m[(c, 1)].median / m[(c, PIPELINE_STREAMS)].median)
        _row(r, part="pipeline", case=label[(c, s)], streams=s, chunks=c, impl="cudalab",
             ms=x.median * 1e3, speedup=m[(c, 1)].median / x.median, bound_ms=bound * 1e3,
             pct_of_bound=100.0 * bound / x.median)
    return speedups


def race_text(stale: int, total: int, upload_ms: float) -> str:
    """What the guide's pattern (no wait) read, against the correct one."""
    if stale:
        return (f"the guide's pattern (a side stream that never waits for its input) read "
                f"{stale:,} of {total:,} elements ({100 * stale / total:.1f}%) before the "
                f"{upload_ms:.2f} ms upload on the current stream wrote them; with "
                f"side.wait_stream(current) every element is right")
    return (f"the guide's pattern (a side stream that never waits for its input) read no "
            f"stale element in this run ({total:,} elements, a {upload_ms:.2f} ms upload): the "
            f"side stream happened to start after the upload; nothing orders the two streams, "
            f"so a slower copy, a busier GPU or another driver gives wrong results: it is still "
            f"a race, and side.wait_stream(current) is what makes it correct")


def race_trial(host: np.ndarray, x: Any, sentinel: Any, side: Any, wait: bool) -> np.ndarray:
    """2 * host computed on `side` from `x`, which the current stream fills from `host`.

    `x` is first reset to `sentinel` (and synchronized), so an element the
    side stream reads before the current stream's upload and copy reach it
    comes out as 2 * sentinel. `wait` makes the side stream wait for the
    current one first (the correct version).
    """
    cudalab.copyto(x, sentinel)
    cudalab.synchronize()
    current = cudalab.current_stream()
    d = cudalab.asarray(host, non_blocking=True)  # the producer: upload, then write x
    cudalab.copyto(x, d)
    with side:
        if wait:
            side.wait_stream(current)
        y = cudalab.mul(x, 2.0)  # the consumer
        out = y.get()
    cudalab.synchronize()
    return out


def _race(r: LessonRun, rng: np.random.Generator) -> None:
    n = r.params["race_mib"] * MIB // 4
    host = cudalab.pinned_empty(n, dtype=np.float32)
    host[:] = rng.standard_normal(n, dtype=np.float32)
    want = 2.0 * host
    x = cudalab.empty(n, dtype="float32")
    # Far outside any normal sample: 2 * SENTINEL is never a right answer.
    sentinel = cudalab.full(n, SENTINEL, "float32")
    side = cudalab.Stream()
    upload = r.measure("race: upload", lambda: cudalab.asarray(host, non_blocking=True),
                       bytes=host.nbytes, ceiling="h2d")
    stale = {}
    for wait in (True, False):
        stale[wait] = max(int(np.count_nonzero(race_trial(host, x, sentinel, side, wait)
                                               != want)) for _ in range(RACE_TRIALS))
        _row(r, part="race", case="side.wait_stream(current)" if wait else "no wait (guide)",
             streams=2, impl="cudalab")
    r.check(f"with side.wait_stream(current): 2 * x on the side stream vs NumPy, elements "
            f"wrong (worst of {RACE_TRIALS})", stale[True], 0)
    text = race_text(stale[False], n, upload.median * 1e3)
    r.finding(text[0].upper() + text[1:], value=stale[False], unit="stale elements",
              labels=(upload.label,))
    r.claim("The guide's StreamPipeline (each model on its own stream, no wait) computes the "
            "right outputs", tutorial=None, measured=stale[False], unit="stale elements",
            held=stale[False] == 0, why=text)


def _findings(r: LessonRun, conc: dict, speedups: dict[int, float]) -> None:
    p = r.params
    lo, hi = min(p["streams"]), max(p["streams"])
    gains = {}
    for kernel in ("one-block", "full-GPU"):
        one, many = conc[(kernel, "cudalab", lo)], conc[(kernel, "cudalab", hi)]
        gains[kernel] = g = one.median / many.median
        r.finding(f"{kernel} softmax kernels: {hi} streams run them {g:.2f}x as fast as {lo}",
                  value=g, unit="x", labels=(one.label, many.label))
    g, big = gains["one-block"], gains["full-GPU"]
    r.claim("Work on separate streams runs in parallel", tutorial=None, measured=g, unit="x",
            held=g >= STREAMS_HELP,
            why=f"{g:.2f}x for one-block kernels on {hi} streams (holds from {STREAMS_HELP}x); "
                f"{big:.2f}x for kernels that fill the GPU")
    # One chunk has nothing to overlap: 3 streams then run exactly what 1 does.
    candidates = [c for c in speedups if c > 1] or list(speedups)
    best = max(candidates, key=speedups.get)
    s = speedups[best]
    labels = (f"pipeline {best} chunks, 1 stream(s)",
              f"pipeline {best} chunks, {PIPELINE_STREAMS} stream(s)")
    [pct] = [x["pct_of_bound"] for x in r.rows if x["part"] == "pipeline"
             and x["chunks"] == best and x["streams"] == PIPELINE_STREAMS]
    r.finding(f"The copy/compute/copy pipeline is {s:.2f}x faster on {PIPELINE_STREAMS} streams "
              f"than on 1 at {best} chunks, {pct:.0f}% of what its stage times allow",
              value=s, unit="x", labels=labels)
    engines = cudalab.get_device_properties().async_engine_count
    r.claim("Streams overlap computation and data transfer", tutorial=None, measured=s,
            unit="x", held=s >= PIPELINE_HELPS,
            why=f"{s:.2f}x at {best} chunks (holds from {PIPELINE_HELPS}x); this GPU has "
                f"{engines} copy engine(s): "
                + ("h2d and d2h can run at once" if engines >= 2 else
                   "h2d and d2h copies take turns"))


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("streams", p, "kernel_cols", "kernels", "big_kernels", "pipeline_mib",
           "compute_passes", "repeats", "race_mib")
    P.int_lists("streams", p, "big_shape", "streams", "chunks")
    P.seed("streams", p)


@lesson(12, "streams", title="Streams: concurrent kernels and the copy/compute/copy pipeline",
        seed="Guide 'PyTorch CUDA optimization': CUDA Streams (basic usage, synchronization, "
             "pipeline pattern)",
        params={"kernel_cols": 1 << 20, "kernels": 32, "big_shape": (4096, 4096),
                "big_kernels": 8, "streams": (1, 2, 4, 8), "pipeline_mib": 256,
                "chunks": (1, 2, 4, 8, 16, 32), "compute_passes": 4, "repeats": 10, "seed": 0,
                "race_mib": 256},
        quick_params={"kernel_cols": 1 << 18, "kernels": 16, "streams": (1, 4),
                      "pipeline_mib": 64, "chunks": (1, 4, 16), "repeats": 5, "race_mib": 64},
        check=check_params)
def run(r: LessonRun) -> None:
    rng = np.random.default_rng(r.params["seed"])
    torch = r.torch()
    conc = _concurrency(r, torch)
    speedups = _pipeline_part(r, rng)
    _findings(r, conc, speedups)
    _race(r, rng)


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = [x for x in result.rows if x["part"] == "pipeline"]
    for streams, marker in ((1, "s"), (PIPELINE_STREAMS, "o")):
        pts = sorted((x["chunks"], x["ms"], x["bound_ms"]) for x in rows if x["streams"] == streams)
        if not pts:
            continue
        ax.plot([q[0] for q in pts], [q[1] for q in pts], marker=marker,
                label=f"{streams} stream{'s' if streams > 1 else ''} (measured)")
        if streams > 1:
            ax.plot([q[0] for q in pts], [q[2] for q in pts], "--", color="gray",
                    label="bound from stage times")
    conc = [x for x in result.rows if x["part"] == "concurrency" and x["impl"] == "cudalab"]
    text = "\n".join(f"{x['kernel']} x{x['streams']} streams: {x['speedup']:.2f}x"
                     for x in conc if x["speedup"] is not None)
    # Mid-right, between the one-stream line (top) and the pipelined one; a
    # white box keeps it readable wherever the lines fall on another GPU.
    ax.text(0.98, 0.55, text, transform=ax.transAxes, ha="right", va="center", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks")
    ax.set_ylabel("copy in + compute + copy out (ms)")
    ax.legend(fontsize=7, loc="lower left")
