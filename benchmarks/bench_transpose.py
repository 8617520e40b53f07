"""Benchmarks of transpose (every teaching version), ascontiguousarray(a.T) and
device random numbers, each beside PyTorch in the same run.

``run(quick)`` returns a list of dicts (one per op and implementation):
``{"op", "impl", "shape", "dtype", "median_ms", "iqr_ms", "gb_per_s", "bytes"}``.

* transpose of an N x N float32 matrix (N = 16384, quick: 4096): bytes = read +
  written = 2 * N * N * 4. cudalab rows: ``transpose`` (the default, v5 best)
  and ``transpose_<method>`` for each teaching version; torch row:
  ``x.t().contiguous()`` under op ``transpose``.
* ``ascontiguousarray_T``: cudalab.ascontiguousarray(x.T) (copy.cu routes it to
  the best tiled kernel) and torch's x.t().contiguous() again.
* ``copy``: a plain device-to-device copy of the same matrix, the ceiling the
  transposes are measured against (cudalab x.copy(), torch y.copy_(x)).
* ``random_normal`` / ``random_uniform``: 256M float32 values (quick: 32M),
  bytes = written; torch.randn / torch.rand beside.

Timing: CUDA events from torch when it imports (cudalab runs on the legacy
default stream, which is torch's default stream too), otherwise
synchronize + perf_counter; warm-up, then >= 20 repeats; median and IQR.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable
from timing import times_ms  # noqa: E402

METHODS = ["naive", "coalesced_write", "tiled", "tiled_padded", "best"]


def _torch():
    try:
        import torch
    except Exception:  # torch is optional
        return None
    return torch if torch.cuda.is_available() else None


def _timer(torch, cudalab) -> Callable[[Callable[[], Any], int, int], list[float]]:
    return times_ms


def _row(op, impl, shape, dtype, times, nbytes) -> dict:
    q = statistics.quantiles(times, n=4)
    median = statistics.median(times)
    return {
        "op": op,
        "impl": impl,
        "shape": list(shape),
        "dtype": dtype,
        "median_ms": median,
        "iqr_ms": q[2] - q[0],
        "gb_per_s": nbytes / (median * 1e-3) / 1e9,
        "bytes": nbytes,
    }


def run(quick: bool = False) -> list[dict]:
    import cudalab

    torch = _torch()
    timer = _timer(torch, cudalab)
    warmup, repeats = (3, 20) if quick else (5, 30)
    n = 4096 if quick else 16384
    shape = (n, n)
    nbytes = 2 * n * n * 4
    rows: list[dict] = []

    x = cudalab.random.uniform(shape, -1.0, 1.0, seed=0)  # generated on the device
    for method in METHODS:
        op = "transpose" if method == "best" else f"transpose_{method}"
        times = timer(lambda m=method: cudalab.transpose(x, method=m), warmup, repeats)
        rows.append(_row(op, "cudalab", shape, "float32", times, nbytes))
    times = timer(lambda: cudalab.ascontiguousarray(x.T), warmup, repeats)
    rows.append(_row("ascontiguousarray_T", "cudalab", shape, "float32", times, nbytes))
    times = timer(lambda: x.copy(), warmup, repeats)
    rows.append(_row("copy", "cudalab", shape, "float32", times, nbytes))
    del x

    if torch is not None:
        t = torch.rand(shape, device="cuda", dtype=torch.float32)
        times = timer(lambda: t.t().contiguous(), warmup, repeats)
        rows.append(_row("transpose", "torch", shape, "float32", times, nbytes))
        rows.append(_row("ascontiguousarray_T", "torch", shape, "float32", times, nbytes))
        out = torch.empty_like(t)
        times = timer(lambda: out.copy_(t), warmup, repeats)
        rows.append(_row("copy", "torch", shape, "float32", times, nbytes))
        del t, out
        torch.cuda.empty_cache()

    count = (32 if quick else 256) * 2**20
    rbytes = count * 4
    for op, fn in [
        ("random_normal", lambda: cudalab.random.normal(count, seed=1)),
        ("random_uniform", lambda: cudalab.random.uniform(count, seed=1)),
    ]:
        rows.append(_row(op, "cudalab", (count,), "float32", timer(fn, warmup, repeats), rbytes))
    if torch is not None:
        g = torch.Generator(device="cuda")
        g.manual_seed(1)
        for op, fn in [
            ("random_normal", lambda: torch.randn(count, device="cuda", generator=g)),
            ("random_uniform", lambda: torch.rand(count, device="cuda", generator=g)),
        ]:
            rows.append(_row(op, "torch", (count,), "float32", timer(fn, warmup, repeats),
                             rbytes))
    return rows


if __name__ == "__main__":  # python benchmarks/bench_transpose.py [--quick]
    import sys

    for r in run("--quick" in sys.argv):
        print(f"{r['op']:>24} {r['impl']:>8} {r['median_ms']:9.3f} ms "
              f"(IQR {r['iqr_ms']:.3f}) {r['gb_per_s']:8.1f} GB/s")
