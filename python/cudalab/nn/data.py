"""Synthetic classification data: a fixed random teacher network labels random inputs.

The labels are a deterministic function of the inputs (the argmax of a
teacher MLP's logits), so a student network can learn them and its loss must
fall. Everything is generated on the device, and batch ``i`` is the same
array on every call and every run with the same seed; ``to_host()`` copies the
batches to NumPy arrays, to feed a loop from the host (``ArrayLoader``).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from .. import _core
from .. import random as _random
from .._check import arg_error, check_int, check_seed
from ._util import F32, derive_seed
from .layers import MLP

__all__ = ["TeacherData"]

# Stream indices of derive_seed: the teacher's weights and the inputs get keys
# no student MLP(seed=...) draws from for the same seed.
_TEACHER_STREAM = 0x7EAC
_INPUT_STREAM = 0xDA7A


class TeacherData:
    """TeacherData(in_features, classes, batch_size, *, hidden=(64,), batches=100, seed=0)

    Batches ``(x, labels)``: x (batch_size, in_features) float32 standard
    normal, labels (batch_size,) int64 = argmax of a fixed teacher MLP
    (GELU, PyTorch's initialization) applied to x in true float32.

    Parameters
    ----------
    in_features, classes, batch_size : int
        >= 1 (classes >= 2).
    hidden : sequence of int, optional
        The teacher's hidden sizes.
    batches : int, optional
        How many batches iterating over the data gives (``len(data)``);
        ``batch(i)`` takes any index >= 0.
    seed : int, optional
        In [0, 2**64): the teacher and every batch follow from it.

    Attributes
    ----------
    teacher : MLP
    """

    def __init__(self, in_features: int, classes: int, batch_size: int, *,
                 hidden: Sequence[int] = (64,), batches: int = 100, seed: int = 0) -> None:
        func = "TeacherData"
        self.in_features = check_int(in_features, func, "in_features")
        self.classes = check_int(classes, func, "classes", minimum=2)
        self.batch_size = check_int(batch_size, func, "batch_size")
        if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__iter__"):
            raise arg_error(TypeError, func, "hidden",
                            f"expected a sequence of ints, got {type(hidden).__name__}")
        self.hidden = tuple(check_int(h, func, "hidden") for h in hidden)
        self.batches = check_int(batches, func, "batches")
        self.seed = check_seed(seed, func)
        # Arguments first, then the device: without a GPU the error names TeacherData().
        _core._parse_device(None, func)
        self.teacher = MLP((self.in_features, *self.hidden, self.classes), "gelu",
                           seed=derive_seed(self.seed, _TEACHER_STREAM))
        self._input_key = derive_seed(self.seed, _INPUT_STREAM)

    def batch(self, i: int) -> tuple[_core.DeviceArray, _core.DeviceArray]:
        """batch(i) -> (x, labels)

        Batch `i` (>= 0): new arrays, the same values on every call.
        """
        i = check_int(i, "batch", "i", minimum=0)
        x = _random.normal((self.batch_size, self.in_features), 0.0, 1.0, F32,
                           seed=derive_seed(self._input_key, i))
        logits = self.teacher.forward(x, "fp32")
        labels = _core.argmax(logits, axis=1)
        return x, labels

    def to_host(self) -> tuple[np.ndarray, np.ndarray]:
        """to_host() -> (x, labels)

        The data set's ``len(self)`` batches as host NumPy arrays, batch
        after batch: x (batches * batch_size, in_features) float32 and labels
        (batches * batch_size,) int64. ``ArrayLoader(x, labels, batch_size)``
        yields the same batches as iterating over this object, from the host.

        Returns
        -------
        x, labels : numpy.ndarray
        """
        n, bs = self.batches * self.batch_size, self.batch_size
        x = np.empty((n, self.in_features), np.float32)
        labels = np.empty(n, np.int64)
        for i in range(self.batches):
            xb, lb = self.batch(i)
            x[i * bs:(i + 1) * bs] = xb.get()
            labels[i * bs:(i + 1) * bs] = lb.get()
        return x, labels

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[tuple[_core.DeviceArray, _core.DeviceArray]]:
        for i in range(self.batches):
            yield self.batch(i)

    def __repr__(self) -> str:
        return (f"TeacherData(in_features={self.in_features}, classes={self.classes}, "
                f"batch_size={self.batch_size}, hidden={list(self.hidden)}, "
                f"batches={self.batches}, seed={self.seed})")
