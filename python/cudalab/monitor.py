"""GpuMonitor: utilization, memory, power, temperature and clocks over time.

A background thread reads the device's live state through NVML (see
``cudalab._nvml``; needs ``pip install nvidia-ml-py``) every ``interval_ms``
while your code runs::

    from cudalab.monitor import GpuMonitor

    with GpuMonitor(interval_ms=50) as mon:
        run_the_workload()
    print(mon.summary())
    mon.to_csv("gpu.csv")

NVML's utilization figures are averages over its own sample period (between
about 1/6 s and 1 s depending on the GPU), so sampling much faster than that
repeats values rather than resolving shorter events.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import math
import numbers
import os
import threading
import time
from types import ModuleType
from typing import Any, Sequence

from . import _core, _nvml
from ._nvml import FIELDS, NvmlError, NvmlUnavailableError

__all__ = [
    "FIELDS",
    "GpuMonitor",
    "GpuSample",
    "MonitorSummary",
    "NvmlError",
    "NvmlUnavailableError",
]

# Limits on interval_ms: below 1 ms the thread would only compete for the GIL
# (NVML itself updates far more slowly); above an hour is surely a mistake.
MIN_INTERVAL_MS = 1
MAX_INTERVAL_MS = 3_600_000

# What plot() draws when no fields are named.
DEFAULT_PLOT_FIELDS: tuple[str, ...] = (
    "gpu_utilization_pct", "sm_clock_mhz", "power_w", "temperature_c")


@dataclasses.dataclass(frozen=True)
class GpuSample:
    """One reading of a device's live state.

    Attributes
    ----------
    t_s : float
        Seconds since the monitor started.
    gpu_utilization_pct, memory_utilization_pct : int or None
        Percent of NVML's last sample period in which a kernel ran / device
        memory was read or written.
    memory_used_bytes : int or None
        Device memory in use (by every process).
    temperature_c : int or None
        GPU temperature in degrees Celsius.
    power_w, power_limit_w : float or None
        Board power draw and the enforced power limit, in watts.
    sm_clock_mhz, memory_clock_mhz : int or None
        Current SM and memory clocks.

    A field is None when the device does not support that query.
    """

    t_s: float
    gpu_utilization_pct: int | None
    memory_utilization_pct: int | None
    memory_used_bytes: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None


@dataclasses.dataclass(frozen=True)
class MonitorSummary:
    """Mean and maximum of every field over a monitor's samples.

    Attributes
    ----------
    samples : int
        Number of samples.
    duration_s : float
        Time from the first sample to the last.
    mean, max : dict of str to float or None
        Per field (the keys of :data:`FIELDS`), over the samples where the field
        is not None; None where it never is. The dataclass is frozen but these
        dicts are not: treat them as read-only.
    """

    samples: int
    duration_s: float
    mean: dict[str, float | None]
    max: dict[str, float | None]

    def __str__(self) -> str:
        lines = [f"{self.samples} samples over {self.duration_s:.3f} s",
                 f"  {'field':<24}{'mean':>14}{'max':>14}"]
        for field in FIELDS:
            mean, peak = self.mean[field], self.max[field]
            lines.append(f"  {field:<24}{_format_number(mean):>14}{_format_number(peak):>14}")
        return "\n".join(lines)


def _format_number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _check_interval(interval_ms: Any) -> float:
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, numbers.Real):
        raise TypeError("GpuMonitor() argument 'interval_ms': must be a number of "
                        f"milliseconds, not {type(interval_ms).__name__}")
    value = float(interval_ms)
    if not (math.isfinite(value) and MIN_INTERVAL_MS <= value <= MAX_INTERVAL_MS):
        raise ValueError(f"GpuMonitor() argument 'interval_ms': must be between "
                         f"{MIN_INTERVAL_MS} and {MAX_INTERVAL_MS} ms, got {interval_ms!r}")
    return value


def _check_device_argument(device: Any) -> int | None:
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, numbers.Integral):
        raise TypeError("GpuMonitor() argument 'device': must be an int or None, "
                        f"not {type(device).__name__}")
    index = int(device)
    if index < 0:
        raise ValueError("GpuMonitor() argument 'device': must be a non-negative device "
                         f"index, got {index}")
    return index


def _resolve_device(index: int | None) -> int:
    """The device to watch: `index`, or the current device; needs a GPU."""
    try:
        current = _core.current_device()
    except _core.NoDeviceError as exc:
        raise _core.NoDeviceError(
            str(exc).replace("current_device()", "GpuMonitor()", 1)) from None
    if index is None:
        return current
    count = _core.device_count()
    if index >= count:
        raise ValueError(f"GpuMonitor() argument 'device': device {index} does not exist "
                         f"({count} device{'' if count == 1 else 's'} visible)")
    return index


class GpuMonitor:
    """Sample a device's utilization, memory, power, temperature and clocks.

    A daemon thread reads the device through NVML every `interval_ms`, from
    :meth:`start` to :meth:`stop` (or over a ``with`` block). A sample is taken
    at start and another at stop, so even a short run has two.

    Parameters
    ----------
    interval_ms : float, default 100
        Time between samples in milliseconds, 1 to 3,600,000. Samples keep to
        a fixed schedule from the start; one that falls behind is not made up.
    device : int, optional
        cudalab device index; None (the default) means the current device.

    Raises
    ------
    TypeError, ValueError
        For a bad `interval_ms` or `device` (checked before anything else).
    NvmlUnavailableError
        If ``nvidia-ml-py`` is not installed (here) or the driver's NVML cannot
        be used (at :meth:`start`); the message says how to fix it.
    NoDeviceError
        Without a CUDA device.

    Examples
    --------
    >>> with GpuMonitor(interval_ms=20) as mon:        # doctest: +SKIP
    ...     for _ in range(100):
    ...         c = cudalab.matmul(a, b)
    ...     cudalab.synchronize()
    >>> mon.summary().max["sm_clock_mhz"]              # doctest: +SKIP
    1980
    """

    def __init__(self, interval_ms: float = 100, device: int | None = None) -> None:
        self.interval_ms: float = _check_interval(interval_ms)
        index = _check_device_argument(device)
        _nvml.require_package()
        self.device: int = _resolve_device(index)
        self._samples: list[GpuSample] = []
        self._lock = threading.Lock()  # guards _samples between the thread and readers
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._nvml: ModuleType | None = None
        self._handle: Any = None
        self._nvml_session = contextlib.ExitStack()  # holds NVML open while running
        self._t0 = 0.0
        self._state = "new"  # "new" -> "running" -> "stopped"

    # ---- running -------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the monitor has started and not yet stopped."""
        return self._state == "running"

    def start(self) -> GpuMonitor:
        """Initialize NVML, take the first sample and start the sampling thread.

        Returns the monitor itself. A monitor runs once: create a new one for
        another recording.

        Raises
        ------
        NvmlUnavailableError
            If NVML cannot be initialized or does not see the device.
        NvmlError
            If the first sample fails.
        RuntimeError
            If the monitor is running or has already run.
        """
        if self._state != "new":
            raise RuntimeError(f"GpuMonitor.start(): the monitor is {self._state}; "
                               "a GpuMonitor records once, create a new one")
        # NVML stays initialized until stop(), so no sample pays for initializing it.
        with contextlib.ExitStack() as stack:
            nvml = stack.enter_context(_nvml.session())
            self._handle = _nvml.device_handle(nvml, self.device)
            self._nvml = nvml
            self._t0 = time.perf_counter()
            self._record()
            self._nvml_session = stack.pop_all()  # success: keep it open past this block
        self._state = "running"
        self._thread = threading.Thread(
            target=self._run, name=f"cudalab-GpuMonitor-{self.device}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, take a last sample and release NVML.

        Idempotent: stopping a stopped monitor (or one never started) does
        nothing.

        Raises
        ------
        NvmlError
            If sampling failed in the thread (the first failure, re-raised here
            so it cannot go unnoticed; the samples before it are kept) or the
            last sample fails.
        """
        if self._state != "running":
            return
        self._state = "stopped"
        self._stop_event.set()
        assert self._thread is not None
        self._thread.join()
        try:
            if self._error is not None:
                raise self._error
            self._record()
        finally:
            self._nvml = self._handle = None
            self._nvml_session.close()

    def __repr__(self) -> str:
        interval = int(self.interval_ms) if self.interval_ms.is_integer() else self.interval_ms
        return (f"GpuMonitor(interval_ms={interval}, device={self.device}): "
                f"{self._state}, {len(self.samples)} samples")

    def __enter__(self) -> GpuMonitor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _record(self) -> None:
        t_s = time.perf_counter() - self._t0
        entry = GpuSample(t_s=t_s, **_nvml.read(self._nvml, self._handle))
        with self._lock:
            self._samples.append(entry)

    def _run(self) -> None:
        interval_s = self.interval_ms / 1000.0
        deadline = self._t0
        try:
            while True:
                deadline += interval_s
                delay = deadline - time.perf_counter()
                if delay < 0:  # fell behind (slow NVML): restart the schedule from now
                    deadline = time.perf_counter()
                    delay = 0.0
                # Event.wait, not sleep, so that stop() ends the wait at once.
                if self._stop_event.wait(delay):
                    return
                self._record()
        except BaseException as exc:  # handed to stop(), which raises it
            self._error = exc

    # ---- results -------------------------------------------------------------

    @property
    def samples(self) -> list[GpuSample]:
        """The samples so far, oldest first (a copy; safe to read while running)."""
        with self._lock:
            return list(self._samples)

    def summary(self) -> MonitorSummary:
        """Mean and maximum of each field, the sample count and the duration."""
        samples = self.samples
        mean: dict[str, float | None] = {}
        peak: dict[str, float | None] = {}
        for field in FIELDS:
            values = [getattr(s, field) for s in samples if getattr(s, field) is not None]
            mean[field] = sum(values) / len(values) if values else None
            peak[field] = max(values) if values else None
        duration = samples[-1].t_s - samples[0].t_s if samples else 0.0
        return MonitorSummary(samples=len(samples), duration_s=duration, mean=mean, max=peak)

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """The samples as CSV text with a header row (``t_s`` then :data:`FIELDS`).

        A field that is None is an empty cell.

        Parameters
        ----------
        path : str or path-like, optional
            Also write the text to this file.

        Returns
        -------
        str
        """
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        columns = ("t_s", *FIELDS)
        writer.writerow(columns)
        for entry in self.samples:
            writer.writerow(["" if (v := getattr(entry, c)) is None else v for c in columns])
        text = buffer.getvalue()
        if path is not None:
            with open(path, "w", newline="") as f:
                f.write(text)
        return text

    def plot(self, ax: Any = None, fields: str | Sequence[str] = DEFAULT_PLOT_FIELDS) -> Any:
        """Plot fields against time with matplotlib (``pip install matplotlib``).

        Parameters
        ----------
        ax : matplotlib Axes or sequence of Axes, optional
            None: a new figure with one panel per field (their units differ). One
            Axes: every field on it. A sequence (or NumPy array) of Axes: one
            per field.
        fields : str or sequence of str
            Names from :data:`FIELDS`; default utilization, SM clock, power and
            temperature.

        Returns
        -------
        matplotlib.figure.Figure
            The figure drawn on.

        Raises
        ------
        ValueError
            For an unknown field, or as many Axes as fields not given.
        ImportError
            If matplotlib is not installed.
        """
        names = (fields,) if isinstance(fields, str) else tuple(fields)
        if not names:
            raise ValueError("GpuMonitor.plot() argument 'fields': must name at least one field")
        for name in names:
            if name not in FIELDS:
                raise ValueError(f"GpuMonitor.plot() argument 'fields': unknown field {name!r}; "
                                 f"choose from {', '.join(FIELDS)}")
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("GpuMonitor.plot() needs matplotlib: pip install matplotlib"
                              ) from exc
        shared = ax is not None and hasattr(ax, "plot")  # one Axes for every field
        if ax is None:
            _, axes = plt.subplots(len(names), 1, sharex=True, squeeze=False,
                                   figsize=(7, 1.8 * len(names) + 0.6))
            panels = [row[0] for row in axes]
        elif shared:
            panels = [ax] * len(names)
        else:  # a sequence (or NumPy array) of Axes
            panels = list(ax)
            if len(panels) != len(names):
                raise ValueError(f"GpuMonitor.plot() argument 'ax': got {len(panels)} Axes "
                                 f"for {len(names)} fields")
        figure = panels[0].figure
        samples = self.samples
        times = [s.t_s for s in samples]
        for panel, name in zip(panels, names):
            values = [math.nan if (v := getattr(s, name)) is None else v for s in samples]
            panel.plot(times, values, label=name)
            if not shared:
                panel.set_ylabel(name)
        if shared:
            panels[0].legend()
        panels[-1].set_xlabel("time (s)")
        return figure
