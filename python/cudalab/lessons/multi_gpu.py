"""What the multi-GPU lessons share: how many GPUs, what a lesson says with fewer, and workers.

Lessons 21-25 (`p2p`, `allreduce`, `data_parallel`, `multi_gpu_inference`,
`pipeline_parallel`) run on any number of GPUs: on one they measure what one
GPU can and add a finding naming what the rest needs (`needs_text`).

Lessons whose measurement needs one process per GPU (`allreduce`, the DDP part
of `data_parallel`) start worker modules (``python -m
cudalab.lessons._allreduce_worker``, ``..._ddp_worker``) through
`cudalab.distributed.run.launch`, one per GPU, with the caller's environment
unchanged (NCCL_* settings reach them as they are). Each worker reads its
configuration from a JSON file and writes ``rank<R>.json`` into the run's
directory: its numbers, or the traceback of what went wrong. The lesson reads
them back with `read_worker_results`, which explains a failed run (exit status,
each rank's error, the ranks that wrote nothing) in one `WorkersFailed`.

Timing inside workers cannot use `cudalab.bench.Timer`: its stop rule adapts
the number of repeats to each process's noise, and a collective must be called
the same number of times on every rank, or the ranks wait for each other
forever. `timed_repeats` and `host_loop_times` run a fixed count instead
(warm-up, then per repeat a barrier and back-to-back calls between two
events), and the lesson reports the slowest rank's median
(`slowest_measurement`): a collective finishes when its last rank does.

A framework module of cudalab.lessons, not a lesson (benchmarks/bench_allreduce.py
launches the allreduce workers with it too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import _core
from ..bench import Measurement

__all__ = ["TorchGroup", "WorkersFailed", "check_gpus", "device_counts", "gpu_count",
           "gpus_used", "host_loop_times", "launch_workers", "needs_text", "parse_worker_results",
           "read_worker_results", "repeat_plan", "run_worker", "scaling_efficiency",
           "slowest_measurement", "timed_repeats", "torch_wanted"]

# Seconds a launched run may take beyond the lesson's own estimate before the launcher
# stops it: process start, imports, NCCL initialisation (torch's too).
LAUNCH_OVERHEAD_S = 120.0
# How many characters of a worker's traceback a failure message keeps.
TRACEBACK_TAIL = 2000
WORKER_FILE = "rank{rank}.json"
TIMER_EVENTS = "CUDA events around back-to-back calls after a barrier; slowest rank's median"
TIMER_HOST = "host clock around a loop of calls and a synchronize, after a barrier; slowest rank"


class WorkersFailed(_core.CudalabError):
    """A lesson's worker processes failed: the message says which rank, how, and why."""


# ---- how many GPUs --------------------------------------------------------------------------


def gpu_count() -> int:
    """The number of GPUs this process sees."""
    return int(_core.device_count())


def check_gpus(lesson: str, value: Any, name: str = "gpus") -> int | None:
    """`value` (None: every GPU present, or an int >= 1) checked; ValueError naming the lesson."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"lesson {lesson!r}: {name} must be None (every GPU) or an int >= 1, "
                         f"got {value!r}")
    return int(value)


# ---- parameters the lessons share ------------------------------------------------------------


def one_or_many(value: Any) -> tuple:
    """A parameter given as one int or as a sequence, as a tuple."""
    return (value,) if isinstance(value, int) else tuple(value)


def positive_ints(lesson: str, name: str, value: Any) -> tuple[int, ...]:
    """One int or a sequence of ints, each >= 1, as a tuple in order; ValueError otherwise."""
    values = one_or_many(value)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"lesson {lesson!r}: {name} must be ints >= 1, got {v!r}")
    return values


def float32_byte_sizes(lesson: str, value: Any) -> tuple[int, ...]:
    """Message sizes in bytes of float32 data (ints >= 4, multiples of 4), as a tuple."""
    sizes = one_or_many(value)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 4 or s % 4:
            raise ValueError(f"lesson {lesson!r}: sizes are bytes of float32, ints >= 4 and "
                             f"multiples of 4, got {s!r}")
    return sizes


def gpus_used(requested: int | None, present: int) -> int:
    """How many GPUs a lesson uses: `requested` (None: all) but no more than are `present`."""
    return present if requested is None else min(requested, present)


def device_counts(requested: Sequence[int] | None, present: int) -> tuple[int, ...]:
    """The GPU counts to measure: `requested` (None: every count 1..present) capped at
    `present`, 1 always first, sorted, repeats dropped."""
    counts = range(1, present + 1) if requested is None else requested
    return tuple(sorted({1, *(c for c in counts if c <= present)}))


def needs_text(what: str, needed: int, present: int) -> str:
    """The finding of a lesson that ran with fewer GPUs than part of it needs."""
    return (f"{what} needs {needed} GPUs; this machine shows {present}, so only the "
            f"{'one-GPU' if present == 1 else f'{present}-GPU'} part ran: run it again "
            f"where {needed} or more GPUs are visible")


def scaling_efficiency(rate_n: float, rate_1: float, n: int) -> float:
    """rate on n GPUs / (n x rate on one): 1.0 is perfect scaling (nan without a rate)."""
    if n < 1 or not rate_1 > 0 or not math.isfinite(rate_n):
        return math.nan
    return rate_n / (n * rate_1)


# ---- launching and reading workers ---------------------------------------------------------


def parse_worker_results(documents: Mapping[int, Any], world_size: int, *,
                         returncode: int = 0, what: str = "workers") -> list[dict[str, Any]]:
    """parse_worker_results(documents, world_size, *, returncode=0, what="workers") -> list

    Each rank's result, in rank order, from what the workers wrote.

    Parameters
    ----------
    documents : mapping of int to dict or str
        Rank -> its parsed JSON (or the raw text, parsed here).
    world_size : int
        How many ranks were launched.
    returncode : int
        The launcher's exit status (0: every worker exited cleanly).
    what : str
        Names the run in messages (``"allreduce workers on 2 GPUs"``).

    Raises
    ------
    WorkersFailed
        A rank is missing or wrote an error, a document is malformed, or the
        launcher failed; the message gathers every reason.
    """
    problems, results = [], {}
    for rank in range(world_size):
        doc = documents.get(rank)
        if doc is None:
            problems.append(f"rank {rank} wrote no result")
            continue
        if isinstance(doc, (str, bytes)):
            try:
                doc = json.loads(doc)
            except ValueError as exc:
                problems.append(f"rank {rank} wrote malformed JSON ({exc})")
                continue
        if not isinstance(doc, dict):
            problems.append(f"rank {rank} wrote a {type(doc).__name__}, not an object")
            continue
        if doc.get("error"):
            problems.append(f"rank {rank} failed:\n{str(doc['error'])[-TRACEBACK_TAIL:]}")
            continue
        if doc.get("rank") != rank or doc.get("world_size") != world_size:
            problems.append(f"rank {rank}'s result says rank {doc.get('rank')!r} of "
                            f"{doc.get('world_size')!r}, expected {rank} of {world_size}")
            continue
        results[rank] = doc
    extra = sorted(k for k in documents if not (isinstance(k, int) and 0 <= k < world_size))
    if extra:
        problems.append(f"results from unexpected ranks {extra}")
    if returncode != 0 and not problems:
        problems.append("every rank wrote a result but the launcher failed")
    if problems:
        head = f"{what}: " + (f"the launcher exited with status {returncode}; "
                              if returncode != 0 else "")
        raise WorkersFailed(head + "; ".join(problems))
    return [results[rank] for rank in range(world_size)]


def read_worker_results(directory: str | os.PathLike[str], world_size: int, *,
                        returncode: int = 0, what: str = "workers") -> list[dict[str, Any]]:
    """The ``rank<R>.json`` files of `directory` through `parse_worker_results`."""
    documents: dict[int, Any] = {}
    for rank in range(world_size):
        path = Path(directory) / WORKER_FILE.format(rank=rank)
        if path.exists():
            documents[rank] = path.read_text(encoding="utf-8")
    return parse_worker_results(documents, world_size, returncode=returncode, what=what)


def launch_workers(module: str, nproc: int, config: Mapping[str, Any], timeout: float,
                   what: str) -> list[dict[str, Any]]:
    """launch_workers(module, nproc, config, timeout, what) -> list of dict

    Run ``python -m module --config FILE --out DIR`` in `nproc` processes (one per
    GPU of this node) through `cudalab.distributed.run.launch`, and return each
    rank's result in rank order. The environment is the caller's, unchanged.

    Parameters
    ----------
    module : str
        The worker module (it calls `run_worker`).
    nproc : int
        Processes, one per GPU (devices 0..nproc-1).
    config : mapping
        JSON-able; the workers read it from FILE.
    timeout : float
        Seconds the run may take (plus `LAUNCH_OVERHEAD_S`); the launcher stops
        the workers after it.
    what : str
        Names the run in error messages.

    Raises
    ------
    WorkersFailed
        See `parse_worker_results`.
    """
    from ..distributed import run as launcher

    with tempfile.TemporaryDirectory(prefix="cudalab_lesson_") as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(dict(config)), encoding="utf-8")
        argv = ["-m", module, "--config", str(config_path), "--out", tmp]
        returncode = launcher.launch(argv, nproc, timeout=timeout + LAUNCH_OVERHEAD_S)
        return read_worker_results(tmp, nproc, returncode=returncode, what=what)


def run_worker(body: Callable[[dict[str, Any], int, int], dict[str, Any]],
               argv: Sequence[str] | None = None) -> int:
    """run_worker(body, argv=None) -> exit status

    A worker module's main: read ``--config``, call ``body(config, rank,
    world_size)`` (rank and world size from the launcher's RANK and WORLD_SIZE),
    and write its dict, or the traceback of what it raised, to ``--out``'s
    ``rank<R>.json`` (written whole, then renamed: a reader never sees half).
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    status = 0
    try:
        config = json.loads(Path(args.config).read_text(encoding="utf-8"))
        result = dict(body(config, rank, world))
        result.update(rank=rank, world_size=world, error=None)
    except BaseException:  # noqa: BLE001 - written for the lesson to report, then exit 1
        result = {"rank": rank, "world_size": world, "error": traceback.format_exc()}
        status = 1
    path = Path(args.out) / WORKER_FILE.format(rank=rank)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, path)
    if status:
        tail = result["error"][-TRACEBACK_TAIL:]
        sys.stderr.write(f"cudalab lesson worker rank {rank}: {tail}\n")
    return status


# ---- timing inside workers -------------------------------------------------------------------


def timed_repeats(fn: Callable[[], Any], *, calls: int, repeats: int, warmup: int,
                  make_event: Callable[[], Any], barrier: Callable[[], Any]) -> list[float]:
    """Seconds per call of `fn`, one value per repeat: CUDA events around `calls` calls.

    `warmup` calls first; then each repeat waits at `barrier` (every rank starts
    together), records an event, makes `calls` calls, records another, and
    waits for it. Every rank must pass the same counts.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        barrier()
        start, end = make_event(), make_event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return times


def host_loop_times(fn: Callable[[], Any], *, calls: int, repeats: int, warmup: int,
                    barrier: Callable[[], Any], synchronize: Callable[[], Any]) -> list[float]:
    """Seconds per call of a host loop of `fn`: `calls` calls then `synchronize`, timed with
    the host clock after `barrier`, one value per repeat."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        times.append((time.perf_counter() - t0) / calls)
    return times


def slowest_measurement(label: str, per_rank: Sequence[Mapping[str, Any]], *,
                        timer: str = TIMER_EVENTS, bytes: float | None = None,
                        flops: float | None = None,
                        metadata: Mapping[str, Any] | None = None) -> Measurement:
    """slowest_measurement(label, per_rank, *, timer=..., bytes=None, flops=None, metadata=None)

    The Measurement of the rank whose median is the largest: what a collective
    (or a data-parallel step) costs, since it ends when its last rank does.

    Parameters
    ----------
    per_rank : sequence of mapping
        One per rank, in rank order: ``{"times": [seconds per call, ...], "calls":
        calls per repeat, "device": index, "device_name": str}`` (device keys optional).
    """
    if not per_rank:
        raise ValueError(f"slowest_measurement(): no rank timed {label!r}")
    medians = []
    for rank, entry in enumerate(per_rank):
        times = entry.get("times") or ()
        if not times:
            raise ValueError(f"slowest_measurement(): rank {rank} has no times for {label!r}")
        medians.append(statistics.median(times))
    slowest = max(range(len(medians)), key=medians.__getitem__)
    entry = per_rank[slowest]
    return Measurement(
        label=label, times=tuple(entry["times"]), number_per_run=int(entry.get("calls", 1)),
        bytes=None if bytes is None else float(bytes),
        flops=None if flops is None else float(flops),
        device=entry.get("device_name"), device_index=entry.get("device"),
        stop_reason="max_repeats",
        metadata={**(metadata or {}), "timer": timer, "slowest_rank": slowest,
                  "rank_medians": medians, "world_size": len(per_rank)})


def repeat_plan(seconds_per_call: float, *, target_repeat_s: float, budget_s: float,
                repeats: int, min_repeats: int = 5, max_calls: int = 100) -> tuple[int, int]:
    """(calls per repeat, repeats) for a call estimated at `seconds_per_call`: enough calls for
    a repeat of about `target_repeat_s` (at most `max_calls`), then at most `repeats` repeats
    and no more than `budget_s` in all, but at least `min_repeats`. Deterministic from its
    arguments, so every rank computes the same counts."""
    est = max(float(seconds_per_call), 1e-7)
    calls = int(min(max_calls, max(1, math.ceil(target_repeat_s / est))))
    fit = int(budget_s / (est * calls))
    return calls, int(max(min_repeats, min(repeats, fit)))


# ---- torch.distributed beside cudalab, inside workers ------------------------------------------


class TorchGroup:
    """torch.distributed's NCCL group on this rank's GPU (workers that time torch beside
    cudalab). Its TCP store listens on MASTER_PORT + 1: cudalab's rendezvous holds
    MASTER_PORT."""

    def __init__(self, rank: int, world: int, device: int, timeout: float) -> None:
        import datetime

        import torch
        import torch.distributed as tdist

        self.torch, self.dist = torch, tdist
        torch.cuda.set_device(device)
        url = f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}"
        kwargs = dict(backend="nccl", init_method=url, rank=rank, world_size=world,
                      timeout=datetime.timedelta(seconds=timeout))
        try:  # device_id (torch >= 2.3) creates the communicator now, not at the first call
            tdist.init_process_group(**kwargs, device_id=torch.device("cuda", device))
        except TypeError:
            tdist.init_process_group(**kwargs)
        self.device = device
        self.version = torch.__version__
        nccl = getattr(torch.cuda, "nccl", None)
        version = None if nccl is None else nccl.version()
        self.nccl = (None if version is None else str(version) if isinstance(version, int)
                     else ".".join(map(str, version)))

    def barrier(self) -> None:
        self.dist.barrier(device_ids=[self.device])
        self.torch.cuda.synchronize(self.device)

    def event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True)

    def close(self) -> None:
        self.dist.destroy_process_group()


def torch_wanted(asked: bool) -> bool:
    """Whether a worker should time torch: asked for, and importable (the same on every rank)."""
    import importlib.util

    return bool(asked) and importlib.util.find_spec("torch") is not None


def join_job(config: Mapping[str, Any], rank: int, world: int) -> tuple[int, TorchGroup | None]:
    """A worker's start: cudalab.distributed.init() (which makes this rank's GPU current)
    and, where the lesson asked for torch and it is installed, torch's group beside it.
    Returns (the device, the TorchGroup or None)."""
    import cudalab.distributed as dist

    timeout = float(config["timeout"])
    device = dist.init(timeout=timeout).device
    wanted = torch_wanted(config["params"]["torch"])
    return device, TorchGroup(rank, world, device, timeout) if wanted else None


def worker_facts(device: int, tg: TorchGroup | None) -> dict[str, Any]:
    """What every worker reports about where it ran: GPU, host, NCCL and torch versions."""
    import cudalab.distributed as dist

    return {"device": device, "device_name": _core._device_properties(device)["name"],
            "host": socket.gethostname(), "nccl": ".".join(map(str, dist.nccl_version())),
            "nccl_library": dist.nccl_library(),
            "torch": None if tg is None else tg.version,
            "torch_nccl": None if tg is None else tg.nccl}
