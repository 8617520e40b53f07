"""cudalab.bench: the one measurement engine behind every figure cudalab prints.

* Presets (`PRESETS`, `Preset`): named timing settings, ``"quick"``,
  ``"default"`` and ``"sustained"``; callers pick one by name.
* `measure(fn, *args, preset=..., ...)` / `Timer(preset, ...).measure(fn, ...)`:
  time GPU work with CUDA events (warm-up, back-to-back repeats held behind a
  spin kernel, noise-based stop, optional L2 flush); a `Measurement`.
* `Measurement`: raw times, median/IQR/min, host time and launch gap per call,
  TFLOP/s, GB/s, % of a measured ceiling, device, clocks and the settings;
  JSON round trip; `Measurement.merge` pools repeated runs.
* `Compare(measurements).print()`: tables in torch.utils.benchmark's layout.
* Cases (`cudalab.bench.cases`): copy, matmul per dtype, host<->device
  transfers and launch latency, defined once and used by the ceilings, the
  CLI and ``benchmarks/``.
* `ceilings()` / `ceiling(name)`: what this GPU measurably does at best,
  measured once per process, beside the theoretical peaks;
  `ceiling_preset("quick")` makes the first measurement light (quick lessons).
* `host_clock` / `host_measurement`: host-clock timing for host-side figures.
* Results files (`cudalab.bench.results`): one JSON schema with one machine
  block, written by `write_results` and read by `read_results`; baselines
  and regressions in `cudalab.bench.baseline` (`load_baseline(path)`,
  `compare(measurement, baseline)`: a `Comparison`).
"""

from . import baseline, cases, results
from .baseline import Comparison, compare, load_baseline, parse_threshold
from .cases import (MATMUL_DTYPES, Case, CopyCase, LaunchCase, MatmulCase, Prepared, TransferCase,
                    torch_cuda)
from .ceilings import CEILING_NAMES, Ceiling, Ceilings, ceiling, ceiling_preset, ceilings
from .compare_table import Compare
from .hostclock import host_clock, host_measurement
from .measurement import Measurement, format_time
from .presets import PRESETS, Preset, get_preset
from .results import (RESULTS_SCHEMA, Results, Row, dumps, machine_info, read_results, results_dict,
                      write_results)
from .timer import MEASURE_OPTIONS, WORK_OPTIONS, Timer, measure

__all__ = [
    "CEILING_NAMES",
    "MATMUL_DTYPES",
    "MEASURE_OPTIONS",
    "PRESETS",
    "RESULTS_SCHEMA",
    "Case",
    "Ceiling",
    "Ceilings",
    "Compare",
    "Comparison",
    "CopyCase",
    "LaunchCase",
    "MatmulCase",
    "Measurement",
    "Preset",
    "Prepared",
    "Results",
    "Row",
    "Timer",
    "TransferCase",
    "WORK_OPTIONS",
    "baseline",
    "cases",
    "ceiling",
    "ceiling_preset",
    "ceilings",
    "compare",
    "dumps",
    "format_time",
    "get_preset",
    "host_clock",
    "host_measurement",
    "load_baseline",
    "machine_info",
    "measure",
    "parse_threshold",
    "read_results",
    "results",
    "results_dict",
    "torch_cuda",
    "write_results",
]
