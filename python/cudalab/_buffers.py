"""Named device buffers, shared by cudalab.nn and cudalab.distributed.

A top-level private module: cudalab's shared internal API (any cudalab
module may import it; code outside the package should not).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core

__all__ = ["Buffers"]


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
