"""Arithmetic shared by the overlap lessons (pinned, streams, prefetch).

Pure functions of measured numbers, so they are tested without a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence


__all__ = ["Overlap", "overlap", "pipeline_bound"]


@dataclasses.dataclass(frozen=True)
class Overlap:
    """How much of two pieces of work ran at the same time.

    Attributes
    ----------
    serialized : float
        Seconds of the two run one after the other (the sum of both alone).
    overlapped : float
        Seconds measured when they were issued to overlap.
    hidden : float
        ``serialized - overlapped``: the time taken off (negative when
        overlapping made it slower).
    fraction : float
        `hidden` over the shorter piece: 1.0 when the shorter one is hidden
        entirely (the best any overlap can do), 0 when nothing is.
    """

    serialized: float
    overlapped: float
    hidden: float
    fraction: float


def overlap(first: float, second: float, overlapped: float) -> Overlap:
    """The `Overlap` of two pieces of work that take `first` and `second` seconds alone.

    Raises
    ------
    ValueError
        A time that is not positive.
    """
    for name, value in (("first", first), ("second", second), ("overlapped", overlapped)):
        if not value > 0:
            raise ValueError(f"overlap() argument '{name}': expected seconds > 0, got {value!r}")
    serialized = first + second
    hidden = serialized - overlapped
    return Overlap(serialized, overlapped, hidden, hidden / min(first, second))


def pipeline_bound(stages: Sequence[float], chunks: int) -> float:
    """The fastest a chunked pipeline of `stages` can run (seconds).

    Each stage's whole time is split evenly over `chunks`; with every stage
    on its own engine, the first chunk passes through all stages and the
    rest follow one slowest stage apart:
    ``(sum(stages) + (chunks - 1) * max(stages)) / chunks``. One chunk is
    the serialized sum; many chunks approach the slowest stage.
    """
    if chunks < 1:
        raise ValueError(f"pipeline_bound() argument 'chunks': expected >= 1, got {chunks}")
    if not stages or any(not s >= 0 for s in stages):
        raise ValueError("pipeline_bound() argument 'stages': expected seconds >= 0")
    return (sum(stages) + (chunks - 1) * max(stages)) / chunks
