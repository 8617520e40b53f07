"""Results files: one JSON schema, one machine block, one writer, one reader.

Everything cudalab measures and saves goes through `write_results`: the
pytest plugin's ``--gpu-benchmark-json``, ``cudalab bench ... --json``,
``cudalab ceilings --json`` and ``benchmarks/``. A file reads::

    {
      "schema": "cudalab.results/1",
      "kind": "pytest" | "bench matmul" | "ceilings" | "compute_benchmarks" | ...,
      "created": "2026-11-22T01:25:32+00:00",
      "command": "cudalab ceilings --json ceilings.json",
      "machine": {...machine_info()...},
      "rows": [
        {...fields of the row (nodeid, op, impl, name, ...)...,
         "measurement": {...Measurement.to_dict()...}},
        ...
      ],
      ...more top-level keys a kind adds (settings, ceilings, ...)
    }

Every row carries one `Measurement` with its raw times, so any file can be
read back (`read_results`), merged, compared (`cudalab.bench.baseline`) or
shown in a `Compare` table. A writer may cap the raw times kept per
measurement (`max_times`): longer series are replaced by that many order
statistics at equally spaced quantiles, which keep the median, quartiles,
minimum and maximum exact (the row then says ``"times_kept"``).

Everything here is plain Python (no GPU needed) except that `machine_info`
asks cudalab about the devices it can see.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy

from .. import _core
from .._version import __version__
from .measurement import Measurement

__all__ = [
    "RESULTS_SCHEMA",
    "Results",
    "Row",
    "dumps",
    "machine_info",
    "read_results",
    "results_dict",
    "write_results",
]

RESULTS_SCHEMA = "cudalab.results/1"


# ---- rows ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a results file: a Measurement and the row's other fields.

    Attributes
    ----------
    measurement : Measurement
    fields : dict
        Everything else the row holds (``nodeid``, ``comparison``, ``op``,
        ``impl``, a ceiling's ``name`` and ``value``, ...).
    """

    measurement: Measurement
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


def _order_statistics(times: tuple[float, ...], count: int) -> list[float]:
    """`count` values at quantiles 0, 1/(count-1), ..., 1 (NumPy's linear method)."""
    ordered = sorted(times)
    last = len(ordered) - 1
    values = []
    for i in range(count):
        position = last * i / (count - 1)
        low = int(position)
        high = min(low + 1, last)
        values.append(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
    return values


def _measurement_dict(m: Measurement, max_times: int | None) -> dict[str, Any]:
    data = m.to_dict()
    if max_times is not None and m.repeats > max_times:
        data["times"] = _order_statistics(m.times, max_times)
        data["times_kept"] = (f"{max_times} order statistics of {m.repeats} repeats at equally "
                              "spaced quantiles (median, quartiles, min and max are exact)")
    return data


def _row_dict(row: Measurement | Row | Mapping[str, Any], max_times: int | None) -> dict[str, Any]:
    if isinstance(row, Measurement):
        return {"measurement": _measurement_dict(row, max_times)}
    if isinstance(row, Row):
        fields, m = dict(row.fields), row.measurement
    elif isinstance(row, Mapping) and isinstance(row.get("measurement"), Measurement):
        fields = {k: v for k, v in row.items() if k != "measurement"}
        m = row["measurement"]
    else:
        raise TypeError(
            "write_results() argument 'rows': expected Measurements, Rows or dicts with a "
            f"Measurement under 'measurement', got {type(row).__name__}"
        )
    return {**fields, "measurement": _measurement_dict(m, max_times)}


# ---- writing ---------------------------------------------------------------------------


def _default_command() -> str:
    return " ".join([os.path.basename(sys.argv[0]) if sys.argv else "python", *sys.argv[1:]])


def results_dict(kind: str, rows: Iterable[Measurement | Row | Mapping[str, Any]], *,
                 machine: Mapping[str, Any] | None = None, command: str | None = None,
                 extra: Mapping[str, Any] | None = None,
                 max_times: int | None = None) -> dict[str, Any]:
    """The JSON-able content of a results file (the layout is in the module docstring).

    Parameters
    ----------
    kind : str
        What produced the file (``"pytest"``, ``"ceilings"``, ...).
    rows : iterable
        `Measurement`, `Row`, or dict holding a `Measurement` under
        ``"measurement"`` and other JSON-able fields.
    machine : mapping, optional
        The machine block (default: `machine_info()`).
    command : str, optional
        The command that ran (default: this process's argv).
    extra : mapping, optional
        More top-level keys; they may not replace the schema's own.
    max_times : int, optional
        Keep at most this many raw times per measurement (at least 5).
    """
    if not isinstance(kind, str) or not kind:
        raise TypeError("results_dict() argument 'kind': expected a non-empty str")
    if max_times is not None and (isinstance(max_times, bool) or not isinstance(max_times, int)
                                  or max_times < 5):
        raise ValueError(f"results_dict() argument 'max_times': expected an int >= 5 or None, "
                         f"got {max_times!r}")
    data: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "kind": kind,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _default_command() if command is None else command,
        "machine": dict(machine_info() if machine is None else machine),
        "rows": [_row_dict(r, max_times) for r in rows],
    }
    clash = sorted(set(extra or {}) & set(data))
    if clash:
        raise ValueError(f"results_dict() argument 'extra': {', '.join(map(repr, clash))} "
                         "belong to the schema")
    data.update(extra or {})
    return data


def dumps(data: Any) -> str:
    """JSON with indent 2, lists of numbers kept on one line (NumPy values as lists/numbers)."""
    text = json.dumps(data, indent=2, default=_json_default)
    # Only lists that json.dumps broke over lines: a JSON string has no raw
    # newline, so text inside strings is never touched.
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    flat = re.compile(r"\[\n\s*(" + number + r"(?:,\n\s*" + number + r")*)\n\s*\]")
    return flat.sub(lambda mo: "[" + re.sub(r",\n\s*", ", ", mo.group(1)) + "]", text)


def _json_default(value: Any) -> Any:
    # NumPy scalars and arrays a user may put in metadata; anything else as text.
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_results(path: str | os.PathLike[str], kind: str,
                  rows: Iterable[Measurement | Row | Mapping[str, Any]], **options: Any) -> Path:
    """Write a results file; the keywords are those of `results_dict`.

    The directory must exist: a missing one is an error, not created (a typo
    in a path should not scatter result files).

    Raises
    ------
    FileNotFoundError
        The directory of `path` does not exist.
    IsADirectoryError
        `path` is a directory.
    """
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file path")
    parent = target.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"directory {str(parent)!r} of {str(path)!r} does not exist")
    target.write_text(dumps(results_dict(kind, rows, **options)) + "\n", encoding="utf-8")
    return target


# ---- reading ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Results:
    """A results file read back.

    Attributes
    ----------
    kind : str
    machine : dict
    rows : list of Row
    data : dict
        The whole document as read (top-level keys a kind adds are here).
    """

    kind: str
    machine: dict[str, Any]
    rows: list[Row]
    data: dict[str, Any]

    @property
    def measurements(self) -> list[Measurement]:
        return [r.measurement for r in self.rows]


def read_results(path: str | os.PathLike[str]) -> Results:
    """Read a file written by `write_results`.

    Raises
    ------
    ValueError
        The file is not JSON or not a cudalab results file; the message says why.
    OSError
        The file cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or "schema" not in data:
        raise ValueError(f"{path} is not a cudalab results file (expected an object with "
                         f"\"schema\": {RESULTS_SCHEMA!r}, as cudalab writes)")
    if data["schema"] != RESULTS_SCHEMA:
        raise ValueError(f"{path}: unknown schema {data['schema']!r} (expected {RESULTS_SCHEMA!r})")
    if not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: expected a 'rows' list")
    rows = []
    for index, entry in enumerate(data["rows"]):
        try:
            measurement = Measurement.from_dict(entry["measurement"])
            fields = {k: v for k, v in entry.items() if k != "measurement"}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: row #{index} is malformed ({exc})") from None
        rows.append(Row(measurement, fields))
    machine = data.get("machine")
    return Results(kind=str(data.get("kind", "")), machine=machine if isinstance(machine, dict) else {},
                   rows=rows, data=data)


# ---- the machine -----------------------------------------------------------------------

_PROPERTY_SUMMARY = (
    "name", "compute_capability", "multi_processor_count", "total_memory", "l2_cache_size",
    "clock_rate_khz", "memory_clock_rate_khz", "memory_bus_width", "peak_memory_bandwidth",
    "peak_flops", "ecc_enabled", "pci_bus_id",
)
# Versions recorded when the package is installed.
_OPTIONAL_PACKAGES = ("torch", "cupy", "nvidia-ml-py")


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


def _driver_release() -> str | None:
    try:
        from .. import _nvml

        return _nvml.driver_release()
    except Exception:  # optional, like the clocks
        return None


def machine_info(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Where a measurement ran: host, software versions, devices, and the git commit.

    Parameters
    ----------
    root : path, optional
        A directory; when it is inside a git checkout, its HEAD commit is
        recorded.

    Returns
    -------
    dict
        ``hostname``, ``platform``, ``versions`` (python, cudalab, numpy, and
        torch, cupy, nvidia-ml-py when installed), ``cuda`` (``available``,
        ``runtime_version`` and ``driver_version`` as CUDA encodes them, e.g.
        13000, and ``driver``, the NVIDIA driver release through NVML or None),
        ``devices`` (a property summary and the live clocks of
        `cudalab._nvml.sample` per device; empty without a GPU) and ``git``
        (``commit`` and ``dirty``, or None).
    """
    available = bool(_core.is_available())
    versions = {"python": platform.python_version(), "cudalab": __version__,
                "numpy": numpy.__version__}
    for name in _OPTIONAL_PACKAGES:
        version = _package_version(name)
        if version is not None:
            versions[name] = version
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "versions": versions,
        "cuda": {
            "available": available,
            "runtime_version": _core.runtime_version(),
            "driver_version": _core.driver_version(),
            "driver": _driver_release() if available else None,
        },
        "devices": [_device_summary(i) for i in range(_core.device_count())] if available else [],
        "git": None if root is None else _git_commit(Path(root)),
    }
