"""What the benchmark modules share: the preset, result rows, the results file.

Every GPU time comes from `cudalab.bench.measure` (CUDA events on the legacy
default stream, which PyTorch and CuPy use by default too, so their work is
timed the same way): warm-up, back-to-back repeats, a spin-kernel hold for
launch-bound calls, rounds that keep the GPU fed, and a noise-based stop.
Every benchmark uses the same preset, `preset(quick)`: "sustained" (the
clock settled under load), or "quick" with --quick; so the cudalab and
PyTorch variants of a case are measured alike, one right after the other.
Copy, matmul and transfer cases come from `cudalab.bench.cases`, shared with
the measured ceilings and ``cudalab bench``.

Two figures are host-side by nature and use `cudalab.bench.host_clock`
instead: the dispatch cost of an op issued from Python and work that runs on
several streams and returns synchronized (the copy/compute pipeline). Their
times become `Measurement` objects too, so every row is built the same way
by `row`, and every file is written by `cudalab.bench.write_results`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping, Sequence

from cudalab.bench import PRESETS, Preset, torch_cuda  # noqa: F401  (re-exported for bench_*.py)

# Raw times kept per measurement in a results file: longer series keep this
# many order statistics (median, quartiles, min and max stay exact), so the
# file stays small: short ops reach thousands of repeats.
MAX_TIMES_IN_JSON = 201

MEASURE_TIMER = "CUDA events (cudalab.bench.measure)"


def preset(quick: bool) -> Preset:
    """The preset of every benchmark (the same for cudalab and torch)."""
    return PRESETS["quick" if quick else "sustained"]


def require_gpu(who: str) -> None:
    """Raise cudalab.NoDeviceError naming `who` when no CUDA device is usable."""
    import cudalab

    if not cudalab.is_available():
        raise cudalab.NoDeviceError(
            f"{who}: no CUDA device is available (the benchmarks time GPU work and need one)"
        )



# ---- rows -------------------------------------------------------------------------


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
    out["measurement"] = m  # written by cudalab.bench.write_results
    return out


# ---- output -----------------------------------------------------------------------


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
    """Entry point of a bench_<name>.py script: [--quick] [--json] (the results file on stdout)."""
    import cudalab
    from cudalab.bench import dumps, results_dict

    argv = sys.argv[1:]
    quick = "--quick" in argv
    try:
        rows = run(quick)
    except cudalab.NoDeviceError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(show(rows))
    if "--json" in argv:
        print(dumps(results_dict("compute_benchmarks", rows, max_times=MAX_TIMES_IN_JSON,
                                 extra={"preset": preset(quick).to_dict()})))
    return 0
