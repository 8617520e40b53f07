"""Pure helpers for judging lesson numbers: claim verdicts, sizes, the latency + bandwidth fit.

A framework module of cudalab.lessons, not a lesson (benchmarks/bench_allreduce.py
formats its sizes with it too).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .._table import format_bytes

MIB = 1 << 20

# A tutorial's speed-up claim holds when this GPU reaches at least this
# fraction of the tutorial's factor: the claim is about an order of
# magnitude, not the T4's exact figure.
CLAIM_FRACTION = 0.5
# A tutorial's absolute figure (a latency, a size) holds within this factor
# either way: different machines, same order of magnitude.
CLAIM_FACTOR = 3.0


def at_least_fraction(measured: float | None, tutorial: float,
                      fraction: float = CLAIM_FRACTION) -> bool:
    """at_least_fraction(measured, tutorial, fraction=CLAIM_FRACTION) -> bool

    Whether a measured speed-up reaches `fraction` of the tutorial's.
    """
    return measured is not None and math.isfinite(measured) and measured >= fraction * tutorial


def within_factor(measured: float | None, tutorial: float, factor: float = CLAIM_FACTOR) -> bool:
    """within_factor(measured, tutorial, factor=CLAIM_FACTOR) -> bool

    Whether `measured` lies in ``[tutorial / factor, tutorial * factor]``.
    """
    if measured is None or not math.isfinite(measured) or measured <= 0 or tutorial <= 0:
        return False
    return tutorial / factor <= measured <= tutorial * factor


def format_bytes_short(nbytes: float) -> str:
    """format_bytes_short(nbytes) -> str: '4 KiB', '1.5 MiB', '2 GiB' (the one byte
    formatter, cudalab._table.format_bytes, in its short form)."""
    return format_bytes(nbytes, short=True)


def first_at_least(xs: Sequence[float], values: Sequence[float | None],
                   mark: float) -> float | None:
    """first_at_least(xs, values, mark) -> float or None

    The first x (in the given order) from which every later value is >= `mark`:
    where a ratio crosses a mark for good. None when the last value is below it.
    """
    found = None
    for x, v in zip(xs, values):
        if v is not None and v >= mark:
            if found is None:
                found = x
        else:
            found = None
    return found


def fit_latency_bandwidth(nbytes: Sequence[float], seconds: Sequence[float]
                          ) -> tuple[float, float, float]:
    """fit_latency_bandwidth(nbytes, seconds) -> (latency_s, bandwidth_Bps, max_rel_residual)

    Least-squares fit of ``t = latency + nbytes / bandwidth``.

    Each point is weighted by 1 / t (relative residuals), so a sweep over
    decades of sizes fixes the latency from the small copies and the
    bandwidth from the large ones; an unweighted fit lets the largest copy
    decide both.

    Raises
    ------
    ValueError
        Fewer than two distinct sizes, or a time that is not positive.
    """
    x = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if x.shape != t.shape or x.ndim != 1 or len(np.unique(x)) < 2:
        raise ValueError("fit_latency_bandwidth(): expected two equal-length sequences "
                         "with at least two distinct sizes")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("fit_latency_bandwidth(): times must be finite and > 0")
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    bandwidth = 1.0 / per_byte if per_byte > 0 else math.inf
    residual = float(np.max(np.abs(latency + per_byte * x - t) / t))
    return float(latency), float(bandwidth), residual


def claim_at_least(r, claim: str, tutorial: float, measured: float | None, unit: str,
                   detail: str) -> None:
    """Record a speed-up claim on `r` (a LessonRun): held when `at_least_fraction`."""
    r.claim(claim, tutorial=tutorial, measured=measured, unit=unit,
            held=at_least_fraction(measured, tutorial),
            why=f"{detail}; holds from {CLAIM_FRACTION * tutorial:.3g}{unit}")


def claim_within(r, claim: str, tutorial: float, measured: float | None, unit: str,
                 detail: str) -> None:
    """Record a claim of an absolute figure on `r`: held when `within_factor`."""
    r.claim(claim, tutorial=tutorial, measured=measured, unit=unit,
            held=within_factor(measured, tutorial),
            why=f"{detail}; holds within {CLAIM_FACTOR:g}x of {tutorial:.3g} {unit}")
