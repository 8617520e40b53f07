"""Lesson 22 `allreduce`: all_reduce from 8 B to 4 GiB, bus bandwidth and latency, beside torch.

Data-parallel training ends every step with an all_reduce of the gradients,
so its cost decides how far training scales. The lesson starts one worker
process per GPU (`cudalab.distributed.run.launch`); each joins cudalab's NCCL
group and torch.distributed's (NCCL, its own port) and times, after a barrier,
back-to-back in-place all_reduces of float32 buffers of every size with CUDA
events; the lesson reports the slowest rank's median, since a collective ends
when its last rank does.

The figures are nccl-tests': the algorithm bandwidth ``algbw = bytes / time``
and the bus bandwidth ``busbw = algbw * 2 (n - 1) / n``, the rate at which each
GPU's link carries data in a ring all_reduce (each byte crosses 2 (n - 1) / n
links), comparable across GPU counts and with the link's own speed. Small
messages cost a latency instead: an 8-byte all_reduce issued from a Python
loop (per call), and the same captured in a CUDA graph and replayed. Every
size's result is checked against the sum of every rank's data.

On one GPU the lesson runs a world of 1 (NCCL's all_reduce is then a local
copy, and busbw is 0 by definition) and says what the rest needs.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .analysis import fit_latency_bandwidth, format_bytes_short
from . import multi_gpu as M
from .registry import LessonRun, lesson

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FULL_SIZES = (8, 64, 512, 4 * KIB, 32 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB,
              256 * MIB, GIB, 4 * GIB)
QUICK_SIZES = (8, 4 * KIB, MIB, 64 * MIB)
WORKER = "cudalab.lessons._allreduce_worker"
# all_reduce result vs the sum of every rank's data, max |diff| / max |sum|: float32 sums
# in another order (exact for 2 ranks).
SUM_TOLERANCE = 1e-5
# cudalab at or above this fraction of torch's bus bandwidth counts as level with it
# (two runs of the same NCCL call differ by 2-3%).
PARITY = 0.97
# From this size up, all_reduce is bandwidth-bound: where cudalab is compared with torch.
BANDWIDTH_FROM = MIB
# Graph replay at least this many times faster per call than the host loop: the graph helps.
GRAPH_HELPS = 1.2
# Issue 20's aim for an 8-byte all_reduce from a Python loop (torch.distributed: 43 us on
# two H200s).
LOOP_TARGET_US = 20.0
TORCH_LOOP_H200_US = 43.0
# Device memory the worker holds per byte of the largest size: the rank's data, the
# expected sum, the buffer, a temporary while the sum is built (and torch's buffer).
BUFFERS = 4
TORCH_BUFFERS = 1
# Fraction of the free device memory the buffers may take.
MEMORY_SHARE = 0.8
# A fit whose largest relative residual exceeds this does not describe the sweep.
FIT_RESIDUAL_OK = 0.25

ROW_KEYS = ("part", "impl", "size", "bytes", "count", "us", "algbw_gbps", "busbw_gbps",
            "torch_over_ours", "slowest_rank", "ranks")


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def bus_factor(n: int) -> float:
    """nccl-tests' all_reduce factor 2 (n - 1) / n: bytes each link carries per byte reduced."""
    if n < 1:
        raise ValueError(f"bus_factor(): expected n >= 1 ranks, got {n}")
    return 2.0 * (n - 1) / n


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in B/s: bytes / time (inf at 0 s)."""
    return nbytes / seconds if seconds > 0 else math.inf


def busbw(nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in B/s: algbw * 2 (n - 1) / n, as nccl-tests counts an all_reduce."""
    return algbw(nbytes, seconds) * bus_factor(n)


def sizes_that_fit(sizes: Sequence[int], free_bytes: float, buffers: int) -> tuple[int, ...]:
    """The sizes whose `buffers` buffers take at most MEMORY_SHARE of `free_bytes`."""
    return tuple(s for s in sizes if buffers * s <= MEMORY_SHARE * free_bytes)


def parity_span(pairs: Sequence[tuple[int, float]]) -> tuple[float, int, float, int] | None:
    """(lowest ratio, its size, highest ratio, its size) over (bytes, ours / torch) pairs from
    BANDWIDTH_FROM up; None when no size is that large."""
    big = [(b, x) for b, x in pairs if b >= BANDWIDTH_FROM and math.isfinite(x)]
    if not big:
        return None
    low, high = min(big, key=lambda p: p[1]), max(big, key=lambda p: p[1])
    return low[1], low[0], high[1], high[0]


def parity_text(span: tuple[float, int, float, int], n: int) -> str:
    """One sentence on cudalab's bus bandwidth against torch's from BANDWIDTH_FROM up."""
    low, at_low, high, at_high = span
    head = (f"From {format_bytes_short(BANDWIDTH_FROM)} up on {n} GPUs, cudalab's bus bandwidth "
            f"is {low:.3f}x (at {format_bytes_short(at_low)}) to {high:.3f}x (at "
            f"{format_bytes_short(at_high)}) torch.distributed's")
    if low >= PARITY:
        return head + f": level with it or faster at every size (parity from {PARITY}x)"
    return head + f": below parity ({PARITY}x) at {format_bytes_short(at_low)}"


def latency_text(loop_s: float, graph_s: float, torch_s: float | None, n: int) -> str:
    """One sentence on the 8-byte all_reduce's per-call cost, loop vs graph (vs torch)."""
    gain = loop_s / graph_s if graph_s > 0 else math.inf
    text = (f"An 8-byte all_reduce on {n} GPU{'s' if n > 1 else ''} costs "
            f"{loop_s * 1e6:.1f} us per call from a Python loop and {graph_s * 1e6:.1f} us "
            f"replayed from a CUDA graph ({gain:.2f}x)")
    if torch_s is not None:
        text += f"; torch.distributed's loop {torch_s * 1e6:.1f} us"
    if gain >= GRAPH_HELPS:
        return text + ": launching from Python is a real share of a small collective"
    return text + ": the collective itself, not its launch, is the cost"


def check_params(p: Mapping[str, Any]) -> tuple[int, ...]:
    """The sizes in bytes (sorted, repeats dropped) from the params; ValueError on a bad one."""
    sizes = M.float32_byte_sizes("allreduce", p["sizes"])
    if not sizes:
        raise ValueError("lesson 'allreduce': sizes must name at least one size")
    M.check_gpus("allreduce", p["gpus"])
    for name in ("repeats", "latency_calls", "graph_calls"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"lesson 'allreduce': {name} must be an int >= 1, got {v!r}")
    if p["repeats"] < 5:
        raise ValueError(f"lesson 'allreduce': repeats must be >= 5 (a median and an IQR), "
                         f"got {p['repeats']}")
    for name in ("budget_s", "timeout"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"lesson 'allreduce': {name} must be a number > 0, got {v!r}")
    if not isinstance(p["torch"], bool):
        raise ValueError(f"lesson 'allreduce': torch must be True or False, got {p['torch']!r}")
    return tuple(sorted(set(int(s) for s in sizes)))


# ---- reading the workers' numbers ------------------------------------------------------------


def _label(impl: str, nbytes: int, part: str = "") -> str:
    head = "torch all_reduce" if impl == "torch" else "all_reduce"
    return f"{head} {format_bytes_short(nbytes)}" + (f" {part}" if part else "")


def size_entries(results: Sequence[Mapping[str, Any]], impl: str) -> dict[int, list[dict]]:
    """bytes -> each rank's ``{"times", "calls", "device", "device_name"}`` for `impl`
    ("cudalab" or "torch"); sizes a rank did not time for `impl` are left out."""
    out: dict[int, list[dict]] = {}
    first = results[0]["sizes"]
    for i, entry in enumerate(first):
        per_rank = []
        for res in results:
            e = res["sizes"][i]
            if e["bytes"] != entry["bytes"] or not e.get(impl):
                break
            per_rank.append({"times": e[impl], "calls": e["calls"], "device": res["device"],
                             "device_name": res["device_name"]})
        else:
            out[int(entry["bytes"])] = per_rank
    return out


def worst_error(results: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    """bytes -> the largest error over ranks under `key` ("error" or "torch_error")."""
    worst: dict[int, float] = {}
    for res in results:
        for e in res["sizes"]:
            if key in e and e[key] is not None:
                worst[int(e["bytes"])] = max(worst.get(int(e["bytes"]), 0.0), float(e[key]))
    return worst


# ---- the lesson ---------------------------------------------------------------------------


@lesson(22, "allreduce", title="all_reduce: bus bandwidth from 8 B to 4 GiB, latency, graphs",
        seed="PyTorch 'Writing distributed applications' (all_reduce) and DDP tutorials; "
             "nccl-tests' algbw / busbw; issue 20 (beside torch.distributed)",
        params={"sizes": FULL_SIZES, "gpus": None, "repeats": 20, "budget_s": 1.0,
                "latency_calls": 1000, "graph_calls": 100, "torch": True, "timeout": 600.0},
        quick_params={"sizes": QUICK_SIZES, "repeats": 8, "budget_s": 0.2,
                      "latency_calls": 200, "graph_calls": 50, "timeout": 120.0},
        check=check_params)
def run(r: LessonRun) -> None:
    import cudalab

    p = r.params
    sizes = check_params(p)
    present = M.gpu_count()
    n = M.gpus_used(p["gpus"], present)
    want_torch = p["torch"] and r.torch() is not None
    free = min(cudalab.mem_get_info(d)[0] for d in range(n))
    fit = sizes_that_fit(sizes, free, BUFFERS + (TORCH_BUFFERS if want_torch else 0))
    if not fit:
        raise ValueError(f"lesson 'allreduce': no size fits in {free / GIB:.1f} GiB free "
                         f"(each needs {BUFFERS} buffers of its size)")
    config = {"params": {**dict(p), "sizes": list(fit), "torch": bool(want_torch)},
              "timeout": float(p["timeout"])}
    results = M.launch_workers(WORKER, n, config, float(p["timeout"]),
                               f"lesson 'allreduce': {n} worker(s)")
    _checks(r, results, n)
    ours, theirs = _sizes(r, results, n)
    lat = _latency(r, results, n)
    _findings(r, results, n, present, ours, theirs, lat, sizes, fit)


def _checks(r: LessonRun, results: Sequence[Mapping[str, Any]], n: int) -> None:
    for key, who in (("error", "cudalab"), ("torch_error", "torch.distributed")):
        for nbytes, err in worst_error(results, key).items():
            r.check(f"{who} all_reduce of {format_bytes_short(nbytes)} float32 on {n} rank(s) "
                    f"vs the sum of every rank's data (max |diff| / max |sum|, worst rank)",
                    err, SUM_TOLERANCE)


def _sizes(r: LessonRun, results: Sequence[Mapping[str, Any]], n: int) -> tuple[dict, dict]:
    """Measurements per size for both implementations, and their rows."""
    found: dict[str, dict[int, Any]] = {}
    for impl in ("cudalab", "torch"):
        found[impl] = {}
        for nbytes, per_rank in size_entries(results, impl).items():
            m = M.slowest_measurement(_label(impl, nbytes), per_rank, bytes=nbytes,
                                      metadata={"world_size": n, "impl": impl})
            found[impl][nbytes] = r.add(m)
    for impl in ("cudalab", "torch"):
        for nbytes, m in found[impl].items():
            other = found["torch"].get(nbytes)
            r.row(**_row("sweep", impl, nbytes, m, n,
                         None if impl == "torch" or other is None else other.median / m.median))
    return found["cudalab"], found["torch"]


def _row(part: str, impl: str, nbytes: int, m: Any, n: int, vs: float | None) -> dict:
    return {"part": part, "impl": impl, "size": format_bytes_short(nbytes), "bytes": nbytes,
            "count": nbytes // 4, "us": m.median * 1e6, "algbw_gbps": algbw(nbytes, m.median) / 1e9,
            "busbw_gbps": busbw(nbytes, m.median, n) / 1e9, "torch_over_ours": vs,
            "slowest_rank": m.metadata.get("slowest_rank"), "ranks": n}


def _latency(r: LessonRun, results: Sequence[Mapping[str, Any]], n: int) -> dict[str, Any]:
    lat: dict[str, Any] = {}
    for key, impl, part in (("cudalab loop", "cudalab", "host loop"),
                            ("cudalab graph", "cudalab", "graph replay"),
                            ("torch loop", "torch", "host loop")):
        per_rank = [{**res["latency"][key], "device": res["device"],
                     "device_name": res["device_name"]}
                    for res in results if key in res.get("latency", {})]
        if len(per_rank) != len(results):
            continue
        nbytes = int(results[0]["latency"]["bytes"])
        m = r.add(M.slowest_measurement(_label(impl, nbytes, part), per_rank, bytes=nbytes,
                                        timer=M.TIMER_HOST, metadata={"world_size": n}))
        lat[key] = m
        r.row(**_row("latency " + part, impl, nbytes, m, n, None))
    return lat


def _findings(r: LessonRun, results: Sequence[Mapping[str, Any]], n: int, present: int,
              ours: dict, theirs: dict, lat: dict, asked: Sequence[int],
              fit: Sequence[int]) -> None:
    info = results[0]
    if len(fit) < len(asked):
        left = [format_bytes_short(s) for s in asked if s not in fit]
        r.finding(f"Left out for lack of device memory: {', '.join(left)} (each size needs "
                  f"{BUFFERS} buffers of its size on every GPU)")
    if n < 2:
        r.finding(M.needs_text("The all_reduce across GPUs (bus bandwidth over NVLink or PCIe)",
                               2, present) + "; a world of 1 all-reduces with a local copy, and "
                  "its bus bandwidth is 0 by definition (2 (n - 1) / n = 0)", value=present,
                  unit="GPUs")
    else:
        best = max(ours, key=lambda b: busbw(b, ours[b].median, n))
        bw = busbw(best, ours[best].median, n)
        text = (f"On {n} {info['device_name']} GPUs cudalab's all_reduce (NCCL "
                f"{info['nccl']}) peaks at {bw / 1e9:.1f} GB/s bus bandwidth "
                f"({algbw(best, ours[best].median) / 1e9:.1f} GB/s algorithm) at "
                f"{format_bytes_short(best)}")
        labels = [ours[best].label]
        if theirs:
            tbest = max(theirs, key=lambda b: busbw(b, theirs[b].median, n))
            text += (f"; torch.distributed (NCCL {info.get('torch_nccl')}) peaks at "
                     f"{busbw(tbest, theirs[tbest].median, n) / 1e9:.1f} GB/s at "
                     f"{format_bytes_short(tbest)}")
            labels.append(theirs[tbest].label)
        r.finding(text, value=bw / 1e9, unit="GB/s", labels=tuple(labels))
    _fit_finding(r, ours, n)
    span = None
    if theirs and n >= 2:
        pairs = [(b, theirs[b].median / ours[b].median) for b in ours if b in theirs]
        span = parity_span(pairs)
        if span is not None:
            r.finding(parity_text(span, n), value=span[0], unit="x",
                      labels=tuple(m.label for b in ours if b in theirs and b >= BANDWIDTH_FROM
                                   for m in (ours[b], theirs[b])))
    loop, graph, tloop = lat.get("cudalab loop"), lat.get("cudalab graph"), lat.get("torch loop")
    failed = [res["latency"]["graph_error"] for res in results
              if res.get("latency", {}).get("graph_error")]
    if failed:
        r.finding(f"Capturing all_reduce in a CUDA graph failed on {len(failed)} rank(s): "
                  f"{failed[0]}")
    if loop is not None and graph is not None:
        r.finding(latency_text(loop.median, graph.median,
                               None if tloop is None else tloop.median, n),
                  value=loop.median * 1e6, unit="us",
                  labels=tuple(m.label for m in (loop, graph, tloop) if m is not None))
    _claims(r, n, span, loop, graph)


def _fit_finding(r: LessonRun, ours: dict, n: int) -> None:
    if len(ours) < 2:
        return
    sizes = sorted(ours)
    latency, bandwidth, residual = fit_latency_bandwidth(sizes, [ours[b].median for b in sizes])
    quality = (f"the fit holds within {100 * residual:.0f}%" if residual <= FIT_RESIDUAL_OK else
               f"the fit misses a size by {100 * residual:.0f}%: NCCL switches algorithm and "
               "protocol with the size, so no one latency and bandwidth describe it all")
    r.finding(f"Fitted as latency + bytes / bandwidth: {latency * 1e6:.1f} us + "
              f"{bandwidth * bus_factor(n) / 1e9:.1f} GB/s bus bandwidth "
              f"({bandwidth / 1e9:.1f} GB/s algorithm); below "
              f"{format_bytes_short(max(latency * bandwidth, 0.0))} an all_reduce is mostly "
              f"latency; {quality}", value=latency * 1e6, unit="us",
              labels=tuple(ours[b].label for b in sizes))


def _claims(r: LessonRun, n: int, span: tuple | None, loop: Any, graph: Any) -> None:
    if span is not None:
        low, at_low = span[0], span[1]
        r.claim("NCCL is the engine for GPU collectives: a library calling NCCL directly "
                "reaches torch.distributed's bus bandwidth from 1 MiB up",
                tutorial=None, measured=low, unit="x", held=low >= PARITY,
                why=f"lowest ratio {low:.3f}x at {format_bytes_short(at_low)} on {n} GPUs; "
                    f"holds from {PARITY}x")
    # On one GPU NCCL's all_reduce of one rank moves nothing (the H200 run replayed it in
    # 0.0 us), so the graph's gain over the loop is a no-op's: the claim needs two GPUs.
    if loop is not None and graph is not None and n >= 2:
        gain = loop.median / graph.median if graph.median > 0 else math.inf
        r.claim("CUDA graphs remove the launch cost of small repeated work, collectives "
                "included", tutorial=None, measured=gain, unit="x", held=gain >= GRAPH_HELPS,
                why=f"8-byte all_reduce: {loop.median * 1e6:.1f} us per call in a loop, "
                    f"{graph.median * 1e6:.1f} us replayed; holds from {GRAPH_HELPS}x")
        if n >= 2:
            us = loop.median * 1e6
            r.claim(f"An 8-byte all_reduce from a Python loop can cost <= {LOOP_TARGET_US:g} us "
                    f"per call (torch.distributed: {TORCH_LOOP_H200_US:g} us on two H200s)",
                    tutorial=TORCH_LOOP_H200_US, measured=us, unit="us",
                    held=us <= LOOP_TARGET_US,
                    why=f"{us:.1f} us per call on {n} GPUs (slowest rank's median)")


@run.plot
def plot(result: Any, ax: Any) -> None:
    for impl, style in (("cudalab", "o-"), ("torch", "s--")):
        rows = sorted((x["bytes"], x["busbw_gbps"], x["algbw_gbps"]) for x in result.rows
                      if x["part"] == "sweep" and x["impl"] == impl)
        if not rows:
            continue
        ranks = next(x["ranks"] for x in result.rows if x["part"] == "sweep")
        y = [b if ranks > 1 else a for _, b, a in rows]
        ax.plot([q[0] for q in rows], y, style,
                label=f"{impl} {'busbw' if ranks > 1 else 'algbw (world of 1)'}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("all_reduce size (bytes, float32)")
    ax.set_ylabel("bandwidth (GB/s)")
    lat = [x for x in result.rows if x["part"].startswith("latency")]
    if lat:
        text = "\n".join(f"{x['impl']} 8 B {x['part'][8:]}: {x['us']:.1f} us" for x in lat)
        ax.text(0.02, 0.98, text, transform=ax.transAxes, va="top", fontsize=7,
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    ax.legend(fontsize=8, loc="lower right")
