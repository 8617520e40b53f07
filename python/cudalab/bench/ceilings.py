"""Measured ceilings: what this GPU actually does at its best, per process.

Every lesson result is placed against a *measured* ceiling, not only the
datasheet, because the theoretical peaks of `get_device_properties()` are
upper bounds (max boost clock, no protocol overhead) that no kernel reaches.

=================  ============================================  ===========
name               the case (`cudalab.bench.cases`)               theoretical
=================  ============================================  ===========
copy               ``CopyCase``: device-to-device copy of 1 GiB   DRAM peak
                   (or a quarter of free memory), bytes read +
                   written
h2d, d2h           ``TransferCase``: 256 MiB between pinned host  -
                   memory and the device, non_blocking copies
launch             ``LaunchCase``: seconds per empty kernel,      -
                   10,000 launched back to back from C then
                   synchronized (host clock, 15 repeats)
matmul_<dtype>     ``MatmulCase``: n^3 GEMM through               tensor/FMA
                   cudalab.matmul (n = 8192, or 4096 when memory  peak
                   is short), dtype float64, float32 (true fp32),
                   tf32, float16, bfloat16
=================  ============================================  ===========

Each is measured on first use, once per process and device, with the
"sustained" preset (the clock settled under load), and cached:
`ceiling(name)` measures only that one, `ceilings()` measures all of them.
Inside ``with ceiling_preset("quick"):`` (what quick lessons do) a ceiling
not yet cached is measured with that lighter preset instead, in about a
tenth of the time; a later request outside the block measures it again at
the full preset. Every Ceiling's measurement names the preset it used.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterable, Mapping

from .. import _core
from .._table import format_table
from ..devices import get_device_properties
from .cases import MATMUL_DTYPES, Case, CopyCase, LaunchCase, MatmulCase, TransferCase
from .measurement import Measurement, format_time
from .results import Row
from .timer import Timer, set_ceiling_resolver

__all__ = ["CEILING_NAMES", "Ceiling", "Ceilings", "ceiling", "ceiling_preset", "ceilings",
           "resolve_ceiling"]

CEILING_NAMES: tuple[str, ...] = (
    "copy", "h2d", "d2h", "launch", *(f"matmul_{d}" for d in MATMUL_DTYPES)
)
TRANSFER_BYTES = 256 << 20
COPY_BYTES = 1 << 30
LAUNCHES = 10_000

# (device, name) -> (preset it was measured with, the ceiling)
_cache: dict[tuple[int, str], tuple[str, "Ceiling"]] = {}


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

    def row(self) -> Row:
        """The results-file row: name, value, unit, theoretical and the measurement."""
        fields = self.to_dict()
        del fields["measurement"]
        return Row(self.measurement, fields)

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

# The preset ceilings are measured with, unless ceiling_preset() says otherwise.
CEILING_PRESET = "sustained"
# The presets ceiling_preset() takes, lightest first: a cached ceiling serves
# a request for its own preset or a lighter one.
CEILING_PRESETS = ("quick", "default", "sustained")
_preset: contextvars.ContextVar[str] = contextvars.ContextVar("cudalab_ceiling_preset",
                                                              default=CEILING_PRESET)


@contextlib.contextmanager
def ceiling_preset(preset: str):
    """Within the block, measure ceilings not yet cached with `preset`.

    Quick lessons use ``ceiling_preset("quick")`` so that a ceiling they
    need costs a fraction of a second instead of several; a ceiling already
    measured with the same or a heavier preset is reused as it is.

    Parameters
    ----------
    preset : {'quick', 'default', 'sustained'}
    """
    if preset not in CEILING_PRESETS:
        raise ValueError(f"ceiling_preset() argument 'preset': expected one of "
                         f"{', '.join(repr(p) for p in CEILING_PRESETS)}, got {preset!r}")
    token = _preset.set(preset)
    try:
        yield
    finally:
        _preset.reset(token)


def _case(name: str, device: int) -> Case:
    """The benchmark case behind ceiling `name`, sized for the free memory of `device`."""
    if name == "copy":
        return CopyCase.sized_for(_core.mem_get_info(device)[0], COPY_BYTES)
    if name in ("h2d", "d2h"):
        return TransferCase(name, "pinned", TRANSFER_BYTES)
    if name == "launch":
        return LaunchCase(LAUNCHES)
    return MatmulCase.sized_for(name[len("matmul_"):], _core.mem_get_info(device)[0])


def _run(name: str, props, preset: str) -> Ceiling:
    case = _case(name, props.device)
    m = case.measure(Timer(preset), label="ceiling", sub_label=name, description=None)
    if isinstance(case, LaunchCase):
        return Ceiling(name=name, value=m.median, unit="s", theoretical=None, measurement=m)
    if isinstance(case, MatmulCase):
        return Ceiling(name=name, value=m.flops / m.median, unit="FLOP/s",
                       theoretical=props.peak_flops.get(case.peak_key), measurement=m)
    theoretical = props.peak_memory_bandwidth if name == "copy" else None
    return Ceiling(name=name, value=m.bytes / m.median, unit="B/s", theoretical=theoretical,
                   measurement=m)


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

    Measured with the "sustained" preset, or the one `ceiling_preset` set.

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
    preset = _preset.get()
    cached = _cache.get(key)
    if refresh or cached is None or (CEILING_PRESETS.index(cached[0]) <
                                     CEILING_PRESETS.index(preset)):
        from ..devices import device as device_context

        with device_context(index):
            cached = _cache[key] = (preset, _run(name, get_device_properties(index), preset))
    return cached[1]


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


# Timer.measure resolves its `ceiling` argument with this (see set_ceiling_resolver).
set_ceiling_resolver(resolve_ceiling)
