"""`Compare`: side-by-side tables of Measurements, in torch.utils.benchmark's layout.

One table per `label`; one row per `sub_label`; one column per
`description`. Repeated measurements of the same (label, sub_label,
description) are merged first. Cells show the median per call in one unit per
table (or a derived rate: TFLOP/s, GB/s, % of ceiling), with an optional
``(!)`` mark on noisy results and optional colour: green for the best cell
of each row (or column), red for cells at least 1.5x slower.

(The module is not called ``compare``: that name in cudalab.bench is the
baseline comparison function, `cudalab.bench.baseline.compare`.)
"""

from __future__ import annotations

from typing import Iterable

from .._table import format_table
from .measurement import Measurement

__all__ = ["Compare"]

_VALUES = ("time", "tflops", "gbps", "percent_of_ceiling")
_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))
_GREEN, _RED, _RESET = "\033[92m", "\033[91m", "\033[0m"


class Compare:
    """Tables comparing measurements, one per label.

    Parameters
    ----------
    measurements : iterable of Measurement
    value : str, optional
        What each cell shows: ``"time"`` (median per call, default),
        ``"tflops"``, ``"gbps"`` or ``"percent_of_ceiling"``.
    """

    def __init__(self, measurements: Iterable[Measurement], value: str = "time") -> None:
        if value not in _VALUES:
            raise ValueError(
                f"Compare() argument 'value': expected one of {', '.join(map(repr, _VALUES))}, "
                f"got {value!r}"
            )
        self._results: list[Measurement] = []
        self._value = value
        self._highlight = False
        self._colorize: str | None = None
        self._significant: int | None = None
        self.extend_results(measurements)

    def extend_results(self, measurements: Iterable[Measurement]) -> None:
        for m in measurements:
            if not isinstance(m, Measurement):
                raise TypeError(
                    f"Compare() expects Measurement objects, got {type(m).__name__}"
                )
            self._results.append(m)

    def highlight_warnings(self) -> Compare:
        """Mark noisy cells with ``(!)`` (IQR over 10% of the median)."""
        self._highlight = True
        return self

    def colorize(self, rowwise: bool = False) -> Compare:
        """Colour the best cell of each column (of each row with rowwise)."""
        self._colorize = "row" if rowwise else "column"
        return self

    def trim_significant_figures(self, digits: int = 3) -> Compare:
        """Show only `digits` significant figures."""
        if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
            raise ValueError(f"trim_significant_figures() argument 'digits': expected an int >= 1, got {digits!r}")
        self._significant = digits
        return self

    # ---- rendering -------------------------------------------------------------------

    def _cell_value(self, m: Measurement) -> float | None:
        if self._value == "time":
            return m.median
        return getattr(m, self._value)

    def _format(self, value: float | None, scale: float) -> str:
        if value is None:
            return "-"
        scaled = value / scale
        if self._significant is not None:
            return f"{scaled:.{self._significant}g}"
        return f"{scaled:.1f}" if abs(scaled) >= 100 else f"{scaled:.3g}" if abs(scaled) < 1 else f"{scaled:.2f}"

    def _table(self, label: str, group: list[Measurement]) -> str:
        rows: list[str] = []
        columns: list[str] = []
        cells: dict[tuple[str, str], Measurement] = {}
        for m in group:
            row = m.sub_label or m.label
            col = m.description or ""
            if row not in rows:
                rows.append(row)
            if col not in columns:
                columns.append(col)
            cells[(row, col)] = m

        values = {key: self._cell_value(m) for key, m in cells.items()}
        higher_is_better = self._value != "time"
        if self._value == "time":
            finite = [v for v in values.values() if v]
            smallest = min(finite) if finite else 1.0
            unit, scale = next(((u, s) for u, s in _TIME_UNITS if smallest >= s), _TIME_UNITS[-1])
            unit_note = f"Times are median per call in {unit}"
        else:
            scale = 1.0
            unit_note = {"tflops": "TFLOP/s at the median time", "gbps": "GB/s at the median time",
                         "percent_of_ceiling": "% of the measured ceiling"}[self._value]

        def best_of(keys: list[tuple[str, str]]) -> float | None:
            present = [values[k] for k in keys if values.get(k) is not None]
            if not present:
                return None
            return max(present) if higher_is_better else min(present)

        header = [""] + [c or "(value)" for c in columns]
        body = []
        for row in rows:
            line = [row]
            for col in columns:
                m = cells.get((row, col))
                if m is None:
                    line.append("")
                    continue
                text = self._format(values[(row, col)], scale)
                if self._highlight and m.noisy:
                    text += " (!)"
                line.append(text)
            body.append(line)

        def colour(r_index: int, c_index: int, padded: str) -> str:
            cell = body[r_index][c_index]
            if self._colorize and c_index > 0 and cell:
                key = (rows[r_index], columns[c_index - 1])
                group_keys = ([(rows[r_index], c) for c in columns] if self._colorize == "row"
                              else [(r, columns[c_index - 1]) for r in rows])
                best = best_of(group_keys)
                v = values.get(key)
                if v is not None and best is not None:
                    if v == best:
                        padded = f"{_GREEN}{padded}{_RESET}"
                    elif (v >= 1.5 * best) if not higher_is_better else (v * 1.5 <= best):
                        padded = f"{_RED}{padded}{_RESET}"
            return padded

        # The one table formatter, without its rule, trailing spaces kept, cells coloured.
        out = [format_table(header, body, title=f"[{'-' * 2} {label} {'-' * 2}]", rule=False,
                            strip=False, decorate=colour)]
        devices = sorted({m.device for m in group if m.device})
        note = unit_note + (f"; device: {', '.join(devices)}" if devices else "")
        if self._highlight and any(m.noisy for m in group):
            note += "; (!) = noisy: IQR over 10% of the median"
        out.append(note)
        return "\n".join(out)

    def __str__(self) -> str:
        merged = Measurement.merge(self._results)
        groups: dict[str, list[Measurement]] = {}
        for m in merged:
            groups.setdefault(m.label, []).append(m)
        return "\n\n".join(self._table(label, group) for label, group in groups.items())

    def print(self) -> None:
        """Print the tables (the one place this module writes to stdout)."""
        print(str(self))
