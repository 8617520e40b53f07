"""The data_parallel lesson's worker: one process per GPU, started by the lesson through
`cudalab.distributed.run.launch` (``python -m cudalab.lessons._ddp_worker --config FILE
--out DIR``), once per GPU count.

Each rank trains the lesson's MLP on its own rows and times, per per-GPU batch:

* ``plain``: the training step with no communication at all (forward, loss,
  backward, AdamW): on a world of 1 the one-GPU baseline, on more the compute
  the all-reduce has to hide;
* ``ddp fp32`` / ``ddp bf16``: the same step through DistributedDataParallel,
  gradients all-reduced in float32 or in bfloat16 while the backward runs;
* ``comm fp32`` / ``comm bf16``: DistributedDataParallel's bucket all-reduces
  alone (`all_reduce_buckets`), once per GPU count;
* ``forward`` / ``ddp forward``: inference through the bare model and through
  the DDP wrapper (the tutorials wrap inference in DDP);
* the same in torch (``torch plain``, ``torch ddp fp32``, ``torch ddp bf16``
  with torch's bf16_compress_hook, ``torch forward``, ``torch ddp forward``)
  where torch is installed.

With more than one rank it also checks what DDP computes, in fp32 on a small
global batch split into equal shards: the averaged gradients against one
GPU's gradients of the whole batch (computed on rank 0), the losses of a few
AdamW steps against one GPU's, and the tutorials' missing sharding (every rank
on the same rows: the averaged gradient is then one GPU's gradient of those
rows, not of a batch world_size times larger).

Every count of calls is the same on every rank: the per-call estimate that
sets the repeats is the slowest rank's (an all_reduce with MAX).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from . import multi_gpu as M
from ..nn import torch_twin as TT
from . import training as T

# A timed repeat aims at this much GPU time; warm-up steps before the estimate.
TARGET_REPEAT_S = 0.02
WARMUP_STEPS = 3
# The check's data: every rank draws the same global batch from this seed.
CHECK_SEED = 77


def _grads(model: Any) -> list:
    return [p.grad.get() for p in model.parameters()]


class _Clock:
    """Fixed-count timing shared by every measurement of this rank (cudalab and torch)."""

    def __init__(self, cudalab: Any, dist: Any, tg: M.TorchGroup | None,
                 p: dict[str, Any]) -> None:
        self.cl, self.dist, self.tg, self.p = cudalab, dist, tg, p

    def _estimate(self, fn: Callable[[], Any], torch: bool) -> float:
        """Seconds of one call, the slowest rank's (so every rank plans the same counts)."""
        for _ in range(WARMUP_STEPS):
            fn()
        if torch:
            self.tg.barrier()
            start, end = self.tg.event(), self.tg.event()
        else:
            self.dist.barrier()
            start, end = self.cl.Event(), self.cl.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        est = self.cl.full((1,), start.elapsed_time(end) * 1e-3, dtype="float32")
        self.dist.all_reduce(est, op="max")
        return float(est.get()[0])

    def time(self, fn: Callable[[], Any], torch: bool = False) -> dict[str, Any]:
        est = self._estimate(fn, torch)
        calls, repeats = M.repeat_plan(est, target_repeat_s=TARGET_REPEAT_S,
                                       budget_s=float(self.p["budget_s"]),
                                       repeats=int(self.p["repeats"]))
        if torch:
            make, barrier = self.tg.event, self.tg.barrier
        else:
            make, barrier = self.cl.Event, self.dist.barrier
        times = M.timed_repeats(fn, calls=calls, repeats=repeats, warmup=1, make_event=make,
                                barrier=barrier)
        return {"times": times, "calls": calls}


def body(config: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import cudalab
    import cudalab.distributed as dist

    p = config["params"]
    device, tg = M.join_job(config, rank, world)
    clock = _Clock(cudalab, dist, tg, p)
    sizes = tuple(config["sizes"])
    out: dict[str, Any] = {**M.worker_facts(device, tg), "batches": [], "comm": {}}
    for i, b in enumerate(config["batches"]):
        out["batches"].append(_batch(cudalab, dist, tg, clock, p, sizes, rank, world, int(b),
                                     out["comm"] if i == 0 else None))
    if world > 1:
        out["check"] = _check(cudalab, dist, p, sizes, rank, world)
    if tg is not None:
        tg.close()
    dist.destroy()
    return out


# The worker key's wire name of DDP with bf16 gradients and the optimizer stepped per bucket.
OPTIM_IN_BACKWARD = "bf16+optim"


def _batch(cudalab: Any, dist: Any, tg: M.TorchGroup | None, clock: _Clock, p: dict[str, Any],
           sizes: tuple[int, ...], rank: int, world: int, b: int,
           comm: dict[str, Any] | None) -> dict[str, Any]:
    """Every timing of one per-GPU batch on this rank; the bucket all-reduces into `comm`."""
    from cudalab import nn

    prec, seed, lr = p["precision"], int(p["seed"]), float(p["lr"])
    data = nn.TeacherData(sizes[0], sizes[-1], b, hidden=T.TEACHER_HIDDEN, batches=1,
                          seed=seed + 1000 * (rank + 1))
    x, labels = data.batch(0)
    res: dict[str, Any] = {"batch": b}

    def train(wrapped: Any, opt: Any) -> Callable[[], None]:
        def step() -> None:
            logits = wrapped.forward(x, prec)
            nn.functional.cross_entropy(logits, labels, grad=logits)
            wrapped.backward(logits)
            opt.step()
        return step

    model = nn.MLP(sizes, "gelu", seed=seed)
    res["plain"] = clock.time(train(model, nn.AdamW(model.parameters(), lr=lr)))
    res["forward"] = clock.time(lambda: model.forward(x, prec))
    del model
    if world > 1:
        for wire in ("fp32", "bf16"):
            model = nn.MLP(sizes, "gelu", seed=seed)
            ddp = dist.DistributedDataParallel(model, grad_dtype=None if wire == "fp32" else wire)
            opt = nn.AdamW(model.parameters(), lr=lr)  # after wrapping: grads are bucket views
            res[f"ddp {wire}"] = clock.time(train(ddp, opt))
            if wire == "fp32":
                res["ddp forward"] = clock.time(lambda: ddp.forward(x, prec))
            if comm is not None:
                comm[wire] = clock.time(ddp.all_reduce_buckets)
                comm[f"{wire} bytes"] = sum(ddp.bucket_bytes)
                comm[f"{wire} buckets"] = len(ddp.buckets)
            del model, ddp, opt
        # The lever where the optimizer is much of the step (small batches): each bucket's
        # AdamW steps on its own stream while the next bucket is all-reduced.
        model = nn.MLP(sizes, "gelu", seed=seed)
        ddp = dist.DistributedDataParallel(model, grad_dtype="bf16")
        ddp.optimize_in_backward(nn.AdamW, lr=lr)

        def step_in_backward() -> None:
            logits = ddp.forward(x, prec)
            nn.functional.cross_entropy(logits, labels, grad=logits)
            ddp.backward(logits)  # steps the bucket optimizers too

        res[f"ddp {OPTIM_IN_BACKWARD}"] = clock.time(step_in_backward)
        del model, ddp
    cudalab.synchronize()
    if tg is not None:
        res.update(_torch_batch(cudalab, tg, clock, p, sizes, world, x, labels))
    return res


def _torch_batch(cudalab: Any, tg: M.TorchGroup, clock: _Clock, p: dict[str, Any],
                 sizes: tuple[int, ...], world: int, x: Any, labels: Any) -> dict[str, Any]:
    """torch's twin of each step (autocast in the lesson's precision, fused AdamW)."""
    from cudalab import nn

    torch = tg.torch
    prec, seed, lr = p["precision"], int(p["seed"]), float(p["lr"])
    cudalab.synchronize()
    tx, tl = torch.from_dlpack(x), torch.from_dlpack(labels)
    dtype = {"bf16": torch.bfloat16}.get(prec)
    res: dict[str, Any] = {}

    def forward(module: Any) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                return module(tx)
        return run

    with TT.Tf32(torch, prec == "tf32"):
        twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=seed))
        opt = TT.torch_adamw(torch, twin.parameters(), lr)
        step = TT.torch_train_step(torch, twin, opt, None, prec)
        res["torch plain"] = clock.time(lambda: step(tx, tl), torch=True)
        res["torch forward"] = clock.time(forward(twin), torch=True)
        del twin, opt, step
        if world > 1:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            for wire in ("fp32", "bf16"):
                twin = TT.torch_twin(torch, nn.MLP(sizes, "gelu", seed=seed))
                ddp = torch.nn.parallel.DistributedDataParallel(twin, device_ids=[tg.device])
                if wire == "bf16":
                    ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
                opt = TT.torch_adamw(torch, ddp.parameters(), lr)
                step = TT.torch_train_step(torch, ddp, opt, None, prec)
                res[f"torch ddp {wire}"] = clock.time(lambda: step(tx, tl), torch=True)
                if wire == "fp32":
                    res["torch ddp forward"] = clock.time(forward(ddp), torch=True)
                del twin, ddp, opt, step
    torch.cuda.synchronize(tg.device)
    torch.cuda.empty_cache()
    return res


def _check(cudalab: Any, dist: Any, p: dict[str, Any], sizes: tuple[int, ...], rank: int,
           world: int) -> dict[str, Any]:
    """DDP in fp32 against one GPU on the same global batch, and the missing-sharding case."""
    from cudalab import nn

    from .grad_accumulation import grad_difference

    seed, lr = int(p["seed"]), float(p["lr"])
    rows, steps = int(p["check_rows"]), int(p["check_steps"])
    data = nn.TeacherData(sizes[0], sizes[-1], world * rows, hidden=T.TEACHER_HIDDEN,
                          batches=1, seed=CHECK_SEED)
    xg, lg = data.batch(0)  # the same global batch on every rank
    mine = slice(rank * rows, (rank + 1) * rows)
    xs, ls = xg[mine], lg[mine]
    res: dict[str, Any] = {"rows_per_rank": rows, "steps": steps}

    # DDP on equal shards: losses of each step, the averaged grads of the first.
    model = nn.MLP(sizes, "gelu", seed=seed)
    ddp = dist.DistributedDataParallel(model)
    opt = nn.AdamW(model.parameters(), lr=lr)
    losses, first = [], None
    for s in range(steps):
        logits = ddp.forward(xs, "fp32")
        loss = nn.functional.cross_entropy(logits, ls, grad=logits)
        ddp.backward(logits)
        losses.append(float(loss.get()))
        if s == 0 and rank == 0:
            first = _grads(model)
        opt.step()
    res["losses"] = losses
    after = [q.value.get() for q in model.parameters()] if rank == 0 else None
    del model, ddp, opt

    # The tutorials' loop without a DistributedSampler: every rank on the same rows.
    model = nn.MLP(sizes, "gelu", seed=seed)
    ddp = dist.DistributedDataParallel(model)
    same_x, same_l = xg[:rows], lg[:rows]
    logits = ddp.forward(same_x, "fp32")
    nn.functional.cross_entropy(logits, same_l, grad=logits)
    ddp.backward(logits)
    same = _grads(model) if rank == 0 else None
    del model, ddp
    dist.barrier()

    if rank == 0:  # one GPU: the whole global batch, and the first shard alone
        ref = nn.MLP(sizes, "gelu", seed=seed)
        ref_opt = nn.AdamW(ref.parameters(), lr=lr)
        ref_losses, ref_first = [], None
        for s in range(steps):
            logits = ref.forward(xg, "fp32")
            loss = nn.functional.cross_entropy(logits, lg, grad=logits)
            ref.backward(logits)
            ref_losses.append(float(loss.get()))
            if s == 0:
                ref_first = _grads(ref)
            ref_opt.step()
        ref_after = [q.value.get() for q in ref.parameters()]
        del ref, ref_opt
        local = nn.MLP(sizes, "gelu", seed=seed)
        logits = local.forward(same_x, "fp32")
        nn.functional.cross_entropy(logits, same_l, grad=logits)
        local.backward(logits)
        local_grads = _grads(local)
        del local
        start = nn.MLP(sizes, "gelu", seed=seed)
        init = [q.value.get() for q in start.parameters()]
        del start
        res.update(
            ref_losses=ref_losses,
            grad_diff=grad_difference(first, ref_first),
            update_diff=grad_difference([a - i for a, i in zip(after, init)],
                                        [a - i for a, i in zip(ref_after, init)]),
            same_rows_vs_local=grad_difference(same, local_grads),
            same_rows_vs_global=grad_difference(same, ref_first))
    dist.barrier()
    return res


if __name__ == "__main__":
    sys.exit(M.run_worker(body))
