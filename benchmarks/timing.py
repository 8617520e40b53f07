"""CUDA-event timing shared by the benchmark modules (until cudalab.bench exists).

cudalab enqueues its work on CUDA's legacy default stream, which is also
PyTorch's default stream, so torch.cuda.Event records order with cudalab
launches and one timer measures both libraries the same way.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def times_ms(fn: Callable[[], object], warmup: int = 3, repeats: int = 30) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn`, after `warmup` calls.

    Each call is bracketed by a pair of CUDA events (PyTorch's) when PyTorch
    with CUDA is installed; otherwise by the host clock around a
    cudalab.synchronize(), which also counts launch overhead.
    """
    for _ in range(warmup):
        fn()
    torch = _torch_cuda()
    if torch is None:
        import cudalab

        cudalab.synchronize()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            cudalab.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def median_iqr(values: list[float]) -> tuple[float, float]:
    """Median and inter-quartile range (0 with fewer than 4 values)."""
    if len(values) < 4:
        return statistics.median(values), 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[1], q[2] - q[0]


def time_cuda(fn: Callable[[], object], warmup: int = 5, repeats: int = 30,
              inner: int = 1) -> dict[str, float]:
    """Median and IQR (ms per call) of `fn`, timed with CUDA events.

    Each repeat records an event pair around `inner` back-to-back calls, so
    very short ops are timed as a block and launch gaps are included.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
    torch.cuda.synchronize()
    samples = sorted(s.elapsed_time(e) / inner for s, e in zip(starts, ends))
    q = statistics.quantiles(samples, n=4)
    return {"median_ms": statistics.median(samples), "iqr_ms": q[2] - q[0],
            "min_ms": samples[0], "repeats": repeats}


def row(op: str, impl: str, shape, dtype: str, timing: dict[str, float], *,
        bytes: int | None = None, flops: int | None = None, **extra) -> dict:
    """One result row; GB/s from bytes read + written, TFLOP/s from flops."""
    seconds = timing["median_ms"] / 1e3
    out = {"op": op, "impl": impl, "shape": list(shape), "dtype": dtype, **timing}
    if bytes is not None:
        out["bytes"] = bytes
        out["gb_per_s"] = bytes / seconds / 1e9
    if flops is not None:
        out["flops"] = flops
        out["tflops"] = flops / seconds / 1e12
    out.update(extra)
    return out
