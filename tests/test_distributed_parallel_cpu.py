"""CPU tier: the parallelism layer (DataParallel, DistributedDataParallel, Pipeline, .to()).

No GPU. What runs here:

* every argument check made before GPU work (the constructors, the steps,
  ``.to()``'s device spellings), and the pure logic: torch.chunk's row split,
  the balanced stage split (against brute force), the gradient buckets
  (reverse layer order, torch's cap rule, aligned offsets, the layer that
  completes each bucket);
* DistributedDataParallel's hot path with fakes standing in for the device
  (a module whose backward calls the hook layer by layer, a communicator, streams
  and events that log what is enqueued, NumPy buckets): each bucket all-reduced
  on the communication stream right after its last layer's gradients, the half
  wire's casts, the join at the end, no_sync skipping all of it and its
  bookkeeping, the per-bucket optimizers stepping only once their weights are no
  longer read; MLP.backward's and Linear's hook plumbing;
* the whole orchestration on a NumPy stand-in for the devices (bottom of the
  file): Pipeline, DataParallel and DDP of a real nn.MLP against the unsplit
  MLP's losses, gradients and AdamW updates, and MLP.to.

The GPU's numerics are in tests/test_distributed_parallel_gpu.py.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import types

import numpy as np
import pytest
from _support import BF16, assert_arg_error, no_gpu_only

import cudalab
import cudalab.nn as nn
from cudalab import _core
from cudalab.distributed import ddp as ddp_mod
from cudalab.distributed import pipeline as pipe_mod
from cudalab.distributed.data_parallel import DataParallel, split_rows
from cudalab.distributed.ddp import (ALIGN, DistributedDataParallel, assign_buckets,
                                     plan_buckets)
from cudalab.distributed.group import ProcessGroup
from cudalab.distributed.pipeline import Pipeline, split_stages
from cudalab.nn import layers as layers_mod

MIB = 1024 * 1024


# ---- torch.chunk's row split -------------------------------------------------------------


@pytest.mark.parametrize("rows, parts", [(r, p) for r in range(1, 40) for p in range(1, 9)])
def test_split_rows_is_torch_chunk(rows, parts):
    got = split_rows(rows, parts)
    size = -(-rows // parts)
    # Contiguous, covering every row once, in order.
    assert got[0][0] == 0 and got[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    # torch.chunk: every piece ceil(rows / parts) rows but the last, never more pieces than
    # asked, and as many as those sizes need.
    assert all(stop - start == size for start, stop in got[:-1])
    assert 1 <= got[-1][1] - got[-1][0] <= size
    assert len(got) == -(-rows // size) <= parts


def test_split_rows_examples_from_torch_chunk_docs():
    # torch.arange(11).chunk(6) has 6 pieces of 2, 2, 2, 2, 2, 1; torch.arange(12).chunk(6)
    # 6 of 2; torch.arange(5).chunk(4) only 3 (2, 2, 1).
    assert [b - a for a, b in split_rows(11, 6)] == [2, 2, 2, 2, 2, 1]
    assert [b - a for a, b in split_rows(12, 6)] == [2] * 6
    assert [b - a for a, b in split_rows(5, 4)] == [2, 2, 1]


def test_split_rows_matches_torch_where_installed():
    torch = pytest.importorskip("torch")
    for rows, parts in itertools.product(range(1, 30), range(1, 7)):
        want = [len(c) for c in torch.arange(rows).chunk(parts)]
        assert [b - a for a, b in split_rows(rows, parts)] == want, (rows, parts)


@pytest.mark.parametrize("rows, parts, exc, param", [
    (0, 2, ValueError, "rows"), (4, 0, ValueError, "parts"), (4.0, 2, TypeError, "rows"),
    (4, True, TypeError, "parts")])
def test_split_rows_argument_errors(rows, parts, exc, param):
    with assert_arg_error(exc, "split_rows", param):
        split_rows(rows, parts)


# ---- the stage split ----------------------------------------------------------------------


def _all_splits(n, stages):
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        yield list(zip(edges[:-1], edges[1:]))


def _largest(costs, split):
    return max(sum(costs[a:b]) for a, b in split)


def test_split_stages_is_optimal_against_brute_force():
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 9)
        stages = rng.randint(1, n)
        costs = [rng.choice([0, 1, 5, 100, rng.randint(0, 1000)]) for _ in range(n)]
        got = split_stages(costs, stages)
        splits = list(_all_splits(n, stages))
        best = min(_largest(costs, s) for s in splits)
        assert _largest(costs, got) == best, (costs, stages, got)
        # Contiguous, non-empty, in order, covering every item.
        assert got[0][0] == 0 and got[-1][1] == n and len(got) == stages
        assert all(a < b for a, b in got) and all(x[1] == y[0] for x, y in zip(got, got[1:]))


def test_split_stages_of_mlp_shapes():
    # 4 x 4096 GELU layers and a small head: two stages of two layers, the head on the last.
    sizes = [4096] * 5 + [10]
    costs = [a * b + b for a, b in zip(sizes[:-1], sizes[1:])]
    assert split_stages(costs, 2) == [(0, 2), (2, 5)]
    assert split_stages(costs, 4) == [(0, 1), (1, 2), (2, 3), (3, 5)]
    assert split_stages(costs, 1) == [(0, 5)]
    # A first layer twice the others' size gets a stage of its own.
    assert split_stages([200, 100, 100], 2) == [(0, 1), (1, 3)]
    # A tie goes to the earliest cuts.
    assert split_stages([5] * 5, 2) == [(0, 2), (2, 5)]


def test_split_stages_argument_errors():
    with assert_arg_error(ValueError, "split_stages", "stages", "need at least 3 items"):
        split_stages([1, 2], 3)
    with assert_arg_error(ValueError, "split_stages", "stages"):
        split_stages([1, 2], 0)


# ---- gradient buckets ---------------------------------------------------------------------


def _mlp_layer_params(sizes):
    return [[(f"{i}.weight", a * b), (f"{i}.bias", b)]
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]


def test_assign_buckets_reverse_order_and_torch_cap_rule():
    rng = random.Random(3)
    for _ in range(200):
        sizes = [rng.randint(1, 50) for _ in range(rng.randint(1, 12))]
        cap = rng.randint(1, 300)
        got = assign_buckets(sizes, cap, itemsize=4)
        # Every tensor once, in reverse order.
        assert [i for b in got for i in b] == list(range(len(sizes) - 1, -1, -1))
        for b in got[:-1]:  # closed buckets reached the cap; without their last, they had not
            assert sum(sizes[i] for i in b) * 4 >= cap
            assert sum(sizes[i] for i in b[:-1]) * 4 < cap
        assert sum(sizes[i] for i in got[-1][:-1]) * 4 < cap


def test_buckets_of_a_4x4096_mlp_hold_one_layer_each():
    sizes = [4096] * 5 + [10]
    buckets = plan_buckets(_mlp_layer_params(sizes), 25 * MIB)
    # The head (41k parameters) joins the last 4096 layer's bucket; every 64 MiB weight
    # closes a bucket.
    assert [b.params for b in buckets] == [("4.bias", "4.weight", "3.bias", "3.weight"),
                                           ("2.bias", "2.weight"), ("1.bias", "1.weight"),
                                           ("0.bias", "0.weight")]
    assert [b.layers for b in buckets] == [(4, 3), (2,), (1,), (0,)]
    assert [b.ready_after for b in buckets] == [3, 2, 1, 0]
    assert buckets[1].elements == 4096 * 4096 + 4096
    for b in buckets:
        assert b.index == buckets.index(b)
        assert all(off % ALIGN == 0 for off in b.offsets)
        assert b.numel >= b.elements and b.numel % ALIGN == 0
        assert b.nbytes == 4 * b.numel
        assert b.numel - b.elements < ALIGN * len(b.params)  # padding only for alignment


def test_bucket_offsets_leave_room_for_each_tensor():
    layer_params = [[("0.weight", 33 * 7), ("0.bias", 7)], [("1.weight", 7 * 5), ("1.bias", 5)]]
    for cap in (1, 100, 10 ** 9):
        for b in plan_buckets(layer_params, cap):
            sizes = dict(p for layer in layer_params for p in layer)
            ends = [off + sizes[name] for name, off in zip(b.params, b.offsets)]
            assert all(end <= nxt for end, nxt in zip(ends, b.offsets[1:]))
            assert ends[-1] <= b.numel
    one = plan_buckets(layer_params, 10 ** 9)
    assert len(one) == 1 and one[0].params == ("1.bias", "1.weight", "0.bias", "0.weight")
    assert one[0].ready_after == 0
    each = plan_buckets(layer_params, 1)
    assert [b.params for b in each] == [("1.bias",), ("1.weight",), ("0.bias",), ("0.weight",)]
    assert [b.ready_after for b in each] == [1, 1, 0, 0]


# ---- DistributedDataParallel with fakes -------------------------------------------------------


class Log(list):
    def names(self, kind):
        return [e for e in self if e[0] == kind]


class FakeStream:
    def __init__(self, log, name, device=0):
        self.log, self.name, self.device = log, name, device

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.name))

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", self.name))
        return False


class FakeEvent:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def record(self, stream=None):
        self.log.append(("record", self.name, stream.name))


def fake_core(log, fail_stream_priority=False):
    """The few _core calls DistributedDataParallel makes, on NumPy arrays."""
    events = itertools.count()
    compute = FakeStream(log, "compute")

    def stream(priority=0, device=None):
        if fail_stream_priority and priority != 0:
            raise ValueError("priority out of range")
        log.append(("stream", priority, device))
        # A DDP makes its communication stream, then (optimize_in_backward) its optimizer's.
        return FakeStream(log, "optim" if core.made_comm_stream else "comm", device)

    def copyto(dst, src):
        log.append(("copyto", dst.dtype.name, src.dtype.name, dst.size))
        dst[...] = src

    core = types.SimpleNamespace(
        made_comm_stream=False,
        zeros=lambda shape, dtype: np.zeros(shape, dtype),
        empty=lambda shape, dtype: np.full(shape, np.nan, dtype),
        copyto=copyto,
        Stream=stream,
        Event=lambda enable_timing=True: FakeEvent(log, f"e{next(events)}"),
        current_stream=lambda device=None: compute,
        DistributedError=_core.DistributedError,
    )
    return core


class FakeComm:
    def __init__(self, log, buffers=None):
        self.log = log
        self.buffers = buffers  # name -> array, to say which bucket a call got

    def _which(self, a):
        where = (a.__array_interface__["data"][0], a.size)
        for name, arr in (self.buffers or {}).items():
            if (arr.__array_interface__["data"][0], arr.size) == where:
                return name
        return "?"

    def all_reduce(self, send, recv, op):
        assert send is recv, "in place"
        self.log.append(("all_reduce", self._which(send), op, send.dtype.name))

    def broadcast(self, send, recv, root):
        self.log.append(("broadcast", send.name, root))


class FakeValue:
    def __init__(self, name, device):
        self.name, self.device = name, device


class FakeParam:
    def __init__(self, name, shape, device=0, seed=0):
        self.name, self.shape = name, shape
        self.size = int(np.prod(shape))
        self.value = FakeValue(name, device)
        self.grad = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) + 3


class FakeLayer:
    def __init__(self, i, n_in, n_out, device=0):
        self.weight = FakeParam(f"{i}.weight", (n_out, n_in), device, seed=2 * i)
        self.bias = FakeParam(f"{i}.bias", (n_out,), device, seed=2 * i + 1)

    def parameters(self):
        return [self.weight, self.bias]


class FakeMLP:
    """The shape of nn.MLP that DDP uses; backward logs each layer and calls the hook."""

    def __init__(self, log, sizes, device=0, skip_hook=None):
        self.log, self.skip_hook = log, skip_hook
        self.layers = [FakeLayer(i, a, b, device) for i, (a, b) in
                       enumerate(zip(sizes[:-1], sizes[1:]))]

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad[...] = 0

    def forward(self, x, precision="fp32", *, cast_weights=True):
        self.log.append(("forward", x, precision, cast_weights))
        return "logits"

    def backward(self, grad, *, accumulate=False, hook=None):
        self.log.append(("backward", grad, accumulate, hook is not None))
        for i in range(len(self.layers) - 1, -1, -1):
            self.log.append(("grads", i))
            if hook is not None and i != self.skip_hook:
                hook(i)


SIZES = [24, 40, 16, 8]


@pytest.fixture
def fake(monkeypatch):
    """A fake device for ddp.py; returns (log, make) where make(**kw) builds a DDP."""
    log = Log()
    core = fake_core(log)
    monkeypatch.setattr(ddp_mod, "_core", core)
    monkeypatch.setattr(ddp_mod, "_device", lambda d: contextlib.nullcontext())

    def make(module=None, world_size=2, rank=0, device=0, **kw):
        core.made_comm_stream = False
        module = module if module is not None else FakeMLP(log, SIZES)
        comm = FakeComm(log)
        group = ProcessGroup(comm, rank=rank, world_size=world_size, local_rank=rank,
                             local_world_size=world_size, device=device, launcher="none",
                             timeout=10.0)
        ddp = DistributedDataParallel(module, group=group, **kw)
        core.made_comm_stream = True
        comm.buffers = {f"bucket{b}": flat for b, flat in enumerate(ddp._flat)}
        comm.buffers.update({f"wire{b}": w for b, w in enumerate(ddp._wire_views)})
        log.clear()
        return ddp, module
    return log, make


def test_ddp_grads_become_views_of_the_buckets_with_their_values(fake):
    log, make = fake
    module = FakeMLP(log, SIZES)
    before = {p.name: p.grad.copy() for p in module.parameters()}
    ddp, _ = make(module, bucket_cap_mb=(40 * 16 + 16) * 4 / MIB)  # layer 1 fills one bucket
    flat = {p.name: b for b in ddp.buckets for p in module.parameters() if p.name in b.params}
    for p in module.parameters():
        b = flat[p.name]
        assert np.shares_memory(p.grad, ddp._flat[b.index]), p.name
        assert p.grad.shape == p.shape and p.grad.flags.c_contiguous
        np.testing.assert_array_equal(p.grad, before[p.name])
        off = b.offsets[b.params.index(p.name)]
        assert p.grad.__array_interface__["data"][0] == (
            ddp._flat[b.index].__array_interface__["data"][0] + 4 * off)
    assert [b.params for b in ddp.buckets] == [("2.bias", "2.weight", "1.bias", "1.weight"),
                                               ("0.bias", "0.weight")]
    assert ddp.bucket_bytes == [b.nbytes for b in ddp.buckets]


def test_ddp_broadcasts_rank_0s_parameters_at_construction(fake, monkeypatch):
    log = fake[0]
    module = FakeMLP(log, SIZES)
    comm = FakeComm(log)
    group = ProcessGroup(comm, rank=1, world_size=2, local_rank=1, local_world_size=2, device=0,
                         launcher="none", timeout=10.0)
    DistributedDataParallel(module, group=group)
    assert log.names("broadcast") == [("broadcast", p.name, 0) for p in module.parameters()]
    log.clear()
    DistributedDataParallel(FakeMLP(log, SIZES), group=group, broadcast_parameters=False)
    assert log.names("broadcast") == []


def _expected_launch(b, name="bucket"):
    return [("record", f"e{b}", "compute"), ("wait", "comm", f"e{b}"), ("enter", "comm"),
            ("all_reduce", f"{name}{b}", 4, "float32"), ("exit", "comm")]


def test_ddp_backward_all_reduces_each_bucket_right_after_its_last_layer(fake):
    log, make = fake
    ddp, module = make(bucket_cap_mb=1e-6)  # one bucket per tensor
    nb = len(ddp.buckets)
    ddp.backward("g")
    assert log[0] == ("backward", "g", False, True)
    # Layer i's gradients, then the all-reduce of its buckets (bias, weight: reverse order),
    # on the communication stream after an event of the compute stream.
    want = [("backward", "g", False, True)]
    b = 0
    for i in (2, 1, 0):
        want.append(("grads", i))
        for _ in range(2):
            want += _expected_launch(b)
            b += 1
    # Then the compute stream waits for everything on the communication stream.
    want += [("record", f"e{nb}", "comm"), ("wait", "compute", f"e{nb}")]
    assert log == want
    assert ddp.local_backwards == 0


def test_ddp_buckets_spanning_layers_launch_after_their_lowest_layer(fake):
    log, make = fake
    ddp, _ = make()  # 25 MiB: everything in one bucket
    assert len(ddp.buckets) == 1 and ddp.buckets[0].ready_after == 0
    ddp.backward("g", accumulate=True)
    grads = [i for i, e in enumerate(log) if e[0] == "grads"]
    reduce = [i for i, e in enumerate(log) if e[0] == "all_reduce"]
    assert log[0] == ("backward", "g", True, True)
    assert len(reduce) == 1 and reduce[0] > grads[-1]


def test_ddp_bf16_casts_into_a_shared_buffer_on_the_comm_stream(fake):
    log, make = fake
    ddp, _ = make(grad_dtype="bf16", bucket_cap_mb=(40 * 16 + 16) * 4 / MIB)
    assert ddp.grad_dtype == BF16
    assert len(ddp.buckets) == 2
    # One wire buffer, as large as the largest bucket, viewed per bucket.
    w0, w1 = ddp._wire_views
    assert w0.dtype == BF16 and np.shares_memory(w0, w1)
    assert [w.size for w in ddp._wire_views] == [b.numel for b in ddp.buckets]
    assert ddp.bucket_bytes == [2 * b.numel for b in ddp.buckets]
    ddp.backward("g")
    launch = log[log.index(("enter", "comm")):log.index(("exit", "comm")) + 1]
    n = ddp.buckets[0].numel
    assert launch == [("enter", "comm"), ("copyto", "bfloat16", "float32", n),
                      ("all_reduce", "wire0", 4, "bfloat16"),
                      ("copyto", "float32", "bfloat16", n), ("exit", "comm")]


def test_ddp_no_sync_skips_communication_and_counts_local_backwards(fake):
    log, make = fake
    ddp, _ = make()
    with ddp.no_sync():
        assert ddp.require_backward_grad_sync is False
        ddp.backward("g0")
        ddp.backward("g1", accumulate=True)
        assert ddp.local_backwards == 2
    assert ddp.require_backward_grad_sync is True
    assert log.names("all_reduce") == [] and log.names("record") == []
    assert [e for e in log if e[0] == "backward"] == [("backward", "g0", False, False),
                                                      ("backward", "g1", True, False)]
    log.clear()
    ddp.backward("g2", accumulate=True)  # the first after no_sync: all-reduces everything
    assert log[0] == ("backward", "g2", True, True)
    assert len(log.names("all_reduce")) == len(ddp.buckets)
    assert ddp.local_backwards == 0


def test_ddp_no_sync_nests_and_is_restored_after_an_error(fake):
    ddp, _ = fake[1]()
    with ddp.no_sync():
        with ddp.no_sync():
            pass
        assert ddp.require_backward_grad_sync is False
    assert ddp.require_backward_grad_sync is True
    with pytest.raises(KeyError):
        with ddp.no_sync():
            raise KeyError("boom")
    assert ddp.require_backward_grad_sync is True


def test_ddp_all_reduce_buckets_alone(fake):
    log, make = fake
    ddp, _ = make(bucket_cap_mb=1e-6)
    ddp.all_reduce_buckets()
    want = [e for b in range(len(ddp.buckets)) for e in _expected_launch(b)]
    nb = len(ddp.buckets)
    assert log == want + [("record", f"e{nb}", "comm"), ("wait", "compute", f"e{nb}")]


class FakeOptimizer:
    def __init__(self, log, params, lr):
        self.log, self.names, self.lr = log, [p.name for p in params], lr

    def step(self):
        self.log.append(("step", tuple(self.names)))


def test_ddp_optimize_in_backward_steps_each_bucket_after_its_all_reduce(fake):
    log, make = fake
    ddp, module = make(grad_dtype="bf16", bucket_cap_mb=(40 * 16 + 16) * 4 / MIB)
    opts = ddp.optimize_in_backward(lambda params, lr: FakeOptimizer(log, params, lr), lr=0.5)
    assert [o.names for o in opts] == [list(b.params) for b in ddp.buckets]
    assert all(o.lr == 0.5 for o in opts) and ddp.bucket_optimizers == opts
    assert log.names("stream") == [("stream", 0, 0)]  # the optimizer stream
    log.clear()
    ddp.backward("g")
    nb = len(ddp.buckets)
    assert nb == 2 and [b.ready_after for b in ddp.buckets] == [1, 0]

    def launch(b):
        n = ddp.buckets[b].numel
        return [("record", f"e{b}", "compute"), ("wait", "comm", f"e{b}"), ("enter", "comm"),
                ("copyto", "bfloat16", "float32", n), ("all_reduce", f"wire{b}", 4, "bfloat16"),
                ("copyto", "float32", "bfloat16", n), ("exit", "comm"),
                ("record", f"e{nb + 1 + b}", "comm")]  # reduced

    def step(b):
        # After its all-reduce and after the compute stream's last read of its weights
        # (the input-gradient GEMM after its lowest layer's hook): an fp32 forward uses the
        # master weights that the optimizer updates.
        return [("record", f"e{2 * nb + 1 + b}", "compute"), ("wait", "optim", f"e{nb + 1 + b}"),
                ("wait", "optim", f"e{2 * nb + 1 + b}"), ("enter", "optim"),
                ("step", ddp.buckets[b].params), ("exit", "optim")]

    want = [("backward", "g", False, True), ("grads", 2), ("grads", 1), *launch(0),
            ("grads", 0), *step(0), *launch(1), *step(1),
            # The compute stream waits for the optimizer stream (which waited for the rest).
            ("record", f"e{nb}", "optim"), ("wait", "compute", f"e{nb}")]
    assert log == want
    # no_sync backwards step nothing; all_reduce_buckets communicates only.
    log.clear()
    with ddp.no_sync():
        ddp.backward("g")
    ddp.all_reduce_buckets()
    assert log.names("step") == [] and len(log.names("all_reduce")) == nb
    assert log[-2:] == [("record", f"e{nb}", "comm"), ("wait", "compute", f"e{nb}")]
    assert ddp._step_in_backward
    with pytest.raises(RuntimeError, match="already"):
        ddp.optimize_in_backward(lambda params: None)


def test_ddp_refuses_a_backward_that_skips_a_layers_hook_after_joining(fake):
    log, make = fake
    ddp, _ = make(FakeMLP(fake[0], SIZES, skip_hook=1), bucket_cap_mb=1e-6)
    with pytest.raises(RuntimeError, match=r"4 of 6 buckets were all-reduced"):
        ddp.backward("g")
    # What was launched is still joined before the error.
    assert log[-2:] == [("record", "e6", "comm"), ("wait", "compute", "e6")]


def test_ddp_forward_and_call_delegate(fake):
    log, make = fake
    ddp, _ = make()
    assert ddp("x", "bf16") == "logits" and ddp.forward("x", cast_weights=False) == "logits"
    assert log == [("forward", "x", "bf16", True), ("forward", "x", "fp32", False)]


def test_ddp_comm_stream_is_high_priority_where_possible(monkeypatch):
    log = Log()
    for fail in (False, True):
        monkeypatch.setattr(ddp_mod, "_core", fake_core(log, fail_stream_priority=fail))
        monkeypatch.setattr(ddp_mod, "_device", lambda d: contextlib.nullcontext())
        group = ProcessGroup(FakeComm(log), rank=0, world_size=1, local_rank=0,
                             local_world_size=1, device=3, launcher="none", timeout=1.0)
        log.clear()
        DistributedDataParallel(FakeMLP(log, SIZES, device=3), group=group)
        assert log.names("stream") == [("stream", 0 if fail else -1, 3)]


def test_ddp_argument_errors(fake):
    log, make = fake
    with assert_arg_error(TypeError, "DistributedDataParallel", "module", "nn.MLP"):
        make(module=object())
    for cap, exc in ((0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
                     ("25", TypeError), (True, TypeError)):
        with assert_arg_error(exc, "DistributedDataParallel", "bucket_cap_mb"):
            make(bucket_cap_mb=cap)
    for wire, exc in (("int8", ValueError), ("float64", ValueError), (3.5, TypeError),
                      (np.int32, ValueError)):
        with assert_arg_error(exc, "DistributedDataParallel", "grad_dtype"):
            make(grad_dtype=wire)
    for wire in ("fp32", "float32", np.float32, None):
        assert make(grad_dtype=wire)[0].grad_dtype is None
    for wire in ("fp16", "float16", np.float16):
        assert make(grad_dtype=wire)[0].grad_dtype == np.float16
    with assert_arg_error(TypeError, "DistributedDataParallel", "broadcast_parameters"):
        make(broadcast_parameters=1)
    with assert_arg_error(TypeError, "DistributedDataParallel", "group"):
        DistributedDataParallel(FakeMLP(log, SIZES), group="nccl")
    # The tutorials' bug: a rank's GPU picked by its global rank.
    with assert_arg_error(ValueError, "DistributedDataParallel", "module",
                          r"on device 2 but this rank's device is 0 \(rank 2, local rank 2\).*"
                          r"module.to\(0\).*local rank"):
        make(module=FakeMLP(log, SIZES, device=2), rank=2, world_size=4, device=0)


def test_ddp_refuses_a_destroyed_group(fake):
    group = ProcessGroup(None, rank=0, world_size=2, local_rank=0, local_world_size=2,
                         device=0, launcher="none", timeout=1.0)
    with pytest.raises(_core.DistributedError, match="destroyed"):
        DistributedDataParallel(FakeMLP(fake[0], SIZES), group=group)


def test_ddp_without_init_names_init(fake):
    from cudalab.distributed import group as group_mod
    if group_mod.is_initialized():
        pytest.skip("a default group exists in this process")
    with pytest.raises(_core.DistributedError, match=r"init\(\)"):
        DistributedDataParallel(FakeMLP(fake[0], SIZES))


# ---- MLP.backward's hook and the layers' backward loop, with fake layers ------------------------


class HookLayer:
    """What backward_layers uses of a Linear; _backward logs its call."""

    def __init__(self, log, i, activation):
        self.log, self.i, self.activation = log, i, activation
        self.aux, self.input = f"aux{i}", f"input{i}"

    def _check_grad(self, grad):
        self.log.append(("check", self.i, grad))

    def _backward(self, grad, accumulate, input_grad, activation, aux, out, hook, index):
        self.log.append(("layer", self.i, grad, accumulate, input_grad, activation, aux, out))
        if hook is not None:
            hook(index)
        return f"g{self.i}" if input_grad else None


def test_backward_layers_fuses_each_previous_activation_and_calls_the_hook():
    log = []
    layers = [HookLayer(log, i, act) for i, act in enumerate(["gelu", "relu", None])]
    got = layers_mod.backward_layers(layers, "gL", True, lambda i: log.append(("hook", i)))
    assert got is None
    assert log == [("layer", 2, "gL", True, True, "relu", "aux1", "input2"), ("hook", 2),
                   ("layer", 1, "g2", True, True, "gelu", "aux0", "input1"), ("hook", 1),
                   ("layer", 0, "g1", True, False, None, None, None), ("hook", 0)]
    log.clear()
    # A pipeline stage after the first: its first layer's input gradient, into a given array.
    got = layers_mod.backward_layers(layers[:1], "g", False, None, "box")
    assert got == "g0" and log == [("layer", 0, "g", False, True, None, None, "box")]


def test_mlp_backward_passes_the_hook_and_checks_it(monkeypatch):
    monkeypatch.setattr(_core, "current_device", lambda: 0)
    log = []
    model = types.SimpleNamespace(device=0, _activations_live=True, _segments=None,
                                  layers=[HookLayer(log, i, "gelu") for i in range(2)])
    seen = []
    nn.MLP.backward(model, "g", hook=seen.append)
    assert seen == [1, 0] and log[0] == ("check", 1, "g")
    assert model._activations_live is False
    with pytest.raises(RuntimeError, match="twice"):
        nn.MLP.backward(model, "g")
    model._activations_live = True
    with assert_arg_error(TypeError, "backward", "hook", "callable"):
        nn.MLP.backward(model, "g", hook=3)
    assert model._activations_live is True  # refused before anything ran


def test_linear_backward_calls_the_hook_between_weight_and_input_gradients(monkeypatch):
    log = []
    monkeypatch.setattr(_core, "_nn_linear_backward_weight",
                        lambda *a: log.append("weight grads"), raising=False)
    monkeypatch.setattr(_core, "_nn_linear_backward_input",
                        lambda *a: log.append("input grad"), raising=False)
    monkeypatch.setattr(layers_mod, "check_array", lambda value, func, param: value)
    layer = object.__new__(nn.Linear)
    layer._check_grad = lambda grad: log.append("checks")
    layer.weight = types.SimpleNamespace(grad="dW")
    layer.bias = types.SimpleNamespace(grad="db")
    layer._precision = nn.PRECISIONS["fp32"]
    layer.input = np.zeros((3, 4), np.float32)
    layer._w = "w"
    out = np.zeros((3, 4), np.float32)
    got = layer._backward("grad", False, True, None, None, out, lambda i: log.append(f"hook {i}"),
                          7)
    assert got is out
    assert log == ["checks", "weight grads", "hook 7", "input grad"]


# ---- device arguments of .to(), DataParallel, Pipeline --------------------------------------------


@pytest.mark.parametrize("obj", [nn.Linear, nn.MLP, cudalab.models.ResNet50],
                         ids=["Linear", "MLP", "ResNet50"])
@pytest.mark.parametrize("device, exc, match", [
    (None, TypeError, "expected an int"), (1.0, TypeError, "expected an int"),
    (True, TypeError, "expected an int"), (-1, ValueError, "non-negative"),
    ("cpu", ValueError, "'cuda:N'"), ("cuda:", ValueError, "'cuda:N'"),
    ("cuda:-1", ValueError, "'cuda:N'"), ("cuda:1x", ValueError, "'cuda:N'")])
def test_to_checks_the_device_before_touching_the_model(obj, device, exc, match):
    # object() has none of a model's attributes: the check comes first.
    with assert_arg_error(exc, "to", "device", match):
        obj.to(object(), device)


@no_gpu_only
def test_to_needs_a_gpu_for_a_valid_index():
    with pytest.raises(cudalab.NoDeviceError):
        nn.MLP.to(object(), "cuda:0")


def _bare_mlp(n_layers=3):
    """An nn.MLP instance without weights (no GPU): what the argument checks look at."""
    mlp = object.__new__(nn.MLP)
    mlp.sizes = tuple([8] * (n_layers + 1))
    mlp.layers = [None] * n_layers
    return mlp


def test_data_parallel_argument_errors():
    with assert_arg_error(TypeError, "DataParallel", "module", "nn.MLP"):
        DataParallel(object())
    mlp = _bare_mlp()
    for ids, exc, match in (("01", TypeError, "sequence"), ([0, 1.0], TypeError, "ints"),
                            ([0, -1], ValueError, ">= 0"), ([], ValueError, "at least one"),
                            ([1, 0, 1], ValueError, "twice"), (3, TypeError, "sequence")):
        with assert_arg_error(exc, "DataParallel", "device_ids", match):
            DataParallel(mlp, ids)
    with assert_arg_error(TypeError, "DataParallel", "output_device"):
        DataParallel(mlp, [0], output_device="0")
    with assert_arg_error(ValueError, "DataParallel", "output_device"):
        DataParallel(mlp, [0], output_device=-2)


@no_gpu_only
def test_data_parallel_and_pipeline_need_the_devices():
    with assert_arg_error(ValueError, "DataParallel", "device_ids", "does not exist"):
        DataParallel(_bare_mlp(), [0, 1])
    with pytest.raises(cudalab.NoDeviceError):
        DataParallel(_bare_mlp())
    with assert_arg_error(ValueError, "Pipeline", "devices", "does not exist"):
        Pipeline(_bare_mlp(), [0, 1], 4)


def test_pipeline_argument_errors():
    with assert_arg_error(TypeError, "Pipeline", "mlp", "nn.MLP"):
        Pipeline(object(), [0, 1], 2)
    mlp = _bare_mlp(n_layers=2)
    with assert_arg_error(ValueError, "Pipeline", "devices", "twice"):
        Pipeline(mlp, [0, 0], 2)
    with assert_arg_error(TypeError, "Pipeline", "devices"):
        Pipeline(mlp, "01", 2)
    with assert_arg_error(ValueError, "Pipeline", "devices", "3 stages need at least 3 layers"):
        Pipeline(mlp, [0, 1, 2], 2)
    for chunks, exc in ((0, ValueError), (2.0, TypeError), (None, TypeError)):
        with assert_arg_error(exc, "Pipeline", "chunks"):
            Pipeline(mlp, [0, 1], chunks)
    with assert_arg_error(TypeError, "Pipeline", "timing"):
        Pipeline(mlp, [0, 1], 2, timing=1)


def test_pipeline_bubble_theory_and_timings_arithmetic():
    t = pipe_mod.PipelineTimings(step_ms=10.0, forward_ms=[[1.0, 1.0], [2.0, 2.0]],
                                 backward_ms=[[2.0, 2.0], [3.0, 3.0]], busy_ms=[6.0, 10.0],
                                 bubble=[0.4, 0.0], bubble_theory=1 / 3, stages=2,
                                 micro_batches=2)
    assert t.bubble_mean == pytest.approx(0.2)


def test_data_parallel_step_traffic():
    dp = object.__new__(DataParallel)
    dp.module = types.SimpleNamespace(sizes=(64, 128, 10))
    dp.device_ids, dp.output_device = [0, 1, 2], 0
    n_params = 64 * 128 + 128 + 128 * 10 + 10
    fp32, bf16 = dp.step_traffic(30, "fp32"), dp.step_traffic(30, "bf16")
    assert fp32["replicate"] == 2 * n_params * 4 and bf16["replicate"] == 2 * n_params * 2
    assert fp32["reduce"] == bf16["reduce"] == 2 * n_params * 4
    # 10 rows each: rows of x to devices 1 and 2, their logits back and their gradients out.
    assert fp32["scatter"] == 20 * 64 * 4 + 20 * 10 * 4
    assert fp32["gather"] == 20 * 10 * 4 and bf16["gather"] == 20 * 10 * 2
    assert fp32["total"] == sum(v for k, v in fp32.items() if k != "total")
    dp.device_ids = [0]
    one = dp.step_traffic(30, "fp32")
    assert one["total"] == 0


def test_public_names_and_signatures():
    import inspect
    import cudalab.distributed as dist
    if getattr(dist, "__file__", None) is None:
        pytest.skip("cudalab.distributed loads as a namespace package: the editable install "
                    "predates its __init__.py (pip install -e . again)")
    assert dist.DataParallel is DataParallel and dist.DistributedDataParallel is \
        DistributedDataParallel and dist.Pipeline is Pipeline
    for cls in (DataParallel, DistributedDataParallel, Pipeline):
        assert inspect.getdoc(cls).startswith(cls.__name__ + "("), cls
        assert "Parameters\n----------" in inspect.getdoc(cls)
    params = inspect.signature(DistributedDataParallel).parameters
    assert [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY] == [
        "group", "bucket_cap_mb", "grad_dtype", "broadcast_parameters"]
    assert params["bucket_cap_mb"].default == 25
    assert list(inspect.signature(DataParallel).parameters) == ["module", "device_ids",
                                                                "output_device"]
    assert list(inspect.signature(nn.MLP.backward).parameters) == ["self", "grad_logits",
                                                                   "accumulate", "hook"]


def _bare(cls, **attrs):
    obj = object.__new__(cls)
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def test_data_parallel_step_argument_errors():
    dp = _bare(DataParallel, module=types.SimpleNamespace(sizes=(8, 16, 4)), device_ids=[0, 1],
               _live=False, last_split=[], _replicated=None)
    with assert_arg_error(TypeError, "forward", "x", "DeviceArray"):
        dp.forward(np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match=r"^forward\(\) argument 'precision'"):
        dp.forward(None, "fp64")
    with pytest.raises(RuntimeError, match=r"DataParallel.backward\(\) called without a "
                                           r"forward\(\)"):
        dp.backward(None)
    with assert_arg_error(ValueError, "step_traffic", "batch"):
        dp.step_traffic(0)


def test_pipeline_step_argument_errors():
    pipe = _bare(Pipeline, mlp=types.SimpleNamespace(sizes=(8, 16, 4)), chunks=2,
                 stages=[None, None])
    with assert_arg_error(ValueError, "forward_backward", "precision", "'fp16' needs loss"):
        pipe.forward_backward(None, None, "fp16")
    with assert_arg_error(TypeError, "forward_backward", "x", "DeviceArray"):
        pipe.forward_backward(np.zeros((3, 8), np.float32), None)
    with assert_arg_error(TypeError, "forward", "x", "DeviceArray"):
        pipe.forward([[1.0] * 8])
    for opts in ([], [object()], "ab", None):
        with assert_arg_error(ValueError, "train_step", "optimizers", "one optimizer per stage"):
            pipe.train_step(None, None, opts)
    with pytest.raises(RuntimeError, match="timing=True"):
        _bare(Pipeline, _timed=None).timings()


# ---- the whole orchestration on a NumPy stand-in for the devices -------------------------------
#
# Pipeline, DataParallel and DistributedDataParallel run here end to end on a NumPy
# stand-in for the few _core calls they (and nn's layers and optimizers) make: arrays that
# know their device, the Linear GEMMs with their epilogues, the loss, AdamW, streams and
# events that check what CUDA would not (an event waited on before it was recorded is a
# silent race on a GPU; here it fails), and NCCL group calls that run their collective at
# the group's end. The numbers are float64 NumPy rounded to the arrays' dtypes, so the
# schedule, the splits, the micro-batch accumulation, the stage-boundary activation
# derivative and the gradient reduction are checked against the unsplit MLP here; the GPU
# tier checks the same on the devices.


class NpArray(np.ndarray):
    """A NumPy array on a pretend device (``.device``; views keep it)."""

    def __array_finalize__(self, obj):
        self._dev = getattr(obj, "_dev", NumpyDevice.current)

    @property
    def device(self):
        return self._dev

    @property
    def is_contiguous(self):
        return self.flags.c_contiguous

    @property
    def data_ptr(self):
        return self.__array_interface__["data"][0]

    def get(self):
        return np.array(self)

    def to(self, device, copy=False):
        if device == self._dev and not copy:
            return self
        out = np.array(self).view(NpArray)
        out._dev = device
        return out


def _wide(a):
    return np.asarray(a, dtype=np.float64)


def _gelu(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


def _gelu_slope(z):
    k = np.sqrt(2 / np.pi)
    t = np.tanh(k * (z + 0.044715 * z ** 3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t ** 2) * k * (1 + 3 * 0.044715 * z ** 2)


class NpEvent:
    def __init__(self, enable_timing=True, blocking=False):
        self.device, self.recorded = NumpyDevice.current, False

    def record(self, stream=None):
        if stream is not None:
            assert stream.device == self.device, (
                f"an event of device {self.device} recorded on a stream of {stream.device}")
        self.recorded = True

    def elapsed_time(self, end):
        assert self.device == end.device, "elapsed_time between devices"
        assert self.recorded and end.recorded, "elapsed_time of an event never recorded"
        return 1.0


class NpStream:
    def __init__(self, priority=0, device=None):
        self.device = NumpyDevice.current if device is None else device

    def wait_event(self, event):
        assert event.recorded, "a stream waits for an event that was never recorded"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class NpComm:
    """One rank of an in-process clique (_nccl_init_all): calls queue until the group ends."""

    def __init__(self, device, clique):
        self.device, self.clique = device, clique

    def broadcast(self, send, recv, root):
        assert send.device == recv.device == self.device
        self.clique.queue(self, ("broadcast", send, recv, root))

    def reduce(self, send, recv, op, root):
        assert send.device == recv.device == self.device and op == 0
        self.clique.queue(self, ("reduce", send, recv, root))


class NpClique:
    def __init__(self):
        self.calls, self.open, self.groups = {}, False, 0

    def queue(self, comm, call):
        assert self.open, "a collective of an in-process clique outside a group call"
        self.calls.setdefault(comm, []).append(call)

    def start(self):
        self.open = True

    def end(self):
        self.open = False
        per_rank = list(self.calls.values())
        self.calls = {}
        assert len({len(c) for c in per_rank}) == 1, "ranks made different numbers of calls"
        for calls in zip(*per_rank):
            kind, root = calls[0][0], calls[0][3]
            assert all(c[0] == kind and c[3] == root for c in calls)
            if kind == "broadcast":
                for c in calls:
                    c[2][...] = calls[root][1]
            else:
                calls[root][2][...] = sum(_wide(c[1]) for c in calls)
        self.groups += 1


class NumpyDevice:
    """Installs the stand-in with monkeypatch; `current` is the current device."""

    current = 0

    def __init__(self, monkeypatch, count=3):
        self.count, self.clique, self.peer_copies = count, NpClique(), 0
        NumpyDevice.current = 0
        streams = {}
        set_ = monkeypatch.setattr
        set_(_core, "DeviceArray", NpArray)
        set_(_core, "empty", lambda shape, dtype=np.float32: self.new(shape, dtype, np.nan))
        set_(_core, "zeros", lambda shape, dtype=np.float32: self.new(shape, dtype, 0))
        set_(_core, "ones", lambda shape, dtype=np.float32: self.new(shape, dtype, 1))
        set_(_core, "full", lambda shape, value, dtype=None: self.new(shape, dtype, value))
        set_(_core, "copyto", self.copyto)
        set_(_core, "_nn_linear", self.linear)
        set_(_core, "_nn_linear_backward_input", self.backward_input)
        set_(_core, "_nn_linear_backward_weight", self.backward_weight)
        set_(_core, "_nn_cross_entropy", self.cross_entropy)
        set_(_core, "_nn_adamw_", self.adamw)
        set_(_core, "gelu", lambda a, approximate="none", out=None: self.put(out, _gelu(_wide(a))))
        set_(_core, "gelu_grad", lambda g, x, approximate="none", out=None: self.put(
            out, _wide(g) * _gelu_slope(_wide(x)), g, x))
        set_(_core, "relu_grad", lambda g, x, out=None: self.put(
            out, np.where(_wide(x) <= 0, 0, _wide(g)), g, x))
        set_(_core, "add", lambda a, b, out=None: self.put(out, _wide(a) + _wide(b), a, b))
        set_(_core, "mul", lambda a, b, out=None: self.put(out, _wide(a) * _wide(b), a))
        set_(_core, "where", lambda c, x, y, out=None: self.put(out, 0, out))
        set_(_core, "sum", self.sum)
        set_(_core, "Stream", NpStream)
        set_(_core, "Event", NpEvent)
        set_(_core, "current_stream",
             lambda device=None: streams.setdefault(device, NpStream(device=device)))
        set_(_core, "current_device", lambda: NumpyDevice.current)
        set_(_core, "device_count", lambda: self.count)
        set_(_core, "_parse_device", self.parse_device)
        set_(_core, "_parse_device_spec", self.parse_device_spec)
        set_(_core, "_exchange_device", self.exchange)
        set_(_core, "can_access_peer", lambda a, b: a != b)
        set_(_core, "enable_peer_access", lambda peer, device=None: True)
        set_(_core, "_nccl_init_all",
             lambda devices, timeout: [NpComm(d, self.clique) for d in devices])
        set_(_core, "_nccl_group_start", self.clique.start)
        set_(_core, "_nccl_group_end", self.clique.end)
        set_(_core, "max_memory_allocated", lambda device=None: 1)
        set_(_core, "is_current_stream_capturing", lambda: False)
        set_(cudalab.random, "uniform", self.uniform)
        monkeypatch.setattr(nn.fusion, "_mode", "fused")
        from cudalab.distributed import library
        set_(library, "load", lambda: "numpy")

    @staticmethod
    def new(shape, dtype, fill):
        a = np.empty(shape, dtype or np.float32).view(NpArray)
        a[...] = 0 if np.isnan(fill) and np.dtype(a.dtype).kind in "iub" else fill
        return a

    @staticmethod
    def put(out, values, *inputs):
        assert all(a.device == out.device for a in inputs if isinstance(a, NpArray)), (
            "operands on different devices")
        out[...] = values
        return out

    @staticmethod
    def same(*arrays):
        devices = {a.device for a in arrays if isinstance(a, NpArray)}
        assert len(devices) <= 1, f"operands on devices {sorted(devices)}"

    def copyto(self, dst, src):
        if isinstance(src, NpArray) and src.device != dst.device:
            assert src.dtype == dst.dtype and src.shape == dst.shape and dst.is_contiguous
            self.peer_copies += 1
        dst[...] = src

    def linear(self, x, w, b, activation, y, aux, mp):
        self.same(x, w, b, y, aux)
        z = _wide(x) @ _wide(w).T + (0 if b is None else _wide(b))
        if activation == "gelu":
            aux[...] = z
            z = _gelu(_wide(aux))
        elif activation == "relu":
            bits = np.packbits(z > 0, axis=1, bitorder="little")
            aux[...] = 0
            aux[:, :bits.shape[1]] = bits
            z = np.maximum(z, 0)
        y[...] = z
        return y

    def backward_input(self, grad, w, gx, aux, activation, bias_grad, mp):
        self.same(grad, w, gx, aux)
        g = _wide(grad) @ _wide(w)
        if activation == "gelu":
            g *= _gelu_slope(_wide(aux))
        elif activation == "relu":
            g *= np.unpackbits(np.asarray(aux), axis=1, bitorder="little")[:, :g.shape[1]]
        gx[...] = g
        return gx

    def backward_weight(self, grad, x, w_grad, b_grad, accumulate, mp):
        self.same(grad, x, w_grad, b_grad)
        w_grad[...] = _wide(grad).T @ _wide(x) + (_wide(w_grad) if accumulate else 0)
        if b_grad is not None:
            b_grad[...] = _wide(grad).sum(0)
        return w_grad

    def sum(self, a, axis=None, keepdims=False, dtype=None, out=None):
        if out is None:
            out = self.new(() if axis is None else a.shape[1:], np.float32, 0)
            out._dev = a.device
        return self.put(out, _wide(a).sum(axis=axis), a)

    def cross_entropy(self, logits, labels, grad, reduction, loss_scale, out, ignore_index):
        self.same(logits, labels, grad, loss_scale, out)
        z = _wide(logits)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        rows = np.arange(len(labels))
        losses = -np.log(p[rows, np.asarray(labels)])
        if grad is not None:
            p[rows, np.asarray(labels)] -= 1
            scale = 1.0 if loss_scale is None else float(np.asarray(loss_scale).ravel()[0])
            grad[...] = p * scale / (len(rows) if reduction == "mean" else 1)
        if out is None:
            out = self.new((), np.float32, 0)
            out._dev = logits.device
        out[...] = losses.mean() if reduction == "mean" else losses.sum()
        return out

    def adamw(self, params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps,
              weight_decay, found_inf, grad_scale):
        self.same(step, *params, *grads, *exp_avgs, *exp_avg_sqs)
        step[...] = step + 1
        t = float(step[0])
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            p[...] = _wide(p) * (1 - lr * weight_decay)
            m[...] = beta1 * _wide(m) + (1 - beta1) * _wide(g)
            v[...] = beta2 * _wide(v) + (1 - beta2) * _wide(g) ** 2
            p[...] = _wide(p) - lr * (_wide(m) / (1 - beta1 ** t)) / (
                np.sqrt(_wide(v) / (1 - beta2 ** t)) + eps)

    def parse_device(self, device, caller, check_only=False):
        if device is None:
            return None if check_only else NumpyDevice.current
        assert isinstance(device, int) and 0 <= device < self.count, (caller, device)
        return device

    def parse_device_spec(self, device, caller):
        """The C parser's forms: an int, 'cuda' or 'cuda:N' (None is refused there)."""
        if isinstance(device, str):
            device = None if device == "cuda" else int(device.partition(":")[2])
        return self.parse_device(device, caller)

    @staticmethod
    def exchange(device, caller):
        previous, NumpyDevice.current = NumpyDevice.current, device
        return previous

    @staticmethod
    def uniform(shape, low, high, dtype, seed=0):
        rng = np.random.default_rng(seed % 2 ** 63)
        shape = shape if isinstance(shape, tuple) else (shape,)
        return NumpyDevice.new(shape, np.float32, 0) + rng.uniform(low, high, shape).astype(
            np.float32)

    def array(self, values, device=0):
        a = np.array(values).view(NpArray)
        a._dev = device
        return a


@pytest.fixture
def npdev(monkeypatch):
    device = NumpyDevice(monkeypatch)
    yield device
    NumpyDevice.current = 0


NP_SIZES = [32, 64, 48, 40, 16]


def _np_batch(npdev, rng, rows, device=0, sizes=NP_SIZES):
    x = npdev.array(rng.standard_normal((rows, sizes[0])).astype(np.float32), device)
    labels = npdev.array(rng.integers(0, sizes[-1], rows).astype(np.int64), device)
    return x, labels


def _np_step(model, x, labels, accumulate=False):
    """One device's step on (x, labels) where the model is: the loss (host float)."""
    with cudalab.device(model.device):
        x, labels = x.to(model.device), labels.to(model.device)
        logits = model.forward(x, "fp32")
        loss = _core._nn_cross_entropy(logits, labels, logits, "mean", None, None, -100)
        model.backward(logits, accumulate=accumulate)
    return float(loss)


def _assert_close(got_params, want_params, attr, tol, what):
    for p, q in zip(got_params, want_params):
        got, want = _wide(getattr(p, attr)), _wide(getattr(q, attr))
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < tol, f"{what}: {p.name}.{attr} differs by {err:.3g}"


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("devices, chunks, rows", [([0, 1], 4, 37), ([0, 1, 2], 3, 36),
                                                   ([2, 0], 5, 3), ([1], 2, 9)])
def test_pipeline_on_numpy_devices_equals_the_unsplit_mlp(npdev, activation, devices, chunks,
                                                          rows):
    rng = np.random.default_rng(0)
    ref, model = nn.MLP(NP_SIZES, activation, seed=5), nn.MLP(NP_SIZES, activation, seed=5)
    pipe = Pipeline(model, devices, chunks, timing=True)
    for (start, stop), d in zip(pipe.bounds, devices):
        assert all(layer.device == d for layer in model.layers[start:stop])
    opts = pipe.optimizers(nn.AdamW, lr=1e-2)
    assert [o.step_count.device for o in opts] == devices
    ref_opt = nn.AdamW(ref.parameters(), lr=1e-2)
    for step in range(3):
        x, labels = _np_batch(npdev, rng, rows, device=step % 2)  # x, labels anywhere
        loss = pipe.train_step(x, labels, opts, "fp32")
        assert loss.device == devices[-1] and loss.shape == ()
        assert pipe.last_split == split_rows(rows, chunks)
        want = _np_step(ref, x, labels)
        assert abs(float(loss) - want) < 1e-6 * want, (step, float(loss), want)
        _assert_close(model.parameters(), ref.parameters(), "grad", 1e-5, f"step {step}")
        ref_opt.step()
        _assert_close(model.parameters(), ref.parameters(), "value", 1e-5, f"step {step}")
    t = pipe.timings()
    assert (t.stages, t.micro_batches) == (len(devices), len(pipe.last_split))
    logits = pipe.forward(x.to(devices[0]), "fp32")
    with cudalab.device(0):
        want = ref.forward(x.to(0), "fp32")
    assert np.linalg.norm(_wide(logits) - _wide(want)) < 1e-5 * np.linalg.norm(_wide(want))
    # Gradients accumulate over two steps' batches with accumulate=True.
    x2, l2 = _np_batch(npdev, rng, rows)
    pipe.forward_backward(x, labels, "fp32")
    pipe.forward_backward(x2, l2, "fp32", accumulate=True)
    _np_step(ref, x, labels)
    _np_step(ref, x2, l2, accumulate=True)
    _assert_close(model.parameters(), ref.parameters(), "grad", 1e-5, "accumulated")
    assert np.isfinite(float(pipe.forward_backward(x, labels, "bf16")))


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("ids, output, rows", [([0, 1], None, 37), ([0, 1, 2], 2, 10),
                                               ([1, 0], None, 1), ([0], 1, 5)])
def test_data_parallel_on_numpy_devices_equals_one_device(npdev, activation, ids, output, rows):
    rng = np.random.default_rng(1)
    with cudalab.device(ids[0]):
        ref, model = nn.MLP(NP_SIZES, activation, seed=7), nn.MLP(NP_SIZES, activation, seed=7)
        ref_opt, opt = nn.AdamW(ref.parameters(), lr=1e-2), nn.AdamW(model.parameters(), lr=1e-2)
    dp = DataParallel(model, ids, output)
    for step in range(3):
        x, labels = _np_batch(npdev, rng, rows)
        logits = dp.forward(x, "fp32")
        assert logits.device == dp.output_device and logits.shape == (rows, NP_SIZES[-1])
        assert dp.last_split == split_rows(rows, len(ids))
        loss = _core._nn_cross_entropy(logits, labels.to(logits.device), logits, "mean", None,
                                       None, -100)
        dp.backward(logits, accumulate=step == 2)
        want = _np_step(ref, x, labels, accumulate=step == 2)
        assert abs(float(loss) - want) < 1e-6 * want
        _assert_close(model.parameters(), ref.parameters(), "grad", 1e-5, f"step {step}")
        opt.step()
        ref_opt.step()
    with pytest.raises(RuntimeError, match="without a forward"):
        dp.backward(logits)
    assert npdev.clique.groups == (6 if len(ids) > 1 else 0)  # a broadcast and a reduce a step


@pytest.mark.parametrize("grad_dtype", [None, "bf16"])
@pytest.mark.parametrize("in_backward", [False, True])
@pytest.mark.parametrize("accum", [1, 2])
def test_ddp_of_a_real_mlp_on_a_numpy_device(npdev, monkeypatch, grad_dtype, in_backward, accum):
    """A world of one (the all-reduce is the identity): DDP's grads, no_sync accumulation and
    per-bucket optimizers give one device's training."""
    class Comm:
        reduced = 0

        def all_reduce(self, send, recv, op):
            assert send is recv and op == 4
            Comm.reduced += 1

    monkeypatch.setattr(ddp_mod, "_core", _core)
    monkeypatch.setattr(ddp_mod, "_device", cudalab.device)
    group = ProcessGroup(Comm(), rank=0, world_size=1, local_rank=0, local_world_size=1,
                         device=0, launcher="none", timeout=1.0)
    sizes = [512, 64, 48, 16]
    ref, model = nn.MLP(sizes, seed=5), nn.MLP(sizes, seed=5)
    ddp = DistributedDataParallel(model, group=group, bucket_cap_mb=0.01, grad_dtype=grad_dtype)
    assert len(ddp.buckets) == 2 and ddp.buckets[1].params == ("0.bias", "0.weight")
    ref_opt = nn.AdamW(ref.parameters(), lr=1e-2)
    opt = None if in_backward else nn.AdamW(model.parameters(), lr=1e-2)
    if in_backward:
        ddp.optimize_in_backward(nn.AdamW, lr=1e-2)
    scale = _core.full((1,), 1.0 / accum, np.float32)
    tol = 1e-5 if grad_dtype is None else 1e-2
    rng = np.random.default_rng(4)
    for step in range(3):
        x, labels = _np_batch(npdev, rng, 8, sizes=sizes)
        rows = 8 // accum
        for micro in range(accum):
            part = slice(micro * rows, (micro + 1) * rows)
            quiet = ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext()
            with quiet:
                logits = ddp(x[part], "fp32")
                _core._nn_cross_entropy(logits, labels[part], logits, "mean", scale, None, -100)
                ddp.backward(logits, accumulate=micro > 0)
        _np_step(ref, x, labels)
        _assert_close(model.parameters(), ref.parameters(), "grad", tol, f"step {step}")
        if opt is not None:
            opt.step()
        ref_opt.step()
        _assert_close(model.parameters(), ref.parameters(), "value", tol, f"step {step}")
        for p in model.parameters():
            assert any(np.shares_memory(p.grad, flat) for flat in ddp._flat), p.name
    assert Comm.reduced == 3 * len(ddp.buckets)


def test_mlp_to_on_numpy_devices(npdev):
    model = nn.MLP(NP_SIZES, seed=3)
    x, _ = _np_batch(npdev, np.random.default_rng(2), 9)
    first = np.array(model.forward(x, "fp32"))
    assert model.to(1) is model and model.device == 1
    assert all(p.value.device == 1 and p.grad.device == 1 for p in model.parameters())
    with assert_arg_error(ValueError, "forward", "x", "is on device 0 but the layer is on "
                                                      "device 1"):
        model.forward(x, "fp32")
    out = model.forward(x.to(1), "fp32")  # device 0 stays current
    assert out.device == 1 and NumpyDevice.current == 0
    np.testing.assert_array_equal(np.array(out), first)
    model.backward(_core.ones((9, NP_SIZES[-1]), np.float32).to(1))
    assert all(p.grad.device == 1 for p in model.parameters())
    buffers = [l._buffers._arrays["output"] for l in model.layers]
    assert model.to("cuda:1") is model  # already there: nothing dropped
    assert [l._buffers._arrays["output"] for l in model.layers] == buffers
    model.to(0)
    assert all(not l._buffers._arrays and l._w is None for l in model.layers)
    np.testing.assert_array_equal(np.array(model.forward(x, "fp32")), first)
