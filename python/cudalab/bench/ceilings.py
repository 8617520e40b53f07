"""Measured ceilings: what this GPU actually does at its best, per process.

Every lesson result is placed against a *measured* ceiling, not only the
datasheet, because the theoretical peaks of `get_device_properties()` are
upper bounds (max boost clock, no protocol overhead) that no kernel reaches.

=================  ============================================  ===========
name               how it is measured                             theoretical
=================  ============================================  ===========
copy               device-to-device copy of a contiguous buffer   DRAM peak
                   (1 GiB, or a quarter of free memory), bytes
                   read + written
h2d, d2h           256 MiB between pinned host memory and the     -
                   device, non_blocking copies
launch             seconds per empty kernel, 10,000 launched      -
                   back to back from C then synchronized (the
                   rate the host can feed the GPU)
matmul_<dtype>     n^3 GEMM through cudalab.matmul (n = 8192, or  tensor/FMA
                   4096 when memory is short), dtype float64,      peak
                   float32 (true fp32), tf32, float16, bfloat16
=================  ============================================  ===========

Each is measured on first use, once per process and device, with
`measure()`, and cached: `ceiling(name)` measures only that one,
`ceilings()` measures all of them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable, Mapping

from .. import _core
from .. import random as _random
from .._table import format_table
from ..devices import get_device_properties
from .measurement import Measurement, format_time

__all__ = ["CEILING_NAMES", "Ceiling", "Ceilings", "ceiling", "ceilings", "resolve_ceiling"]

MATMUL_DTYPES = ("float64", "float32", "tf32", "float16", "bfloat16")
CEILING_NAMES: tuple[str, ...] = (
    "copy", "h2d", "d2h", "launch", *(f"matmul_{d}" for d in MATMUL_DTYPES)
)
TRANSFER_BYTES = 256 << 20
COPY_BYTES = 1 << 30
LAUNCHES = 10_000

_cache: dict[tuple[int, str], "Ceiling"] = {}


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """One measured ceiling.

    Attributes
    ----------
    name : str
        One of `CEILING_NAMES`.
    value : float
        The measured rate: B/s (copy, h2d, d2h), FLOP/s (matmul_*), or
        seconds per launch (launch: lower is better).
    unit : str
        ``"B/s"``, ``"FLOP/s"`` or ``"s"``.
    theoretical : float or None
        The matching theoretical peak from the device properties, if any.
    measurement : Measurement
        The timing it came from.
    """

    name: str
    value: float
    unit: str
    theoretical: float | None
    measurement: Measurement

    @property
    def percent_of_theoretical(self) -> float | None:
        if not self.theoretical:
            return None
        return 100.0 * self.value / self.theoretical

    def formatted(self) -> str:
        """The value with a readable unit: '4255 GB/s', '702.1 TFLOP/s', '2.1 us'."""
        return _format_value(self.value, self.unit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "theoretical": self.theoretical,
            "percent_of_theoretical": self.percent_of_theoretical,
            "measurement": self.measurement.to_dict(),
        }


def _format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "B/s":
        return f"{value / 1e9:.4g} GB/s"
    if unit == "FLOP/s":
        return f"{value / 1e12:.4g} TFLOP/s"
    return format_time(value)


@dataclasses.dataclass(frozen=True)
class Ceilings(Mapping[str, Ceiling]):
    """The ceilings of one device, by name (a read-only mapping)."""

    device: str
    device_index: int
    entries: dict[str, Ceiling]

    def __getitem__(self, name: str) -> Ceiling:
        return self.entries[name]

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def table(self) -> str:
        """A text table: name, measured, theoretical, % of theoretical, IQR."""
        rows = []
        for c in self.entries.values():
            pct = c.percent_of_theoretical
            rows.append((
                c.name,
                c.formatted(),
                _format_value(c.theoretical, c.unit) if c.theoretical else "-",
                f"{pct:.1f}" if pct is not None else "-",
                f"{c.measurement.relative_iqr:.1%}",
            ))
        return format_table(
            ("ceiling", "measured", "theoretical", "% of theor.", "IQR/median"), rows,
            title=f"Measured ceilings of {self.device} (device {self.device_index})")

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "device_index": self.device_index,
            "ceilings": {name: c.to_dict() for name, c in self.entries.items()},
        }


# ---- the measurements ---------------------------------------------------------------


def _measure_kw() -> dict[str, Any]:
    # Warm-up long enough for the clock to settle under sustained load.
    return {"ceiling": None, "warmup": 0.25, "min_run_time": 0.2, "max_run_time": 1.0}


def _copy(props) -> tuple[float, float | None, Measurement]:
    free, _ = _core.mem_get_info(props.device)
    nbytes = min(COPY_BYTES, (free // 4) & ~0xFFFF)
    src = _core.full(nbytes // 4, 1.5, dtype="float32")
    m = _timed(lambda: src.copy(), "copy", bytes=2 * nbytes,
               metadata={"nbytes": nbytes})
    return 2 * nbytes / m.median, props.peak_memory_bandwidth, m


def _transfer(props, direction: str) -> tuple[float, None, Measurement]:
    host = _core.pinned_empty(TRANSFER_BYTES // 4, "float32")
    host[:] = 1.25
    if direction == "h2d":
        fn = lambda: _core.asarray(host, non_blocking=True)  # noqa: E731
    else:
        dev = _core.asarray(host)
        fn = lambda: dev.get(out=host, non_blocking=True)  # noqa: E731
    m = _timed(fn, direction, bytes=TRANSFER_BYTES, metadata={"nbytes": TRANSFER_BYTES, "pinned": True})
    return TRANSFER_BYTES / m.median, None, m


def _launch(props) -> tuple[float, None, Measurement]:
    # Host clock around LAUNCHES launches plus a synchronize: the per-launch
    # cost when the host feeds the GPU as fast as it can. Repeated for a median.
    _core._empty_kernel(LAUNCHES)
    _core.synchronize()
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        _core._empty_kernel(LAUNCHES)
        _core.synchronize()
        times.append((time.perf_counter() - t0) / LAUNCHES)
    m = Measurement(label="ceiling", sub_label="launch", times=tuple(times), number_per_run=LAUNCHES,
                    device=props.name, device_index=props.device,
                    metadata={"method": "host clock around 10,000 empty-kernel launches + synchronize"})
    return m.median, None, m


def _matmul(props, dtype: str) -> tuple[float, float | None, Measurement]:
    free, _ = _core.mem_get_info(props.device)
    n = 8192 if free > 3 * 8192 * 8192 * 8 * 2 else 4096
    np_dtype = "float32" if dtype == "tf32" else dtype
    a = _random.normal((n, n), dtype=np_dtype, seed=1)
    b = _random.normal((n, n), dtype=np_dtype, seed=2)
    out = _core.empty((n, n), dtype=np_dtype)
    precision = "high" if dtype == "tf32" else ("highest" if dtype == "float32" else None)
    fn = lambda: _core.matmul(a, b, out=out, precision=precision)  # noqa: E731
    flops = 2.0 * n * n * n
    m = _timed(fn, f"matmul_{dtype}", flops=flops, metadata={"n": n, "dtype": dtype})
    key = "tfloat32" if dtype == "tf32" else dtype
    return flops / m.median, props.peak_flops.get(key), m


def _timed(fn, name: str, **kw: Any) -> Measurement:
    from .timer import measure

    return measure(fn, label="ceiling", sub_label=name, **_measure_kw(), **kw)


def _run(name: str, props) -> Ceiling:
    if name == "copy":
        value, theoretical, m = _copy(props)
        unit = "B/s"
    elif name in ("h2d", "d2h"):
        value, theoretical, m = _transfer(props, name)
        unit = "B/s"
    elif name == "launch":
        value, theoretical, m = _launch(props)
        unit = "s"
    else:
        value, theoretical, m = _matmul(props, name[len("matmul_"):])
        unit = "FLOP/s"
    return Ceiling(name=name, value=value, unit=unit, theoretical=theoretical, measurement=m)


def _check_name(name: Any, func: str, param: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{func}() argument '{param}': expected a str, got {type(name).__name__}")
    if name not in CEILING_NAMES:
        raise ValueError(
            f"{func}() argument '{param}': unknown ceiling {name!r} "
            f"(expected one of {', '.join(repr(n) for n in CEILING_NAMES)})"
        )
    return name


def _device_index(device: int | None, func: str) -> int:
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise TypeError(f"{func}() argument 'device': expected an int or None, got {type(device).__name__}")
    if not _core.is_available():
        raise _core.NoDeviceError(f"{func}(): no CUDA device is available")
    index = _core.current_device() if device is None else device
    if not 0 <= index < _core.device_count():
        raise ValueError(f"{func}() argument 'device': no device {index} "
                         f"({_core.device_count()} available)")
    return index


def ceiling(name: str, device: int | None = None, refresh: bool = False) -> Ceiling:
    """Measure (once per process) and return one ceiling of `device`.

    Parameters
    ----------
    name : str
        One of `CEILING_NAMES`.
    device : int, optional
        Device index (default: the current device).
    refresh : bool, optional
        Measure again even when cached.
    """
    name = _check_name(name, "ceiling", "name")
    index = _device_index(device, "ceiling")
    key = (index, name)
    if refresh or key not in _cache:
        from ..devices import device as device_context

        with device_context(index):
            _cache[key] = _run(name, get_device_properties(index))
    return _cache[key]


def ceilings(device: int | None = None, names: Iterable[str] | None = None,
             refresh: bool = False, progress=None) -> Ceilings:
    """Measure (once per process) and return the ceilings of `device`.

    Parameters
    ----------
    device : int, optional
        Device index (default: the current device).
    names : iterable of str, optional
        A subset of `CEILING_NAMES` (default: all of them).
    refresh : bool, optional
        Measure again even when cached.
    progress : callable, optional
        Called as ``progress(done, total, name)`` before each ceiling (the
        CLI draws its progress bar with it).
    """
    wanted = list(CEILING_NAMES if names is None else names)
    for n in wanted:
        _check_name(n, "ceilings", "names")
    index = _device_index(device, "ceilings")
    entries = {}
    for i, n in enumerate(wanted):
        if progress is not None:
            progress(i, len(wanted), n)
        entries[n] = ceiling(n, index, refresh=refresh)
    if progress is not None:
        progress(len(wanted), len(wanted), "done")
    return Ceilings(device=get_device_properties(index).name, device_index=index, entries=entries)


def resolve_ceiling(spec: Any, flops: float | None, bytes: float | None,
                    check_only: bool = False) -> tuple[str | None, float | None, str | None]:
    """`measure()`'s `ceiling` argument as (name, value, unit).

    With check_only, only validates (no GPU work) and returns Nones.
    """
    if spec is None:
        return None, None, None
    if isinstance(spec, Ceiling):
        return spec.name, spec.value, spec.unit
    if not isinstance(spec, str):
        raise TypeError(
            f"measure() argument 'ceiling': expected a str, a Ceiling or None, got {type(spec).__name__}"
        )
    if spec == "auto":
        if bytes is None or flops is not None:
            return None, None, None
        spec = "copy"
    name = _check_name(spec, "measure", "ceiling")
    if name == "launch":
        raise ValueError("measure() argument 'ceiling': 'launch' is a time, not a rate to compare against")
    unit = "FLOP/s" if name.startswith("matmul_") else "B/s"
    needed = flops if unit == "FLOP/s" else bytes
    if needed is None:
        raise ValueError(
            f"measure() argument 'ceiling': {name!r} is in {unit}, so "
            f"{'flops' if unit == 'FLOP/s' else 'bytes'} must be given too"
        )
    if check_only:
        return None, None, None
    c = ceiling(name)
    return c.name, c.value, c.unit
