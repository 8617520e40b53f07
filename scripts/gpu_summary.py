"""Write the JSON summary of a GPU test run (used by scripts/gpu_check.sh).

Reads pytest's JUnit XML for the counts; the machine block (device, driver,
runtime and package versions) is cudalab's own (`cudalab.bench.machine_info`),
and the file is a cudalab results file (`cudalab.bench.write_results`, kind
"gpu_check", no rows), so it says exactly what ran where.
"""

from __future__ import annotations

import argparse
import json
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


def total_counts(paths: list[Path]) -> dict[str, int]:
    """junit_counts summed over several files (the shards of one run)."""
    total: dict[str, int] = {}
    for path in paths:
        for key, value in junit_counts(path).items():
            total[key] = total.get(key, 0) + value
    return total


def machine() -> dict:
    """machine_info(), with the driver release from nvidia-smi when NVML is not installed."""
    from cudalab.bench import machine_info

    info = machine_info(Path(__file__).resolve().parent.parent)
    if info["cuda"]["driver"] is None:
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True, timeout=30)
            info["cuda"]["driver"] = smi.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return info


def readme_row(results: dict) -> str:
    """The "latest GPU check" table row of docs/results.md for a gpu_check results file.

    docs/results.md holds this row verbatim; tests/test_readme_results_cpu.py
    checks that it does, so the documented test counts cannot drift from the file.
    """
    machine = results["machine"]
    dev = machine["devices"][0] if machine["devices"] else None
    if dev is None:
        device = "no GPU"
    else:
        cc = ".".join(str(v) for v in dev["compute_capability"])
        device = f"{dev['name']} (cc {cc}, {dev['multi_processor_count']} SMs)"
    runtime = machine["cuda"]["runtime_version"]
    runtime_text = f"CUDA {runtime // 1000}.{runtime % 1000 // 10}"
    driver = machine["cuda"]["driver"] or "?"
    return (f"| {device} | {driver} / {runtime_text} | {results['tests']} | {results['passed']} | "
            f"{results['failures'] + results['errors']} | {results['skipped']} | "
            f"`{results['command']}` |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--junit", type=Path, nargs="+", required=True,
                        help="one JUnit file, or one per shard of a run split over calls "
                             "(CUDALAB_TEST_SHARD): their counts are added")
    parser.add_argument("--build-seconds", type=float, default=None)
    parser.add_argument("--test-seconds", type=float, default=None)
    parser.add_argument("--command", default="scripts/gpu_check.sh")
    parser.add_argument("--outdir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--copy-to", type=Path, default=None)
    args = parser.parse_args()

    from cudalab.bench import write_results

    info = machine()
    counts = total_counts(args.junit)
    device = info["devices"][0]["name"] if info["devices"] else "no GPU"
    slug = re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_")
    args.outdir.mkdir(parents=True, exist_ok=True)
    path = args.outdir / f"gpu_check_{slug}.json"
    write_results(path, "gpu_check", [], machine=info, command=args.command,
                  extra={"env": {"CUDALAB_REQUIRE_GPU": "1"}, **counts,
                         "build_seconds": args.build_seconds, "test_seconds": args.test_seconds})
    if args.copy_to is not None and args.copy_to.resolve() != args.outdir.resolve():
        shutil.copy(path, args.copy_to / path.name)
    print("docs/results.md row:")
    print(readme_row(json.loads(path.read_text())))
    print(f"summary: {counts['passed']} passed, {counts['failures']} failed, "
          f"{counts['errors']} errors, {counts['skipped']} skipped on {device} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
