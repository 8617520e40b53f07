"""CPU tier: nn.ArrayLoader without a GPU.

Every argument check and its message, the batch count, the shuffled orders
(deterministic per seed and epoch), and whole epochs through a stand-in for
the device (tests/test_lessons_d_cpu.py's logging calls: uploads copy the
host values): batches equal the host rows in order, the pinned staging ring
is allocated once, prefetching keeps its uploads ahead. The device side is in
tests/test_nn_loader_gpu.py.
"""

from __future__ import annotations

import inspect
import threading

import ml_dtypes
import numpy as np
import pytest
import test_lessons_d_cpu as standin  # the logging stand-in for streams, events, uploads
from _support import assert_arg_error, random_array

import cudalab.nn as nn
from cudalab import prefetch as feeding

N, F = 23, 5


@pytest.fixture
def data(rng):
    return random_array(rng, (N, F), np.float32), rng.integers(0, 7, N).astype(np.int64)


@pytest.fixture
def fake(monkeypatch):
    """(calls, pinned allocations): the loader's uploads go to the logging stand-in."""
    api = standin._FakeApi()
    made = []

    def pinned_empty(shape, dtype):
        made.append(np.empty(shape, dtype))
        return made[-1]

    monkeypatch.setattr(feeding, "CUDALAB", api)
    monkeypatch.setattr(feeding, "_pinned", pinned_empty)
    return api, made


def _log(api, kind):
    return [e for e in api.log if e[0] == kind]


def _epoch(loader):
    return [(x.get(), y.get()) for x, y in loader]


# ---- the API -------------------------------------------------------------------------------


def test_exported_with_a_docstring_and_keyword_only_options():
    assert "ArrayLoader" in nn.__all__ and nn.ArrayLoader.__module__ == "cudalab.nn.loader"
    doc = inspect.getdoc(nn.ArrayLoader)
    assert doc.startswith("ArrayLoader(x, labels, batch_size, *, shuffle=False, seed=0, "
                          "drop_last=True, prefetch=2, pinned=True, workers=0)")
    assert "Parameters\n----------" in doc
    params = inspect.signature(nn.ArrayLoader).parameters
    assert list(params) == ["x", "labels", "batch_size", "shuffle", "seed", "drop_last",
                            "prefetch", "pinned", "workers"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in list(params)[3:])
    assert inspect.getdoc(nn.ArrayLoader.order).startswith("order(epoch)")
    assert inspect.getdoc(nn.TeacherData.to_host).startswith("to_host()")


X, Y = np.ones((10, 3), np.float32), np.zeros(10, np.int64)


@pytest.mark.parametrize("args,kwargs,exc,param,match", [
    (([[1.0]], Y, 2), {}, TypeError, "x", "numpy.ndarray of samples, got list"),
    ((X, list(Y), 2), {}, TypeError, "labels", "got list"),
    ((np.float32(1), Y, 2), {}, TypeError, "x", "got float32"),
    ((np.array(1.0), Y, 2), {}, ValueError, "x", "at least 1 dimension"),
    ((X, np.array(3), 2), {}, ValueError, "labels", "at least 1 dimension"),
    ((X.astype(np.int16), Y, 2), {}, TypeError, "x", r"unsupported dtype.*int16.*bfloat16"),
    ((X, Y.astype(np.complex64), 2), {}, TypeError, "labels", "complex64"),
    ((X.astype(">f4"), Y, 2), {}, TypeError, "x", "non-native byte order"),
    ((X, Y.astype(object), 2), {}, TypeError, "labels", "unsupported dtype"),
    ((X, Y[:9], 2), {}, ValueError, "labels", "has 9 samples but x has 10"),
    ((X[:0], Y[:0], 2), {}, ValueError, "x", "has no samples"),
    ((X, Y, 0), {}, ValueError, "batch_size", ">= 1"),
    ((X, Y, 2.0), {}, TypeError, "batch_size", "int"),
    ((X, Y, True), {}, TypeError, "batch_size", "int"),
    ((X, Y, 11), {}, ValueError, "batch_size", r"11 exceeds the 10 samples.*drop_last=True"),
    ((X, Y, 2), {"shuffle": 1}, TypeError, "shuffle", "bool"),
    ((X, Y, 2), {"seed": -1}, ValueError, "seed", r"2\*\*64"),
    ((X, Y, 2), {"seed": 2**64}, ValueError, "seed", r"2\*\*64"),
    ((X, Y, 2), {"seed": 0.5}, TypeError, "seed", "int"),
    ((X, Y, 2), {"drop_last": "yes"}, TypeError, "drop_last", "bool"),
    ((X, Y, 2), {"prefetch": -1}, ValueError, "prefetch", ">= 0"),
    ((X, Y, 2), {"prefetch": 1.5}, TypeError, "prefetch", "int"),
    ((X, Y, 2), {"pinned": None}, TypeError, "pinned", "bool"),
    ((X, Y, 2), {"workers": -1}, ValueError, "workers", ">= 0"),
    ((X, Y, 2), {"workers": 2.0}, TypeError, "workers", "int"),
    ((X, Y, 2), {"workers": True}, TypeError, "workers", "int"),
])
def test_argument_errors(args, kwargs, exc, param, match):
    with assert_arg_error(exc, "ArrayLoader", param, match):
        nn.ArrayLoader(*args, **kwargs)


def test_keyword_only_options():
    with pytest.raises(TypeError):
        nn.ArrayLoader(X, Y, 2, True)


def test_accepted_arguments_and_repr():
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float64, np.uint8, np.int8, np.int32,
                  np.bool_):
        nn.ArrayLoader(X.astype(dtype), Y.astype(np.int32), 2)
    loader = nn.ArrayLoader(X, Y, 11, drop_last=False, seed=2**64 - 1, prefetch=0, pinned=False)
    assert len(loader) == 1 and loader.epoch == 0
    assert repr(loader) == ("ArrayLoader(x=(10, 3) float32, labels=(10,) int64, batch_size=11, "
                            "shuffle=False, seed=18446744073709551615, drop_last=False, "
                            "prefetch=0, pinned=False, workers=0)")


@pytest.mark.parametrize("n,bs,drop_last,want", [
    (10, 4, True, 2), (10, 4, False, 3), (12, 4, True, 3), (12, 4, False, 3), (1, 1, True, 1),
    (5, 8, False, 1)])
def test_len(n, bs, drop_last, want):
    x, y = np.ones((n, 2), np.float32), np.zeros(n, np.int64)
    assert len(nn.ArrayLoader(x, y, bs, drop_last=drop_last)) == want


def test_construction_allocates_nothing(fake):
    api, made = fake
    nn.ArrayLoader(X, Y, 2)
    assert made == [] and api.log == []


# ---- orders ------------------------------------------------------------------------------------


def test_order_without_shuffle_is_the_sample_order():
    loader = nn.ArrayLoader(X, Y, 3)
    assert np.array_equal(loader.order(0), np.arange(10)) and loader.order(5).dtype == np.int64
    with assert_arg_error(ValueError, "order", "epoch", ">= 0"):
        loader.order(-1)
    with assert_arg_error(TypeError, "order", "epoch"):
        loader.order(1.0)


def test_shuffled_orders_are_permutations_fixed_by_seed_and_epoch():
    a = nn.ArrayLoader(X, Y, 3, shuffle=True, seed=7)
    b = nn.ArrayLoader(X, Y, 3, shuffle=True, seed=7)
    c = nn.ArrayLoader(X, Y, 3, shuffle=True, seed=8)
    orders = [a.order(e) for e in range(4)]
    for e, o in enumerate(orders):
        assert sorted(o) == list(range(10))
        assert np.array_equal(o, b.order(e)) and np.array_equal(o, a.order(e))
    assert len({tuple(o) for o in orders}) == 4  # a new order every epoch
    assert not np.array_equal(orders[0], c.order(0))
    assert not np.array_equal(orders[0], np.arange(10))


# ---- epochs through the stand-in -----------------------------------------------------------


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("prefetch", [0, 1, 2, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_are_the_host_rows_in_order(fake, data, pinned, prefetch, shuffle):
    x, y = data
    loader = nn.ArrayLoader(x, y, 4, shuffle=shuffle, seed=3, prefetch=prefetch, pinned=pinned)
    for epoch in range(3):
        got = _epoch(loader)
        order = loader.order(epoch)
        assert loader.epoch == epoch + 1 and len(got) == len(loader) == N // 4
        for k, (gx, gy) in enumerate(got):
            rows = order[4 * k:4 * k + 4]
            assert gx.dtype == np.float32 and gy.dtype == np.int64
            assert np.array_equal(gx, x[rows]) and np.array_equal(gy, y[rows])


@pytest.mark.parametrize("pinned", [True, False])
def test_last_partial_batch_kept_without_drop_last(fake, data, pinned):
    x, y = data
    loader = nn.ArrayLoader(x, y, 5, shuffle=True, drop_last=False, pinned=pinned)
    got = _epoch(loader)
    assert [len(gx) for gx, _ in got] == [5, 5, 5, 5, 3]
    order = loader.order(0)
    assert np.array_equal(np.concatenate([gx for gx, _ in got]), x[order])
    assert np.array_equal(np.concatenate([gy for _, gy in got]), y[order])


def test_any_layout_and_dtype_and_label_shape(fake, rng):
    base = random_array(rng, (2 * N, F, 3), ml_dtypes.bfloat16)
    x = base[::-2].transpose(0, 2, 1)  # reversed, strided, transposed samples
    y = random_array(rng, (N, 2), np.float64)[:, ::-1]
    loader = nn.ArrayLoader(x, y, 6, shuffle=True, seed=1)
    order = loader.order(0)
    for k, (gx, gy) in enumerate(_epoch(loader)):
        rows = order[6 * k:6 * k + 6]
        assert gx.dtype == x.dtype and gx.shape == (6, 3, F)
        assert np.array_equal(gx, x[rows]) and np.array_equal(gy, y[rows])


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_the_staging_ring_is_allocated_once_and_reused(fake, data, prefetch):
    api, made = fake
    x, y = data
    loader = nn.ArrayLoader(x, y, 4, shuffle=True, prefetch=prefetch)
    for _ in range(3):
        _epoch(loader)
    slots = prefetch + 1
    assert len(made) == 2 * slots  # one x and one labels buffer per slot, for every epoch
    assert [(m.shape, m.dtype) for m in made[:2]] == [((4, F), x.dtype), ((4,), y.dtype)]


def test_pageable_loading_allocates_no_staging(fake, data):
    api, made = fake
    _epoch(nn.ArrayLoader(*data, 4, pinned=False))
    assert made == []


def test_prefetch_uploads_ahead_on_a_side_stream(fake, data):
    api, _ = fake
    x, y = data
    it = iter(nn.ArrayLoader(x, y, 4, prefetch=2))
    assert len(_log(api, "upload")) == 2 * 2  # x and labels of two batches, before next()
    for k in range(N // 4):
        next(it)
        assert len(_log(api, "upload")) == 2 * min(k + 3, N // 4)
    with pytest.raises(StopIteration):
        next(it)
    assert _log(api, "upload") == [("upload", True)] * (2 * (N // 4))
    assert [w[2] for w in _log(api, "wait")] == [r[2] for r in _log(api, "record")]
    assert _log(api, "record_stream") == [("record_stream", "consumer")] * (2 * (N // 4))
    assert api.sides == 1
    # Slots are refilled after the copy that read them: 5 batches, 3 slots.
    assert [e[1] for e in _log(api, "sync")] == [r[2] for r in _log(api, "record")][:5 - 3]


def test_prefetch_zero_uploads_each_batch_when_asked(fake, data):
    api, _ = fake
    it = iter(nn.ArrayLoader(*data, 4, prefetch=0))
    assert api.log == []
    next(it)
    assert _log(api, "upload") == [("upload", False)] * 2 and api.sides == 0


def test_an_abandoned_epoch_leaves_the_next_one_whole(fake, data):
    x, y = data
    loader = nn.ArrayLoader(x, y, 4, shuffle=True, seed=5)
    it = iter(loader)
    next(it)
    del it
    got = _epoch(loader)
    order = loader.order(1)
    assert len(got) == N // 4 and np.array_equal(got[2][0], x[order[8:12]])


# ---- workers: the gathers in threads ---------------------------------------------------------


def _worker_threads():
    return [t for t in threading.enumerate() if t.name.startswith(feeding.WORKER_THREAD_NAME)]


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_workers_hand_out_the_same_batches_in_order(fake, data, pinned, prefetch, workers):
    x, y = data
    loader = nn.ArrayLoader(x, y, 3, shuffle=True, seed=4, prefetch=prefetch, pinned=pinned,
                            workers=workers, drop_last=False)
    serial = nn.ArrayLoader(x, y, 3, shuffle=True, seed=4, prefetch=prefetch, pinned=pinned,
                            drop_last=False)
    for _ in range(2):
        got, want = _epoch(loader), _epoch(serial)
        assert len(got) == len(want) == 8
        for (gx, gy), (wx, wy) in zip(got, want):
            assert np.array_equal(gx, wx) and np.array_equal(gy, wy)
    assert _worker_threads() == []  # every epoch's threads ended with it


@pytest.mark.parametrize("prefetch,workers", [(0, 1), (1, 2), (2, 3)])
def test_workers_get_a_ring_slot_each_and_refill_none_before_its_copy(fake, data, prefetch,
                                                                      workers):
    api, made = fake
    x, y = data
    loader = nn.ArrayLoader(x, y, 2, prefetch=prefetch, workers=workers)
    slots = prefetch + workers + 1
    got = _epoch(loader)
    assert len(made) == 2 * slots  # x and labels per slot, allocated once
    for k, (gx, gy) in enumerate(got):  # a slot refilled too early would change a batch
        assert np.array_equal(gx, x[2 * k:2 * k + 2]) and np.array_equal(gy, y[2 * k:2 * k + 2])
    if prefetch:  # each refill waited for the copy that last read the slot
        records = [r[2] for r in _log(api, "record")]
        assert [e[1] for e in _log(api, "sync")] == records[:len(got) - slots]


def test_worker_threads_end_when_an_epoch_is_dropped(fake, data):
    loader = nn.ArrayLoader(*data, 2, workers=3)
    it = iter(loader)
    next(it)
    assert 1 <= len(_worker_threads()) <= 3
    del it
    assert _worker_threads() == []


def test_a_gather_that_fails_raises_in_the_consumer_at_its_batch(fake, data, monkeypatch):
    x, y = data
    loader = nn.ArrayLoader(x, y, 2, workers=2, prefetch=1)
    gather = loader._gather

    def failing(task):
        if task[0] == 6:  # the fourth batch
            raise KeyError("bad sample")
        return gather(task)

    monkeypatch.setattr(loader, "_gather", failing)
    it = iter(loader)
    got = [next(it) for _ in range(3)]  # the batches before the failed one all come out
    with pytest.raises(KeyError, match="bad sample"):
        next(it)
    assert [gx.get()[0, 0] for gx, _ in got] == [x[0, 0], x[2, 0], x[4, 0]]
    assert _worker_threads() == []
    with pytest.raises(StopIteration):  # and the epoch is over
        next(it)
