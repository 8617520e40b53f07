"""Profiler overhead: dispatch time of a small op with cudalab.profiler off and on.

* ``add_inplace_dispatch``: host wall time per in-place add of 1,024 float32
  (``x += y``) issued 10,000 times from Python with one synchronize at the end,
  as in bench_streams.py, median and IQR over repeats. Variants, interleaved
  in rounds so that clock drift hits all of them alike:

  - ``profiler off``: the normal case (no profile, NVTX off): each op tests
    one C flag. Compare with bench_streams.py's ``add_inplace_dispatch``
    (4.5 us per op on an H200 before the profiler existed);
  - ``nvtx on``: NVTX ranges forced on without a tool attached (what an op
    costs under Nsight Systems, less the tool's own work);
  - ``profiler on``: inside ``cudalab.profiler.profile()`` (a record and two
    CUDA event records per op). Reading the events when the profile ends is
    not in the timed loop; ``exit_ms`` reports it per profile.

``run(quick)`` returns one dict per variant with median_ms/iqr_ms (ms per op),
``us_per_op`` and ``overhead_us_per_op`` (against ``profiler off``); it imports
without a GPU (and then returns no rows).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from timing import median_iqr  # noqa: E402

N = 1024
ITERS = 10_000


def _row(variant: str, per_op_ms: list[float], **extra: Any) -> dict[str, Any]:
    median, iqr = median_iqr(per_op_ms)
    return {
        "op": "add_inplace_dispatch",
        "impl": "cudalab",
        "variant": variant,
        "shape": [N],
        "dtype": "float32",
        "median_ms": median,
        "iqr_ms": iqr,
        "us_per_op": median * 1e3,
        "repeats": len(per_op_ms),
        "iters": ITERS,
        "timer": "host wall",
        **extra,
    }


def run(quick: bool) -> list[dict[str, Any]]:
    import numpy as np

    import cudalab as cl
    from cudalab import _core

    if not cl.is_available():
        return []
    repeats = 5 if quick else 20
    x_h = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
    x, y = cl.asarray(x_h), cl.asarray(x_h)

    def loop(n: int) -> None:
        a, b = x, y
        for _ in range(n):
            a += b

    def per_op_ms() -> float:
        cl.synchronize()
        t0 = time.perf_counter()
        loop(ITERS)
        cl.synchronize()
        return (time.perf_counter() - t0) * 1e3 / ITERS

    nvtx_at_start = _core._nvtx_set_enabled(False)
    samples: dict[str, list[float]] = {"profiler off": [], "nvtx on": [], "profiler on": []}
    exit_ms: list[float] = []

    def profiled() -> float:
        prof = cl.profiler.profile()
        with prof:
            ms = per_op_ms()
            t0 = time.perf_counter()
        exit_ms.append((time.perf_counter() - t0) * 1e3)
        assert len(prof.events()) == ITERS
        return ms

    def with_nvtx() -> float:
        _core._nvtx_set_enabled(True)
        try:
            return per_op_ms()
        finally:
            _core._nvtx_set_enabled(False)

    variants: dict[str, Callable[[], float]] = {
        "profiler off": per_op_ms,
        "nvtx on": with_nvtx,
        "profiler on": profiled,
    }
    try:
        loop(200)  # warm-up, and one profile to fill the profiler's event pool
        profiled()
        exit_ms.clear()
        for _ in range(repeats):
            for name, fn in variants.items():
                samples[name].append(fn())
    finally:
        _core._nvtx_set_enabled(nvtx_at_start)

    off, _ = median_iqr(samples["profiler off"])
    rows = []
    for name, values in samples.items():
        extra: dict[str, Any] = {"overhead_us_per_op": (median_iqr(values)[0] - off) * 1e3}
        if name == "profiler on":
            extra["exit_ms"] = median_iqr(exit_ms)[0]
        rows.append(_row(name, values, **extra))
    return rows


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=1))
