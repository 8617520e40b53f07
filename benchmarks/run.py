"""Run the compute benchmarks on a GPU and write benchmarks/results/compute_<device>.json.

Usage: python benchmarks/run.py [--quick] [--only elementwise,reduce,...]

Measures the device-to-device copy ceiling first (cudalab copy() and
torch clone() of 1 GiB float32, bytes read + written), then every
benchmarks/bench_<name>.py module's run(quick), each op beside PyTorch in the
same process, and prints a table with % of the copy ceiling and the ratio to
PyTorch.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import row, time_cuda  # noqa: E402

MODULES = ["elementwise", "reduce", "transpose", "matmul", "streams", "transfer", "pipeline",
           "profiler"]


def copy_ceiling(quick: bool) -> list[dict]:
    import numpy as np
    import torch

    import cudalab as cl

    n = (64 << 20 if quick else 1 << 30) // 4
    a = cl.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    x = torch.randn(n, device="cuda")
    nbytes = 2 * n * 4
    return [
        row("copy", "cudalab", (n,), "float32", time_cuda(a.copy), bytes=nbytes),
        row("copy", "torch", (n,), "float32", time_cuda(x.clone), bytes=nbytes),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(MODULES))
    parser.add_argument("--outdir", type=Path, default=HERE / "results")
    args = parser.parse_args()

    import torch

    import cudalab as cl

    props = cl.get_device_properties(0)
    rows = copy_ceiling(args.quick)
    for name in args.only.split(","):
        try:
            module = importlib.import_module(f"bench_{name}")
        except ModuleNotFoundError:
            print(f"(no benchmarks/bench_{name}.py; skipped)")
            continue
        rows.extend(module.run(args.quick))

    ceiling = max(r["gb_per_s"] for r in rows if r["op"] == "copy")
    def key(r):  # rows compare with the torch row of the same op, size and variant
        return (r["op"], tuple(r["shape"]), r["dtype"], r.get("variant"), r.get("memory"))

    torch_rows = {key(r): r for r in rows if r["impl"] == "torch"}
    for r in rows:
        if "gb_per_s" in r:
            r["pct_of_copy_ceiling"] = 100.0 * r["gb_per_s"] / ceiling
        ref = torch_rows.get(key(r))
        if ref is not None and r["impl"] != "torch":
            r["speedup_vs_torch"] = ref["median_ms"] / r["median_ms"]

    result = {
        "kind": "compute_benchmarks",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/run.py" + (" --quick" if args.quick else ""),
        "device": props.name,
        "compute_capability": list(props.compute_capability),
        "sm_clock_mhz_max": props.clock_rate_khz / 1000,
        "cuda_runtime": cl.runtime_version(),
        "cuda_driver": cl.driver_version(),
        "torch": torch.__version__,
        "copy_ceiling_gb_per_s": ceiling,
        "rows": rows,
    }
    slug = re.sub(r"[^A-Za-z0-9]+", "_", props.name).strip("_")
    args.outdir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    path = args.outdir / f"compute_{slug}{suffix}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")

    print(f"{props.name}: copy ceiling {ceiling:.0f} GB/s (read + written)")
    print(f"{'op':<22} {'impl':<8} {'variant':<22} {'shape':<18} {'dtype':<9} "
          f"{'median ms':>10} {'IQR ms':>8} {'GB/s':>8} {'TFLOP/s':>8} {'%copy':>6} {'x torch':>8}")
    for r in rows:
        variant = r.get("variant", r.get("memory", ""))
        print(f"{r['op']:<22} {r['impl']:<8} {str(variant):<22} "
              f"{'x'.join(map(str, r['shape'])):<18} {r['dtype']:<9} "
              f"{r['median_ms']:>10.4f} {r['iqr_ms']:>8.4f} "
              f"{r.get('gb_per_s', float('nan')):>8.0f} {r.get('tflops', float('nan')):>8.1f} "
              f"{r.get('pct_of_copy_ceiling', float('nan')):>6.1f} "
              f"{r.get('speedup_vs_torch', float('nan')):>8.3f}")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
