"""Human-readable reports of the stream-ordered memory pool's statistics.

``_core.memory_stats`` returns a flat dict of counters (PyTorch-style key
names); :func:`memory_summary` formats it as a fixed-width table in the spirit
of ``torch.cuda.memory_summary``. The formatting is a pure function,
:func:`format_memory_summary`, so that it can be tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import _core
from ._table import format_bytes  # the one byte formatter (re-exported here)

__all__ = ["STAT_KEYS", "format_bytes", "format_memory_summary", "memory_summary"]


# The keys _core.memory_stats() returns (and format_memory_summary reads).
STAT_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "requested_bytes.all.current",
    "requested_bytes.all.peak",
    "allocation.all.current",
    "allocation.all.allocated",
    "allocation.all.freed",
    "num_alloc_retries",
    "num_ooms",
    "limit_bytes",
    "fraction",
    "device_free_bytes",
    "device_total_bytes",
)

# Table geometry: "| label | v | v | v | v |".
_LABEL_WIDTH = 21
_VALUE_WIDTH = 11  # fits the longest format_bytes output, "1023.99 KiB"
_NUM_VALUES = 4
_INNER_WIDTH = _LABEL_WIDTH + _NUM_VALUES * (_VALUE_WIDTH + 3) + 2  # between the outer bars


def _border(char: str) -> str:
    return "|" + char * _INNER_WIDTH + "|"


def _row(label: str, *values: str) -> str:
    cells = " | ".join(f"{v:>{_VALUE_WIDTH}}" for v in values)
    return f"| {label:<{_LABEL_WIDTH}} | {cells} |"


def _wide_row(label: str, text: str) -> str:
    # One value spanning all value columns.
    width = _INNER_WIDTH - _LABEL_WIDTH - 5
    return f"| {label:<{_LABEL_WIDTH}} | {text:<{width}} |"


def format_memory_summary(stats: Mapping[str, int | float], device: int, abbreviated: bool = False) -> str:
    """Format memory statistics as a fixed-width text table.

    Parameters
    ----------
    stats : mapping
        The dict ``_core.memory_stats`` returns (keys such as
        ``"allocated_bytes.all.current"``, ``"num_ooms"``, ``"limit_bytes"``).
    device : int
        Device index, shown in the title.
    abbreviated : bool, optional
        If True, show only the memory rows (allocated, requested, reserved),
        leaving out the allocation counts and the limit / device rows.

    Returns
    -------
    str
        The table, one line per row, no trailing newline. A "-" marks a
        statistic the pool does not track.

    Raises
    ------
    KeyError
        If ``stats`` lacks a key; the message names every missing key.
    """
    missing = [k for k in STAT_KEYS if k not in stats]
    if missing:
        raise KeyError(f"format_memory_summary(): stats lack {', '.join(missing)}")

    title = f"cudalab memory summary, device {device}"
    ooms = f"OOMs: {stats['num_ooms']}"
    retries = f"alloc retries: {stats['num_alloc_retries']}"
    half = (_INNER_WIDTH - 1) // 2
    lines = [
        _border("="),
        f"|{title:^{_INNER_WIDTH}}|",
        _border("-"),
        f"|{ooms:^{half}}|{retries:^{_INNER_WIDTH - half - 1}}|",
        _border("="),
        _row("Metric", "Current", "Peak", "Total", "Freed"),
        _border("-"),
    ]
    # The pool tracks no cumulative byte totals, hence "-" in the last two columns.
    for label, key in (
        ("Allocated memory", "allocated_bytes"),
        ("Requested memory", "requested_bytes"),
        ("Reserved memory", "reserved_bytes"),
    ):
        current = format_bytes(stats[f"{key}.all.current"])
        peak = format_bytes(stats[f"{key}.all.peak"])
        lines.append(_row(label, current, peak, "-", "-"))

    if not abbreviated:
        lines += [
            _border("-"),
            _row(
                "Allocations",
                str(stats["allocation.all.current"]),
                "-",
                str(stats["allocation.all.allocated"]),
                str(stats["allocation.all.freed"]),
            ),
            _border("-"),
            _wide_row(
                "Per-process limit",
                f"{format_bytes(stats['limit_bytes'])} (fraction {float(stats['fraction']):.2f})",
            ),
            _wide_row(
                "Device free / total",
                f"{format_bytes(stats['device_free_bytes'])} / {format_bytes(stats['device_total_bytes'])}",
            ),
        ]
    lines.append(_border("="))
    return "\n".join(lines)


def memory_summary(device: int | None = None, abbreviated: bool = False) -> str:
    """Return a readable table of the memory pool's statistics for a device.

    Parameters
    ----------
    device : int, optional
        Device index; None (the default) means the current device.
    abbreviated : bool, optional
        If True, show only the allocated / requested / reserved memory rows.

    Returns
    -------
    str
        See :func:`format_memory_summary`.

    Raises
    ------
    NoDeviceError
        Without a CUDA device or driver.
    TypeError, ValueError
        For a ``device`` that is not the index of a visible device.
    """
    # The C extension checks `device` and names this function in its errors.
    index = _core._parse_device(device, "memory_summary")
    return format_memory_summary(_core.memory_stats(index), index, abbreviated=abbreviated)
