"""Write the JSON summary of a GPU test run (used by scripts/gpu_check.sh).

Reads pytest's JUnit XML for the counts and asks cudalab and nvidia-smi for
the device, so the file says exactly what ran where.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit_counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def device_info() -> dict[str, object]:
    import cudalab
    import numpy

    info: dict[str, object] = {
        "cudalab": cudalab.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "cuda_runtime": cudalab.runtime_version(),
        "cuda_driver": cudalab.driver_version(),
        "device_count": cudalab.device_count(),
    }
    if cudalab.is_available():
        props = cudalab.get_device_properties(0)
        info["device"] = props.name
        info["compute_capability"] = list(props.compute_capability)
        info["total_memory"] = props.total_memory
        info["multi_processor_count"] = props.multi_processor_count
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30)
        info["nvidia_driver"] = smi.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--junit", type=Path, required=True)
    parser.add_argument("--build-seconds", type=float, default=None)
    parser.add_argument("--test-seconds", type=float, default=None)
    parser.add_argument("--command", default="scripts/gpu_check.sh")
    parser.add_argument("--outdir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--copy-to", type=Path, default=None)
    args = parser.parse_args()

    summary = {
        "kind": "gpu_check",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": args.command,
        "env": {"CUDALAB_REQUIRE_GPU": "1"},
        **device_info(),
        **junit_counts(args.junit),
        "build_seconds": args.build_seconds,
        "test_seconds": args.test_seconds,
    }
    slug = re.sub(r"[^A-Za-z0-9]+", "_", str(summary.get("device", "no_gpu"))).strip("_")
    args.outdir.mkdir(parents=True, exist_ok=True)
    path = args.outdir / f"gpu_check_{slug}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    if args.copy_to is not None and args.copy_to.resolve() != args.outdir.resolve():
        shutil.copy(path, args.copy_to / path.name)
    print(f"summary: {summary['passed']} passed, {summary['failures']} failed, "
          f"{summary['errors']} errors, {summary['skipped']} skipped on "
          f"{summary.get('device', 'no GPU')} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
