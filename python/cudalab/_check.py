"""Argument checks shared by every part of cudalab (nn, models, lessons, distributed).

A top-level private module: cudalab's shared internal API. Any cudalab
module may import from it; code outside the package should not. Its
functions give cudalab's wording for a bad argument,
``func() argument 'param': text``, so a message reads the same whichever
part of the package raised it (tests match these messages exactly).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _core

__all__ = ["arg_error", "check_array", "check_bool", "check_int", "check_real", "check_seed"]

_MASK64 = (1 << 64) - 1


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


def check_array(value: Any, func: str, param: str) -> _core.DeviceArray:
    if not isinstance(value, _core.DeviceArray):
        raise arg_error(TypeError, func, param,
                        f"expected a DeviceArray, got {type(value).__name__}")
    return value


def check_bool(value: Any, func: str, param: str) -> bool:
    if not isinstance(value, bool):
        raise arg_error(TypeError, func, param, f"expected a bool, got {type(value).__name__}")
    return value
