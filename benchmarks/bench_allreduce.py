"""Benchmark: all_reduce (float32, sum) from 8 B to 4 GiB, cudalab beside torch.distributed.

An nccl-tests-like table (size, count, time, algorithm and bus bandwidth) for
cudalab's NCCL all_reduce and torch.distributed's (NCCL) side by side, with
the ratio of their bus bandwidths, on every GPU of this machine (``--gpus N``:
the first N). The measurement is the ``allreduce`` lesson's worker
(``cudalab.lessons._allreduce_worker``), one process per GPU started by
``cudalab.distributed.run.launch``: each rank checks every size against the
sum of every rank's data, then times back-to-back in-place all_reduces with
CUDA events after a barrier (warm-up, a fixed number of repeats that is the
same on every rank); a row is the slowest rank's median, since a collective
ends when its last rank does. ``busbw = algbw * 2 (n - 1) / n`` as nccl-tests
counts an all_reduce. Then the latency of an 8-byte all_reduce: a Python
loop (per call), the same captured in a CUDA graph (per call of a replay),
and torch's loop.

The environment reaches the workers unchanged (keep NCCL_NVLS_ENABLE=0 where
it is set). Targets (issue 20) are evaluated in the output
(`evaluate_targets`): bus bandwidth >= 0.97x torch's at every size from 1 MiB
to 4 GiB; an 8-byte all_reduce from a Python loop <= 20 us per call.

Module API for the benchmark driver: run(quick: bool) -> list[dict] (rows of
benchlib.row). Run as a script to measure and write
benchmarks/results/allreduce_<device>_<N>gpu[_quick].json and .txt:
python benchmarks/bench_allreduce.py [--quick] [--gpus N] [--outdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchlib import MAX_TIMES_IN_JSON, require_gpu, row, torch_cuda  # noqa: E402

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# nccl-tests' sweep: 8 B to 4 GiB, doubling; quick: a few sizes up to 64 MiB.
SIZES = tuple(8 << i for i in range(30))
QUICK_SIZES = (8, 4 * KIB, MIB, 64 * MIB)
# Repeats per size and seconds of timed calls per size and implementation (counts the
# workers fix in advance: every rank must make the same calls).
REPEATS = {False: 30, True: 10}
BUDGET_S = {False: 1.0, True: 0.2}
LATENCY_CALLS = {False: 2000, True: 200}
GRAPH_CALLS = 100
TIMEOUT_S = {False: 600.0, True: 120.0}
OP = "all_reduce"
PARITY = 0.97
PARITY_FROM, PARITY_TO = MIB, 4 * GIB
LOOP_TARGET_US = 20.0


# ---- targets (pure, tested on the CPU) -------------------------------------------------------


def compare_with_torch(rows: list[dict]) -> None:
    """busbw_vs_torch (ours / torch's bus bandwidth) on cudalab rows of the size sweep."""
    theirs = {r["bytes"]: r for r in rows if r["impl"] == "torch" and r.get("part") == "sweep"}
    for r in rows:
        t = theirs.get(r.get("bytes"))
        if r["impl"] == "cudalab" and r.get("part") == "sweep" and t is not None:
            r["busbw_vs_torch"] = t["median_ms"] / r["median_ms"]


def evaluate_targets(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """evaluate_targets(rows) -> list of dict

    Each target with the measured value, its bound and whether it held
    (``held`` None when the rows lack what it needs: no torch, one GPU, no
    size in the range).
    """
    ranks = max((r.get("ranks", 1) for r in rows), default=1)
    ratios = [(r["bytes"], r["busbw_vs_torch"]) for r in rows
              if "busbw_vs_torch" in r and PARITY_FROM <= r["bytes"] <= PARITY_TO]
    low = min(ratios, key=lambda p: p[1]) if ratios and ranks > 1 else None
    loop = next((r for r in rows if r["impl"] == "cudalab" and r.get("part") == "host loop"),
                None)
    loop_us = None if loop is None or ranks < 2 else loop["median_ms"] * 1e3
    return [
        {"target": f"busbw >= {PARITY}x torch.distributed from 1 MiB to 4 GiB",
         "measured": None if low is None else low[1], "bound": PARITY, "unit": "x",
         "held": None if low is None else low[1] >= PARITY,
         "at": None if low is None else low[0]},
        {"target": f"8-byte all_reduce from a Python loop <= {LOOP_TARGET_US:g} us per call",
         "measured": loop_us, "bound": LOOP_TARGET_US, "unit": "us",
         "held": None if loop_us is None else loop_us <= LOOP_TARGET_US, "at": 8},
    ]


# ---- measuring -----------------------------------------------------------------------------


def _row(m: Any, impl: str, part: str, nbytes: int, n: int) -> dict:
    from cudalab.lessons import allreduce as A

    m = dataclasses.replace(m, label=OP, description=impl,
                            sub_label=None if part == "sweep" else part)
    return row(m, (max(1, nbytes // 4),), "float32", part=part, ranks=n, bytes=nbytes,
               count=max(1, nbytes // 4), algbw_gbps=A.algbw(nbytes, m.median) / 1e9,
               busbw_gbps=A.busbw(nbytes, m.median, n) / 1e9)


def run(quick: bool = False, gpus: int | None = None, extra: dict | None = None) -> list[dict]:
    """The rows: the size sweep of both libraries, then the 8-byte latencies. `extra` (a dict)
    receives the workers' versions and the correctness checks."""
    require_gpu("bench_allreduce")
    import cudalab
    from cudalab.lessons import multi_gpu as M
    from cudalab.lessons import allreduce as A

    n = cudalab.device_count() if gpus is None else min(gpus, cudalab.device_count())
    want_torch = torch_cuda() is not None
    free = min(cudalab.mem_get_info(d)[0] for d in range(n))
    sizes = A.sizes_that_fit(QUICK_SIZES if quick else SIZES, free,
                             A.BUFFERS + (A.TORCH_BUFFERS if want_torch else 0))
    params = {"sizes": list(sizes), "gpus": n, "repeats": REPEATS[quick],
              "budget_s": BUDGET_S[quick], "latency_calls": LATENCY_CALLS[quick],
              "graph_calls": GRAPH_CALLS, "torch": want_torch, "timeout": TIMEOUT_S[quick]}
    results = M.launch_workers(A.WORKER, n, {"params": params, "timeout": TIMEOUT_S[quick]},
                               TIMEOUT_S[quick], f"bench_allreduce: {n} worker(s)")
    rows = []
    for impl in ("cudalab", "torch"):
        for nbytes, per_rank in A.size_entries(results, impl).items():
            rows.append(_row(M.slowest_measurement(f"{impl} {nbytes}", per_rank, bytes=nbytes),
                             impl, "sweep", nbytes, n))
    for key in ("cudalab loop", "cudalab graph", "torch loop"):
        per_rank = [{**res["latency"][key], "device": res["device"],
                     "device_name": res["device_name"]}
                    for res in results if key in res.get("latency", {})]
        if len(per_rank) == len(results):
            impl, part = key.split()
            nbytes = int(results[0]["latency"]["bytes"])
            m = M.slowest_measurement(key, per_rank, bytes=nbytes, timer=M.TIMER_HOST)
            rows.append(_row(m, impl, "host loop" if part == "loop" else "graph replay",
                             nbytes, n))
    compare_with_torch(rows)
    if extra is not None:
        info = results[0]
        extra.update({"ranks": n, "nccl": info["nccl"], "nccl_library": info["nccl_library"],
                      "torch": info["torch"], "torch_nccl": info["torch_nccl"],
                      "max_error": {k: max(A.worst_error(results, k).values(), default=None)
                                    for k in ("error", "torch_error")}})
        errors = [e for e in extra["max_error"].values() if e is not None]
        if any(e > A.SUM_TOLERANCE for e in errors):
            raise cudalab.CudalabError(f"bench_allreduce: a result is wrong: {extra['max_error']} "
                                       f"(tolerance {A.SUM_TOLERANCE})")
    return rows


# ---- output --------------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    from cudalab.lessons.analysis import format_bytes_short

    return format_bytes_short(nbytes)


def table(rows: Sequence[dict]) -> str:
    """nccl-tests' columns, cudalab and torch side by side, then the latencies."""
    sweep = {(r["impl"], r["bytes"]): r for r in rows if r["part"] == "sweep"}
    sizes = sorted({b for _, b in sweep})
    head = (f"{'size':>9} {'count':>11} | {'cudalab us':>10} {'algbw':>7} {'busbw':>7} | "
            f"{'torch us':>10} {'algbw':>7} {'busbw':>7} | {'ratio':>6}")
    lines = [head, "-" * len(head)]
    for b in sizes:
        ours, theirs = sweep.get(("cudalab", b)), sweep.get(("torch", b))
        cells = [f"{_size(b):>9} {max(1, b // 4):>11}"]
        for r in (ours, theirs):
            cells.append("-".rjust(26) if r is None else
                         f"{r['median_ms'] * 1e3:>10.2f} {r['algbw_gbps']:>7.2f} "
                         f"{r['busbw_gbps']:>7.2f}")
        ratio = None if ours is None else ours.get("busbw_vs_torch")
        cells.append("-".rjust(6) if ratio is None else f"{ratio:>6.3f}")
        lines.append(" | ".join(cells) + ("  !" if ours and ours.get("warning") else ""))
    lines.append("")
    for r in rows:
        if r["part"] != "sweep":
            lines.append(f"8-byte all_reduce, {r['impl']} {r['part']}: "
                         f"{r['median_ms'] * 1e3:.2f} us per call")
    lines.append("(us per call; GB/s; ratio = cudalab busbw / torch busbw; slowest rank's median)")
    return "\n".join(lines)


def targets_text(targets: list[dict]) -> str:
    lines = ["Targets:"]
    for t in targets:
        verdict = {True: "held", False: "MISSED", None: "not measured"}[t["held"]]
        value = "-" if t["measured"] is None else f"{t['measured']:.3f} {t['unit']}"
        at = "" if t.get("at") is None else f" at {_size(t['at'])}"
        lines.append(f"- {t['target']}: {value}{at}: {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpus", type=int, default=None, help="use the first N GPUs")
    parser.add_argument("--outdir", type=Path, default=HERE / "results")
    args = parser.parse_args()

    import cudalab
    from cudalab.bench import write_results

    extra: dict[str, Any] = {}
    try:
        rows = run(args.quick, args.gpus, extra)
    except cudalab.NoDeviceError as exc:
        print(exc, file=sys.stderr)
        return 1
    targets = evaluate_targets(rows)
    n = extra["ranks"]
    text = (f"{n} GPU(s), NCCL {extra['nccl']} (cudalab), torch {extra['torch']} "
            f"(NCCL {extra['torch_nccl']})\n" + table(rows) + "\n\n" + targets_text(targets))
    print(text)
    props = cudalab.get_device_properties(0)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    stem = f"allreduce_{slug}_{n}gpu{'_quick' if args.quick else ''}"
    args.outdir.mkdir(parents=True, exist_ok=True)
    path = args.outdir / f"{stem}.json"
    command = "python benchmarks/bench_allreduce.py" + (" --quick" if args.quick else "") + \
        (f" --gpus {args.gpus}" if args.gpus else "")
    write_results(path, "compute_benchmarks", rows, max_times=MAX_TIMES_IN_JSON, command=command,
                  extra={"targets": targets, **extra})
    (args.outdir / f"{stem}.txt").write_text(f"{props.name} x{n}\n{text}\n", encoding="utf-8")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
