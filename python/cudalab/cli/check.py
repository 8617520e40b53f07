"""``cudalab check``: a report of every device.

deviceQuery-style properties and theoretical peaks, plus live utilization,
clocks, temperature and power nvidia-smi style when NVML is installed
(``pip install nvidia-ml-py``). Exits 1 with a clear message when no GPU or
driver is present.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from .. import __version__, _core, _nvml
from ..devices import get_device_properties
from ..memory import format_bytes
from .args import output_file

__all__ = ["add_parsers", "check_report"]


def _nvml_sample(index: int) -> dict[str, Any] | None:
    """Live state from NVML; None without nvidia-ml-py, {"error": ...} when NVML fails."""
    try:
        return _nvml.query(index)
    except _nvml.NvmlError as exc:
        if exc.nvml_message is None:  # no NVML call was made: nvidia-ml-py is missing
            return None
        return {"error": exc.nvml_message}


def _no_device_reason() -> str:
    try:
        _core.current_device()
    except _core.NoDeviceError as exc:
        return str(exc).replace("current_device(): ", "")
    return "no CUDA device is available"


def check_report() -> dict[str, Any]:
    """Everything `cudalab check` prints, as a dict (also its --json output)."""
    report: dict[str, Any] = {
        "cuda_runtime": _core.runtime_version(),
        "cuda_driver": _core.driver_version(),
        "device_count": _core.device_count(),
        "devices": [],
    }
    for index in range(report["device_count"]):
        props = get_device_properties(index)
        free, total = _core.mem_get_info(index)
        report["devices"].append({
            **dataclasses.asdict(props),
            "free_memory": free,
            "live": _nvml_sample(index),
        })
    return report


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}" if v else "none"


def _live_line(live: dict[str, Any]) -> str:
    """One line of live state; a field the device does not support reads "n/a"."""
    def show(key: str, fmt: str = "") -> str:
        return "n/a" if live[key] is None else format(live[key], fmt)

    used = "n/a" if live["memory_used_bytes"] is None else format_bytes(live["memory_used_bytes"])
    return (f"{show('gpu_utilization_pct')}% busy, SM {show('sm_clock_mhz')} MHz, "
            f"memory {show('memory_clock_mhz')} MHz, {show('temperature_c')} C, "
            f"{show('power_w', '.0f')} / {show('power_limit_w', '.0f')} W, {used} used")


def _print_check(report: dict[str, Any]) -> None:
    print(f"cudalab {__version__}: CUDA runtime {_version(report['cuda_runtime'])}, "
          f"driver supports CUDA {_version(report['cuda_driver'])}, "
          f"{report['device_count']} device(s)")
    for index in range(report["device_count"]):
        info = report["devices"][index]
        print()
        print(get_device_properties(index))
        print(f"  Free memory now:                  {format_bytes(info['free_memory'])}")
        live = info["live"]
        if live is None:
            print("  Live state:                       (install nvidia-ml-py for utilization, "
                  "clocks, temperature and power)")
        elif "error" in live:
            print(f"  Live state:                       NVML error: {live['error']}")
        else:
            print(f"  Live state (NVML):                {_live_line(live)}")


def _cmd_check(args: argparse.Namespace) -> int:
    if not _core.is_available():
        reason = (_no_device_reason() if _core.driver_version()
                  else "no CUDA device is available: no NVIDIA driver was found "
                       "(libcuda.so.1 could not be loaded)")
        print(f"cudalab check: {reason}.", file=sys.stderr)
        print(f"CUDA runtime {_version(_core.runtime_version())} (built in); driver: "
              f"{'none found' if not _core.driver_version() else _version(_core.driver_version())}.",
              file=sys.stderr)
        return 1
    report = check_report()
    _print_check(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``check`` to the CLI."""
    check = sub.add_parser(
        "check", help="report every CUDA device (exit 1 when there is none)",
        description="Report every CUDA device: properties, theoretical peaks and, with "
                    "nvidia-ml-py installed, live utilization, clocks, temperature and power. "
                    "Exits 1 with a clear message when no GPU or driver is present.")
    check.add_argument("--json", metavar="PATH", type=output_file,
                       help="also write the report as JSON to PATH (its directory must exist)")
    check.set_defaults(func=_cmd_check)
