"""What the benchmark modules share: measure() settings, result rows, the host clock.

Every GPU time comes from `cudalab.bench.measure` (CUDA events on the legacy
default stream, which PyTorch and CuPy use by default too, so their work is
timed the same way): warm-up, back-to-back repeats, a spin-kernel hold for
launch-bound calls, rounds that keep the GPU fed, and a noise-based stop.
Every benchmark passes the same `measure_settings(quick)`, so the cudalab and
PyTorch variants of a case are measured alike, one right after the other.

Two figures are host-side by nature and use `host_clock` instead: the
dispatch cost of an op issued from Python (host time per op over a long loop
that ends with a synchronize) and work that runs on several streams and
returns synchronized (the copy/compute pipeline). Their times become
`Measurement` objects too, so every row is built the same way by `row`.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from typing import Any, Callable, Mapping, Sequence

# Warm-up before every measurement: long enough for a power-capped GPU's
# clock to settle under load (an H200's fp16 GEMM clock falls from 1980 MHz to
# ~1400 MHz within 0.2 s), so no figure is taken at the idle boost clock.
WARMUP_S = 0.25
# Raw times kept in a row's "measurement" dict; above this, only the
# statistics (the JSON stays small: short ops reach thousands of repeats).
MAX_TIMES_IN_JSON = 200

MEASURE_TIMER = "CUDA events (cudalab.bench.measure)"


def measure_settings(quick: bool) -> dict[str, Any]:
    """The measure() keywords of every benchmark (the same for cudalab and torch)."""
    if quick:
        return {"warmup": WARMUP_S, "min_run_time": 0.05, "max_run_time": 0.25}
    return {"warmup": WARMUP_S, "min_run_time": 0.5, "max_run_time": 2.0}


def require_gpu(who: str) -> None:
    """Raise cudalab.NoDeviceError naming `who` when no CUDA device is usable."""
    import cudalab

    if not cudalab.is_available():
        raise cudalab.NoDeviceError(
            f"{who}: no CUDA device is available (the benchmarks time GPU work and need one)"
        )


def torch_cuda() -> Any:
    """PyTorch when it is installed and sees a CUDA device, else None (torch rows are skipped)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# ---- rows -------------------------------------------------------------------------


def measurement_dict(m: Any) -> dict[str, Any]:
    """m.to_dict(), without the raw times when there are more than MAX_TIMES_IN_JSON."""
    data = m.to_dict()
    if m.repeats > MAX_TIMES_IN_JSON:
        del data["times"]
        data["times_omitted"] = m.repeats
    return data


def row(m: Any, shape: Sequence[int], dtype: str, *, ops_per_call: int = 1,
        **extra: Any) -> dict[str, Any]:
    """One result row from a Measurement.

    op, impl and variant are the Measurement's label, description and
    sub_label. Times are per op: a call of the measured function that runs
    `ops_per_call` ops (a graph of 100 adds, say) is divided by it, and so are
    the bytes and FLOPs (the rates are the same either way).
    """
    per = ops_per_call
    out: dict[str, Any] = {"op": m.label, "impl": m.description}
    if m.sub_label is not None:
        out["variant"] = m.sub_label
    out.update({
        "shape": list(shape),
        "dtype": dtype,
        "median_ms": m.median / per * 1e3,
        "iqr_ms": m.iqr / per * 1e3,
        "min_ms": m.min / per * 1e3,
        "repeats": m.repeats,
        "calls_per_repeat": m.number_per_run,
    })
    if m.host_time is not None:
        out["host_us"] = m.host_time / per * 1e6
    if m.launch_gap is not None:
        out["launch_gap_us"] = m.launch_gap / per * 1e6
    if m.bytes is not None:
        out["bytes"] = round(m.bytes / per)
        out["gb_per_s"] = m.gbps
    if m.flops is not None:
        out["flops"] = round(m.flops / per)
        out["tflops"] = m.tflops
    if m.percent_of_ceiling is not None:
        out["ceiling"] = m.ceiling_name
        out["pct_of_ceiling"] = m.percent_of_ceiling
        if m.ceiling_name == "copy":
            out["pct_of_copy_ceiling"] = m.percent_of_ceiling
    out["timer"] = m.metadata.get("timer", MEASURE_TIMER)
    if m.warning:
        out["warning"] = m.warning
    out.update(extra)
    out["measurement"] = measurement_dict(m)
    return out


# ---- the host clock ---------------------------------------------------------------


def host_clock(cases: Mapping[str, Callable[[], Any]], repeats: int,
               warmup: float = WARMUP_S) -> dict[str, list[float]]:
    """Host seconds of each call of each case, interleaved in rounds.

    Every case must return only once its GPU work is done (end with a
    synchronize), so a call's host time is its whole span. Each case is
    warmed up for `warmup` seconds first; then every round calls each case
    once, so clock and thermal drift over the run hit all of them alike.
    """
    for fn in cases.values():
        fn()
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def host_measurement(times: Sequence[float], *, calls: int, label: str, description: str,
                     timer: str, sub_label: str | None = None, bytes: float | None = None,
                     host_time: bool = True, metadata: dict[str, Any] | None = None) -> Any:
    """A Measurement from `host_clock` times of `calls` calls each.

    With host_time (dispatch figures) the median per call is also the
    Measurement's host_time, so the row gets "host_us".
    """
    import cudalab
    from cudalab.bench import Measurement

    per_call = tuple(t / calls for t in times)
    device = cudalab.current_device()
    return Measurement(
        label=label,
        sub_label=sub_label,
        description=description,
        times=per_call,
        number_per_run=calls,
        host_time=statistics.median(per_call) if host_time else None,
        bytes=bytes,
        device=cudalab.get_device_properties(device).name,
        device_index=device,
        stop_reason="max_repeats",
        metadata={**(metadata or {}), "timer": timer},
    )


# ---- output -----------------------------------------------------------------------


def dumps(data: Any) -> str:
    """JSON with indent 2, lists of numbers kept on one line."""
    text = json.dumps(data, indent=2)
    # Only lists that json.dumps broke over lines: a JSON string has no raw
    # newline, so text inside strings is never touched.
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    flat = re.compile(r"\[\n\s*(" + number + r"(?:,\n\s*" + number + r")*)\n\s*\]")
    return flat.sub(lambda mo: "[" + re.sub(r",\n\s*", ", ", mo.group(1)) + "]", text)


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """A text table of result rows (one line each; "!" marks a noisy result)."""
    lines = [
        f"{'op':<26} {'impl':<14} {'variant':<22} {'shape':<18} {'dtype':<9} "
        f"{'median ms':>10} {'IQR ms':>8} {'host us':>8} {'GB/s':>8} {'TFLOP/s':>8} "
        f"{'% ceiling':>12} {'x torch':>8}"
    ]
    for r in rows:
        variant = r.get("variant", r.get("memory", ""))
        pct = r.get("pct_of_ceiling")
        ceiling = "-" if pct is None else f"{pct:.1f} {r.get('ceiling', '')}"
        lines.append(
            f"{r['op']:<26} {r['impl']:<14} {str(variant):<22} "
            f"{'x'.join(map(str, r['shape'])):<18} {r['dtype']:<9} "
            f"{r['median_ms']:>10.4f} {r['iqr_ms']:>8.4f} {_cell(r.get('host_us'), '.2f'):>8} "
            f"{_cell(r.get('gb_per_s'), '.4g'):>8} {_cell(r.get('tflops'), '.1f'):>8} "
            f"{ceiling:>12} {_cell(r.get('speedup_vs_torch'), '.3f'):>8}"
            + (" !" if r.get("warning") else "")
        )
    return "\n".join(lines)


def main(run: Callable[[bool], list[dict[str, Any]]],
         show: Callable[[list[dict[str, Any]]], str] = format_rows) -> int:
    """Entry point of a bench_<name>.py script: [--quick] [--json]."""
    import cudalab

    argv = sys.argv[1:]
    try:
        rows = run("--quick" in argv)
    except cudalab.NoDeviceError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(show(rows))
    if "--json" in argv:
        print(dumps(rows))
    return 0
