"""Lesson 13 `prefetch`: a prefetching loader vs synchronous loading, and a loader bug.

Every training or inference loop feeds the GPU batches prepared on the host
(here: uint8 rows shifted by the batch index, then normalized to float32 in
NumPy). Loaded synchronously, each batch is prepared, copied (the call waits
for the copy) and then used. A prefetching loader prepares batch i+1 into a
pinned staging buffer and copies it on a side stream while the GPU works on
batch i: an event orders the consumer's stream after the copy, the batch's
memory is recorded on the consumer's stream so its free waits for the
consumer, and a staging buffer is refilled only once the copy that read it
is done. That mechanism is cudalab.prefetch's (StagingRing, Prefetcher), the
one nn.ArrayLoader trains from; here it is driven through cudalab and PyTorch.

The tutorial's prefetcher calls ``next(iter(loader))`` for every batch: it
restarts the loader each time (here: batch 0 again, prepared into the next
staging buffer). The lesson times that pattern too, and its check shows what timing
alone does not: it hands out the first batch over and over.

Prefetching hides the preparation only up to the GPU step's length; when
preparing a batch takes as long as the step, the loop stays host-bound. The
guides' answer is DataLoader's ``num_workers``: here ``workers`` threads
(cudalab.prefetch.HostWorkers) prepare the next batches in parallel (NumPy
releases the GIL), and the lesson says from which count the loop runs at the
GPU step's pace. A GpuMonitor (NVML) records the GPU's utilization while the
loop loads synchronously, prefetches, and prefetches with workers, and writes
its samples as CSV; the tutorial's ``nvidia-smi -lms 100 > gpu_log.csv``
writes nvidia-smi's text table, not CSV, which the lesson shows when
nvidia-smi is on the PATH.
"""

from __future__ import annotations

import csv
import itertools
import shutil
import subprocess
import time
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

import cudalab
from cudalab import _precision
from cudalab.bench import host_clock, host_measurement
from cudalab.monitor import GpuMonitor, NvmlError
from cudalab.prefetch import CudalabCalls, StagingRing
from cudalab.prefetch import Prefetcher as SharedPrefetcher

from ._measuring import rel_error
from ._overlap import overlap
from . import _params as P
from .registry import LessonRun, lesson

# Normalization constants of the host-side preparation (uint8 -> float32).
MEAN = 127.5
INV_STD = 1.0 / 64.0
# Pinned staging buffers per loader: one being filled, one being copied (plus one per
# worker thread: each fills its own).
SLOTS = 2
# At most this many worker threads (a host has few cores to give a loader).
MAX_WORKERS = 32
# The GPU step is this many matmuls at most, sized to take about as long as
# the host preparation (where prefetching has the most to hide).
MAX_PASSES = 64
# Prefetching at least this many times faster than synchronous loading: the
# claim "prefetch while the GPU processes" holds.
PREFETCH_HELPS = 1.1
# A loop whose time per batch is within this factor of the GPU step alone runs at the
# GPU's pace: GPU-bound, the host keeps up (the claim about num_workers holds). Tight,
# because the step is calibrated to last about as long as the host preparation: a
# host-bound loop is only the preparation's excess (plus enqueueing) slower.
GPU_BOUND = 1.05
# GpuMonitor: a sample every MONITOR_INTERVAL_MS; NVML's utilization is an average over
# its own period (up to 1 s), so samples in the first UTIL_SETTLE_S of a phase partly
# describe the phase before and are left out of its mean.
MONITOR_INTERVAL_MS = 50
UTIL_SETTLE_S = 0.25
MAX_MONITOR_S = 10.0
# The tutorial's logging command, and one that does write CSV (the same loop).
SEED_LOG_COMMAND = "nvidia-smi -lms 100 > gpu_log.csv"
CSV_QUERY = "timestamp,utilization.gpu,memory.used,power.draw"
CSV_LOG_COMMAND = f"nvidia-smi --query-gpu={CSV_QUERY} --format=csv -lms 100 > gpu_log.csv"
NVIDIA_SMI_TIMEOUT_S = 15
MATMUL_TOLERANCE = 1e-5
TIMER = "host clock around a whole epoch + synchronize, per batch"

ROW_KEYS = ("case", "impl", "workers", "ms_per_batch", "speedup", "gpu_util_pct",
            "distinct_batches", "wrong_batches")

SYNC = "synchronous, pageable"
PREFETCH = "prefetch, one iterator"


def worker_label(workers: int) -> str:
    """The row name of prefetching with `workers` host threads preparing batches."""
    return f"prefetch, {workers} worker{'' if workers == 1 else 's'}"


def gpu_bound(per_batch: float, gpu_step: float) -> bool:
    """Whether a loop at `per_batch` s per batch runs at the GPU step's pace (GPU_BOUND)."""
    return per_batch <= GPU_BOUND * gpu_step


def workers_text(per_batch: Mapping[int, float], gpu_step: float, prep: float) -> str:
    """What prefetching with 0, 1, 2... worker threads did (seconds per batch by count)."""
    base = per_batch[0]
    parts = ", ".join(f"{n} {'worker' if n == 1 else 'workers'} {t * 1e3:.2f} ms "
                      f"({base / t:.2f}x)" for n, t in sorted(per_batch.items()))
    head = (f"Prefetching with host worker threads, per batch: {parts}; preparing one batch "
            f"takes {prep * 1e3:.2f} ms on one thread and the GPU step {gpu_step * 1e3:.2f} ms. ")
    bound = sorted(n for n, t in per_batch.items() if gpu_bound(t, gpu_step))
    if not bound:
        best = min(per_batch, key=per_batch.get)
        return head + (f"Host-bound with any count: the best, {best} workers, is "
                       f"{per_batch[best] / gpu_step:.2f}x the GPU step (the preparation does "
                       f"not scale over threads here: host memory bandwidth or work holding "
                       f"the GIL)")
    if bound[0] == 0:
        return head + (f"Prefetching alone already keeps pace with the GPU (within "
                       f"{GPU_BOUND - 1:.0%} of its step): GPU-bound, workers cannot help")
    return head + (f"From {bound[0]} worker{'' if bound[0] == 1 else 's'} the loop runs at the "
                   f"GPU step's pace (within {GPU_BOUND - 1:.0%}): GPU-bound, the host prepares "
                   f"faster than the GPU consumes; without workers it was "
                   f"{base / gpu_step:.2f}x the step")


def phase_means(samples: Sequence[tuple[float, Optional[float]]],
                phases: Mapping[str, tuple[float, float]],
                settle: float = UTIL_SETTLE_S) -> dict[str, Optional[float]]:
    """Mean of the (time, value) samples in each phase's [start + settle, end]; None if none.

    Samples whose value is None (a field the device does not report) are left out.
    """
    out: dict[str, Optional[float]] = {}
    for name, (start, end) in phases.items():
        values = [v for t, v in samples if v is not None and start + settle <= t <= end]
        out[name] = sum(values) / len(values) if values else None
    return out


def csv_rows(text: str) -> tuple[int, int]:
    """(lines that are rows of a CSV table, lines that are not) in `text`.

    The first non-empty line is the header; a table has at least two columns and every
    line as many fields as the header. Without such a header, no line is a row.
    """
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return 0, 0
    widths = [len(next(csv.reader([line]))) for line in lines]
    if widths[0] < 2:
        return 0, len(lines)
    good = sum(w == widths[0] for w in widths)
    return good, len(lines) - good


class BatchSource:
    """Raw uint8 rows and the host-side preparation of batch i (a NumPy transform)."""

    def __init__(self, rows: int, features: int, batches: int, pool: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.raw = [rng.integers(0, 256, (rows, features), dtype=np.uint8) for _ in range(pool)]
        self.shape = (rows, features)
        self.batches = batches

    def prepare(self, i: int, out: np.ndarray) -> np.ndarray:
        """Batch i into `out` (float32): raw rows shifted by i columns, then normalized."""
        shifted = np.roll(self.raw[i % len(self.raw)], i, axis=1)
        np.subtract(shifted, MEAN, out=out, dtype=np.float32)
        np.multiply(out, INV_STD, out=out)
        return out

    def expected(self, i: int) -> np.ndarray:
        return self.prepare(i, np.empty(self.shape, np.float32))


class HostLoader:
    """An iterable over (index, host batch), like a DataLoader.

    Without `pinned`, every batch is a new pageable array. With it, batches
    are prepared into the loader's ring of ``SLOTS + workers`` pinned staging
    buffers (cudalab.prefetch.StagingRing: allocated once, since page-locking
    is slow and freeing pinned memory waits for the whole device) that every
    iterator shares, so a restarted iterator takes the next buffer of the
    ring, not a new one. A buffer is refilled only after the event its last
    reader handed to `release`.

    Iterating prepares each batch when it is due. For worker threads,
    :meth:`items` hands out (index, buffer) on the iterating thread and
    :meth:`prepare` fills the buffer (NumPy work: it can run in a thread).
    """

    def __init__(self, source: BatchSource, pinned: bool, pinned_empty: Any = None,
                 workers: int = 0) -> None:
        self.source, self.pinned, self.workers = source, pinned, workers
        allocate = None if pinned_empty is None else (lambda shape, dtype: pinned_empty(shape))
        self.ring = StagingRing([(source.shape, np.float32)], SLOTS + workers, allocate=allocate)

    def release(self, host: np.ndarray, event: Any) -> None:
        """`host`, if one of the staging buffers, may be refilled once `event` completed."""
        self.ring.release(host, event)

    def items(self) -> Iterator[tuple[int, np.ndarray]]:
        """(index, the buffer to prepare it into), for each batch of an epoch."""
        src = self.source
        for i in range(src.batches):
            yield i, self.ring.acquire()[0] if self.pinned else np.empty(src.shape, np.float32)

    def prepare(self, item: tuple[int, np.ndarray]) -> tuple[int, np.ndarray]:
        """Batch `i` prepared into its buffer: (i, the buffer)."""
        i, out = item
        return i, self.source.prepare(i, out)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return map(self.prepare, self.items())


# The calls the prefetcher makes, through cudalab (`Torch` is the same through PyTorch).
Cudalab = CudalabCalls


class Torch:
    """`Cudalab`'s calls through PyTorch (pinned staging from torch: torch knows it is pinned)."""

    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.Stream, self.current_stream = torch.cuda.Stream, torch.cuda.current_stream
        self.synchronize, self.stream = torch.cuda.synchronize, torch.cuda.stream
        self.device = f"cuda:{cudalab.current_device()}"
        self._tensors: dict[int, Any] = {}  # pinned numpy view -> its torch tensor

    def pinned_empty(self, shape: tuple[int, ...]) -> np.ndarray:
        t = self.torch.empty(shape, dtype=self.torch.float32, pin_memory=True)
        view = t.numpy()  # keeps `t` alive; the map only finds it again for the upload
        self._tensors[view.ctypes.data] = t
        while len(self._tensors) > 2 * SLOTS:  # only the current epochs' slots are looked up
            del self._tensors[next(iter(self._tensors))]
        return view

    def upload(self, host: np.ndarray, non_blocking: bool) -> Any:
        t = self._tensors.get(host.ctypes.data)
        t = self.torch.from_numpy(host) if t is None else t
        return t.to(self.device, non_blocking=non_blocking)

    def record(self, s: Any) -> Any:
        event = self.torch.cuda.Event()
        event.record(s)
        return event


def _restarting(loader: HostLoader) -> Iterator[tuple[int, np.ndarray]]:
    """The tutorial's ``next(iter(loader))`` for every batch: each one starts a new epoch."""
    while True:
        first = next(iter(loader), None)
        if first is None:
            return
        yield first


class Prefetcher(SharedPrefetcher):
    """Batches uploaded one ahead on a side stream: ``for i, batch in Prefetcher(loader, api)``.

    cudalab.prefetch.Prefetcher over the loader's batches, each staging
    buffer released after its copy. With ``restart=True`` it reproduces the
    tutorial's bug: every preload calls ``next(iter(loader))``, which starts
    a new epoch (and never ends).
    """

    def __init__(self, loader: HostLoader, api: Any, restart: bool = False) -> None:
        if loader.workers:  # the loader's worker threads prepare its batches
            super().__init__(loader.items(), ahead=1, release=loader.release, calls=api,
                             workers=loader.workers, prepare=loader.prepare)
            return
        batches = _restarting(loader) if restart else loader
        super().__init__(batches, ahead=1, release=loader.release, calls=api)


def synchronous(loader: HostLoader, api: Any) -> SharedPrefetcher:
    """Batches uploaded when asked for: the copy completes before the call returns."""
    return SharedPrefetcher(loader, ahead=0, calls=api)


# ---- the lesson ------------------------------------------------------------------------------


def _epoch(batches: Any, count: int, step: Any) -> None:
    for _, batch in itertools.islice(batches, count):
        step(batch)


def _consumed(batches: Any, count: int, source: BatchSource) -> tuple[int, int]:
    """(distinct indices, batches whose values differ from the k-th produced batch)."""
    seen, wrong = set(), 0
    for k, (i, batch) in enumerate(itertools.islice(batches, count)):
        seen.add(i)
        host = batch.get() if hasattr(batch, "get") else batch.cpu().numpy()
        wrong += not np.array_equal(host, source.expected(k))
    return len(seen), wrong


def _calibrate(r: LessonRun, source: BatchSource, w: Any) -> int:
    """Matmuls per GPU step so that the step takes about as long as preparing a batch."""
    out = np.empty(source.shape, np.float32)
    [prep] = host_clock({"prep": lambda: source.prepare(1, out)}, 5, warmup=0.05).values()
    prep_s = float(np.median(prep))
    r.add(host_measurement(prep, calls=1, label="prepare one batch (host, NumPy)",
                           host_time=False, timer="host clock"))
    x = cudalab.asarray(source.expected(0))
    y = cudalab.empty((source.shape[0], w.shape[1]))
    flops = 2.0 * source.shape[0] * source.shape[1] * w.shape[1]
    m = r.measure("one step matmul", lambda: cudalab.matmul(x, w, out=y, precision="highest"),
                  flops=flops, ceiling="matmul_float32")
    return int(min(MAX_PASSES, max(1, round(prep_s / m.median))))


def _check_step(r: LessonRun, source: BatchSource, w: Any) -> None:
    x = source.expected(3)[:64]
    got = cudalab.matmul(cudalab.asarray(x), w, precision="highest").get()
    r.check("the step's matmul (64 rows) vs float64 NumPy",
            rel_error(got, x.astype(np.float64) @ w.get().astype(np.float64)),
            MATMUL_TOLERANCE)


def _variants(source: BatchSource, torch: Any, workers: Sequence[int]
              ) -> dict[str, tuple[Any, Any]]:
    """name -> (api, factory of an iterable of (index, device batch))."""
    api = Cudalab()
    pageable, pinned = HostLoader(source, False), HostLoader(source, True)
    out = {
        SYNC: (api, lambda: synchronous(pageable, api)),
        "synchronous, pinned staging": (api, lambda: synchronous(pinned, api)),
        "prefetch, restarting iterator (tutorial)": (api, lambda: Prefetcher(pinned, api, True)),
        PREFETCH: (api, lambda: Prefetcher(pinned, api)),
    }
    for n in workers:
        loader = HostLoader(source, True, workers=n)
        out[worker_label(n)] = (api, lambda loader=loader: Prefetcher(loader, api))
    if torch is not None:
        tapi = Torch(torch)
        tpageable = HostLoader(source, False)
        tpinned = HostLoader(source, True, tapi.pinned_empty)
        out["torch synchronous, pageable"] = (tapi, lambda: synchronous(tpageable, tapi))
        out["torch prefetch, one iterator"] = (tapi, lambda: Prefetcher(tpinned, tapi))
    return out


def _steps(w: Any, passes: int, torch: Any) -> dict[str, Any]:
    """The consumer's GPU work per batch, by implementation: `passes` float32 matmuls."""
    def ours(batch: Any) -> None:
        for _ in range(passes):
            cudalab.matmul(batch, w, precision="highest")

    steps = {"cudalab": ours}
    if torch is not None:
        tw = torch.from_dlpack(w)

        def theirs(batch: Any) -> None:
            with _precision.TorchTf32(torch, False):
                for _ in range(passes):
                    torch.mm(batch, tw)
        steps["torch"] = theirs
    return steps


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("prefetch", p, "batches", "rows", "features", "pool", "repeats")
    P.seed("prefetch", p)
    P.int_lists("prefetch", p, "workers")
    w = p["workers"]
    if len(set(w)) != len(w) or max(w) > MAX_WORKERS:
        raise ValueError(f"lesson 'prefetch': workers must be distinct counts from 1 to "
                         f"{MAX_WORKERS}, got {w!r}")
    m = p["monitor_s"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m <= MAX_MONITOR_S:
        raise ValueError(f"lesson 'prefetch': monitor_s must be a number of seconds from 0 to "
                         f"{MAX_MONITOR_S:g} (0: no GPU monitor), got {m!r}")


@lesson(13, "prefetch", title="A prefetching loader vs synchronous loading",
        seed="Guide 'PyTorch CUDA optimization': Asynchronous Copy Pattern (AsyncGPUDataLoader), "
             "pinned memory and num_workers in DataLoader, nvidia-smi logging; 'GPU idle, CPU "
             "overloaded' pitfall",
        params={"batches": 32, "rows": 4096, "features": 1024, "pool": 4, "repeats": 5,
                "workers": (1, 2, 4), "monitor_s": 1.5, "seed": 0},
        quick_params={"batches": 12, "rows": 2048, "repeats": 3, "monitor_s": 0.6},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    torch = r.torch()
    source = BatchSource(p["rows"], p["features"], p["batches"], p["pool"], p["seed"])
    w = cudalab.random.normal((p["features"], p["features"]), std=p["features"] ** -0.5,
                              seed=p["seed"] + 1)
    _check_step(r, source, w)
    passes = _calibrate(r, source, w)
    steps = _steps(w, passes, torch)
    variants = _variants(source, torch, p["workers"])
    n = p["batches"]
    consumed = {}
    for name, (api, make) in variants.items():
        consumed[name] = _consumed(make(), n, source)
        api.synchronize()
    for name in (k for k in variants if "restarting" not in k):
        r.check(f"{name}: consumed batches that differ from the produced ones",
                consumed[name][1], 0)

    def epoch(api: Any, make: Any) -> Any:
        step = steps[api.name]

        def run_epoch() -> None:
            _epoch(make(), n, step)
            api.synchronize()
        return run_epoch

    epochs = {k: epoch(*v) for k, v in variants.items()}
    times = host_clock(epochs, p["repeats"], warmup=r.timer.settings.warmup)
    m = {k: r.add(host_measurement(t, calls=n, label=k, host_time=False, timer=TIMER,
                                   metadata={"passes": passes}), k)
         for k, t in times.items()}
    best = min((worker_label(k) for k in p["workers"]), key=lambda k: m[k].median)
    util = _monitor(r, epochs, (SYNC, PREFETCH, best))
    for k, x in m.items():
        base = m["torch synchronous, pageable" if k.startswith("torch") else SYNC]
        r.row(case=k, impl="torch" if k.startswith("torch") else "cudalab",
              workers=next((c for c in p["workers"] if k == worker_label(c)), 0),
              ms_per_batch=x.median * 1e3, speedup=base.median / x.median,
              gpu_util_pct=util.get(k), distinct_batches=consumed[k][0],
              wrong_batches=consumed[k][1])
    _findings(r, m, consumed, passes)
    _nvidia_smi(r)


def _monitor(r: LessonRun, epochs: Mapping[str, Any], cases: Sequence[str]
             ) -> dict[str, Optional[float]]:
    """Mean GPU utilization (NVML, through GpuMonitor) while each case's loop runs for
    monitor_s seconds, one phase after the other; {} (and a finding that says why) when
    NVML is not available."""
    seconds = r.params["monitor_s"]
    if not seconds:
        r.finding("GPU utilization not measured (monitor_s=0); GpuMonitor would record it "
                  f"(the tutorial's `{SEED_LOG_COMMAND}` logs a text table, not CSV: "
                  f"`{CSV_LOG_COMMAND}` does)")
        return {}
    phases = {}
    try:
        mon = GpuMonitor(interval_ms=MONITOR_INTERVAL_MS)
        with mon:
            t0 = time.perf_counter()
            for case in cases:
                start = time.perf_counter() - t0
                while time.perf_counter() - t0 - start < seconds:
                    epochs[case]()
                phases[case] = (start, time.perf_counter() - t0)
    except NvmlError as exc:  # no nvidia-ml-py, no NVML, or a failed read: not the lesson's
        r.finding(f"GPU utilization not measured: {exc}. Without NVML, `{CSV_LOG_COMMAND}` "
                  f"logs it as CSV (the tutorial's `{SEED_LOG_COMMAND}` logs a text table)")
        return {}
    samples = mon.samples
    util = phase_means([(x.t_s, x.gpu_utilization_pct) for x in samples], phases,
                       UTIL_SETTLE_S)
    csv_rows = len(mon.to_csv().splitlines()) - 1  # the header line, then one row a sample
    parts = "; ".join(f"{case}: " + ("n/a" if util[case] is None else f"{util[case]:.0f}%")
                      for case in cases)
    r.finding(f"GPU utilization (mean of NVML samples every {MONITOR_INTERVAL_MS} ms, "
              f"{seconds:g} s per loop, the first {UTIL_SETTLE_S:g} s of each left out): "
              f"{parts}. GpuMonitor.to_csv() gives the {csv_rows} samples as the CSV "
              f"the tutorial's `{SEED_LOG_COMMAND}` meant to write; the nvidia-smi command "
              f"that writes CSV is `{CSV_LOG_COMMAND}`",
              value=util[cases[-1]], unit="%", labels=tuple(cases))
    return util


def _run_nvidia_smi(exe: str, *args: str) -> Optional[str]:
    """nvidia-smi's standard output, or None if it failed or took too long."""
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, check=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def _nvidia_smi(r: LessonRun) -> None:
    """The claim that the tutorial's logging command writes CSV, tested on one snapshot of
    what its loop repeats (only where nvidia-smi is on the PATH)."""
    exe = shutil.which("nvidia-smi")
    table = None if exe is None else _run_nvidia_smi(exe)
    if table is None:
        r.finding(f"nvidia-smi {'is not on the PATH' if exe is None else 'failed'}: the "
                  f"tutorial's `{SEED_LOG_COMMAND}` was not tried here (it writes nvidia-smi's "
                  f"text table every 100 ms; `{CSV_LOG_COMMAND}` writes CSV)")
        return
    good, bad = csv_rows(table)
    fixed = _run_nvidia_smi(exe, f"--query-gpu={CSV_QUERY}", "--format=csv")
    ok, wrong = csv_rows(fixed) if fixed is not None else (0, 0)
    after = (f"`{CSV_LOG_COMMAND}` gives {ok} CSV line(s) ({wrong} not)" if fixed is not None
             else f"`{CSV_LOG_COMMAND}` failed here")
    r.claim(f"`{SEED_LOG_COMMAND}` logs the GPU's usage as CSV", tutorial=None,
            measured=bad, unit="lines not CSV", held=bad == 0 and good > 1,
            why=f"one snapshot of what its loop writes (`nvidia-smi`): {bad} of {good + bad} "
                f"lines are not rows of a CSV table; {after}")


def _findings(r: LessonRun, m: dict, consumed: dict, passes: int) -> None:
    n = r.params["batches"]
    sync, pre = m[SYNC], m[PREFETCH]
    restart = m["prefetch, restarting iterator (tutorial)"]
    prep = r.measurements["prepare one batch (host, NumPy)"].median
    step = r.measurements["one step matmul"].median * passes
    gain = sync.median / pre.median
    o = overlap(prep, step, pre.median)
    r.finding(f"Prefetching: {pre.median * 1e3:.2f} ms per batch vs {sync.median * 1e3:.2f} ms "
              f"synchronous ({gain:.2f}x); with {prep * 1e3:.2f} ms of host preparation and a "
              f"{step * 1e3:.2f} ms GPU step per batch, {o.fraction:.0%} of the shorter is hidden",
              value=gain, unit="x", labels=(sync.label, pre.label, "one step matmul",
                                             "prepare one batch (host, NumPy)"))
    counts = r.params["workers"]
    per_batch = {0: pre.median, **{c: m[worker_label(c)].median for c in counts}}
    most = max(counts)
    r.finding(workers_text(per_batch, step, prep), value=pre.median / min(per_batch.values()),
              unit="x", labels=(pre.label, *(worker_label(c) for c in counts)))
    distinct, wrong = consumed[restart.label]
    r.finding(f"The restarting iterator took {restart.median * 1e3:.2f} ms per batch "
              f"({pre.median / restart.median:.2f}x the one-iterator speed) and delivered "
              f"{distinct} distinct batch(es) of {n}: {wrong} were not the batch due",
              value=wrong, unit="batches", labels=(restart.label, pre.label))
    r.claim("Prefetching on a side stream keeps the GPU fed while the host prepares data",
            tutorial=None, measured=gain, unit="x", held=gain >= PREFETCH_HELPS,
            why=f"{gain:.2f}x over synchronous loading (holds from {PREFETCH_HELPS}x)")
    ratio = per_batch[most] / step
    r.claim(f"DataLoader workers (num_workers={most} here: threads) prepare batches while the "
            f"GPU processes, so the GPU is no longer left idle", tutorial=None,
            measured=ratio, unit="x the GPU step", held=gpu_bound(per_batch[most], step),
            why=f"{most} workers: {per_batch[most] * 1e3:.2f} ms per batch, {ratio:.2f}x the "
                f"{step * 1e3:.2f} ms GPU step (GPU-bound up to {GPU_BOUND}x); without workers "
                f"{per_batch[0] / step:.2f}x")
    r.claim("The tutorial's AsyncGPUDataLoader yields the loader's batches in order",
            tutorial=None, measured=wrong, unit="wrong batches", held=wrong == 0,
            why=f"next(iter(loader)) restarts the loader: {distinct} distinct of {n}")


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = result.rows
    names = [x["case"] for x in rows]
    values = [x["ms_per_batch"] for x in rows]
    colors = ["tab:red" if x["wrong_batches"] else "tab:blue" for x in rows]
    ax.barh(names, values, color=colors)
    for i, x in enumerate(rows):
        if x["wrong_batches"]:
            ax.annotate(f"  {x['wrong_batches']} wrong batches", (values[i], i), fontsize=7,
                        va="center", color="tab:red")
        elif x.get("gpu_util_pct") is not None:
            ax.annotate(f"  GPU busy {x['gpu_util_pct']:.0f}%", (values[i], i), fontsize=7,
                        va="center")
    step = result.measurements.get("one step matmul")
    if step is not None and SYNC in result.measurements:
        passes = result.measurements[SYNC].metadata.get("passes", 1)
        ax.axvline(step.median * passes * 1e3, color="gray", linestyle="--", linewidth=1,
                   label="the GPU step alone")
        ax.legend(fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per batch (ms), host preparation + copy + GPU step")
