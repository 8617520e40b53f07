"""Named timing presets: how long and how carefully `measure()` times a call.

Every caller (``measure``, `Timer`, ceilings, the CLI, the pytest plugin,
``benchmarks/``) picks one of these by name instead of repeating numbers.

==========  ======  ============  ============  =======  ======================================
name        warmup  min_run_time  max_run_time  repeats  for
==========  ======  ============  ============  =======  ======================================
quick       0.1 s   0.05 s        0.25 s        10+      tests, smoke runs, quick lessons
default     0.1 s   0.2 s         1 s           10+      ``measure()`` and the pytest fixture
sustained   0.25 s  0.5 s         2 s           10+      published figures: ceilings, CLI,
                                                         ``benchmarks/``
==========  ======  ============  ============  =======  ======================================

All three stop once IQR / median <= 2% (`noise_threshold`) after
`min_run_time`, and take at most 10,000 repeats. "sustained" warms up long
enough for a power-capped GPU's clock to settle under load (an H200's fp16
GEMM clock falls from 1980 MHz to ~1400 MHz within ~0.2 s), so its figures
are the rates the GPU holds, not its idle boost.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

__all__ = ["PRESETS", "Preset", "get_preset"]

# The fields a caller may override, in the order measure() documents them.
SETTING_NAMES = ("warmup", "min_run_time", "max_run_time", "min_repeats", "max_repeats",
                 "noise_threshold", "flush_l2")


def check_number(func: str, name: str, value: Any, *, allow_zero: bool = False) -> float:
    """`value` as a float > 0 (or >= 0); TypeError/ValueError naming `func` and `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{func}() argument '{name}': expected a number, got {type(value).__name__}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{func}() argument '{name}': expected a number {bound}, got {value!r}")
    return float(value)


def check_count(func: str, name: str, value: Any) -> int:
    """`value` as an int >= 1; TypeError/ValueError naming `func` and `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{func}() argument '{name}': expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{func}() argument '{name}': expected an int >= 1, got {value}")
    return value


def _check_order(func: str, low_name: str, low: float, high_name: str, high: float) -> None:
    if high < low:
        raise ValueError(f"{func}() argument '{high_name}': expected >= {low_name} ({low}), got {high}")


@dataclasses.dataclass(frozen=True)
class Preset:
    """How `measure()` times a call (see the module docstring for the named ones).

    Attributes
    ----------
    name : str
        The preset's name; a preset with overrides keeps the name it came from.
    warmup : float
        Seconds of warm-up calls after the first call.
    min_run_time : float
        Seconds of timed repeats before the noise criterion may stop timing.
    max_run_time : float
        The time budget: timing stops after this many seconds of repeats even
        when still noisy (the result then carries a warning).
    min_repeats, max_repeats : int
        Bounds on the number of timed repeats.
    noise_threshold : float
        Timing stops once IQR / median is at most this.
    flush_l2 : bool
        Overwrite a buffer twice the L2 size before every repeat (cold cache,
        one call per repeat).
    """

    name: str
    warmup: float
    min_run_time: float
    max_run_time: float
    min_repeats: int = 10
    max_repeats: int = 10_000
    noise_threshold: float = 0.02
    flush_l2: bool = False

    def __post_init__(self) -> None:
        _validate(self, "Preset")

    def replace(self, *, func: str = "Preset", **overrides: Any) -> Preset:
        """A copy with `overrides` (None values are ignored), checked for `func`'s messages.

        When `min_run_time` is raised and `max_run_time` is not given, the
        budget grows to ``5 * min_run_time`` if it would otherwise be shorter.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - set(SETTING_NAMES))
        if unknown:
            raise TypeError(f"{func}() got unexpected setting(s) {', '.join(map(repr, unknown))}")
        if "flush_l2" in given and not isinstance(given["flush_l2"], bool):
            raise TypeError(f"{func}() argument 'flush_l2': expected a bool, "
                            f"got {type(given['flush_l2']).__name__}")
        if "min_run_time" in given and "max_run_time" not in given:
            minimum = check_number(func, "min_run_time", given["min_run_time"])
            given["max_run_time"] = max(self.max_run_time, 5 * minimum)
        values = {name: given.get(name, getattr(self, name)) for name in SETTING_NAMES}
        _check_values(func, values)
        return dataclasses.replace(self, **values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: ``'0.25 s warm-up; repeats until IQR/median <= 2% after 0.5 s, within 2 s'``."""
        text = (f"{self.warmup:g} s warm-up; repeats until IQR/median <= "
                f"{self.noise_threshold:.0%} after {self.min_run_time:g} s, within "
                f"{self.max_run_time:g} s ({self.min_repeats:,} to {self.max_repeats:,} repeats)")
        return text + ("; L2 flushed before every repeat" if self.flush_l2 else "")


def _check_values(func: str, values: Mapping[str, Any]) -> None:
    check_number(func, "warmup", values["warmup"], allow_zero=True)
    low = check_number(func, "min_run_time", values["min_run_time"])
    _check_order(func, "min_run_time", low, "max_run_time",
                 check_number(func, "max_run_time", values["max_run_time"]))
    low = check_count(func, "min_repeats", values["min_repeats"])
    _check_order(func, "min_repeats", low, "max_repeats",
                 check_count(func, "max_repeats", values["max_repeats"]))
    check_number(func, "noise_threshold", values["noise_threshold"])


def _validate(preset: Preset, func: str) -> None:
    if not isinstance(preset.name, str) or not preset.name:
        raise TypeError(f"{func}() argument 'name': expected a non-empty str")
    _check_values(func, {name: getattr(preset, name) for name in SETTING_NAMES})


PRESETS: dict[str, Preset] = {
    p.name: p for p in (
        Preset("quick", warmup=0.1, min_run_time=0.05, max_run_time=0.25),
        Preset("default", warmup=0.1, min_run_time=0.2, max_run_time=1.0),
        Preset("sustained", warmup=0.25, min_run_time=0.5, max_run_time=2.0),
    )
}


def get_preset(preset: str | Preset, func: str = "get_preset") -> Preset:
    """The `Preset` named `preset` (a `Preset` is returned as it is).

    Raises
    ------
    TypeError
        `preset` is neither a str nor a Preset.
    ValueError
        No preset has that name; the message lists the names.
    """
    if isinstance(preset, Preset):
        return preset
    if not isinstance(preset, str):
        raise TypeError(f"{func}() argument 'preset': expected a str or a Preset, "
                        f"got {type(preset).__name__}")
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(f"{func}() argument 'preset': unknown preset {preset!r} (expected one "
                         f"of {', '.join(map(repr, PRESETS))})") from None
