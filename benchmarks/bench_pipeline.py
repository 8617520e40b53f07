"""Copy in, compute, copy out: chunks on 3 streams vs the same work on one stream.

The lesson behind it: with pinned host buffers and non_blocking copies, the
host-to-device copy of one chunk, the kernels of another and the
device-to-host copy of a third run at the same time (separate copy engines
and the SMs), so the pipeline approaches the time of its slowest stage
instead of the sum of all three.

``run(quick)`` returns result rows; ``pipeline(...)`` is the work itself and
is also what tests/test_pipeline_gpu.py checks for correctness.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_iqr  # noqa: E402

MIB = 1 << 20


def pipeline(cl, streams, host_in: np.ndarray, host_out: np.ndarray, chunks: int) -> None:
    """host_out = gelu(2 * host_in + 1), chunk by chunk, round-robin over `streams`.

    Both host arrays should be pinned (cudalab.pinned_empty) for the copies to
    be asynchronous. Returns once every stream has finished.
    """
    n = host_in.shape[0] // chunks
    live = []  # device arrays stay referenced until their stream is done
    for i in range(chunks):
        part = slice(i * n, host_in.shape[0] if i == chunks - 1 else (i + 1) * n)
        with streams[i % len(streams)]:
            d = cl.asarray(host_in[part], non_blocking=True)
            y = cl.axpy(2.0, d, 1.0)
            cl.gelu(y, out=y)
            y.get(out=host_out[part], non_blocking=True)
            live.append((d, y))
    for s in streams:
        s.synchronize()


def run(quick: bool = False) -> list[dict]:
    import cudalab as cl

    total = (64 if quick else 512) * MIB
    chunks = 16
    n = total // 4
    host_in = cl.pinned_empty(n, dtype=np.float32)
    host_in[:] = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    host_out = cl.pinned_empty(n, dtype=np.float32)
    variants = {
        "1 stream (serialized)": [cl.Stream()],
        "3 streams (pipelined)": [cl.Stream() for _ in range(3)],
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, streams in variants.items():  # warm-up: pool, handles, module load
        pipeline(cl, streams, host_in, host_out, chunks)
    for _ in range(5 if quick else 10):  # interleaved, so drift hits both alike
        for name, streams in variants.items():
            cl.synchronize()
            t0 = time.perf_counter()
            pipeline(cl, streams, host_in, host_out, chunks)
            times[name].append((time.perf_counter() - t0) * 1e3)
    rows = []
    serial_ms = median_iqr(times["1 stream (serialized)"])[0]
    for name, samples in times.items():
        median, iqr = median_iqr(samples)
        rows.append({
            "op": "pipeline_h2d_compute_d2h", "impl": "cudalab", "variant": name,
            "shape": [n], "dtype": "float32", "chunks": chunks,
            "median_ms": median, "iqr_ms": iqr, "repeats": len(samples),
            "bytes": 2 * total, "gb_per_s": 2 * total / (median * 1e-3) / 1e9,
            "speedup_vs_serialized": serial_ms / median,
            "timer": "host wall clock around the whole pipeline (it ends synchronized)",
        })
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv[1:]):
        print(f"{row['variant']:<24} {row['median_ms']:8.2f} ms  {row['gb_per_s']:6.1f} GB/s  "
              f"x{row['speedup_vs_serialized']:.2f}")
