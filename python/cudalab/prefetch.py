"""Feeding the device from the host: a pinned staging ring and a prefetching iterator.

A loop that trains or infers on host data wants each batch's copy to overlap
the work on the previous one. Two pieces do that, for any iterable of host
batches:

* :class:`StagingRing`: a few page-locked (pinned) host buffers, allocated once
  and handed out in turn. Only pinned memory can be copied asynchronously,
  and page-locking is slow (freeing it waits for the whole device), so a
  loader prepares every batch into the ring instead of into a new array. A
  buffer is refilled only after the copy that last read it has finished:
  whoever starts that copy hands its event to :meth:`StagingRing.release`.
* :class:`Prefetcher`: iterates over host batches and uploads the next
  ``ahead`` of them on its own side stream while the consumer works on the
  current one. Handing out a batch makes the consumer's current stream wait
  for the batch's copy event (a wait on the device, not on the host) and
  records the batch on that stream, so the memory pool frees it only after
  the consumer's work on it. With ``workers=N`` (and a ``prepare``
  function) the host preparation of the batches runs in N threads ahead of
  the uploads (:class:`HostWorkers`), like ``num_workers`` of PyTorch's
  DataLoader.
* :class:`HostWorkers`: ``prepare(item)`` for each item, computed by a few
  threads ahead of the consumer and handed out in order.

The calls the prefetcher makes (streams, upload, event) go through a small
set of functions, :data:`CUDALAB` by default, so that the same mechanism can
drive another library's arrays (the lesson ``prefetch`` runs it through
PyTorch too).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from . import _core

__all__ = ["CUDALAB", "CudalabCalls", "HostWorkers", "Prefetcher", "StagingRing",
           "WORKER_THREAD_NAME"]

# The name every HostWorkers thread's name starts with (threading.enumerate() finds them).
WORKER_THREAD_NAME = "cudalab-host-worker"


class CudalabCalls:
    """The calls :class:`Prefetcher` makes, through cudalab.

    Another implementation (same method names) lets the prefetcher move
    another library's arrays: ``Stream()``, ``current_stream()``,
    ``stream(s)`` (a context making `s` current), ``upload(host,
    non_blocking)``, ``record(s)`` (a new event recorded on `s`) and
    ``synchronize()``.
    """

    name = "cudalab"

    @staticmethod
    def Stream() -> Any:  # noqa: N802 - the name of the class it makes
        return _core.Stream()

    @staticmethod
    def current_stream() -> Any:
        return _core.current_stream()

    @staticmethod
    def synchronize() -> None:
        _core.synchronize()

    @staticmethod
    def stream(s: Any) -> Any:
        return s  # a cudalab Stream is its own context manager

    @staticmethod
    def upload(host: np.ndarray, non_blocking: bool) -> Any:
        return _core.asarray(host, non_blocking=non_blocking)

    @staticmethod
    def record(s: Any) -> Any:
        return s.record_event()


CUDALAB = CudalabCalls()


def _pinned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return _core.pinned_empty(shape, dtype)


class StagingRing:
    """StagingRing(buffers, slots=2, *, allocate=None)

    A ring of host staging slots, each holding one buffer per entry of
    `buffers`, allocated on the slot's first use and reused afterwards.

    :meth:`acquire` hands out the slots in turn; before handing out a slot
    again it waits (on the host) for the event given to :meth:`release` for
    it, the end of the copy that read it. With ``slots = ahead + 1`` for a
    :class:`Prefetcher` that keeps ``ahead`` uploads in flight, that copy
    finished long ago and the wait costs nothing.

    Parameters
    ----------
    buffers : sequence of (shape, dtype)
        The buffers of one slot (e.g. a batch's inputs and its labels).
    slots : int, optional
        How many slots, >= 1.
    allocate : callable, optional
        ``allocate(shape, dtype) -> numpy.ndarray``; page-locked memory from
        :func:`cudalab.pinned_empty` by default.

    Attributes
    ----------
    slots : int
    allocations : int
        Buffers allocated so far (at most ``slots * len(buffers)``).
    """

    def __init__(self, buffers: Sequence[tuple[Any, Any]], slots: int = 2, *,
                 allocate: Optional[Callable[[tuple[int, ...], Any], np.ndarray]] = None) -> None:
        self._specs = [(tuple(shape), np.dtype(dtype)) for shape, dtype in buffers]
        self.slots = _check_count(slots, "StagingRing", "slots", 1)
        self._allocate = _pinned if allocate is None else allocate
        self._buffers: list[Optional[tuple[np.ndarray, ...]]] = [None] * slots
        self._read_by: list[Any] = [None] * slots  # event of the copy that read slot j
        self._turn = 0  # the slot handed out next
        self.allocations = 0

    def acquire(self) -> tuple[np.ndarray, ...]:
        """acquire() -> tuple of numpy.ndarray

        The next slot's buffers, free to be filled: the copy that last read
        them (if any) has finished.
        """
        j, self._turn = self._turn, (self._turn + 1) % self.slots
        if self._buffers[j] is None:
            self._buffers[j] = tuple(self._allocate(shape, dtype) for shape, dtype in self._specs)
            self.allocations += len(self._specs)
        if self._read_by[j] is not None:
            self._read_by[j].synchronize()
            self._read_by[j] = None
        return self._buffers[j]

    def release(self, batch: Any, event: Any) -> None:
        """release(batch, event)

        The slots whose buffers `batch` lies in (an array, or a tuple or list
        holding arrays; views of the buffers count) may be refilled once
        `event` has completed. Arrays outside the ring are ignored.
        """
        for a in _host_arrays(batch):
            for j, slot in enumerate(self._buffers):
                if slot is not None and any(np.may_share_memory(a, b) for b in slot):
                    self._read_by[j] = event


def _check_count(value: Any, func: str, param: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{func}() argument '{param}': expected an int, "
                        f"got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{func}() argument '{param}': must be >= {minimum}, got {value}")
    return int(value)


def _host_arrays(batch: Any) -> list[np.ndarray]:
    if isinstance(batch, np.ndarray):
        return [batch]
    if isinstance(batch, (tuple, list)):
        return [a for a in batch if isinstance(a, np.ndarray)]
    return []


def _upload(batch: Any, calls: Any, non_blocking: bool) -> tuple[Any, list[Any]]:
    """(the batch with its NumPy arrays uploaded, the uploaded arrays).

    A batch is a NumPy array, or a tuple or list whose NumPy arrays are
    uploaded and whose other items (an index, a name) pass through.
    """
    if isinstance(batch, np.ndarray):
        a = calls.upload(batch, non_blocking)
        return a, [a]
    if not isinstance(batch, (tuple, list)):
        raise TypeError(f"a host batch must be a numpy.ndarray or a tuple of them, "
                        f"got {type(batch).__name__}")
    items = [calls.upload(a, non_blocking) if isinstance(a, np.ndarray) else a for a in batch]
    uploaded = [d for d, a in zip(items, batch) if isinstance(a, np.ndarray)]
    return type(batch)(items), uploaded


def _shut_down(pool: ThreadPoolExecutor, pending: deque[Future]) -> None:
    """Cancel the tasks not started, wait for the running ones, end the threads."""
    for task in pending:
        task.cancel()
    pending.clear()
    # A worker thread that drops the last reference cannot join itself: it lets the
    # other threads end on their own.
    inside = threading.current_thread().name.startswith(WORKER_THREAD_NAME)
    pool.shutdown(wait=not inside, cancel_futures=True)


class HostWorkers:
    """HostWorkers(items, prepare, workers)

    An iterator over ``prepare(item)`` for each item of `items`, in the order
    of `items`, computed by `workers` threads ahead of the consumer.

    `items` is read on the consumer's thread (so it may hand out staging
    buffers in turn: :class:`StagingRing` is not shared between threads);
    only `prepare` runs in the workers. At most `workers` items are being
    prepared or wait to be taken at a time (a bounded queue): creating the
    iterator starts the first `workers`, and each ``next()`` starts one more
    before it waits for the oldest. An exception in `prepare` is raised by the
    ``next()`` that would have returned that item, with the worker's
    traceback; the iterator then stops.

    The threads end when the items run out, after an exception, at
    :meth:`close`, or when the iterator is dropped (a running task is waited
    for; the tasks not yet started are cancelled): none outlives its epoch.

    Why threads, not processes: a batch's host preparation is NumPy work
    (a gather with ``np.take``, arithmetic, copies) whose loops release the
    GIL, so threads run it in parallel, share the process's memory (a worker
    writes straight into a pinned staging buffer, and nothing is pickled or
    copied between processes) and start in microseconds. Preparation that
    holds the GIL (per-sample Python code: decoding files, PIL transforms,
    Python loops) gains nothing from threads; it needs worker processes, as
    ``torch.utils.data.DataLoader(num_workers=N)`` uses, with the batches
    handed back through shared memory.

    Parameters
    ----------
    items : iterable
        What each task is given (a batch index, rows to gather, a buffer).
    prepare : callable
        ``prepare(item) -> batch``, run in a worker thread.
    workers : int
        Threads, >= 1.
    """

    def __init__(self, items: Iterable[Any], prepare: Callable[[Any], Any],
                 workers: int) -> None:
        self.workers = _check_count(workers, "HostWorkers", "workers", 1)
        if not callable(prepare):
            raise TypeError(f"HostWorkers() argument 'prepare': expected a callable, "
                            f"got {type(prepare).__name__}")
        self._items: Iterator[Any] = iter(items)
        self._prepare = prepare
        self._pending: deque[Future] = deque()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=WORKER_THREAD_NAME)
        # Runs once: at close(), or when the iterator is garbage collected.
        self._closer = weakref.finalize(self, _shut_down, self._pool, self._pending)
        try:
            while len(self._pending) < self.workers and self._submit():
                pass
        except BaseException:
            self.close()
            raise

    def _submit(self) -> bool:
        """Start preparing the next item; False once the items have run out."""
        try:
            item = next(self._items)
        except StopIteration:
            return False
        self._pending.append(self._pool.submit(self._prepare, item))
        return True

    @property
    def closed(self) -> bool:
        """Whether the threads have been shut down."""
        return not self._closer.alive

    def close(self) -> None:
        """Cancel the items not started, wait for the running ones and end the threads."""
        self._closer()

    def __iter__(self) -> HostWorkers:
        return self

    def __next__(self) -> Any:
        if not self._pending:
            self.close()
            raise StopIteration
        oldest = self._pending.popleft()
        try:
            self._submit()  # keeps every worker busy while this thread waits
            return oldest.result()
        except BaseException:
            self.close()
            raise


class Prefetcher:
    """Prefetcher(batches, *, ahead=1, release=None, calls=None, workers=0, prepare=None)

    An iterator over host batches that yields them on the device, uploading
    the next `ahead` batches on a side stream while the current one is used.

    Each batch is copied with ``non_blocking=True`` on the prefetcher's own
    stream, and an event is recorded after the copy. ``next()`` makes the
    caller's current stream wait for that event, so work enqueued on it
    afterwards sees the batch (the host does not wait), and records every
    array of the batch on that stream, so that freeing the batch waits for
    that work. Creating the prefetcher starts the first uploads.

    An exception raised while a batch is prepared (by `batches` or
    `prepare`) is raised by the ``next()`` due to return that batch, after
    the batches before it; the iteration then ends.

    Parameters
    ----------
    batches : iterable
        Host batches: NumPy arrays, or tuples (or lists) whose NumPy arrays
        are uploaded and whose other items pass through unchanged. Arrays in
        pinned memory are copied asynchronously; pageable ones synchronously.
    ahead : int, optional
        Batches uploaded ahead of the one handed out, >= 0. With 0, each
        batch is uploaded when asked for, on the current stream, and the call
        returns once it is copied (synchronous loading: nothing overlaps).
    release : callable, optional
        ``release(host_batch, event)``, called once a batch's copy is
        enqueued; `event` completes when the copy has read the host batch
        (e.g. :meth:`StagingRing.release`, so that the batch's staging
        buffer is refilled only afterwards).
    calls : optional
        The streams, events and upload to use (:class:`CudalabCalls`); cudalab's
        by default.
    workers : int, optional
        Threads preparing host batches ahead of the uploads, >= 0 (needs
        `prepare`). 0, the default, prepares each batch on the caller's
        thread when it is due for upload. With N >= 1, `batches` is read on the caller's
        thread and ``prepare(item)`` runs in N threads, in order, at most N
        items ahead (:class:`HostWorkers`; why threads and not processes is
        said there). The threads end with the epoch, at :meth:`close`, or
        when the prefetcher is dropped.
    prepare : callable, optional
        ``prepare(item) -> host batch``: the items of `batches` become host
        batches through it (on the caller's thread with ``workers=0``).

    Examples
    --------
    >>> ring = StagingRing([((256, 64), np.float32)], slots=2)
    >>> def host_batches():
    ...     for i in range(100):
    ...         (buf,) = ring.acquire()
    ...         buf[...] = make_batch(i)       # on the host
    ...         yield buf
    >>> for x in Prefetcher(host_batches(), release=ring.release):
    ...     step(x)                            # batch i+1 is being copied meanwhile

    With two threads preparing, each batch's buffer taken from the ring on
    this thread (the ring then needs ``ahead + workers + 1`` slots)::

    >>> ring = StagingRing([((256, 64), np.float32)], slots=1 + 2 + 1)
    >>> def fill(item):
    ...     i, buf = item
    ...     buf[...] = make_batch(i)           # in a worker thread
    ...     return buf
    >>> items = ((i, ring.acquire()[0]) for i in range(100))
    >>> for x in Prefetcher(items, release=ring.release, workers=2, prepare=fill):
    ...     step(x)
    """

    def __init__(self, batches: Iterable[Any], *, ahead: int = 1,
                 release: Optional[Callable[[Any, Any], None]] = None,
                 calls: Any = None, workers: int = 0,
                 prepare: Optional[Callable[[Any], Any]] = None) -> None:
        self._ahead = _check_count(ahead, "Prefetcher", "ahead", 0)
        workers = _check_count(workers, "Prefetcher", "workers", 0)
        if prepare is not None and not callable(prepare):
            raise TypeError(f"Prefetcher() argument 'prepare': expected a callable, "
                            f"got {type(prepare).__name__}")
        if workers and prepare is None:
            raise ValueError(f"Prefetcher() argument 'workers': workers={workers} needs "
                             f"prepare=, the function the workers run on each item (an "
                             f"iterator's own next() runs one call at a time)")
        self._workers: Optional[HostWorkers] = None
        if workers:
            self._workers = HostWorkers(batches, prepare, workers)
            self._source: Iterator[Any] = self._workers
        elif prepare is not None:
            self._source = map(prepare, batches)
        else:
            self._source = iter(batches)
        self._calls = CUDALAB if calls is None else calls
        self._release = release
        self._side = self._calls.Stream() if self._ahead else None
        self._pending: deque[tuple[Any, list[Any], Any]] = deque()
        self._exhausted = False
        self._error: Optional[Exception] = None  # raised after the batches before it
        for _ in range(self._ahead):
            self._preload()

    def _preload(self) -> None:
        if self._exhausted:
            return
        try:
            host = next(self._source)
        except StopIteration:
            self._exhausted = True
            return
        except Exception as exc:  # preparing this batch failed: its turn raises it
            self._exhausted, self._error = True, exc
            return
        calls = self._calls
        with calls.stream(self._side):
            batch, arrays = _upload(host, calls, non_blocking=True)
            copied = calls.record(self._side)
        if self._release is not None:
            self._release(host, copied)  # its staging buffer is reused after the copy
        self._pending.append((batch, arrays, copied))

    def close(self) -> None:
        """End the worker threads (if any) now; batches already uploaded are still handed out."""
        if self._workers is not None:
            self._workers.close()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if not self._ahead:  # synchronous: the copy is done when upload returns
            return _upload(next(self._source), self._calls, non_blocking=False)[0]
        if not self._pending:
            error, self._error = self._error, None
            if error is not None:
                raise error
            raise StopIteration
        batch, arrays, copied = self._pending.popleft()
        consumer = self._calls.current_stream()
        consumer.wait_event(copied)    # the consumer's work starts after the copy
        for a in arrays:
            a.record_stream(consumer)  # and the batch's free waits for that work
        self._preload()
        return batch
