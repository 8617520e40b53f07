"""Benchmark result files: machine info, the JSON layout, and baselines.

A results file is what ``pytest --gpu-benchmark-json PATH`` writes (see
`cudalab.pytest_plugin`)::

    {
      "schema": "cudalab.bench.results/1",
      "machine": {...machine_info()...},
      "benchmarks": [
        {"nodeid": "tests/test_x.py::test_add",
         "measurement": {...Measurement.to_dict()...},
         "comparison": {...Comparison.to_dict()...} or null},
        ...
      ]
    }

A saved file serves as a baseline for a later run: measurements are matched
by `Measurement.key` (label, sub_label, description) and a measurement whose
median time grew by more than a threshold is a regression.

Everything here is plain Python (no GPU needed) except that `machine_info`
asks cudalab about the devices it can see.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import math
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .measurement import Measurement, format_time

__all__ = [
    "RESULTS_SCHEMA",
    "Comparison",
    "Record",
    "compare",
    "load_baseline",
    "machine_info",
    "parse_threshold",
    "read_results",
    "results_dict",
    "write_results",
]

RESULTS_SCHEMA = "cudalab.bench.results/1"

Key = tuple[str, "str | None", "str | None"]


# ---- thresholds ------------------------------------------------------------------------


def parse_threshold(text: str, *, option: str = "threshold") -> float:
    """A regression threshold as a fraction: ``"10%"`` -> 0.1, ``"0.1"`` -> 0.1.

    Parameters
    ----------
    text : str
        A percentage (``"10%"``, ``"2.5%"``, ``"200%"``) or a fraction in
        (0, 1] (``"0.1"``). A bare number above 1 is refused because it is
        ambiguous: ``"10"`` most likely means 10%, not 1000%.
    option : str, optional
        The option name to put in error messages.

    Returns
    -------
    float
        The allowed relative increase of the median time (0.1 for 10%).

    Raises
    ------
    ValueError
        Anything else, with a message naming `option`.
    """
    raw = str(text).strip()
    expected = f"{option}: expected a percentage such as '10%' or a fraction such as '0.1'"
    is_percent = raw.endswith("%")
    number_text = raw[:-1].strip() if is_percent else raw
    try:
        number = float(number_text)
    except ValueError:
        raise ValueError(f"{expected}, got {text!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{expected} (greater than 0), got {text!r}")
    if is_percent:
        return number / 100.0
    if number > 1:
        raise ValueError(
            f"{option}: {text!r} is ambiguous: as a fraction it allows a {number:.0%} slowdown; "
            f"write '{number_text}%' for {number_text} percent (fractions must be at most 1; "
            "give larger thresholds as percentages, e.g. '200%')"
        )
    return number


def format_threshold(threshold: float) -> str:
    """0.1 -> '10%'."""
    return f"{threshold * 100:g}%"


# ---- comparison ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One measurement against its baseline.

    Attributes
    ----------
    title : str
        The measurement's title (label | sub_label | description).
    current_median : float
        Median seconds per call now.
    baseline_median : float or None
        Median seconds per call in the baseline; None when the baseline has no
        measurement with the same key.
    threshold : float or None
        Allowed relative increase of the median (0.1 for 10%); None when only
        reporting.
    current_device, baseline_device : str or None
        Where each was measured (comparisons across devices are reported but
        mean little).
    """

    title: str
    current_median: float
    baseline_median: float | None
    threshold: float | None = None
    current_device: str | None = None
    baseline_device: str | None = None

    @property
    def missing(self) -> bool:
        """True when the baseline has no measurement with this key."""
        return self.baseline_median is None

    @property
    def change(self) -> float | None:
        """Relative change of the median: current / baseline - 1 (+0.25 = 25% slower)."""
        if self.baseline_median is None:
            return None
        if self.baseline_median <= 0:
            return math.inf if self.current_median > 0 else 0.0
        return self.current_median / self.baseline_median - 1.0

    @property
    def regressed(self) -> bool:
        """True when the median grew by more than the threshold."""
        change = self.change
        return self.threshold is not None and change is not None and change > self.threshold

    @property
    def status(self) -> str:
        """``"missing"``, ``"regression"``, ``"faster"``, ``"slower"`` or ``"same"``."""
        change = self.change
        if change is None:
            return "missing"
        if self.regressed:
            return "regression"
        return "faster" if change < 0 else "slower" if change > 0 else "same"

    def describe(self) -> str:
        """One line: medians, change and threshold (the failure message of a regression)."""
        if self.baseline_median is None:
            return f"{self.title}: median {format_time(self.current_median)}, no baseline measurement"
        text = (
            f"{self.title}: median {format_time(self.current_median)} vs baseline "
            f"{format_time(self.baseline_median)} ({_signed_percent(self.change)})"
        )
        if self.threshold is not None:
            verdict = "more than" if self.regressed else "within"
            text += f", {verdict} the allowed +{format_threshold(self.threshold)}"
        if self.baseline_device and self.current_device and self.baseline_device != self.current_device:
            text += f" (baseline measured on {self.baseline_device}, now on {self.current_device})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline_median": self.baseline_median,
            "current_median": self.current_median,
            "change": self.change,
            "threshold": self.threshold,
            "status": self.status,
            "baseline_device": self.baseline_device,
        }


def _signed_percent(change: float | None) -> str:
    if change is None:
        return "-"
    if math.isinf(change):
        return "+inf%"
    return f"{change * 100:+.1f}%"


def compare(
    measurement: Measurement,
    baseline: Mapping[Key, Measurement],
    threshold: float | None = None,
) -> Comparison:
    """Compare one measurement with the baseline entry of the same key.

    Parameters
    ----------
    measurement : Measurement
    baseline : mapping of key to Measurement
        As `load_baseline` returns.
    threshold : float, optional
        Allowed relative increase of the median (0.1 for 10%); None to report
        the change without judging it.
    """
    old = baseline.get(measurement.key)
    return Comparison(
        title=measurement.title,
        current_median=measurement.median,
        baseline_median=None if old is None else old.median,
        threshold=threshold,
        current_device=measurement.device,
        baseline_device=None if old is None else old.device,
    )


# ---- the JSON file ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Record:
    """One benchmark of a run: the test that measured it, and its comparison."""

    nodeid: str
    measurement: Measurement
    comparison: Comparison | None = None


def results_dict(records: Sequence[Record], machine: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-able content of a results file (layout in the module docstring)."""
    return {
        "schema": RESULTS_SCHEMA,
        "machine": dict(machine),
        "benchmarks": [
            {
                "nodeid": r.nodeid,
                "measurement": r.measurement.to_dict(),
                "comparison": None if r.comparison is None else r.comparison.to_dict(),
            }
            for r in records
        ],
    }


def write_results(path: str | os.PathLike[str], records: Sequence[Record], machine: Mapping[str, Any]) -> None:
    """Write a results file (parent directories are created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results_dict(records, machine), indent=2, default=_json_default)
    target.write_text(text + "\n", encoding="utf-8")


def _json_default(value: Any) -> Any:
    # NumPy scalars and arrays a user may put in metadata; anything else as text.
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def read_results(path: str | os.PathLike[str]) -> list[Record]:
    """Read a results file back: one `Record` per benchmark (comparisons are not read).

    Raises
    ------
    ValueError
        The file is not JSON or not a results file; the message says why.
    OSError
        The file cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError(
            f"{path} is not a cudalab benchmark results file (expected an object with a "
            "'benchmarks' list, as written by --gpu-benchmark-json)"
        )
    schema = data.get("schema")
    if schema != RESULTS_SCHEMA:
        raise ValueError(f"{path}: unknown schema {schema!r} (expected {RESULTS_SCHEMA!r})")
    records = []
    for index, entry in enumerate(data["benchmarks"]):
        try:
            measurement = Measurement.from_dict(entry["measurement"])
            nodeid = str(entry.get("nodeid", ""))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: benchmark #{index} is malformed ({exc})") from None
        records.append(Record(nodeid=nodeid, measurement=measurement))
    return records


def load_baseline(path: str | os.PathLike[str]) -> dict[Key, Measurement]:
    """The measurements of a results file by key (repeated keys are merged)."""
    measurements = [r.measurement for r in read_results(path)]
    try:
        merged = Measurement.merge(measurements)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return {m.key: m for m in merged}


# ---- the machine -----------------------------------------------------------------------

_PROPERTY_SUMMARY = (
    "name", "compute_capability", "multi_processor_count", "total_memory", "l2_cache_size",
    "clock_rate_khz", "memory_clock_rate_khz", "memory_bus_width", "peak_memory_bandwidth",
    "peak_flops", "ecc_enabled", "pci_bus_id",
)


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit(root: Path) -> dict[str, Any] | None:
    """HEAD of the git checkout at `root` and whether tracked files differ; None if not one."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _device_summary(index: int) -> dict[str, Any]:
    from ..devices import get_device_properties

    props = get_device_properties(index)
    summary: dict[str, Any] = {"index": index}
    summary.update({name: getattr(props, name) for name in _PROPERTY_SUMMARY})
    summary["compute_capability"] = list(props.compute_capability)
    summary["clocks"] = _live_clocks(index)
    return summary


def _live_clocks(index: int) -> dict[str, Any] | None:
    """What cudalab._nvml.sample reports (clocks, power, ...), or None without it."""
    try:
        from .. import _nvml  # optional: needs nvidia-ml-py
    except ImportError:
        return None
    try:
        sample = _nvml.sample(index)
    except Exception as exc:  # a failing NVML read must not lose the results file
        return {"error": str(exc)}
    return None if sample is None else dict(sample)


def machine_info(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Where a benchmark ran: host, software versions, devices, and the git commit.

    Parameters
    ----------
    root : path, optional
        A directory; when it is inside a git checkout, its HEAD commit is
        recorded.

    Returns
    -------
    dict
        ``hostname``, ``timestamp`` (UTC, ISO 8601), ``platform``,
        ``versions`` (python, cudalab, numpy, torch: None when not installed),
        ``cuda`` (runtime and driver versions as CUDA encodes them, e.g. 13000,
        and ``available``), ``devices`` (a property summary and the clocks of
        `cudalab._nvml.sample` per device; empty without a GPU) and ``git``
        (``commit`` and ``dirty``, or None).
    """
    from .. import _core

    available = bool(_core.is_available())
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "cudalab": _package_version("cudalab"),
            "numpy": _package_version("numpy"),
            "torch": _package_version("torch"),
        },
        "cuda": {
            "available": available,
            "runtime_version": _core.runtime_version(),
            "driver_version": _core.driver_version(),
        },
        "devices": [_device_summary(i) for i in range(_core.device_count())] if available else [],
        "git": None if root is None else _git_commit(Path(root)),
    }
    return info


def summary_lines(records: Iterable[Record]) -> list[str]:
    """A text table of records: name, median, IQR, rates and the baseline comparison."""
    records = list(records)
    compared = any(r.comparison is not None for r in records)
    header = ["benchmark", "median", "IQR", "rate"] + (["vs baseline"] if compared else [])
    rows = []
    for r in records:
        m = r.measurement
        rates = []
        if m.tflops is not None:
            rates.append(f"{m.tflops:.4g} TFLOP/s")
        if m.gbps is not None:
            rates.append(f"{m.gbps:.4g} GB/s")
        if m.percent_of_ceiling is not None:
            rates.append(f"{m.percent_of_ceiling:.1f}% of {m.ceiling_name}")
        iqr = format_time(m.iqr) + (" (!)" if m.noisy else "")
        row = [m.title, format_time(m.median), iqr, ", ".join(rates) or "-"]
        if compared:
            row.append(_comparison_cell(r.comparison))
        rows.append(row)
    widths = [max(len(line[i]) for line in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header] + rows]
    if any(r.measurement.noisy for r in records):
        lines.append("(!) noisy: IQR over 10% of the median")
    return lines


def _comparison_cell(comparison: Comparison | None) -> str:
    if comparison is None:
        return "-"
    if comparison.missing:
        return "no baseline"
    cell = f"{format_time(comparison.baseline_median)} -> {_signed_percent(comparison.change)}"
    if comparison.regressed:
        cell += f" REGRESSION (> +{format_threshold(comparison.threshold)})"
    if (comparison.baseline_device and comparison.current_device
            and comparison.baseline_device != comparison.current_device):
        cell += f" [baseline on {comparison.baseline_device}]"
    return cell
