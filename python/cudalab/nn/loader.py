"""Training batches from host arrays, prefetched to the device.

:class:`ArrayLoader` is the host-data side of a training loop, in the spirit
of ``torch.utils.data.DataLoader`` over a ``TensorDataset``: it cuts NumPy
arrays into (optionally shuffled) batches, gathers each one into a pinned
staging buffer and uploads it on a side stream while the previous batch
trains (:mod:`cudalab.prefetch`, the mechanism lesson 13 measures). With
``workers=N`` the gathers run in N threads ahead of the uploads, like
DataLoader's ``num_workers``.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np

from .. import _core
from ..prefetch import Prefetcher, StagingRing
from .._check import arg_error, check_bool, check_int, check_seed

__all__ = ["ArrayLoader"]

# The dtypes a DeviceArray can hold (native byte order).
_DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
           "float64")


def _check_host_array(value: Any, func: str, param: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise arg_error(TypeError, func, param,
                        f"expected a numpy.ndarray of samples, got {type(value).__name__}")
    if value.ndim == 0:
        raise arg_error(ValueError, func, param, "expected at least 1 dimension (the samples)")
    if value.dtype.name not in _DTYPES or not value.dtype.isnative:
        order = "" if value.dtype.isnative else " (non-native byte order)"
        raise arg_error(TypeError, func, param, f"unsupported dtype {value.dtype!r}{order} "
                                                f"(supported: {', '.join(_DTYPES)})")
    return value


class ArrayLoader:
    """ArrayLoader(x, labels, batch_size, *, shuffle=False, seed=0, drop_last=True, prefetch=2, pinned=True, workers=0)

    Batches ``(x, labels)`` of NumPy host arrays, yielded as DeviceArrays.

    Each iteration is an epoch: sample ``k`` of a batch is row ``order[k]``
    of `x` and of `labels`, where `order` is ``range(len(x))`` or, with
    `shuffle`, a permutation drawn from ``(seed, epoch)``. With `pinned`,
    every batch is gathered into a ring of ``prefetch + workers + 1``
    page-locked staging buffers (allocated on first use, then reused in every
    epoch), and with ``prefetch > 0`` uploaded that many batches ahead on a
    side stream, so its copy overlaps the work on the batches before it.
    With ``workers > 0`` the gathers run in that many threads, up to
    `workers` batches ahead of the uploads.

    A batch is ready for the stream that is current when ``next()`` hands it
    out: that stream waits for its copy on the device (the host does not) and
    records the arrays, so they are freed only after its work on them. Use
    each batch on that stream.

    Parameters
    ----------
    x : numpy.ndarray
        Samples along axis 0, any layout; one of cudalab's dtypes.
    labels : numpy.ndarray
        The same number of samples along axis 0 (class indices for
        :func:`train_step`: int32 or int64).
    batch_size : int
        Samples per batch, >= 1.
    shuffle : bool, optional
        A new order every epoch.
    seed : int, optional
        In [0, 2**64): with `shuffle`, epoch ``e``'s order is the same for
        the same seed on every run.
    drop_last : bool, optional
        Leave out the last batch when it would hold fewer than `batch_size`
        samples (True by default: every step sees the same shapes, which a
        captured CUDA graph needs).
    prefetch : int, optional
        Batches uploaded ahead, >= 0; 0 uploads each batch when asked for
        and returns once it is copied.
    pinned : bool, optional
        Gather into page-locked staging buffers; without it each batch is
        copied from pageable memory, synchronously.
    workers : int, optional
        Threads gathering batches (``np.take`` of the batch's rows) ahead of
        the uploads, >= 0, like DataLoader's ``num_workers``; 0 gathers each
        batch on the iterating thread when it is due. Batches come out in the
        same order either way. The threads live for one epoch: they end when
        its batches run out or its iterator is dropped, and an exception in a
        gather is raised by the ``next()`` that was to return that batch.
        Threads rather than processes because NumPy releases the GIL while it
        gathers, and a thread writes straight into the pinned staging buffer
        (see :class:`cudalab.prefetch.HostWorkers`); per-sample Python work
        that holds the GIL would need processes, which this loader does not
        do.

    Attributes
    ----------
    epoch : int
        Epochs started so far: the next iteration takes ``order(epoch)``
        (set it to replay or resume a run's orders).

    Examples
    --------
    >>> import cudalab.nn as nn
    >>> x, labels = nn.TeacherData(64, 10, batch_size=256).to_host()
    >>> loader = nn.ArrayLoader(x, labels, 256, shuffle=True)
    >>> for epoch in range(3):
    ...     for xb, yb in loader:
    ...         loss = nn.train_step(model, opt, xb, yb)
    """

    def __init__(self, x: np.ndarray, labels: np.ndarray, batch_size: int, *,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = True,
                 prefetch: int = 2, pinned: bool = True, workers: int = 0) -> None:
        func = "ArrayLoader"
        self.x = _check_host_array(x, func, "x")
        self.labels = _check_host_array(labels, func, "labels")
        if len(labels) != len(x):
            raise arg_error(ValueError, func, "labels",
                            f"has {len(labels)} samples but x has {len(x)}")
        if len(x) == 0:
            raise arg_error(ValueError, func, "x", "has no samples")
        self.batch_size = check_int(batch_size, func, "batch_size")
        self.shuffle = check_bool(shuffle, func, "shuffle")
        self.seed = check_seed(seed, func)
        self.drop_last = check_bool(drop_last, func, "drop_last")
        self.prefetch = check_int(prefetch, func, "prefetch", minimum=0)
        self.pinned = check_bool(pinned, func, "pinned")
        self.workers = check_int(workers, func, "workers", minimum=0)
        if self.drop_last and self.batch_size > len(x):
            raise arg_error(ValueError, func, "batch_size",
                            f"{self.batch_size} exceeds the {len(x)} samples: with "
                            f"drop_last=True there is no batch")
        self.epoch = 0
        self._ring: Optional[StagingRing] = None
        if self.pinned:
            rows = (self.batch_size,)
            self._ring = StagingRing([(rows + x.shape[1:], x.dtype),
                                      (rows + labels.shape[1:], labels.dtype)],
                                     slots=self.prefetch + self.workers + 1)

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """order(epoch) -> numpy.ndarray

        The sample indices of epoch `epoch` (>= 0), in the order its batches
        take them (int64; ``arange`` without `shuffle`).
        """
        epoch = check_int(epoch, "order", "epoch", minimum=0)
        n = len(self.x)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng((self.seed, epoch)).permutation(n)

    def _tasks(self, order: np.ndarray) -> Iterator[tuple[int, np.ndarray, Any]]:
        """The epoch's batches to gather: (first position, rows, staging buffers or None).

        Read on the iterating thread, so the ring hands out its slots in turn
        there (the ring is not shared between threads); only the gathers run in
        the workers. A slot is acquired when its batch is due to be gathered.
        """
        bs = self.batch_size
        for start in range(0, len(self) * bs, bs):
            rows = order[start:start + bs]
            out = None
            if self._ring is not None:
                out = tuple(buf[:len(rows)] for buf in self._ring.acquire())
            yield start, rows, out

    def _gather(self, task: tuple[int, np.ndarray, Any]) -> tuple[np.ndarray, np.ndarray]:
        """One batch on the host, in its staging buffers when pinned (NumPy releases the GIL)."""
        start, rows, out = task
        if out is None:
            # Without shuffling, rows are consecutive: views, no host copy.
            sel = slice(start, start + len(rows)) if not self.shuffle else rows
            return self.x[sel], self.labels[sel]
        xb, lb = out
        np.take(self.x, rows, axis=0, out=xb, mode="clip")  # rows are in range
        np.take(self.labels, rows, axis=0, out=lb, mode="clip")
        return xb, lb

    def __iter__(self) -> Iterator[tuple[_core.DeviceArray, _core.DeviceArray]]:
        order = self.order(self.epoch)
        self.epoch += 1
        release = None if self._ring is None else self._ring.release
        return Prefetcher(self._tasks(order), ahead=self.prefetch, release=release,
                          workers=self.workers, prepare=self._gather)

    def __repr__(self) -> str:
        return (f"ArrayLoader(x={self.x.shape} {self.x.dtype}, labels={self.labels.shape} "
                f"{self.labels.dtype}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last}, prefetch={self.prefetch}, "
                f"pinned={self.pinned}, workers={self.workers})")
