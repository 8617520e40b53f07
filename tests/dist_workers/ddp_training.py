"""Worker: DistributedDataParallel against one GPU on the same global batch.

    python -m cudalab.distributed.run --nproc-per-node 2 ddp_training.py [--timeout S] [--measure]

Every rank draws the same global batches (NumPy, seeded by step), trains
``nn.MLP`` through DistributedDataParallel on its equal shard of each, and
also trains a plain MLP of the same seed on the whole global batch (one GPU's
training, computed by every rank itself, so no rank waits for another).
In fp32 the mean cross-entropy over the global batch is the mean of the
ranks' shard means and the averaged gradient is the global batch's, so the
losses of a few AdamW steps must agree to float32 rounding.

Checks (each in its own try block, reported by name):

* ``fp32``: losses of every step, the first step's averaged gradients, and
  the gradients being views of the buckets;
* ``bf16 wire`` / ``fp16 wire``: the same with gradients communicated in
  half precision (looser: the wire rounds each gradient to 8 / 11 bits);
* ``no_sync``: two micro-batches per rank and step, the first inside
  ``no_sync()`` (no communication), the second all-reducing the sum;
* ``optimizer in backward`` (fp32 and bf16 wire): ``optimize_in_backward``'s
  per-bucket AdamW, stepped on a side stream after each bucket's all-reduce;
* ``graph``: a whole DDP step (forward, loss, backward with its bucket
  all-reduces on the side stream, AdamW) captured in a CUDA graph and
  replayed, against the eager step.

``--measure`` adds timings of a larger model's backward with and without
communication and of the bucket all-reduces alone (reported, not checked).
Reports ``{"checks": [{"name", "ok", "error", ...}], ...}`` into rank<r>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import _common

RANK = _common.started()

import numpy as np  # noqa: E402

import cudalab  # noqa: E402
import cudalab.distributed as dist  # noqa: E402
import cudalab.nn as nn  # noqa: E402
from _support import rel_err  # noqa: E402

SIZES = [32, 64, 48, 16]
ROWS = 24        # per rank and step (even: the no_sync check splits it in two)
STEPS = 4
LR = 1e-3
SEED = 11
# Relative tolerances: float32 rounding (sums in another order), and a half wire.
TOL = {None: 1e-5, "bf16": 2e-3, "fp16": 5e-4}
GRAD_TOL = {None: 1e-5, "bf16": 1e-2, "fp16": 2e-3}


class Checks:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def run(self, name: str, fn, *args) -> None:
        start = time.perf_counter()
        try:
            details = fn(*args) or {}
        except Exception as exc:  # reported by name; the next check still runs
            self.items.append({"name": name, "ok": False, "error": _common.error_text(exc)})
        else:
            self.items.append({"name": name, "ok": True, **details,
                               "ms": round((time.perf_counter() - start) * 1e3, 2)})


def global_batch(step: int, world: int, rows: int = ROWS):
    """The same (x, labels) on every rank: world * rows rows."""
    rng = np.random.default_rng([SEED, step])
    x = rng.standard_normal((world * rows, SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SIZES[-1], world * rows).astype(np.int64)
    return cudalab.asarray(x), cudalab.asarray(labels)


def grads(model) -> list[np.ndarray]:
    return [p.grad.get() for p in model.parameters()]


def reference(world: int, steps: int):
    """One GPU on the whole global batch: per-step losses, first gradients, final weights."""
    model = nn.MLP(SIZES, seed=SEED)
    opt = nn.AdamW(model.parameters(), lr=LR)
    losses, first = [], None
    for step in range(steps):
        x, labels = global_batch(step, world)
        logits = model.forward(x, "fp32")
        loss = nn.functional.cross_entropy(logits, labels, grad=logits)
        model.backward(logits)
        if step == 0:
            first = grads(model)
        opt.step()
        losses.append(float(loss.get()))
    return losses, first, [p.value.get() for p in model.parameters()]


def train_ddp(group, world: int, rank: int, steps: int, wire=None, accum: int = 1,
              in_backward: bool = False):
    """DDP on this rank's shard; returns (global losses per step, first grads, model, ddp)."""
    model = nn.MLP(SIZES, seed=SEED)
    ddp = dist.DistributedDataParallel(model, group=group, grad_dtype=wire)
    if in_backward:
        opts = ddp.optimize_in_backward(nn.AdamW, lr=LR)
        assert len(opts) == len(ddp.buckets)
        opt = None
    else:
        opt = nn.AdamW(model.parameters(), lr=LR)  # after wrapping: grads are bucket views
    inv = cudalab.full((1,), 1.0 / accum, dtype=np.float32)
    loss_buf = cudalab.zeros((1,), dtype=np.float32)
    rows = ROWS // accum
    losses, first = [], None
    for step in range(steps):
        x, labels = global_batch(step, world)
        total = 0.0
        for micro in range(accum):
            start = rank * ROWS + micro * rows
            xs, ls = x[start:start + rows], labels[start:start + rows]
            quiet = ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext()
            with quiet:
                logits = ddp.forward(xs, "fp32")
                # Each micro-batch's mean loss, its gradient divided by the micro-batches.
                nn.functional.cross_entropy(logits, ls, grad=logits, loss_scale=inv,
                                            out=loss_buf)
                ddp.backward(logits, accumulate=micro > 0)
                assert ddp.local_backwards == (micro + 1 if micro < accum - 1 else 0), (
                    f"local_backwards {ddp.local_backwards} after micro-batch {micro}")
            total += float(loss_buf.get()[0])
        if step == 0:
            first = grads(model)
        if opt is not None:
            opt.step()
        mean = cudalab.full((1,), total / accum, dtype=np.float32)
        dist.all_reduce(mean, "avg", group=group)  # shards are equal: the global mean
        losses.append(float(mean.get()[0]))
    return losses, first, model, ddp


def check_against_one_gpu(group, world, rank, wire, accum, ref, in_backward=False):
    ref_losses, ref_first, ref_final = ref
    losses, first, model, ddp = train_ddp(group, world, rank, STEPS, wire, accum, in_backward)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    grad_err = max(rel_err(g, r) for g, r in zip(first, ref_first))
    weight_err = max(rel_err(p.value.get(), r) for p, r in zip(model.parameters(), ref_final))
    details = {"losses": losses, "ref_losses": ref_losses, "loss_err": loss_err,
               "grad_err": grad_err, "weight_err": weight_err,
               "buckets": [b.params for b in ddp.buckets], "bucket_bytes": ddp.bucket_bytes}
    assert grad_err < GRAD_TOL[wire], (
        f"first step's averaged gradients differ from one GPU's by {grad_err:.3g} "
        f"(>= {GRAD_TOL[wire]:g}) {details}")
    assert loss_err < TOL[wire], (
        f"losses differ from one GPU's by {loss_err:.3g} (>= {TOL[wire]:g}): {losses} vs "
        f"{ref_losses}")
    # The grads are views of the flat buckets (torch's gradient_as_bucket_view).
    for b, flat in zip(ddp.buckets, ddp._flat):
        lo, hi = flat.data_ptr, flat.data_ptr + flat.nbytes
        for name in b.params:
            p = dict(model.named_parameters())[name]
            assert lo <= p.grad.data_ptr < hi, f"{name}'s grad is not in bucket {b.index}"
    # Every rank holds the same weights afterwards (rank 0's, broadcast back to compare).
    mine = cudalab.asarray(np.concatenate([p.value.get().ravel() for p in model.parameters()]))
    theirs = mine.copy()
    dist.broadcast(theirs, 0, group=group)
    diff = rel_err(mine, theirs)
    assert diff < 1e-6, f"rank {rank}'s weights differ from rank 0's by {diff:.3g}"
    return details


def check_graph(group, world, rank):
    """A DDP step captured in a CUDA graph gives the eager step's losses."""
    runs = {}
    for mode in ("eager", "graph"):
        model = nn.MLP(SIZES, seed=SEED)
        ddp = dist.DistributedDataParallel(model, group=group)
        opt = nn.AdamW(model.parameters(), lr=LR)
        x_in = cudalab.empty((ROWS, SIZES[0]), dtype=np.float32)
        l_in = cudalab.empty((ROWS,), dtype=np.int64)
        loss = cudalab.zeros((1,), dtype=np.float32)

        def step():
            logits = ddp.forward(x_in, "fp32")
            nn.functional.cross_entropy(logits, l_in, grad=logits, out=loss)
            ddp.backward(logits)
            opt.step()

        graph = None
        losses = []
        for s in range(STEPS):
            x, labels = global_batch(s, world)
            cudalab.copyto(x_in, x[rank * ROWS:(rank + 1) * ROWS])
            cudalab.copyto(l_in, labels[rank * ROWS:(rank + 1) * ROWS])
            if mode == "eager" or s == 0:
                step()  # the first step allocates and plans outside the capture
            else:
                if graph is None:
                    graph = cudalab.CUDAGraph()
                    with cudalab.graph(graph):
                        step()
                graph.replay()
            losses.append(float(loss.get()[0]))
        runs[mode] = losses
    err = max(abs(a - b) / abs(b) for a, b in zip(runs["graph"], runs["eager"]))
    assert err < 1e-6, f"graph losses {runs['graph']} differ from eager {runs['eager']}"
    return {"losses": runs["graph"]}


def measure(group, world, rank):
    """Timings of the lesson's model (4 x 4096 GELU, bf16, batch 256 per GPU): forward +
    backward without / with communication, the bucket all-reduces alone, and whole AdamW
    steps: one GPU's, DDP's, DDP's with the optimizer in the backward (informational)."""
    sizes, rows = [4096] * 5, 256
    bf16 = nn.PRECISIONS["bf16"].compute_dtype
    x = cudalab.asarray(np.random.default_rng(rank).standard_normal(
        (rows, sizes[0])).astype(np.float32))
    labels = cudalab.asarray(np.random.default_rng(rank).integers(0, sizes[-1], rows))
    g = cudalab.ones((rows, sizes[-1]), dtype=bf16)
    out = {}

    def timed(fn, repeats=20):
        for _ in range(3):
            fn()
        dist.barrier(group=group)
        start, end = cudalab.Event(), cudalab.Event()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats

    def train(wrapped, opt):
        def step():
            logits = wrapped.forward(x, "bf16")
            nn.functional.cross_entropy(logits, labels, grad=logits)
            wrapped.backward(logits)
            if opt is not None:
                opt.step()
        return step

    model = nn.MLP(sizes, seed=SEED)
    out["one GPU step ms"] = timed(train(model, nn.AdamW(model.parameters(), lr=LR)))
    for wire in (None, "bf16"):
        name = "fp32" if wire is None else wire
        model = nn.MLP(sizes, seed=SEED)
        ddp = dist.DistributedDataParallel(model, group=group, grad_dtype=wire)
        out[f"{name} ddp step ms"] = timed(train(ddp, nn.AdamW(model.parameters(), lr=LR)))
        model = nn.MLP(sizes, seed=SEED)
        ddp = dist.DistributedDataParallel(model, group=group, grad_dtype=wire)
        ddp.optimize_in_backward(nn.AdamW, lr=LR)
        out[f"{name} ddp step, optimizer in backward ms"] = timed(train(ddp, None))
    del model, ddp
    model = nn.MLP(sizes, seed=SEED)
    for wire in (None, "bf16"):
        ddp = dist.DistributedDataParallel(model, group=group, grad_dtype=wire)

        def backward(sync):
            def run():
                ddp.forward(x, "bf16")
                if sync:
                    ddp.backward(g)
                else:
                    with ddp.no_sync():
                        ddp.backward(g)
            return run

        name = "fp32" if wire is None else wire
        out[f"{name} forward+backward, no comm ms"] = timed(backward(False))
        out[f"{name} forward+backward, ddp ms"] = timed(backward(True))
        out[f"{name} bucket all-reduces alone ms"] = timed(ddp.all_reduce_buckets)
        out[f"{name} bucket MiB"] = [b / 2**20 for b in ddp.bucket_bytes]
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=60.0, help="watchdog seconds")
    parser.add_argument("--measure", action="store_true", help="also time overlap (no checks)")
    args = parser.parse_args()
    start = time.monotonic()
    try:
        group = dist.init(timeout=args.timeout)
    except Exception as exc:
        _common.report(RANK, init_error=_common.error_text(exc), checks=[])
        return 1
    world, rank = group.world_size, group.rank
    checks = Checks()
    ref = None
    try:
        ref = reference(world, STEPS)
    except Exception as exc:
        checks.items.append({"name": "one-GPU reference", "ok": False,
                             "error": _common.error_text(exc)})
    if ref is not None:
        for name, wire, accum in (("fp32", None, 1), ("bf16 wire", "bf16", 1),
                                  ("fp16 wire", "fp16", 1), ("no_sync", None, 2)):
            checks.run(name, check_against_one_gpu, group, world, rank, wire, accum, ref)
        for name, wire in (("optimizer in backward", None),
                           ("optimizer in backward bf16 wire", "bf16")):
            checks.run(name, check_against_one_gpu, group, world, rank, wire, 1, ref, True)
    checks.run("graph", check_graph, group, world, rank)
    if args.measure:
        checks.run("measure", measure, group, world, rank)
    try:
        cudalab.synchronize()
        dist.barrier()
        dist.destroy()
    except Exception as exc:
        checks.items.append({"name": "final barrier and destroy", "ok": False,
                             "error": _common.error_text(exc)})
    _common.report(rank, world_size=world, device=group.device, checks=checks.items,
                   seconds=round(time.monotonic() - start, 2))
    return 0 if all(c["ok"] for c in checks.items) else 1


if __name__ == "__main__":
    raise SystemExit(main())
