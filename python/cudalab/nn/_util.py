"""Private helpers of cudalab.nn: argument checks, seeds, buffer copies."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import _core

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


def arg_error(exc_type: type, func: str, param: str, text: str) -> Exception:
    """cudalab's wording for a bad argument: ``func() argument 'param': text``."""
    return exc_type(f"{func}() argument '{param}': {text}")


def check_int(value: Any, func: str, param: str, minimum: int = 1) -> int:
    """`value` as an int >= minimum (bool refused), else TypeError/ValueError."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise arg_error(TypeError, func, param, f"expected an int, got {type(value).__name__}")
    value = operator.index(value)
    if value < minimum:
        raise arg_error(ValueError, func, param, f"must be >= {minimum}, got {value}")
    return value


def check_seed(value: Any, func: str) -> int:
    """A seed: an int in [0, 2**64)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise arg_error(TypeError, func, "seed", f"expected an int, got {type(value).__name__}")
    value = operator.index(value)
    if not 0 <= value <= _MASK64:
        raise arg_error(ValueError, func, "seed", f"must be in [0, 2**64), got {value}")
    return value


def check_real(value: Any, func: str, param: str) -> float:
    """`value` as a finite float (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise arg_error(TypeError, func, param,
                        f"expected a real number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value):
        raise arg_error(ValueError, func, param, f"must be finite, got {value}")
    return value


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


def check_array(value: Any, func: str, param: str) -> _core.DeviceArray:
    if not isinstance(value, _core.DeviceArray):
        raise arg_error(TypeError, func, param,
                        f"expected a DeviceArray, got {type(value).__name__}")
    return value


def check_bool(value: Any, func: str, param: str) -> bool:
    if not isinstance(value, bool):
        raise arg_error(TypeError, func, param, f"expected a bool, got {type(value).__name__}")
    return value


def fill_zero(dst: _core.DeviceArray) -> None:
    """``dst[...] = 0`` on the current stream, whatever dst holds (inf and NaN too).

    ``where`` with both branches zero never reads dst's values into the
    result, unlike ``dst * 0`` (inf * 0 is NaN).
    """
    zero = dst.dtype.type(0)
    _core.where(dst, zero, zero, out=dst)


class Buffers:
    """Named device buffers, allocated on first use and reused afterwards.

    A training step that finds every buffer already allocated makes no
    allocation of its own, so it can be captured in a CUDA graph and replayed
    (the buffers keep their addresses). Asking for a name with another shape
    or dtype replaces its buffer.
    """

    def __init__(self) -> None:
        self._arrays: dict[str, _core.DeviceArray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: Any) -> _core.DeviceArray:
        shape, dtype = tuple(shape), np.dtype(dtype)
        a = self._arrays.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self._arrays[name] = _core.empty(shape, dtype=dtype)
        return a

    def clear(self) -> None:
        self._arrays.clear()

    def __len__(self) -> int:
        return len(self._arrays)
