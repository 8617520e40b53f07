"""Plain-text formatting for reports, one of each: tables (the first column
left-aligned, the rest right-aligned), times and byte counts.

`format_time` is re-exported as ``cudalab.bench.format_time``, `format_bytes` as
``cudalab.memory.format_bytes`` (and, with ``short=True``, as the lessons'
``format_bytes_short``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

__all__ = ["format_bytes", "format_table", "format_time"]

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None,
                 left: int = 1, rule: bool = True, strip: bool = True,
                 decorate: Callable[[int, int, str], str] | None = None) -> str:
    """Columns padded to their widest cell, a dashed rule under the header.

    The first `left` columns are left-aligned (text), the others right-aligned (numbers).
    `rule` False leaves out the dashed rule; `strip` False keeps the trailing spaces of
    each line; `decorate(row, column, padded)`, when given, rewrites each padded body
    cell (row and column counted from 0; used for colours).
    """
    table = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(cells: list[str], row: int | None = None) -> str:
        padded = [c.ljust(w) if i < left else c.rjust(w)
                  for i, (c, w) in enumerate(zip(cells, widths))]
        if decorate is not None and row is not None:
            padded = [decorate(row, i, p) for i, p in enumerate(padded)]
        text = "  ".join(padded)
        return text.rstrip() if strip else text

    out = [title] if title else []
    out.append(line(table[0]))
    if rule:
        out.append("  ".join("-" * w for w in widths))
    out.extend(line(r, i) for i, r in enumerate(table[1:]))
    return "\n".join(out)


def format_time(seconds: float) -> str:
    """A time with a unit that keeps 3-4 significant digits: '812.3 us'."""
    if seconds is None or math.isnan(seconds):
        return "-"
    magnitude = abs(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if magnitude >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def format_bytes(n: float, short: bool = False) -> str:
    """Format a byte count with binary units.

    Parameters
    ----------
    n : int
        Number of bytes (may be negative).
    short : bool, optional
        False (default): whole bytes below 1 KiB (``"0 B"``, ``"1023 B"``),
        otherwise two decimals in the largest unit up to TiB (``"1.50 KiB"``,
        ``"1.00 GiB"``). True: up to 4 significant digits in the largest unit
        up to GiB that `n` reaches (``"4 KiB"``, ``"1.5 MiB"``, ``"2 GiB"``;
        ``"512 B"``), for labels.

    Returns
    -------
    str

    Examples
    --------
    >>> format_bytes(1536)
    '1.50 KiB'
    >>> format_bytes(1536, short=True)
    '1.5 KiB'
    """
    if short:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n >= size:
                return f"{n / size:.4g} {unit}"
        return f"{n:.0f} B"
    n = int(n)
    size = abs(n)
    sign = "-" if n < 0 else ""
    if size < 1024:
        return f"{sign}{size} B"
    value = float(size)
    unit = 0
    # Move up while the value would print as 1024.00 or more, so that
    # 1073741823 reads "1.00 GiB" and not "1024.00 MiB".
    while round(value, 2) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{sign}{value:.2f} {_BYTE_UNITS[unit]}"
