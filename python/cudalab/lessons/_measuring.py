"""Helpers for taking lesson measurements: host-clock timing, random inputs, errors, verdict wording."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .. import _core
from ..bench import Measurement, host_clock, host_measurement

# Host-clock repeats per case: enough for a stable median, few enough for quick mode.
HOST_REPEATS_QUICK = 15
HOST_REPEATS_FULL = 50


def host_time(r: Any, label: str, fn: Callable[[], Any], calls: int = 1) -> Measurement:
    """Record the host time of ``fn(); synchronize()`` per op (`calls` ops per call).

    This is the time a Python caller waits, launch overhead and allocations
    included, which CUDA events around back-to-back GPU work leave out.
    """
    def whole() -> None:
        fn()
        _core.synchronize()

    repeats = HOST_REPEATS_QUICK if r.quick else HOST_REPEATS_FULL
    [times] = host_clock({label: whole}, repeats, warmup=r.timer.settings.warmup).values()
    m = host_measurement(times, calls=calls, label=label,
                         timer="host clock around the call and a synchronize")
    return r.add(m, label)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (inf when the shapes differ)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


def random_array(seed: int, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """Random normal values (never zeros) of `shape` and `dtype`, reproducible by `seed`."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, inf when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else float("inf")


def break_even_uses(fixed_s: float, slow_s: float, fast_s: float) -> int | None:
    """Uses after which paying `fixed_s` once to run at `fast_s` beats `slow_s` per use.

    The smallest n >= 1 with fixed + n * fast < n * slow; None when the fast path
    is not faster per use (it never pays off).
    """
    saving = slow_s - fast_s
    if saving <= 0:
        return None
    return max(1, math.floor(fixed_s / saving) + 1)


def pick(x: float, margin: float, above: str, below: str, between: str) -> str:
    """`above` when x >= margin, `below` when x <= 1 / margin, else `between`.

    The texts are formats with ``{x}`` (the ratio) and ``{inv}`` (its inverse).
    """
    text = above if x >= margin else below if x <= 1 / margin else between
    return text.format(x=x, inv=ratio(1.0, x))
