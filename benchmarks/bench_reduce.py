"""Benchmark: reductions (cudalab.sum) beside torch.sum on the same shapes.

``run(quick)`` returns one dict per (op, impl):

* ``sum_all``   -- sum over every element of a 1 GiB float32 vector (quick: 64 MiB)
* ``sum_axis0`` -- sum over axis 0 of a (16384, 16384) float32 matrix (quick: 4096^2),
  the strided-axis kernel (threads over columns)
* ``sum_axis1`` -- sum over axis 1 of the same matrix, the contiguous-row kernel
* ``d2d_copy``  -- torch's device-to-device copy of the 1 GiB vector, the ceiling the
  issue measures against (bytes read + written)

GB/s counts the bytes read plus the bytes written (the result is tiny next to
the input, so this is essentially the 1 GiB read). Timing uses
``torch.cuda.Event`` on the default stream, which is also the stream cudalab
enqueues on, after a warm-up; without torch it falls back to wall-clock time
around ``cudalab.synchronize()``. Each figure is the median of >= 20 repeats,
with the interquartile range. Arrays are filled with a non-zero constant on the
device (values don't change the timing of a sum).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import cudalab
from timing import median_iqr, times_ms  # noqa: E402

try:  # torch is optional: only needed for the comparison rows and events
    import torch
except Exception:  # pragma: no cover - no torch on this machine
    torch = None


def _have_torch_cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


def _time_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> tuple[float, float]:
    """Median and IQR (ms) of `reps` timed calls of fn, each bracketed by events."""
    return median_iqr(times_ms(fn, warmup, reps))


def _row(op: str, impl: str, shape, nbytes: int, ms: float, iqr: float) -> dict:
    return {
        "op": op,
        "impl": impl,
        "shape": list(shape),
        "dtype": "float32",
        "median_ms": ms,
        "iqr_ms": iqr,
        "gb_per_s": nbytes / (ms * 1e-3) / 1e9,
        "bytes": nbytes,
    }


def run(quick: bool = False) -> list[dict]:
    if not cudalab.is_available():
        return []
    reps = 20 if quick else 50
    rows: list[dict] = []
    n = (64 << 20) // 4 if quick else (1 << 30) // 4
    side = 4096 if quick else 16384
    value = 1.0009765625  # exactly representable, never zero

    # ---- sum over everything -------------------------------------------------
    x = cudalab.full((n,), value, dtype=np.float32)
    nbytes = n * 4 + 4
    ms, iqr = _time_ms(lambda: cudalab.sum(x), reps)
    rows.append(_row("sum_all", "cudalab", (n,), nbytes, ms, iqr))
    del x
    if _have_torch_cuda():
        t = torch.full((n,), value, dtype=torch.float32, device="cuda")
        ms, iqr = _time_ms(lambda: torch.sum(t), reps)
        rows.append(_row("sum_all", "torch", (n,), nbytes, ms, iqr))
        dst = torch.empty_like(t)
        ms, iqr = _time_ms(lambda: dst.copy_(t), reps)
        rows.append(_row("d2d_copy", "torch", (n,), 2 * n * 4, ms, iqr))
        del t, dst
        torch.cuda.empty_cache()

    # ---- sum over one axis of a square matrix ----------------------------------
    m = cudalab.full((side, side), value, dtype=np.float32)
    nbytes = side * side * 4 + side * 4
    for axis in (0, 1):
        ms, iqr = _time_ms(lambda: cudalab.sum(m, axis=axis), reps)
        rows.append(_row(f"sum_axis{axis}", "cudalab", (side, side), nbytes, ms, iqr))
    del m
    cudalab.empty_cache()
    if _have_torch_cuda():
        tm = torch.full((side, side), value, dtype=torch.float32, device="cuda")
        for axis in (0, 1):
            ms, iqr = _time_ms(lambda: torch.sum(tm, dim=axis), reps)
            rows.append(_row(f"sum_axis{axis}", "torch", (side, side), nbytes, ms, iqr))
        del tm
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":  # pragma: no cover - manual use on a GPU machine
    import json
    import sys

    for r in run(quick="--quick" in sys.argv):
        print(json.dumps(r))
