"""Validate the measurement layer against references that do not depend on it.

1. Timer accuracy: a kernel spinning a known number of SM clock cycles must
   take cycles / clock seconds. The clock is NVML's SM clock read right after
   the measurement (the spin runs at the clock the GPU holds then).
2. Profiler consistency: the GPU times the profiler gives the three ops of a
   script (matmul, add, sum on 4096 x 4096 float32) must add up to the time
   CUDA events measure around the whole script.

Writes benchmarks/results/measurement_validation_<device>.json (through
`cudalab.bench.write_results`; one row per spin with its Measurement) and
prints a summary. Usage: python benchmarks/validate_measurement.py
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import cudalab as cl
from cudalab import _core, _nvml
from cudalab.bench import Row, measure, write_results


def sm_clock_hz() -> float:
    live = _nvml.sample(cl.current_device())
    if live and live.get("sm_clock_mhz"):
        return live["sm_clock_mhz"] * 1e6
    return cl.get_device_properties().clock_rate_khz * 1e3


def timer_accuracy() -> list[Row]:
    rows = []
    for target in (20e-6, 200e-6, 2e-3, 20e-3):
        # Cycles from the max boost clock (an idle GPU reports a low clock);
        # the expected time uses the clock NVML reports right after the run.
        cycles = int(target * cl.get_device_properties().clock_rate_khz * 1e3)
        m = measure(_core._spin, cycles, label="spin", sub_label=f"{target * 1e6:g} us")
        clock = sm_clock_hz()
        expected = cycles / clock
        rows.append(Row(m, {"cycles": cycles, "sm_clock_mhz": clock / 1e6, "expected_s": expected,
                            "median_s": m.median, "error_pct": 100 * (m.median / expected - 1),
                            "relative_iqr": m.relative_iqr, "calls_per_repeat": m.number_per_run,
                            "held": m.held, "repeats": m.repeats}))
    return rows


def profiler_consistency() -> dict:
    n = 4096
    a = cl.random.normal((n, n), dtype="float32", seed=1)

    def script():
        c = cl.matmul(a, a)
        d = c + a
        return cl.sum(d)

    for _ in range(3):
        script()
    cl.synchronize()
    results = []
    for _ in range(5):
        start, end = cl.Event(), cl.Event()
        with cl.profiler.profile() as prof:
            start.record()
            script()
            end.record()
        total_ms = start.elapsed_time(end)
        ops = [(e.name, e.gpu_duration_ns / 1e6) for e in prof.events() if e.kind == "op"]
        op_ms = sum(ms for _, ms in ops)
        results.append({"ops": ops, "sum_of_op_gpu_ms": op_ms, "event_total_ms": total_ms,
                        "ratio": op_ms / total_ms})
    return {"runs": results, "median_ratio": statistics.median(r["ratio"] for r in results),
            "table": prof.key_averages().table(sort_by="gpu_time_total", row_limit=10)}


def main() -> int:
    if not cl.is_available():
        print("validate_measurement: no CUDA device is available", file=sys.stderr)
        return 1
    props = cl.get_device_properties()
    with _nvml.session():
        timer = timer_accuracy()
    profile = profiler_consistency()
    for r in (row.fields for row in timer):
        print(f"spin {r['cycles']:>10} cycles @ {r['sm_clock_mhz']:.0f} MHz: expected "
              f"{r['expected_s'] * 1e6:9.2f} us, measured {r['median_s'] * 1e6:9.2f} us "
              f"({r['error_pct']:+.2f}%), {r['calls_per_repeat']} call(s)/repeat, held={r['held']}")
    print(profile["table"])
    for r in profile["runs"]:
        print(f"profile: ops {', '.join(f'{n} {ms:.3f} ms' for n, ms in r['ops'])}; sum "
              f"{r['sum_of_op_gpu_ms']:.3f} ms vs events {r['event_total_ms']:.3f} ms "
              f"(ratio {r['ratio']:.4f})")
    slug = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    out = Path(__file__).parent / "results" / f"measurement_validation_{slug}.json"
    write_results(out, "measurement_validation", timer,
                  command="python benchmarks/validate_measurement.py",
                  extra={"profiler_consistency": profile})
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
