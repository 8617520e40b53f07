"""cudalab beside PyTorch inside a lesson: each PyTorch timing paired with cudalab's.

Lessons time PyTorch doing the same work as cudalab when torch is installed,
under labels that name it: ``"torch add"`` beside ``"add"``, ``"context
(torch)"`` beside ``"context (cudalab)"``, ``"mlp step torch"`` beside ``"mlp
step"``. `versus_torch` pairs them by those rules, plus a lesson's own
``torch_twin`` for labels the rules do not cover (see `lesson()`), and gives
each pair's speed ratio. A torch measurement with no cudalab twin (PyTorch
doing something cudalab does not, such as its CPU generator) is left out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Sequence

from .registry import get
from .result import LessonResult

__all__ = ["PARITY", "TorchComparison", "versus_torch", "summary"]

# Two runs of the very same cuBLAS call differ by up to about 2-3% from one
# measurement to the next (clocks, power): a ratio from here up is parity.
PARITY = 0.97


@dataclasses.dataclass(frozen=True)
class TorchComparison:
    """One timing of cudalab and of PyTorch doing the same work.

    Attributes
    ----------
    label, torch_label : str
        The two measurement labels.
    seconds, torch_seconds : float
        Their medians.
    """

    label: str
    torch_label: str
    seconds: float
    torch_seconds: float

    @property
    def speedup(self) -> float:
        """PyTorch's time over cudalab's: above 1, cudalab is faster."""
        return self.torch_seconds / self.seconds


def _candidates(label: str) -> Iterator[str]:
    """cudalab labels a torch label may pair with, by the naming rules above."""
    if label.startswith("torch "):
        yield label[len("torch "):]
    for suffix, ours in ((" (torch)", (" (cudalab)", "")), (" torch", (" gpu", ""))):
        if label.endswith(suffix):
            base = label[:-len(suffix)]
            yield from (base + s for s in ours)
    yield label.replace("torch ", "", 1)


def versus_torch(result: LessonResult) -> list[TorchComparison]:
    """versus_torch(result) -> list of TorchComparison, in measurement order.

    Empty when the lesson ran without PyTorch.
    """
    measured = result.measurements
    try:
        twin = get(result.lesson).torch_twin
    except ValueError:  # a result of a lesson this version does not have
        twin = None
    pairs = []
    for label, m in measured.items():
        if "torch" not in label:
            continue
        options = ([twin(label)] if twin is not None else []) + list(_candidates(label))
        ours = next((c for c in options if c and c != label and c in measured
                     and "torch" not in c), None)
        if ours is not None and m.median > 0 and measured[ours].median > 0:
            pairs.append(TorchComparison(ours, label, measured[ours].median, m.median))
    return pairs


def summary(pairs: Sequence[TorchComparison]) -> str:
    """One line: timings at parity or faster (`PARITY`), the geometric mean, the slowest."""
    if not pairs:
        return "-"
    held = sum(p.speedup >= PARITY for p in pairs)
    mean = math.exp(sum(math.log(p.speedup) for p in pairs) / len(pairs))
    worst = min(pairs, key=lambda p: p.speedup)
    text = f"{held} of {len(pairs)} at parity or faster, geometric mean {mean:.2f}x"
    if worst.speedup < PARITY:
        text += f"; slowest {worst.speedup:.2f}x ({worst.label})"
    return text
