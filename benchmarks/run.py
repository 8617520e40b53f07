"""Run the compute benchmarks on a GPU and write benchmarks/results/compute_<device>.json.

Usage: python benchmarks/run.py [--quick] [--only elementwise,reduce,...] [--outdir DIR]

Measures the device-to-device copy ceiling first (`cudalab.bench.ceiling("copy")`:
a 1 GiB copy, bytes read + written, measured once per process, so every
module's "% of ceiling" uses the same figure) and the copy itself through
the shared `cudalab.bench.CopyCase` (cudalab copy(), torch clone() of the same
buffer); then every benchmarks/bench_<name>.py module's run(quick), each op
beside PyTorch in the same process, and prints a table with % of the ceiling
and the ratio to PyTorch.

Every GPU time comes from `cudalab.bench.measure` with the preset of
benchlib.preset ("sustained", or "quick" with --quick; the same for every
library); the dispatch and pipeline figures are host-side and use
`cudalab.bench.host_clock` (see their modules). The file is written by
`cudalab.bench.write_results` (schema "cudalab.results/1", kind
"compute_benchmarks"): every row keeps its Measurement (raw times up to
benchlib.MAX_TIMES_IN_JSON, order statistics beyond).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import (MAX_TIMES_IN_JSON, format_rows, preset, require_gpu, row,  # noqa: E402
                      torch_cuda)

MODULES = ["elementwise", "reduce", "transpose", "matmul", "streams", "transfer", "pipeline",
           "profiler"]


def copy_rows(quick: bool) -> list[dict]:
    """cudalab copy() and torch clone() of a float32 buffer (1 GiB, quick: 64 MiB)."""
    from cudalab.bench import CopyCase, Timer

    case = CopyCase((64 << 20) if quick else (1 << 30))
    prepared = case.prepare()
    timer = Timer(preset(quick))
    shape = (case.nbytes // 4,)
    rows = [row(prepared.measure(timer, ceiling="copy"), shape, "float32")]
    torch = torch_cuda()
    if torch is not None:
        m = prepared.torch_twin(torch).measure(timer, description="torch", ceiling="copy")
        rows.append(row(m, shape, "float32"))
    return rows


def _compare_with_torch(rows: list[dict], copy_gbps: float) -> None:
    """% of the copy ceiling on every bandwidth row, and the speed-up over torch's twin row."""
    def key(r):  # rows compare with the torch row of the same op, size and variant
        return (r["op"], tuple(r["shape"]), r["dtype"], r.get("variant"), r.get("memory"))

    torch_rows = {key(r): r for r in rows if r["impl"] == "torch"}
    for r in rows:
        if "gb_per_s" in r and "pct_of_copy_ceiling" not in r:
            r["pct_of_copy_ceiling"] = 100.0 * r["gb_per_s"] / copy_gbps
        ref = torch_rows.get(key(r))
        if ref is not None and r["impl"] != "torch":
            r["speedup_vs_torch"] = ref["median_ms"] / r["median_ms"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(MODULES))
    parser.add_argument("--outdir", type=Path, default=HERE / "results")
    args = parser.parse_args()

    import cudalab as cl

    try:
        require_gpu("benchmarks/run.py")
    except cl.NoDeviceError as exc:
        print(exc, file=sys.stderr)
        return 1
    from cudalab.bench import ceiling as measured_ceiling
    from cudalab.bench import write_results

    props = cl.get_device_properties(0)
    copy_ceiling = measured_ceiling("copy")
    rows = copy_rows(args.quick)
    for name in args.only.split(","):
        try:
            module = importlib.import_module(f"bench_{name}")
        except ModuleNotFoundError:
            print(f"(no benchmarks/bench_{name}.py; skipped)")
            continue
        rows.extend(module.run(args.quick))
    copy_gbps = copy_ceiling.value / 1e9
    _compare_with_torch(rows, copy_gbps)

    slug = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    args.outdir.mkdir(parents=True, exist_ok=True)
    path = args.outdir / f"compute_{slug}{'_quick' if args.quick else ''}.json"
    write_results(path, "compute_benchmarks", rows, max_times=MAX_TIMES_IN_JSON,
                  command="python benchmarks/run.py" + (" --quick" if args.quick else ""),
                  extra={"preset": preset(args.quick).to_dict(), "copy_ceiling_gb_per_s": copy_gbps,
                         "copy_ceiling": copy_ceiling.to_dict()})

    print(f"{props.name}: copy ceiling {copy_gbps:.0f} GB/s (read + written, "
          f"cudalab.bench.ceiling('copy'))")
    print(format_rows(rows))
    for r in rows:
        if r.get("warning"):
            print(f"! {r['op']} {r['impl']} {r.get('variant', r.get('memory', ''))}: {r['warning']}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
