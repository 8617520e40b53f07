"""Private helpers of cudalab.nn: seeds, the activation check, zero fills.

The argument checks every part of cudalab shares live in cudalab._check,
the named device buffers in cudalab._buffers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from .._check import arg_error

_MASK64 = (1 << 64) - 1
F32 = np.dtype(np.float32)


def derive_seed(seed: int, index: int) -> int:
    """A 64-bit key for stream `index` of `seed` (splitmix64's finalizer).

    Layers and data sets need several independent random streams from one
    user seed; mixing (seed, index) gives keys that neither collide for small
    indices nor repeat another seed's keys in an obvious pattern.
    """
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def check_activation(value: Any, func: str) -> str | None:
    """None, 'relu' or 'gelu'."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise arg_error(TypeError, func, "activation",
                        f"expected None, 'relu' or 'gelu', got {type(value).__name__}")
    if value not in ("relu", "gelu"):
        raise arg_error(ValueError, func, "activation",
                        f"expected None, 'relu' or 'gelu', got {value!r}")
    return value


def fill_zero(dst: _core.DeviceArray) -> None:
    """``dst[...] = 0`` on the current stream, whatever dst holds (inf and NaN too).

    ``where`` with both branches zero never reads dst's values into the
    result, unlike ``dst * 0`` (inf * 0 is NaN).
    """
    zero = dst.dtype.type(0)
    _core.where(dst, zero, zero, out=dst)
