"""What a lesson returns: `LessonResult` and the pieces it is made of.

A result is immutable and complete: the parameters it ran with, the device
and software it ran on, every timing (`cudalab.bench.Measurement`), the
table rows, the findings computed from those numbers, the tutorial's claims
with the value measured here, and the correctness checks. It round-trips
through JSON (`to_dict` / `from_dict`), prints as a table, renders in a
notebook, and plots.
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any, Callable, Mapping

from .._table import format_table
from ..bench import Measurement

__all__ = ["Check", "Claim", "Finding", "LessonResult", "set_lesson_lookup"]

# How `LessonResult.plot` finds a lesson's figure by name. The registry builds
# LessonResults, so it imports this module; it installs its `get` here when it
# loads (cudalab.lessons imports it before any result exists) instead of this
# module importing it back.
_get_lesson: Callable[[str], Any] | None = None


def set_lesson_lookup(get: Callable[[str], Any]) -> None:
    """Install `get` (cudalab.lessons.registry.get: name -> Lesson) for `LessonResult.plot`."""
    global _get_lesson
    _get_lesson = get


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing the lesson's numbers say, computed from them (never fixed prose).

    Attributes
    ----------
    text : str
        The finding in words, with its numbers filled in.
    value : float or None
        The number it rests on (a ratio, a rate, a size).
    unit : str or None
        The unit of `value` (``"x"``, ``"GB/s"``, ``"TFLOP/s"``, ...).
    labels : tuple of str
        The measurement labels it is computed from.
    """

    text: str
    value: float | None = None
    unit: str | None = None
    labels: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Claim:
    """A tutorial's claim beside what this GPU measured.

    Attributes
    ----------
    claim : str
        What the tutorial says, in our words.
    tutorial : float or None
        The tutorial's figure (a T4 run for the Colab lessons), if it gives one.
    measured : float or None
        The same quantity measured here.
    unit : str or None
    held : bool
        Whether the claim holds on this GPU, decided by a named threshold.
    why : str
        One line on why it held or not.
    """

    claim: str
    tutorial: float | None
    measured: float | None
    unit: str | None
    held: bool
    why: str


@dataclasses.dataclass(frozen=True)
class Check:
    """A correctness check: what was compared, the error found and the bound.

    Attributes
    ----------
    what : str
    max_error : float
        The largest error found (relative unless the text says otherwise).
    tolerance : float
    passed : bool
    """

    what: str
    max_error: float
    tolerance: float
    passed: bool


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return str(value)


_CLAIM_HEADER = ["tutorial claim", "tutorial", "measured here", "held", "why"]


def _claim_cells(c: Claim) -> list[str]:
    return [c.claim, _fmt(c.tutorial), f"{_fmt(c.measured)} {c.unit or ''}".strip(),
            _fmt(c.held), c.why]


def _columns(rows: tuple[dict[str, Any], ...]) -> list[str]:
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    return columns


@dataclasses.dataclass(frozen=True)
class LessonResult:
    """The immutable result of `cudalab.lessons.run`.

    Attributes
    ----------
    lesson, number, title, seed : str, int, str, str
        Which lesson ran, and the tutorial section it comes from.
    params : dict
        The parameters it ran with (defaults merged with the caller's).
    quick : bool
        Whether the quick parameters were the defaults.
    device : dict
        Properties of the device it ran on (name, compute capability, SMs,
        memory, clocks, peaks).
    env : dict
        Versions (Python, NumPy, cudalab, PyTorch when installed), CUDA
        runtime and driver, host.
    measurements : dict of str to Measurement
        Every timing, by label.
    rows : tuple of dict
        The lesson's table, one dict per row.
    findings, claims, checks : tuple
        `Finding`, `Claim` and `Check` records.
    wall_seconds : float
        How long the lesson ran.
    created : str
        ISO 8601 time the run finished.
    """

    lesson: str
    number: int
    title: str
    seed: str
    params: dict[str, Any]
    quick: bool
    device: dict[str, Any]
    env: dict[str, Any]
    measurements: dict[str, Measurement]
    rows: tuple[dict[str, Any], ...]
    findings: tuple[Finding, ...]
    claims: tuple[Claim, ...]
    checks: tuple[Check, ...]
    wall_seconds: float
    created: str

    # ---- JSON ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; `from_dict` is its inverse."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["measurements"] = {k: m.to_dict() for k, m in self.measurements.items()}
        data["rows"] = [dict(r) for r in self.rows]
        for name in ("findings", "claims", "checks"):
            data[name] = [dataclasses.asdict(x) for x in data[name]]
        data["params"] = {k: list(v) if isinstance(v, tuple) else v
                          for k, v in self.params.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LessonResult:
        """Rebuild a result from `to_dict`'s output (for example read from JSON)."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(data)
        if missing:
            raise ValueError(f"LessonResult.from_dict(): missing keys {sorted(missing)}")
        values = {k: data[k] for k in names}
        values["measurements"] = {k: Measurement.from_dict(m)
                                  for k, m in data["measurements"].items()}
        values["rows"] = tuple(dict(r) for r in data["rows"])
        values["findings"] = tuple(Finding(**{**f, "labels": tuple(f.get("labels", ()))})
                                   for f in data["findings"])
        values["claims"] = tuple(Claim(**c) for c in data["claims"])
        values["checks"] = tuple(Check(**c) for c in data["checks"])
        values["params"] = dict(data["params"])
        return cls(**values)

    # ---- text ------------------------------------------------------------------------

    @property
    def heading(self) -> str:
        mode = "quick" if self.quick else "full"
        return (f"Lesson {self.number} `{self.lesson}`: {self.title} "
                f"({self.device.get('name', '?')}, {mode}, {self.wall_seconds:.1f} s)")

    def table(self) -> str:
        """The rows, findings, claims and checks as plain text."""
        parts = [self.heading]
        columns = _columns(self.rows)
        if columns:
            parts.append(format_table(columns, [[_fmt(r.get(c)) for c in columns]
                                                for r in self.rows]))
        if self.findings:
            parts.append("Findings:\n" + "\n".join(f"- {f.text}" for f in self.findings))
        if self.claims:
            parts.append(format_table(_CLAIM_HEADER, [_claim_cells(c) for c in self.claims]))
        if self.checks:
            parts.append("Checks:\n" + "\n".join(
                f"- {c.what}: max error {c.max_error:.3g} (tolerance {c.tolerance:.3g}) "
                f"{'ok' if c.passed else 'FAILED'}" for c in self.checks))
        return "\n\n".join(parts)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        # Short: the dataclass default would print every raw time, the host
        # name and the device UUID (and a notebook shows the repr as text).
        return (f"<LessonResult {self.number} {self.lesson!r} on "
                f"{self.device.get('name', '?')}, {'quick' if self.quick else 'full'}: "
                f"{len(self.rows)} rows, {len(self.findings)} findings, "
                f"{len(self.claims)} claims, {len(self.checks)} checks>")

    def _repr_markdown_(self) -> str:
        def md_table(header: list[str], body: list[list[str]]) -> str:
            esc = [[cell.replace("|", "\\|") for cell in r] for r in [header, *body]]
            lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
            return "\n".join(lines)

        parts = [f"**{self.heading}**"]
        columns = _columns(self.rows)
        if columns:
            parts.append(md_table(columns, [[_fmt(r.get(c)) for c in columns]
                                            for r in self.rows]))
        if self.findings:
            parts.append("\n".join(f"- {f.text}" for f in self.findings))
        if self.claims:
            parts.append(md_table(_CLAIM_HEADER, [_claim_cells(c) for c in self.claims]))
        if self.checks:
            parts.append("\n".join(
                f"- check: {c.what}: max error {c.max_error:.3g} "
                f"({'ok' if c.passed else 'FAILED'})" for c in self.checks))
        return "\n\n".join(parts)

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(self.table()) + "</pre>"

    # ---- plot ------------------------------------------------------------------------

    def plot(self, ax: Any = None) -> Any:
        """Draw the lesson's figure on `ax` (a new figure when None); returns the axes.

        Needs matplotlib (``pip install "cudalab[plot]"``).
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError(
                "LessonResult.plot() needs matplotlib: pip install \"cudalab[plot]\"") from None
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 4))
        drawer = _get_lesson(self.lesson).plot
        if drawer is not None:
            drawer(self, ax)
        else:
            labels = list(self.measurements)
            ax.barh(labels, [self.measurements[k].median * 1e3 for k in labels])
            ax.set_xlabel("median time (ms)")
        ax.set_title(f"{self.number} {self.lesson}: {self.device.get('name', '')}", fontsize=10)
        return ax
