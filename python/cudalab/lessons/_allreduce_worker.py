"""The allreduce lesson's worker: one process per GPU, started by the lesson through
`cudalab.distributed.run.launch` (``python -m cudalab.lessons._allreduce_worker --config
FILE --out DIR``).

Each rank:

1. joins cudalab's process group (`cudalab.distributed.init`, rendezvous on
   MASTER_PORT) and, when asked, torch.distributed's NCCL group on its own port
   (MASTER_PORT + 1);
2. for each size (a prefix of one float32 buffer, so 8 B to 4 GiB share it):
   checks one all_reduce against the sum of every rank's data, regenerated on
   this GPU from the ranks' seeds, then times back-to-back all_reduces with CUDA
   events after a barrier (cudalab, then torch, on the same data);
3. times an 8-byte all_reduce issued in a host loop (per call), the same
   captured in a CUDA graph (per call of a replay), and torch's loop;
4. writes everything to ``DIR/rank<R>.json`` (`multi_gpu.run_worker`).

The timed all_reduces are in place and repeated, so the buffer's values grow
by a factor of world_size per call and reach inf within a few hundred calls;
NCCL's sum costs the same for any float value, and torch sees the same data.
Every count here is a function of the configuration alone: every rank makes
the same calls in the same order, or the collectives would wait forever.
"""

from __future__ import annotations

import sys
from typing import Any

from . import multi_gpu as M

# The seeds of the ranks' data: rank r draws from SEED + r.
SEED = 2024
# The per-call estimate the repeat counts follow: a latency plus the bytes at a
# modest bandwidth (an overestimate for NVLink makes fewer repeats, never a hang).
EST_LATENCY_S = 20e-6
EST_BANDWIDTH = 100e9
# A timed repeat aims at this much GPU time (event resolution ~0.5 us).
TARGET_REPEAT_S = 2e-3
LATENCY_BYTES = 8


def plan(nbytes: int, repeats: int, budget_s: float) -> tuple[int, int]:
    """(calls per repeat, repeats) of one size, the same on every rank."""
    return M.repeat_plan(EST_LATENCY_S + nbytes / EST_BANDWIDTH, target_repeat_s=TARGET_REPEAT_S,
                         budget_s=budget_s, repeats=repeats)


def _rel_error(cudalab: Any, got: Any, want: Any) -> float:
    """max |got - want| / max |want| on the device; overwrites `got`."""
    cudalab.sub(got, want, out=got)
    cudalab.abs(got, out=got)
    diff = float(cudalab.max(got).get())
    scale = float(cudalab.max(cudalab.abs(want)).get())
    return diff / scale if scale > 0 else diff


def _torch_rel_error(got: Any, want: Any) -> float:
    """As `_rel_error`, in torch (in place: no temporaries of a 4 GiB size)."""
    scale = float(want.abs().max().item())
    diff = float(got.sub_(want).abs_().max().item())
    return diff / scale if scale > 0 else diff


def body(config: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import cudalab
    import cudalab.distributed as dist

    p = config["params"]
    device, tt = M.join_job(config, rank, world)
    out: dict[str, Any] = {**M.worker_facts(device, tt), "sizes": [], "latency": {}}

    counts = [max(1, int(b) // 4) for b in p["sizes"]]
    top = max(counts + [LATENCY_BYTES // 4])
    # The rank's data, and the sum every rank must get, regenerated here from the seeds.
    mine = cudalab.random.normal((top,), dtype="float32", seed=SEED + rank)
    want = cudalab.random.normal((top,), dtype="float32", seed=SEED)
    for r in range(1, world):
        cudalab.add(want, cudalab.random.normal((top,), dtype="float32", seed=SEED + r), out=want)
    x = cudalab.empty((top,), dtype="float32")
    if tt is not None:
        cudalab.synchronize()  # torch reads cudalab's arrays on its own stream
        torch = tt.torch
        mine_t, want_t = torch.from_dlpack(mine), torch.from_dlpack(want)
        xt = torch.empty(top, dtype=torch.float32, device=f"cuda:{device}")
    ours_events = lambda: cudalab.Event()  # noqa: E731
    budget = float(p["budget_s"])

    for nbytes, count in zip(p["sizes"], counts):
        calls, repeats = plan(count * 4, int(p["repeats"]), budget)
        entry: dict[str, Any] = {"bytes": count * 4, "count": count, "calls": calls,
                                 "repeats": repeats}
        view = x[:count]
        cudalab.copyto(view, mine[:count])
        dist.all_reduce(view)
        entry["error"] = _rel_error(cudalab, view, want[:count])
        cudalab.copyto(view, mine[:count])
        entry["cudalab"] = M.timed_repeats(lambda: dist.all_reduce(view), calls=calls,
                                           repeats=repeats, warmup=max(2, calls),
                                           make_event=ours_events, barrier=dist.barrier)
        cudalab.synchronize()
        if tt is not None:
            tview = xt[:count]
            tview.copy_(mine_t[:count])
            tt.dist.all_reduce(tview)
            entry["torch_error"] = _torch_rel_error(tview, want_t[:count])
            tview.copy_(mine_t[:count])
            entry["torch"] = M.timed_repeats(lambda: tt.dist.all_reduce(tview), calls=calls,
                                             repeats=repeats, warmup=max(2, calls),
                                             make_event=tt.event, barrier=tt.barrier)
            torch.cuda.synchronize(device)
        out["sizes"].append(entry)

    out["latency"] = _latency(cudalab, dist, tt, p, x)
    if tt is not None:
        tt.close()
    dist.destroy()
    return out


def _latency(cudalab: Any, dist: Any, tt: M.TorchGroup | None, p: dict[str, Any],
             x: Any) -> dict[str, Any]:
    """An 8-byte all_reduce: a host loop (cudalab, torch) and CUDA-graph replays (cudalab)."""
    small = x[:LATENCY_BYTES // 4]
    calls, graph_calls, repeats = int(p["latency_calls"]), int(p["graph_calls"]), int(p["repeats"])
    sync = lambda: cudalab.synchronize()  # noqa: E731
    res: dict[str, Any] = {"bytes": LATENCY_BYTES}
    loop = M.host_loop_times(lambda: dist.all_reduce(small), calls=calls, repeats=repeats,
                             warmup=calls, barrier=dist.barrier, synchronize=sync)
    res["cudalab loop"] = {"times": loop, "calls": calls}
    # NCCL records into the graph like any kernel: the capture stream is the current one.
    # A capture that fails is reported, not fatal: every rank fails it alike (same calls).
    try:
        g = cudalab.CUDAGraph()
        with cudalab.graph(g):
            for _ in range(graph_calls):
                dist.all_reduce(small)
        replays = max(1, calls // graph_calls)
        per_replay = M.host_loop_times(g.replay, calls=replays, repeats=repeats,
                                       warmup=replays, barrier=dist.barrier, synchronize=sync)
        res["cudalab graph"] = {"times": [t / graph_calls for t in per_replay],
                                "calls": replays * graph_calls, "graph_calls": graph_calls}
        del g
    except cudalab.CudalabError as exc:
        if isinstance(exc, dist.DistributedError):
            raise  # an aborted communicator: nothing after it can run
        res["graph_error"] = f"{type(exc).__name__}: {exc}"
        dist.barrier()
    if tt is not None:
        torch = tt.torch
        t_small = torch.ones(LATENCY_BYTES // 4, dtype=torch.float32, device=f"cuda:{tt.device}")
        tloop = M.host_loop_times(lambda: tt.dist.all_reduce(t_small), calls=calls,
                                  repeats=repeats, warmup=calls, barrier=tt.barrier,
                                  synchronize=lambda: torch.cuda.synchronize(tt.device))
        res["torch loop"] = {"times": tloop, "calls": calls}
    return res


if __name__ == "__main__":
    sys.exit(M.run_worker(body))
