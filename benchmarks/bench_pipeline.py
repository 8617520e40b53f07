"""Copy in, compute, copy out: chunks on 3 streams vs the same work on one stream.

The lesson behind it: with pinned host buffers and non_blocking copies, the
host-to-device copy of one chunk, the kernels of another and the
device-to-host copy of a third run at the same time (separate copy engines
and the SMs), so the pipeline approaches the time of its slowest stage
instead of the sum of all three.

Timing: the host clock around each whole pipeline (`cudalab.bench.host_clock`),
which returns once every stream has finished, the variants interleaved in
rounds after the preset's warm-up each. Not `cudalab.bench.measure`: its CUDA
events go on one stream (the legacy default stream) and the pipeline runs on
streams of its own, which are non-blocking and so do not order with events
there; the span that matters is the host's, from the first copy enqueued to
the last one done.

``run(quick)`` returns result rows; ``pipeline(...)`` is the work itself and
is also what tests/test_pipeline_gpu.py checks for correctness (it needs
nothing but cudalab and NumPy).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row  # noqa: E402

MIB = 1 << 20
TIMER = "host clock around the whole pipeline (it returns synchronized)"


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
    require_gpu("bench_pipeline")
    import cudalab as cl
    from cudalab.bench import host_clock, host_measurement

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
    cases = {name: (lambda streams=streams: pipeline(cl, streams, host_in, host_out, chunks))
             for name, streams in variants.items()}
    times = host_clock(cases, 5 if quick else 10, warmup=preset(quick).warmup)
    measurements = {
        name: host_measurement(samples, calls=1, label="pipeline_h2d_compute_d2h",
                               sub_label=name, description="cudalab", bytes=2 * total,
                               host_time=False, timer=TIMER, metadata={"chunks": chunks})
        for name, samples in times.items()
    }
    serial = measurements["1 stream (serialized)"].median
    return [row(m, [n], "float32", chunks=chunks, speedup_vs_serialized=serial / m.median)
            for m in measurements.values()]


if __name__ == "__main__":
    sys.exit(main(run))
