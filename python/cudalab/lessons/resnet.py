"""ResNet-50 inference helpers shared by lessons ``inference`` and ``multi_gpu_inference``,
``cudalab inference`` and benchmarks/bench_resnet.py.

* argument parsing: batch sizes (``"1,8,16,32"``) and precisions
  (``"fp16"``, ``"fp32,bf16"``, dtype names accepted);
* rates: images per second, % of a GEMM ceiling;
* inputs: seeded random images.

The PyTorch twin (torchvision's ``resnet50()`` holding our weights) is
:mod:`cudalab.models.torch_twin`. A framework module of cudalab.lessons, not
a lesson. Nothing here needs a GPU at import time.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .. import _precision
from ..models.torch_twin import DTYPE_OF
from ..nn.precision import PRECISIONS as _NN_PRECISIONS

__all__ = ["CEILING_OF", "DTYPE_OF", "MAX_BATCH", "PRECISIONS", "check_batch_sizes",
           "check_precisions", "images", "images_per_s", "parse_batch_sizes", "parse_precisions",
           "pct_of_peak"]

# cudalab.models' precisions (cudalab.nn's names); DTYPE_OF (from
# cudalab.models.torch_twin) gives the dtype each stores activations and weights in.
PRECISIONS = tuple(_NN_PRECISIONS)
# The measured GEMM ceiling a precision's convolutions are compared with.
# ("matmul_" and the precision's bench spelling, from the one table).
CEILING_OF = {name: f"matmul_{_precision.resolve(name).long_name}" for name in PRECISIONS}
# Other spellings accepted on the command line: the table's aliases of these precisions.
ALIASES = {alias: spec.name for alias, spec in _precision.ALIASES.items()
           if alias != spec.name and spec.name in PRECISIONS}
# The largest batch the lesson and the command take (the "up to 256").
MAX_BATCH = 256
# ImageNet's input size.
IMAGE_SIZE = 224


# ---- arguments ----------------------------------------------------------------------------


def check_batch_sizes(values: Iterable[Any], what: str = "batch_sizes") -> tuple[int, ...]:
    """check_batch_sizes(values) -> tuple of int

    Batch sizes as given (order kept, repeats dropped), each an int in
    [1, MAX_BATCH].

    Raises
    ------
    ValueError
        Empty, or a size out of range or not an integer.
    """
    out: list[int] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{what}: expected integers, got {v!r}")
        if not 1 <= int(v) <= MAX_BATCH:
            raise ValueError(f"{what}: each batch size must be in 1..{MAX_BATCH}, got {int(v)}")
        if int(v) not in out:
            out.append(int(v))
    if not out:
        raise ValueError(f"{what}: expected at least one batch size")
    return tuple(out)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """parse_batch_sizes("1,8,16,32") -> (1, 8, 16, 32)

    A comma list of batch sizes, each in [1, MAX_BATCH] (spaces allowed,
    repeats dropped, order kept).

    Raises
    ------
    ValueError
        An item is not an integer or is out of range, or the list is empty.
    """
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ValueError(f"batch sizes: expected integers, got {item!r}") from None
    return check_batch_sizes(values, "batch sizes")


def check_precisions(values: Iterable[Any], what: str = "precisions") -> tuple[str, ...]:
    """check_precisions(values) -> tuple of str

    Precisions among PRECISIONS (dtype names such as ``float16`` accepted),
    order kept, repeats dropped.
    """
    out: list[str] = []
    for v in values:
        name = ALIASES.get(str(v).strip().lower(), str(v).strip().lower())
        if name not in PRECISIONS:
            raise ValueError(f"{what}: unknown precision {v!r}; expected "
                             f"{', '.join(PRECISIONS)}")
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError(f"{what}: expected at least one precision")
    return tuple(out)


def parse_precisions(text: str) -> tuple[str, ...]:
    """parse_precisions("fp32,fp16") -> ("fp32", "fp16")"""
    return check_precisions([t for t in str(text).split(",") if t.strip()], "precisions")


# ---- rates ---------------------------------------------------------------------------------


def images_per_s(batch: int, seconds: float) -> float:
    """Images per second of a forward over `batch` images taking `seconds` (inf at 0 s)."""
    return batch / seconds if seconds > 0 else float("inf")


def pct_of_peak(flops: float, seconds: float, peak_flops: float | None) -> float | None:
    """100 * (flops / seconds) / peak_flops, or None without a peak or a time."""
    if not peak_flops or seconds <= 0:
        return None
    return 100.0 * flops / seconds / peak_flops


def images(seed: int, batch: int) -> np.ndarray:
    """(batch, 224, 224, 3) float32 NHWC, standard normal: already-normalised images."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32)
