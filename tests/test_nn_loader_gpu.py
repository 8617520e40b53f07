"""GPU tier: nn.ArrayLoader and the mechanism under it (cudalab.prefetch) on a device.

* Every batch equals the host rows it stands for, bit for bit, for odd sizes,
  strided and reversed sources, several dtypes, with and without shuffle,
  pinned staging, prefetching and drop_last; a whole epoch is held before
  any is read, so a staging buffer refilled before its copy would show.
* Shuffled orders: the batches follow ``loader.order(epoch)``, new each epoch.
* The staging ring: ``prefetch + 1`` slots of page-locked buffers, allocated
  once for any number of batches and epochs (pinned_empty is counted).
* Ordering: work enqueued on the consumer's stream right after ``next()``
  sees the batch; the batch's memory outlives the consumer's work on it; a
  later batch's copy completes while the consumer's stream is still busy
  (the uploads do not queue behind the consumer's work).
* Workers: with ``workers=N`` threads gathering, the batches are the same
  (values and order), the ring has ``prefetch + workers + 1`` slots, and no
  worker thread outlives its epoch, also behind a busy consumer stream.
* TeacherData.to_host() holds TeacherData's batches; training with
  nn.train_step fed by the loader makes the loss fall, on the default and on
  a non-default current stream.
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest
from _support import random_array

import cudalab
import cudalab.nn as nn
from cudalab import _core
from cudalab import prefetch as feeding
from cudalab.prefetch import Prefetcher

pytestmark = pytest.mark.gpu

N, F = 203, 37          # odd: the last batch is partial unless dropped


def _strided(rng, shape, dtype):
    """A reversed, row-strided view (not contiguous) with random values."""
    base = random_array(rng, (2 * shape[0], *shape[1:]), dtype)
    return base[::-2]


def _epoch(loader):
    """All batches of one epoch as DeviceArrays, none read before the last is handed out."""
    return list(loader)


def _rows(loader, epoch):
    """The sample indices of each batch of epoch `epoch`."""
    bs, order = loader.batch_size, loader.order(epoch)
    return [order[i * bs:(i + 1) * bs] for i in range(len(loader))]


def _assert_same(got, want, what):
    """Bit for bit (bfloat16 and bool included)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                  np.ascontiguousarray(want).view(np.uint8), err_msg=what)


def _assert_epoch(loader, got, epoch):
    rows = _rows(loader, epoch)
    assert len(got) == len(rows) == len(loader)
    for k, ((xb, yb), r) in enumerate(zip(got, rows)):
        assert isinstance(xb, cudalab.DeviceArray) and xb.device == cudalab.current_device()
        assert xb.dtype == loader.x.dtype and yb.dtype == loader.labels.dtype
        _assert_same(xb.get(), loader.x[r], f"x of batch {k}")
        _assert_same(yb.get(), loader.labels[r], f"labels of batch {k}")


@pytest.fixture
def pinned_allocations(monkeypatch):
    """Every pinned_empty call the staging ring makes: (shape, dtype, array)."""
    made = []
    real = _core.pinned_empty

    def counting(shape, dtype):
        a = real(shape, dtype)
        made.append((tuple(shape), np.dtype(dtype), a))
        return a

    monkeypatch.setattr(_core, "pinned_empty", counting)
    return made


# ---- values and order --------------------------------------------------------------------


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_equal_the_host_rows(rng, pinned, prefetch, shuffle):
    x = _strided(rng, (N, F), np.float32)
    y = rng.integers(0, 11, N).astype(np.int64)
    loader = nn.ArrayLoader(x, y, 16, shuffle=shuffle, seed=4, prefetch=prefetch, pinned=pinned)
    for epoch in range(2):
        _assert_epoch(loader, _epoch(loader), epoch)


@pytest.mark.parametrize("xdtype,ydtype", [
    (np.float16, np.int32), (ml_dtypes.bfloat16, np.int64), (np.float64, np.float32),
    (np.uint8, np.int8), (np.int32, np.bool_)])
def test_dtypes_shapes_and_the_last_partial_batch(rng, xdtype, ydtype):
    x = _strided(rng, (N, 3, 7), xdtype).transpose(0, 2, 1)   # (N, 7, 3), no dense layout
    y = random_array(rng, (N, 2), ydtype)[:, ::-1]
    loader = nn.ArrayLoader(x, y, 24, shuffle=True, drop_last=False, seed=9)
    got = _epoch(loader)
    assert [b[0].shape for b in got] == [(24, 7, 3)] * 8 + [(N - 8 * 24, 7, 3)]
    assert got[-1][1].shape == (N - 8 * 24, 2)
    _assert_epoch(loader, got, 0)


def test_shuffled_epochs_follow_their_orders(rng):
    x = random_array(rng, (N, F), np.float32)
    y = np.arange(N, dtype=np.int64)       # labels name their sample
    loader = nn.ArrayLoader(x, y, 20, shuffle=True, seed=123)
    seen = []
    for epoch in range(3):
        labels = np.concatenate([yb.get() for _, yb in loader])
        np.testing.assert_array_equal(labels, loader.order(epoch)[:len(labels)])
        assert len(set(labels)) == len(labels) == 200
        seen.append(labels)
    assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[1], seen[2])
    again = nn.ArrayLoader(x, y, 20, shuffle=True, seed=123)
    np.testing.assert_array_equal(np.concatenate([yb.get() for _, yb in again]), seen[0])


# ---- the staging ring --------------------------------------------------------------------


@pytest.mark.parametrize("prefetch", [0, 1, 2, 4])
def test_the_staging_ring_is_allocated_once(rng, pinned_allocations, prefetch):
    x = random_array(rng, (N, F), np.float16)
    y = rng.integers(0, 5, N).astype(np.int32)
    loader = nn.ArrayLoader(x, y, 8, shuffle=True, prefetch=prefetch)
    for epoch in range(3):                  # 25 batches an epoch
        _assert_epoch(loader, _epoch(loader), epoch)
    slots = prefetch + 1
    assert len(pinned_allocations) == 2 * slots
    assert {(s, d) for s, d, _ in pinned_allocations} == {((8, F), np.dtype(np.float16)),
                                                          ((8,), np.dtype(np.int32))}
    assert all(cudalab.is_pinned(a) for _, _, a in pinned_allocations)


@pytest.mark.parametrize("workers,prefetch", [(1, 0), (2, 1), (4, 3), (3, 2)])
def test_workers_ring_and_batches(rng, pinned_allocations, workers, prefetch):
    x = _strided(rng, (N, F), np.float32)
    y = rng.integers(0, 13, N).astype(np.int64)
    loader = nn.ArrayLoader(x, y, 9, shuffle=True, seed=31, prefetch=prefetch, workers=workers,
                            drop_last=False)
    for epoch in range(2):
        _assert_epoch(loader, _epoch(loader), epoch)   # the whole epoch held, then read
    assert len(pinned_allocations) == 2 * (prefetch + workers + 1)
    assert not [t for t in threading.enumerate()
                if t.name.startswith(feeding.WORKER_THREAD_NAME)]


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_workers_give_the_serial_batches(rng, pinned, workers):
    x = _strided(rng, (N, 5, 3), ml_dtypes.bfloat16)
    y = random_array(rng, (N,), np.int32)
    for shuffle in (False, True):
        loader = nn.ArrayLoader(x, y, 12, shuffle=shuffle, pinned=pinned, workers=workers)
        _assert_epoch(loader, _epoch(loader), 0)


def test_workers_behind_a_busy_consumer_stream(rng):
    x = random_array(rng, (2048 + 7, 1021), np.float32)
    y = rng.integers(0, 3, len(x)).astype(np.int64)
    loader = nn.ArrayLoader(x, y, 512, shuffle=True, prefetch=2, workers=3)
    got = []
    for xb, yb in loader:
        keep = _busy(reps=4)      # the consumer's stream stays busy while refills are due
        got.append((cudalab.add(xb, 0.0), yb, keep))
    cudalab.synchronize()
    rows = _rows(loader, 0)
    for k, ((xb, yb, _), r) in enumerate(zip(got, rows)):
        _assert_same(xb.get(), x[r], f"x of batch {k}")
        _assert_same(yb.get(), y[r], f"labels of batch {k}")


def test_pageable_loading_allocates_no_pinned_memory(rng, pinned_allocations):
    x = random_array(rng, (N, F), np.float32)
    loader = nn.ArrayLoader(x, np.zeros(N, np.int64), 10, pinned=False, shuffle=True)
    _assert_epoch(loader, _epoch(loader), 0)
    assert pinned_allocations == []


# ---- ordering on the device --------------------------------------------------------------


def _busy(n=4096, reps=40):
    """Enqueue float32 matmuls on the current stream (4096, 40: ~0.1 s on an H200).

    Returns the arrays it used: kept alive, nothing is freed on the stream
    behind that work (the pool could hand freed memory to another stream's
    allocation only after it, making an unrelated upload wait).
    """
    a = cudalab.random.normal((n, n), std=n ** -0.5, seed=5)
    out = cudalab.empty((n, n))
    for _ in range(reps):
        cudalab.matmul(a, a, out=out, precision="highest")
    return a, out


def test_consumer_work_enqueued_after_next_sees_the_batch(rng):
    x = random_array(rng, (4096 + 5, 1021), np.float32)   # ~4 MiB batches: copies take time
    y = rng.integers(0, 3, len(x)).astype(np.int64)
    s = cudalab.Stream()
    loader = nn.ArrayLoader(x, y, 1024, shuffle=True, prefetch=2)
    with s:
        doubled = [(xb * 2, yb + 1) for xb, yb in loader]   # on s, as soon as handed out
        got = [(a.get(), b.get()) for a, b in doubled]
    for (gx, gy), r in zip(got, _rows(loader, 0)):
        np.testing.assert_array_equal(gx, x[r] * 2)
        np.testing.assert_array_equal(gy, y[r] + 1)


def test_a_batch_outlives_the_consumers_work_on_it(rng):
    x = random_array(rng, (600, 257), np.float32)
    loader = nn.ArrayLoader(x, np.zeros(600, np.int64), 50, prefetch=3)
    s = cudalab.Stream()
    copies = []
    with s:
        for xb, _ in loader:
            _busy(1024, 4)                   # the consumer is behind the uploads
            copies.append(xb + 0)            # reads xb after the busy work
            del xb                           # freed while that read is still queued
        got = [c.get() for c in copies]
    for g, r in zip(got, _rows(loader, 0)):
        np.testing.assert_array_equal(g, x[r])


def test_uploads_complete_while_the_consumer_stream_is_busy(rng):
    hosts = [cudalab.pinned_empty((512, 256)) for _ in range(6)]
    for h in hosts:
        h[...] = random_array(rng, h.shape, np.float32)
    events = []
    consumer = cudalab.Stream()
    with consumer:
        it = Prefetcher(hosts, ahead=2, release=lambda host, event: events.append(event))
        assert len(events) == 2               # two copies started by the constructor
        first = next(it)
        busy = _busy()                        # long work on the consumer's stream
        second = next(it)                     # starts the copy of batch 3 on the side stream
        assert len(events) == 4
        events[-1].synchronize()              # that copy is done...
        still_busy = not consumer.query()     # ...while the consumer's work is not
        rest = list(it)
        values = [b.get() for b in (first, second, *rest)]
        busy[1].get()
    assert still_busy, "the upload waited for the consumer's stream"
    for v, h in zip(values, hosts):
        np.testing.assert_array_equal(v, h)


# ---- training ------------------------------------------------------------------------------

IN, CLASSES, BATCH, BATCHES, EPOCHS = 32, 16, 256, 50, 4


def test_teacher_data_to_host_holds_its_batches():
    data = nn.TeacherData(IN, CLASSES, 64, batches=5, seed=2)
    x, labels = data.to_host()
    assert x.shape == (5 * 64, IN) and x.dtype == np.float32
    assert labels.shape == (5 * 64,) and labels.dtype == np.int64
    loader = nn.ArrayLoader(x, labels, 64)
    for i, (xb, lb) in enumerate(loader):
        dx, dl = data.batch(i)
        np.testing.assert_array_equal(xb.get(), dx.get())
        np.testing.assert_array_equal(lb.get(), dl.get())
    assert i == 4


def _train(loader, precision="fp32"):
    model = nn.MLP([IN, 128, 128, CLASSES], "gelu", seed=21)
    opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = nn.GradScaler() if precision == "fp16" else None
    losses = []
    for _ in range(EPOCHS):
        for xb, lb in loader:
            losses.append(nn.train_step(model, opt, xb, lb, precision, scaler))
    return np.array([float(v.get()) for v in losses])


def _teacher_loader(**kwargs):
    data = nn.TeacherData(IN, CLASSES, BATCH, hidden=(64,), batches=BATCHES, seed=0)
    return nn.ArrayLoader(*data.to_host(), BATCH, shuffle=True, seed=1, **kwargs)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_training_fed_by_the_loader_makes_the_loss_fall(precision):
    losses = _train(_teacher_loader(), precision)
    assert len(losses) == EPOCHS * BATCHES and np.all(np.isfinite(losses))
    assert losses[-10:].mean() < 0.5 * losses[:5].mean(), (losses[:5], losses[-10:])


def test_training_on_a_non_default_current_stream():
    loader = _teacher_loader(prefetch=3)
    on_default = _train(loader)
    loader.epoch = 0                        # the same orders again
    s = cudalab.Stream()
    with s:
        on_side = _train(loader)
    np.testing.assert_allclose(on_side, on_default, rtol=1e-4)
    assert on_side[-10:].mean() < 0.5 * on_side[:5].mean()


def test_iterator_made_on_one_stream_and_consumed_on_another(rng):
    x = random_array(rng, (N, F), np.float32)
    loader = nn.ArrayLoader(x, np.arange(N, dtype=np.int64), 32, shuffle=True)
    it = iter(loader)                       # uploads start here, on the loader's side stream
    s = cudalab.Stream()
    with s:
        got = [(xb + 0, lb + 0) for xb, lb in it]
        values = [(a.get(), b.get()) for a, b in got]
    for (gx, gl), r in zip(values, _rows(loader, 0)):
        np.testing.assert_array_equal(gx, x[r])
        np.testing.assert_array_equal(gl, r)
