"""A one-line progress bar on stderr for the CLI's longer commands.

Drawn only on a terminal (or when forced), and only once a command has run
for `delay` seconds, so quick runs and captured output stay clean. Progress
is counted in steps (one per benchmark case), each with a fraction done.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``[#########-----------]  3/9  matmul float16  4.2 s`` on one line.

    Parameters
    ----------
    total : int
        Number of steps.
    enabled : bool or None
        None: draw when `stream` is a terminal.
    delay : float
        Seconds before the first draw.
    """

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool | None = None,
                 delay: float = 1.0) -> None:
        self.total = max(1, total)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.delay = delay
        self.start = time.perf_counter()
        self.done = 0
        self.name = ""
        self.fraction = 0.0
        self.drawn = False

    def step(self, name: str) -> None:
        """Begin the next step (call it before each case)."""
        if self.name:
            self.done = min(self.total, self.done + 1)
        self.name = name
        self.fraction = 0.0
        self._draw()

    def update(self, fraction: float) -> None:
        """Fraction (0..1) of the current step done."""
        self.fraction = min(1.0, max(0.0, fraction))
        self._draw()

    def render(self) -> str:
        overall = (self.done + self.fraction) / self.total
        filled = int(round(overall * self.WIDTH))
        elapsed = time.perf_counter() - self.start
        return (f"[{'#' * filled}{'-' * (self.WIDTH - filled)}] "
                f"{min(self.done + 1, self.total)}/{self.total}  {self.name}  {elapsed:.1f} s")

    def _draw(self) -> None:
        if not self.enabled or time.perf_counter() - self.start < self.delay:
            return
        self.stream.write("\r\033[K" + self.render())
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """Erase the bar (the results follow on a clean line)."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False
