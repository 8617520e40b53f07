"""Baselines: compare a run's measurements with a saved results file.

A results file (`cudalab.bench.results`) serves as a baseline for a later
run: measurements are matched by `Measurement.key` (label, sub_label,
description) and a measurement whose median time grew by more than a
threshold is a regression. The pytest plugin's ``--gpu-benchmark-compare``
is built on this; any results file works as a baseline (one written by the
plugin, by ``cudalab bench --json`` or by ``benchmarks/``).

Plain Python: no GPU needed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable, Mapping

from .measurement import Measurement, format_time
from .results import Row, read_results

__all__ = [
    "Comparison",
    "Record",
    "compare",
    "format_threshold",
    "load_baseline",
    "parse_threshold",
    "summary_lines",
]

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


# ---- a run's records -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Record:
    """One benchmark of a run: the test that measured it, and its comparison."""

    nodeid: str
    measurement: Measurement
    comparison: Comparison | None = None

    def row(self) -> Row:
        """The results-file row: ``nodeid``, ``comparison`` and the measurement."""
        comparison = None if self.comparison is None else self.comparison.to_dict()
        return Row(self.measurement, {"nodeid": self.nodeid, "comparison": comparison})


def load_baseline(path: str | os.PathLike[str]) -> dict[Key, Measurement]:
    """The measurements of a results file by key (repeated keys are merged).

    Raises
    ------
    ValueError
        The file is not a results file, or two of its measurements with the
        same key disagree on their work (see `Measurement.merge`).
    OSError
        The file cannot be read.
    """
    measurements = read_results(path).measurements
    try:
        merged = Measurement.merge(measurements)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return {m.key: m for m in merged}


# ---- the summary table -----------------------------------------------------------------


def summary_lines(records: Iterable[Record]) -> list[str]:
    """A text table of records: name, median, IQR, rates and the baseline comparison."""
    records = list(records)
    compared = any(r.comparison is not None for r in records)
    header = ["benchmark", "median", "IQR", "rate"] + (["vs baseline"] if compared else [])
    rows = []
    for r in records:
        m = r.measurement
        iqr = format_time(m.iqr) + (" (!)" if m.noisy else "")
        row = [m.title, format_time(m.median), iqr, ", ".join(m.rates()) or "-"]
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
