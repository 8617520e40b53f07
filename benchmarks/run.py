"""Run the compute benchmarks on a GPU and write benchmarks/results/compute_<device>.json.

Usage: python benchmarks/run.py [--quick] [--only elementwise,reduce,...]

Measures the device-to-device copy ceiling first (`cudalab.bench.ceiling("copy")`:
a 1 GiB copy, bytes read + written, measured once per process, so every
module's "% of ceiling" uses the same figure) and the copy itself through
cudalab copy() and torch clone(); then every benchmarks/bench_<name>.py
module's run(quick), each op beside PyTorch in the same process, and prints a
table with % of the ceiling and the ratio to PyTorch.

Every GPU time comes from `cudalab.bench.measure` with the settings of
benchlib.measure_settings (the same for every library); the dispatch and
pipeline figures are host-side and use benchlib.host_clock (see their
modules). Each row keeps its Measurement under "measurement" (raw times
only up to benchlib.MAX_TIMES_IN_JSON repeats).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import (dumps, format_rows, measure_settings, measurement_dict,  # noqa: E402
                      require_gpu, row, torch_cuda)

MODULES = ["elementwise", "reduce", "transpose", "matmul", "streams", "transfer", "pipeline",
           "profiler"]


def copy_rows(quick: bool) -> list[dict]:
    """cudalab copy() and torch clone() of a float32 vector (1 GiB, quick: 64 MiB)."""
    import cudalab as cl
    from cudalab.bench import measure

    settings = measure_settings(quick)
    n = (64 << 20 if quick else 1 << 30) // 4
    nbytes = 2 * n * 4
    a = cl.random.normal(n, seed=0)
    rows = [row(measure(a.copy, bytes=nbytes, ceiling="copy", label="copy",
                        description="cudalab", **settings), (n,), "float32")]
    torch = torch_cuda()
    if torch is not None:
        x = torch.randn(n, device="cuda")
        rows.append(row(measure(x.clone, bytes=nbytes, ceiling="copy", label="copy",
                                description="torch", **settings), (n,), "float32"))
    return rows


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

    ceiling_gbps = copy_ceiling.value / 1e9

    def key(r):  # rows compare with the torch row of the same op, size and variant
        return (r["op"], tuple(r["shape"]), r["dtype"], r.get("variant"), r.get("memory"))

    torch_rows = {key(r): r for r in rows if r["impl"] == "torch"}
    for r in rows:
        if "gb_per_s" in r and "pct_of_copy_ceiling" not in r:
            r["pct_of_copy_ceiling"] = 100.0 * r["gb_per_s"] / ceiling_gbps
        ref = torch_rows.get(key(r))
        if ref is not None and r["impl"] != "torch":
            r["speedup_vs_torch"] = ref["median_ms"] / r["median_ms"]

    torch = torch_cuda()
    result = {
        "kind": "compute_benchmarks",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/run.py" + (" --quick" if args.quick else ""),
        "device": props.name,
        "compute_capability": list(props.compute_capability),
        "sm_clock_mhz_max": props.clock_rate_khz / 1000,
        "cuda_runtime": cl.runtime_version(),
        "cuda_driver": cl.driver_version(),
        "torch": torch.__version__ if torch is not None else None,
        "timer": "cudalab.bench.measure",
        "measure_settings": measure_settings(args.quick),
        "copy_ceiling_gb_per_s": ceiling_gbps,
        "copy_ceiling": {**copy_ceiling.to_dict(),
                         "measurement": measurement_dict(copy_ceiling.measurement)},
        "rows": rows,
    }
    slug = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    args.outdir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    path = args.outdir / f"compute_{slug}{suffix}.json"
    path.write_text(dumps(result) + "\n")

    print(f"{props.name}: copy ceiling {ceiling_gbps:.0f} GB/s (read + written, "
          f"cudalab.bench.ceiling('copy'))")
    print(format_rows(rows))
    noisy = [r for r in rows if r.get("warning")]
    for r in noisy:
        print(f"! {r['op']} {r['impl']} {r.get('variant', r.get('memory', ''))}: {r['warning']}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
