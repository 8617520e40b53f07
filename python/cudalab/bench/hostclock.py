"""Host-clock timing, for figures that are host-side by nature.

CUDA events time GPU work on one stream. Two kinds of figure are not that:
the cost of issuing ops from Python (host time per op over a long loop that
ends with a synchronize; the empty-kernel launch ceiling) and work spread
over several streams that returns synchronized (a copy/compute pipeline).
They are timed with the host clock around calls that return only once their
GPU work is done, and kept as `Measurement` objects like every other figure.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Sequence

from .measurement import Measurement

__all__ = ["host_clock", "host_measurement"]


def host_clock(cases: Mapping[str, Callable[[], Any]], repeats: int,
               warmup: float) -> dict[str, list[float]]:
    """Host seconds of each call of each case, interleaved in rounds.

    Every case must return only once its GPU work is done (end with a
    synchronize), so a call's host time is its whole span. Each case is
    called once and then warmed up for `warmup` seconds; then every round
    calls each case once, so clock and thermal drift over the run hit all of
    them alike.

    Parameters
    ----------
    cases : mapping of name to callable
    repeats : int
        Timed calls per case.
    warmup : float
        Seconds of warm-up calls per case (a preset's `warmup`).

    Returns
    -------
    dict of name to list of float
    """
    for fn in cases.values():
        fn()
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def host_measurement(times: Sequence[float], *, calls: int, label: str, timer: str,
                     sub_label: str | None = None, description: str | None = None,
                     bytes: float | None = None, host_time: bool = True,
                     metadata: dict[str, Any] | None = None) -> Measurement:
    """A Measurement from `host_clock` times of `calls` calls each.

    Parameters
    ----------
    times : sequence of float
        Host seconds per timed call of the case.
    calls : int
        Ops per timed call (times are divided by it).
    label, sub_label, description : str
        The Measurement's names.
    timer : str
        How the time was taken, stored as ``metadata["timer"]``.
    bytes : float, optional
        Bytes per op.
    host_time : bool, optional
        Dispatch figures (True): the median per op is also the
        Measurement's `host_time`.
    metadata : dict, optional
        More context.
    """
    from .. import _core
    from ..devices import get_device_properties

    per_call = tuple(t / calls for t in times)
    device = _core.current_device()
    return Measurement(
        label=label,
        sub_label=sub_label,
        description=description,
        times=per_call,
        number_per_run=calls,
        host_time=statistics.median(per_call) if host_time else None,
        bytes=bytes,
        device=get_device_properties(device).name,
        device_index=device,
        stop_reason="max_repeats",
        metadata={**(metadata or {}), "timer": timer},
    )
