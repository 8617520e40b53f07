"""`Measurement`: the result of one `measure()` call, and how it is summarised.

A Measurement keeps the raw per-call times of every timed repeat, so anything
derived from them (median, IQR, TFLOP/s, GB/s, % of a ceiling) can be
recomputed, compared and merged later, including from JSON written on another
machine. Times are in seconds throughout, as in ``torch.utils.benchmark``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any, Iterable, Sequence

from .._table import format_time  # the one time formatter (re-exported here)

__all__ = ["Measurement", "format_time", "quartiles"]

# Relative IQR (IQR / median) above which a measurement is flagged as noisy.
NOISY_RELATIVE_IQR = 0.10

SCHEMA = "cudalab.bench.Measurement/1"


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) with linear interpolation (NumPy's default method)."""
    if not values:
        raise ValueError("quartiles() of an empty sequence")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0], ordered[0], ordered[0]
    q1, q2, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return q1, q2, q3


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Timing of one callable on one device, with everything derived from it.

    Attributes
    ----------
    label, sub_label, description : str or None
        Names for grouping, as in ``torch.utils.benchmark``: `Compare` makes
        one table per label, one row per sub_label and one column per
        description.
    times : tuple of float
        Seconds per call, one value per timed repeat (a repeat times
        `number_per_run` back-to-back calls between two CUDA events).
    number_per_run : int
        Calls per timed repeat.
    host_time : float
        Host seconds per call spent enqueueing the work (the Python call
        itself), median over repeats.
    launch_gap : float or None
        Seconds per call the GPU sat idle between calls when they were *not*
        queued ahead (host-bound launches): the per-call time of unheld
        repeats minus `median`, floored at 0. None when it was not measured
        (long calls, L2 flush on, or a single call per repeat).
    flops, bytes : float or None
        Work per call, as given to `measure()`; they give `tflops` / `gbps`.
    ceiling_name, ceiling_value, ceiling_unit : str, float, str or None
        The measured ceiling the result is placed against (``"copy"``,
        ``"matmul_float16"``, ...), in FLOP/s or B/s.
    device, device_index : str, int
        Device name and index.
    clocks : dict or None
        SM and memory clocks in MHz read through NVML right after the timed
        repeats (None without NVML).
    flush_l2 : bool
        Whether L2 was flushed before every repeat (cold-cache timing).
    held : bool
        Whether each repeat was queued behind a spin kernel, so the calls ran
        back to back on the GPU and the time excludes launch gaps.
    stop_reason : str
        Why timing stopped: ``"converged"`` (IQR/median under the noise
        threshold after `min_run_time`), ``"max_repeats"`` or
        ``"time_budget"``; ``"merged"`` after `merge`.
    settings : dict or None
        How it was timed: the preset's name and fields (warm-up, run times,
        repeats, noise threshold, L2 flush) and `hold`, as `Timer.to_dict`
        gives them; None for times taken otherwise (the host clock).
    metadata : dict
        Free-form JSON-able context (shapes, dtype, ...).
    """

    label: str
    times: tuple[float, ...]
    number_per_run: int = 1
    sub_label: str | None = None
    description: str | None = None
    host_time: float | None = None
    launch_gap: float | None = None
    flops: float | None = None
    bytes: float | None = None
    ceiling_name: str | None = None
    ceiling_value: float | None = None
    ceiling_unit: str | None = None
    device: str | None = None
    device_index: int | None = None
    clocks: dict[str, Any] | None = None
    flush_l2: bool = False
    held: bool = False
    stop_reason: str = "converged"
    settings: dict[str, Any] | None = dataclasses.field(default=None, hash=False, compare=False)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        times = tuple(float(t) for t in self.times)
        if not times:
            raise ValueError("Measurement() argument 'times': expected at least one time")
        if any(not math.isfinite(t) or t < 0 for t in times):
            raise ValueError("Measurement() argument 'times': expected finite times >= 0")
        if self.number_per_run < 1:
            raise ValueError("Measurement() argument 'number_per_run': expected >= 1")
        object.__setattr__(self, "times", times)

    # ---- statistics (seconds per call) -------------------------------------------

    @property
    def repeats(self) -> int:
        """Number of timed repeats."""
        return len(self.times)

    @property
    def median(self) -> float:
        return quartiles(self.times)[1]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def iqr(self) -> float:
        """Inter-quartile range (Q3 - Q1)."""
        q1, _, q3 = quartiles(self.times)
        return q3 - q1

    @property
    def relative_iqr(self) -> float:
        """IQR / median: the noise criterion `measure()` stops on."""
        median = self.median
        return self.iqr / median if median > 0 else 0.0

    @property
    def noisy(self) -> bool:
        return self.relative_iqr > NOISY_RELATIVE_IQR

    @property
    def warning(self) -> str | None:
        """Why this result should be read with care, or None."""
        notes = []
        if self.noisy:
            notes.append(
                f"noisy: IQR is {self.relative_iqr:.0%} of the median over {self.repeats} repeats"
            )
        if self.repeats < 4:
            notes.append(f"only {self.repeats} repeat{'s' if self.repeats != 1 else ''}")
        return "; ".join(notes) or None

    # ---- derived rates ---------------------------------------------------------------

    @property
    def tflops(self) -> float | None:
        """TFLOP/s at the median time, or None without `flops`."""
        if self.flops is None or self.median <= 0:
            return None
        return self.flops / self.median / 1e12

    @property
    def gbps(self) -> float | None:
        """GB/s (1e9 bytes per second) at the median time, or None without `bytes`."""
        if self.bytes is None or self.median <= 0:
            return None
        return self.bytes / self.median / 1e9

    @property
    def achieved(self) -> float | None:
        """The rate in the ceiling's unit (FLOP/s or B/s), or None."""
        if self.median <= 0:
            return None
        if self.ceiling_unit == "FLOP/s" and self.flops is not None:
            return self.flops / self.median
        if self.ceiling_unit == "B/s" and self.bytes is not None:
            return self.bytes / self.median
        return None

    @property
    def percent_of_ceiling(self) -> float | None:
        """100 * achieved rate / measured ceiling, or None without a ceiling."""
        achieved = self.achieved
        if achieved is None or not self.ceiling_value:
            return None
        return 100.0 * achieved / self.ceiling_value

    # ---- text ------------------------------------------------------------------------

    @property
    def title(self) -> str:
        return " | ".join(p for p in (self.label, self.sub_label, self.description) if p)

    def rates(self) -> list[str]:
        """The derived rates as text: TFLOP/s, GB/s and % of the measured ceiling (if known)."""
        rates = []
        if self.tflops is not None:
            rates.append(f"{self.tflops:.4g} TFLOP/s")
        if self.gbps is not None:
            rates.append(f"{self.gbps:.4g} GB/s")
        if self.percent_of_ceiling is not None:
            rates.append(f"{self.percent_of_ceiling:.1f}% of measured {self.ceiling_name}")
        return rates

    def summary(self) -> str:
        """A few lines: median, IQR, repeats, rates, ceiling and warnings."""
        lines = [
            f"{self.title}" + (f"  [{self.device}]" if self.device else ""),
            f"  Median: {format_time(self.median)}  IQR: {format_time(self.iqr)} "
            f"({self.relative_iqr:.1%})  min: {format_time(self.min)}  "
            f"{self.repeats} repeats x {self.number_per_run} call"
            f"{'s' if self.number_per_run != 1 else ''}"
            + ("  (L2 flushed)" if self.flush_l2 else ""),
        ]
        host = [text for value, text in (
            (self.host_time, f"host {format_time(self.host_time)} per call"),
            (self.launch_gap, f"launch gap {format_time(self.launch_gap)} per call"),
        ) if value is not None]
        for part in (host, self.rates()):
            if part:
                lines.append("  " + ", ".join(part))
        if self.warning:
            lines.append(f"  WARNING: {self.warning}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return (
            f"<Measurement {self.title!r}: median {format_time(self.median)}, "
            f"IQR {format_time(self.iqr)}, {self.repeats} repeats>"
        )

    # ---- JSON ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: every field plus the derived statistics (for readers)."""
        data = dataclasses.asdict(self)
        data["times"] = list(self.times)
        data["schema"] = SCHEMA
        data["derived"] = {
            "median": self.median,
            "mean": self.mean,
            "iqr": self.iqr,
            "min": self.min,
            "repeats": self.repeats,
            "tflops": self.tflops,
            "gbps": self.gbps,
            "percent_of_ceiling": self.percent_of_ceiling,
            "warning": self.warning,
        }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of `to_dict` (derived values are recomputed, not read)."""
        schema = data.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise ValueError(f"Measurement.from_dict(): unknown schema {schema!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> Measurement:
        return cls.from_dict(json.loads(text))

    # ---- merging ---------------------------------------------------------------------

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        """What identifies a benchmark across runs: (label, sub_label, description)."""
        return (self.label, self.sub_label, self.description)

    @staticmethod
    def merge(measurements: Iterable[Measurement]) -> list[Measurement]:
        """Pool the times of measurements with the same key (one per key, in order).

        Like ``torch.utils.benchmark.Measurement.merge``: repeated runs of the
        same benchmark become one Measurement whose statistics use every time.
        Merged entries must agree on number_per_run, flops, bytes and device.
        """
        groups: dict[tuple, list[Measurement]] = {}
        for m in measurements:
            groups.setdefault(m.key, []).append(m)
        merged = []
        for group in groups.values():
            first = group[0]
            if len(group) == 1:
                merged.append(first)
                continue
            for other in group[1:]:
                for field in ("number_per_run", "flops", "bytes", "device"):
                    if getattr(other, field) != getattr(first, field):
                        raise ValueError(
                            f"Measurement.merge(): {first.title!r} entries disagree on {field} "
                            f"({getattr(first, field)!r} vs {getattr(other, field)!r})"
                        )
            hosts = [m.host_time for m in group if m.host_time is not None]
            gaps = [m.launch_gap for m in group if m.launch_gap is not None]
            merged.append(dataclasses.replace(
                first,
                times=tuple(t for m in group for t in m.times),
                host_time=statistics.median(hosts) if hosts else None,
                launch_gap=statistics.median(gaps) if gaps else None,
                stop_reason="merged",
            ))
        return merged
