"""cudalab.bench: one careful harness for every figure cudalab prints.

* `measure(fn, *args, ...)` times GPU work with CUDA events (warm-up,
  back-to-back repeats held behind a spin kernel, noise-based stop, optional
  L2 flush) and returns a `Measurement`.
* `Measurement`: raw times, median/IQR/min, host time and launch gap per call,
  TFLOP/s, GB/s, % of a measured ceiling, device and clocks; JSON round trip;
  `Measurement.merge` pools repeated runs.
* `Compare(measurements).print()`: tables in torch.utils.benchmark's layout.
* `ceilings()` / `ceiling(name)`: what this GPU measurably does at best
  (copy bandwidth, pinned transfers, launch rate, GEMM peak per dtype),
  measured once per process, beside the theoretical peaks.
"""

from .ceilings import CEILING_NAMES, Ceiling, Ceilings, ceiling, ceilings
from .compare import Compare
from .measurement import Measurement, format_time
from .timer import measure

__all__ = [
    "CEILING_NAMES",
    "Ceiling",
    "Ceilings",
    "Compare",
    "Measurement",
    "ceiling",
    "ceilings",
    "format_time",
    "measure",
]
