"""Checks of lesson parameters, for the lessons' ``check`` functions.

`cudalab.lessons.run` (and the CLI) call a lesson's check on the parameters
it would run with before looking for a GPU, so a bad value is reported as
such, without a GPU too. Each raises ValueError worded
``lesson 'name': param must be ..., got value``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def ints(lesson: str, p: Mapping[str, Any], *names: str, minimum: int = 1) -> None:
    """Each named parameter an int >= minimum."""
    for name in names:
        v = p[name]
        if not _is_int(v) or v < minimum:
            raise ValueError(f"lesson {lesson!r}: {name} must be an int >= {minimum}, got {v!r}")


def int_lists(lesson: str, p: Mapping[str, Any], *names: str, minimum: int = 1) -> None:
    """Each named parameter a non-empty sequence of ints >= minimum."""
    for name in names:
        v = p[name]
        if (isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or not len(v)
                or not all(_is_int(x) and x >= minimum for x in v)):
            raise ValueError(f"lesson {lesson!r}: {name} must be a non-empty sequence of ints "
                             f">= {minimum}, got {v!r}")


def among(lesson: str, p: Mapping[str, Any], name: str, allowed: Iterable[str]) -> None:
    """The named parameter a non-empty sequence of names from `allowed`."""
    allowed = tuple(allowed)
    v = p[name]
    if (isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or not len(v)
            or not all(isinstance(x, str) and x in allowed for x in v)):
        raise ValueError(f"lesson {lesson!r}: {name} must be a non-empty sequence of names "
                         f"among {', '.join(allowed)}, got {v!r}")


def numbers(lesson: str, p: Mapping[str, Any], *names: str) -> None:
    """Each named parameter a real number > 0."""
    for name in names:
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                or not v > 0:
            raise ValueError(f"lesson {lesson!r}: {name} must be a number > 0, got {v!r}")


def bools(lesson: str, p: Mapping[str, Any], *names: str) -> None:
    """Each named parameter True or False."""
    for name in names:
        if not isinstance(p[name], bool):
            raise ValueError(f"lesson {lesson!r}: {name} must be True or False, got {p[name]!r}")


def seed(lesson: str, p: Mapping[str, Any], name: str = "seed") -> None:
    """A seed: an int >= 0."""
    ints(lesson, p, name, minimum=0)
