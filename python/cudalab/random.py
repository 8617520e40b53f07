"""Random numbers generated on the device.

Every array comes from cudalab's own counter-based Philox4x32-10 generator
(``cuda/ops/random.cu``): element ``i`` of a call is a pure function of the key
(the seed), a per-call offset and ``i``, so results never depend on the
launch configuration and the same seed gives bit-identical arrays::

    import cudalab as cl

    x = cl.random.normal((1024, 1024), seed=0)     # reproducible on its own
    cl.random.seed(42)
    a = cl.random.uniform(10)                      # key 42, offset 0
    b = cl.random.uniform(10)                      # key 42, offset 1: differs from a
    cl.random.seed(42)
    assert (cl.random.uniform(10).get() == a.get()).all()

With ``seed=None`` a call draws from the module's default generator: its key
is the last value given to :func:`seed` (a random one from the operating
system until then) and its offset advances by one after every successful call,
so successive calls differ and the whole sequence repeats after ``seed(s)``.
With an explicit ``seed=s`` a call uses key ``s`` and offset 0 and leaves the
default generator alone.

Conversions (see ``cuda/ops/random.cu``): uniform floats use as many random bits as
the dtype's significand (53 for float64) and always lie in ``[low, high)``;
normal uses Box-Muller (float16, bfloat16 and float32 in float32 arithmetic
with the GPU's fast log2, sqrt, sin and cos, float64 in float64); integers
are unbiased (Lemire's method with rejection) and follow NumPy's
``Generator.integers`` bounds.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from . import _core

__all__ = ["integers", "normal", "seed", "uniform"]

_MASK64 = (1 << 64) - 1
# Errors about the caller's arguments or the device: the public functions
# re-raise them from their own frame, so a traceback ends where the user called.
_CALLER_ERRORS = (TypeError, ValueError, OverflowError, _core.CudalabError)


class _DefaultGenerator:
    """The module-level (key, offset) state; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.key = int.from_bytes(os.urandom(8), "little")
        self.offset = 0

    def reseed(self, key: int) -> None:
        with self._lock:
            self.key = key
            self.offset = 0

    def call(self, fn, *args: Any) -> Any:
        """Run ``fn(*args, seed=key, offset=offset)``; advance only on success."""
        with self._lock:
            result = fn(*args, seed=self.key, offset=self.offset)
            self.offset = (self.offset + 1) & _MASK64
            return result


_default = _DefaultGenerator()


def _check_seed(value: Any, func: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(
            f"{func}() argument 'seed': expected an int or None, got {type(value).__name__}"
        )
    value = value.__index__()
    if not 0 <= value <= _MASK64:
        raise ValueError(f"{func}() argument 'seed': must be in [0, 2**64), got {value}")
    return value


def seed(s: int | None = None) -> None:
    """Seed the default generator.

    Parameters
    ----------
    s : int or None
        The key, in ``[0, 2**64)``; None draws a fresh one from the operating
        system. The offset restarts at 0, so the calls that follow repeat
        exactly the sequence that followed the last ``seed(s)`` with the same
        ``s``.
    """
    if s is None:
        _default.reseed(int.from_bytes(os.urandom(8), "little"))
        return
    _default.reseed(_check_seed(s, "seed"))


def _dispatch(fn, func: str, seed_value: Any, *args: Any) -> _core.DeviceArray:
    if seed_value is None:
        return _default.call(fn, *args)
    return fn(*args, seed=_check_seed(seed_value, func), offset=0)


def normal(
    shape: Any,
    mean: float = 0.0,
    std: float = 1.0,
    dtype: Any = None,
    seed: int | None = None,
) -> _core.DeviceArray:
    """Normally distributed values, generated on the current device.

    Parameters
    ----------
    shape : int or tuple of int
    mean : float, optional
        Finite.
    std : float, optional
        Finite and >= 0.
    dtype : dtype-like, optional
        float16, bfloat16, float32 (default) or float64. float16/bfloat16 are
        computed in float32 and rounded to nearest; float64 uses 53-bit
        uniforms.
    seed : int, optional
        Key in ``[0, 2**64)`` for a reproducible call; None uses the default
        generator (see :func:`seed`).

    Returns
    -------
    DeviceArray
        C-contiguous, ``mean + std * z`` with ``z`` standard normal
        (Box-Muller).
    """
    try:
        return _dispatch(_core._random_normal, "normal", seed, shape, mean, std, dtype)
    except _CALLER_ERRORS as exc:
        raise exc.with_traceback(None)  # the caller's error: no frames of this module


def uniform(
    shape: Any,
    low: float = 0.0,
    high: float = 1.0,
    dtype: Any = None,
    seed: int | None = None,
) -> _core.DeviceArray:
    """Uniformly distributed values in ``[low, high)``, generated on the device.

    Parameters
    ----------
    shape : int or tuple of int
    low, high : float, optional
        Finite. Both are first rounded to `dtype` (as NumPy converts them);
        the rounded values must satisfy ``low < high``, and every result
        satisfies ``low <= x < high`` with them.
    dtype : dtype-like, optional
        float16, bfloat16, float32 (default) or float64.
    seed : int, optional
        As for :func:`normal`.

    Returns
    -------
    DeviceArray
        C-contiguous.
    """
    try:
        return _dispatch(_core._random_uniform, "uniform", seed, shape, low, high, dtype)
    except _CALLER_ERRORS as exc:
        raise exc.with_traceback(None)  # the caller's error: no frames of this module


def integers(
    shape: Any,
    low: int,
    high: int | None = None,
    dtype: Any = None,
    seed: int | None = None,
) -> _core.DeviceArray:
    """Uniformly distributed integers, generated on the device.

    Bounds follow NumPy's ``Generator.integers``: values in ``[low, high)``,
    or in ``[0, low)`` when `high` is None.

    Parameters
    ----------
    shape : int or tuple of int
    low : int
    high : int, optional
        Exclusive; it may be one past the dtype's maximum.
    dtype : dtype-like, optional
        int8, uint8, int32 or int64 (default).
    seed : int, optional
        As for :func:`normal`.

    Returns
    -------
    DeviceArray
        C-contiguous; every value of the range is equally likely (no modulo
        bias).
    """
    try:
        return _dispatch(_core._random_integers, "integers", seed, shape, low, high, dtype)
    except _CALLER_ERRORS as exc:
        raise exc.with_traceback(None)  # the caller's error: no frames of this module
