"""Profiler overhead: dispatch time of a small op with cudalab.profiler off and on.

* ``add_inplace_dispatch``: host time per in-place add of 1,024 float32
  (``x += y``) issued 10,000 times from Python with one synchronize at the end,
  measured as in bench_streams.py (`cudalab.bench.host_clock`: the preset's
  warm-up per variant, then the host clock around each loop), median and IQR over
  repeats. Variants, interleaved in rounds so that clock drift hits all of
  them alike:

  - ``profiler off``: the normal case (no profile, NVTX off): each op tests
    one C flag. Compare with bench_streams.py's ``add_inplace_dispatch``;
  - ``nvtx on``: NVTX ranges forced on without a tool attached (what an op
    costs under Nsight Systems, less the tool's own work);
  - ``profiler on``: inside ``cudalab.profiler.profile()`` (a record and two
    CUDA event records per op). Reading the events when the profile ends is
    not in the timed loop; ``exit_ms`` reports it per profile.

``run(quick)`` returns one dict per variant with median_ms/iqr_ms (ms per op),
``us_per_op`` and ``overhead_us_per_op`` (against ``profiler off``) and the
rest of benchlib.row's keys; a GPU is needed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row  # noqa: E402

N = 1024
ITERS = 10_000
TIMER = "host clock around the calls + one synchronize"


def run(quick: bool) -> list[dict[str, Any]]:
    require_gpu("bench_profiler")
    import statistics

    import numpy as np

    import cudalab as cl
    from cudalab import _core
    from cudalab.bench import host_clock, host_measurement

    repeats = 5 if quick else 20
    x_h = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
    x, y = cl.asarray(x_h), cl.asarray(x_h)

    def loop() -> None:
        a, b = x, y
        for _ in range(ITERS):
            a += b
        cl.synchronize()

    exit_s: list[float] = []

    def profiled() -> None:
        prof = cl.profiler.profile()
        with prof:
            loop()
            t0 = time.perf_counter()
        exit_s.append(time.perf_counter() - t0)
        assert len(prof.events()) == ITERS

    def with_nvtx() -> None:
        _core._nvtx_set_enabled(True)
        try:
            loop()
        finally:
            _core._nvtx_set_enabled(False)

    variants: dict[str, Callable[[], None]] = {
        "profiler off": loop,
        "nvtx on": with_nvtx,
        "profiler on": profiled,
    }
    nvtx_at_start = _core._nvtx_set_enabled(False)
    try:
        times = host_clock(variants, repeats, warmup=preset(quick).warmup)
    finally:
        _core._nvtx_set_enabled(nvtx_at_start)
    exit_s = exit_s[-repeats:]  # the timed profiles only, not the warm-up's

    measurements = {
        name: host_measurement(samples, calls=ITERS, label="add_inplace_dispatch",
                               sub_label=name, description="cudalab", timer=TIMER)
        for name, samples in times.items()
    }
    off = measurements["profiler off"].median
    rows = []
    for name, m in measurements.items():
        extra: dict[str, Any] = {"us_per_op": m.median * 1e6, "iters": ITERS,
                                 "overhead_us_per_op": (m.median - off) * 1e6}
        if name == "profiler on":
            extra["exit_ms"] = statistics.median(exit_s) * 1e3
        rows.append(row(m, [N], "float32", **extra))
    return rows


if __name__ == "__main__":
    sys.exit(main(run))
