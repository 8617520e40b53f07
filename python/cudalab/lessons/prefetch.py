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
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

import numpy as np

import cudalab
from cudalab import _precision
from cudalab.bench import host_clock, host_measurement
from cudalab.prefetch import CudalabCalls, StagingRing
from cudalab.prefetch import Prefetcher as SharedPrefetcher

from ._measuring import rel_error
from ._overlap import overlap
from . import _params as P
from .registry import LessonRun, lesson

# Normalization constants of the host-side preparation (uint8 -> float32).
MEAN = 127.5
INV_STD = 1.0 / 64.0
# Pinned staging buffers per loader: one being filled, one being copied.
SLOTS = 2
# The GPU step is this many matmuls at most, sized to take about as long as
# the host preparation (where prefetching has the most to hide).
MAX_PASSES = 64
# Prefetching at least this many times faster than synchronous loading: the
# claim "prefetch while the GPU processes" holds.
PREFETCH_HELPS = 1.1
MATMUL_TOLERANCE = 1e-5
TIMER = "host clock around a whole epoch + synchronize, per batch"

ROW_KEYS = ("case", "impl", "ms_per_batch", "speedup", "distinct_batches", "wrong_batches")


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
    """An iterable over (index, host batch), like a DataLoader without workers.

    Without `pinned`, every batch is a new pageable array. With it, batches
    are prepared into the loader's ring of SLOTS pinned staging buffers
    (cudalab.prefetch.StagingRing: allocated once, since page-locking is slow
    and freeing pinned memory waits for the whole device) that every
    iterator shares, so a restarted iterator takes the next buffer of the
    ring, not a new one. A buffer is refilled only after the event its last
    reader handed to `release`.
    """

    def __init__(self, source: BatchSource, pinned: bool, pinned_empty: Any = None) -> None:
        self.source, self.pinned = source, pinned
        allocate = None if pinned_empty is None else (lambda shape, dtype: pinned_empty(shape))
        self.ring = StagingRing([(source.shape, np.float32)], SLOTS, allocate=allocate)

    def release(self, host: np.ndarray, event: Any) -> None:
        """`host`, if one of the staging buffers, may be refilled once `event` completed."""
        self.ring.release(host, event)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        src = self.source
        for i in range(src.batches):
            out = self.ring.acquire()[0] if self.pinned else np.empty(src.shape, np.float32)
            yield i, src.prepare(i, out)


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


def _variants(source: BatchSource, torch: Any) -> dict[str, tuple[Any, Any]]:
    """name -> (api, factory of an iterable of (index, device batch))."""
    api = Cudalab()
    pageable, pinned = HostLoader(source, False), HostLoader(source, True)
    out = {
        "synchronous, pageable": (api, lambda: synchronous(pageable, api)),
        "synchronous, pinned staging": (api, lambda: synchronous(pinned, api)),
        "prefetch, restarting iterator (tutorial)": (api, lambda: Prefetcher(pinned, api, True)),
        "prefetch, one iterator": (api, lambda: Prefetcher(pinned, api)),
    }
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


@lesson(13, "prefetch", title="A prefetching loader vs synchronous loading",
        seed="Guide 'PyTorch CUDA optimization': Asynchronous Copy Pattern (AsyncGPUDataLoader), "
             "pinned memory in DataLoader; 'GPU idle, CPU overloaded' pitfall",
        params={"batches": 32, "rows": 4096, "features": 1024, "pool": 4, "repeats": 5,
                "seed": 0},
        quick_params={"batches": 12, "rows": 2048, "repeats": 3},
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
    variants = _variants(source, torch)
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

    times = host_clock({k: epoch(*v) for k, v in variants.items()}, p["repeats"],
                       warmup=r.timer.settings.warmup)
    m = {k: r.add(host_measurement(t, calls=n, label=k, host_time=False, timer=TIMER,
                                   metadata={"passes": passes}), k)
         for k, t in times.items()}
    for k, x in m.items():
        base = m["torch synchronous, pageable" if k.startswith("torch") else
                 "synchronous, pageable"]
        r.row(case=k, impl="torch" if k.startswith("torch") else "cudalab",
              ms_per_batch=x.median * 1e3, speedup=base.median / x.median,
              distinct_batches=consumed[k][0], wrong_batches=consumed[k][1])
    _findings(r, m, consumed, passes)


def _findings(r: LessonRun, m: dict, consumed: dict, passes: int) -> None:
    n = r.params["batches"]
    sync, pre = m["synchronous, pageable"], m["prefetch, one iterator"]
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
    distinct, wrong = consumed[restart.label]
    r.finding(f"The restarting iterator took {restart.median * 1e3:.2f} ms per batch "
              f"({pre.median / restart.median:.2f}x the one-iterator speed) and delivered "
              f"{distinct} distinct batch(es) of {n}: {wrong} were not the batch due",
              value=wrong, unit="batches", labels=(restart.label, pre.label))
    r.claim("Prefetching on a side stream keeps the GPU fed while the host prepares data",
            tutorial=None, measured=gain, unit="x", held=gain >= PREFETCH_HELPS,
            why=f"{gain:.2f}x over synchronous loading (holds from {PREFETCH_HELPS}x)")
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
    ax.invert_yaxis()
    ax.set_xlabel("time per batch (ms), host preparation + copy + GPU step")
