"""The documented float -> integer conversion rule, in NumPy: the reference
the CPU tier checks by hand and the GPU tier checks the device against.

Rule (cudalab's astype, reductions' dtype=/out=, full()): truncate toward
zero, then clamp to the target's [min, max]; NaN -> 0, +inf -> max, -inf ->
min. A bool target is ``x != 0`` as in NumPy (NaN -> True, -0.5 -> True).
Integer and bool sources are not covered here: integer -> integer wraps, as
NumPy's astype does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

INT_TARGETS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64))
FLOAT_SOURCES = tuple(np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32,
                                            np.float64))


def saturating_cast(x, dtype) -> np.ndarray:
    """`x` (any float dtype, bfloat16 included) converted to `dtype` by the rule above."""
    dtype = np.dtype(dtype)
    wide = np.asarray(x).astype(np.float64)  # exact for every float source
    if dtype == np.bool_:
        return wide != 0
    info = np.iinfo(dtype)
    # max + 1 is a power of two, exact in float64; max itself is not for int64.
    hi = float(2 ** (info.bits - 1 if info.min < 0 else info.bits))
    t = np.trunc(np.where(np.isnan(wide), 0.0, wide))
    t = np.clip(t, float(info.min), hi)
    out = np.zeros(t.shape, dtype)
    inside = t < hi
    out[inside] = t[inside].astype(dtype)  # exact integers within range
    out[~inside] = info.max
    return out


def boundary_values(dtype) -> np.ndarray:
    """float64 values at and beyond each edge of integer `dtype`, plus the specials."""
    info = np.iinfo(dtype)
    lo, hi = float(info.min), float(info.max)
    edges = [lo, hi, lo - 1, hi + 1, lo - 0.5, hi + 0.5, lo + 0.5, hi - 0.5, lo + 1, hi - 1,
             2 * lo - 1, 2 * hi + 2]
    # The float32 neighbours of the edges (2^31 and 2^63 are not exact in float32).
    for v in (lo, hi):
        f = np.float32(v)
        edges += [float(np.nextafter(f, np.float32(-np.inf))), float(f),
                  float(np.nextafter(f, np.float32(np.inf)))]
        d = np.float64(v)
        edges += [float(np.nextafter(d, -np.inf)), float(np.nextafter(d, np.inf))]
    return np.array(edges, dtype=np.float64)


SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -0.5, 0.5, -0.9, 0.9, -1.0, 1.0,
                     -1.5, 1.5, 127.5, 128.0, 255.9, 256.0, 256.5, -128.5, -129.0, 65504.0,
                     -65504.0, 1e30, -1e30, 3.0e38, -3.0e38, 1e300, -1e300, 2.0 ** 31,
                     -(2.0 ** 31), 2.0 ** 32, 2.0 ** 63, -(2.0 ** 63), 2.0 ** 64, 5e-324,
                     -5e-324])


def conversion_inputs(src) -> np.ndarray:
    """Every special and every target's boundary values, rounded into float dtype `src`."""
    values = np.concatenate([SPECIALS] + [boundary_values(t) for t in INT_TARGETS])
    with np.errstate(over="ignore"):  # float16 overflows to inf: still a valid input
        return values.astype(src)
