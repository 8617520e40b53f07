"""Plain-text tables for reports: the first column left-aligned, the rest right-aligned."""

from __future__ import annotations

from typing import Sequence

__all__ = ["format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None,
                 left: int = 1) -> str:
    """Columns padded to their widest cell, a dashed rule under the header.

    The first `left` columns are left-aligned (text), the others right-aligned (numbers).
    """
    table = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [title] if title else []
    out.append(line(table[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in table[1:])
    return "\n".join(out)
