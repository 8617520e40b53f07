"""`measure()`: time a callable on the GPU with CUDA events.

How a measurement runs (all on the current stream, or `stream`):

1. One call, then warm-up calls for `warmup` seconds (lazy initialisation,
   cuBLAS heuristics, pool growth, and the clock settling under load).
2. A probe: one call between two events gives a GPU-time estimate, and the
   host clock around the call gives the host (enqueue) time per call.
3. Calls per repeat (`number_per_run`): 1 for calls of 200 us or more, else
   enough back-to-back calls for a ~200 us repeat, so event resolution
   (~0.5 us) stays under 1%. With `flush_l2` every repeat is one cold call.
4. Repeats: [spin] [L2 flush] event, calls, event, enqueued in rounds of
   ~20 ms; for unheld calls each round is enqueued before the previous one
   is read, so the GPU never drains (an idle GPU cools down and clocks up: a power-capped GEMM
   looks faster with gaps than it runs back to back; on an H200 the fp16
   GEMM clock settles from 1980 MHz to ~1400 MHz within ~0.2 s of load).
   The spin is a one-thread kernel (cuda/prof/timing.cu) put before each repeat
   of launch-bound calls only (GPU time under 4x the host time per call): it
   holds the stream while the host enqueues the repeat, so the calls run
   back to back on the GPU and the time is the GPU's, free of launch gaps
   (nvbench's "blocking kernel"). Longer calls keep the queue full alone.
5. Stop when at least `min_run_time` seconds and `min_repeats` repeats are
   done and IQR / median <= `noise_threshold` ("converged"), or after
   `max_repeats` repeats, or when `max_run_time` is spent ("time_budget";
   the result then carries a warning if it is noisy).
6. A few repeats without the spin give the per-call time as a host-bound
   caller sees it; the difference is reported as `launch_gap`.

Timing work issued by other libraries: the events order with everything on
the same stream. cudalab's default stream is CUDA's legacy default stream,
which PyTorch and CuPy also use by default, so `measure(lambda: torch.mm(a,
b))` times torch's kernel the same way.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

from .. import _core
from ..devices import get_device_properties
from .measurement import Measurement

__all__ = ["measure"]

# A repeat of short calls aims at this much GPU time (event resolution ~0.5 us).
TARGET_REPEAT_S = 200e-6
MAX_CALLS_PER_REPEAT = 256
# Launches per held round (well under CUDA's queue of pending launches).
HELD_ROUND_LAUNCHES = 512
# Rounds of repeats between reads of the events (keeps the GPU fed).
ROUND_S = 0.02
# Calls are held behind a spin kernel when their GPU time is under this many
# times their host (enqueue) time; longer calls keep the queue full by
# themselves, and holding them would add idle gaps.
HOLD_RATIO = 4.0
# Unheld repeats used to estimate the launch gap.
UNHELD_REPEATS = 5

def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"measure() argument '{name}': expected a number, got {type(value).__name__}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"measure() argument '{name}': expected a number {bound}, got {value!r}")
    return float(value)


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"measure() argument '{name}': expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"measure() argument '{name}': expected an int >= 1, got {value}")
    return value


def _flush_l2(buffer: Any) -> None:
    """Overwrite `buffer` (read + write), evicting whatever the L2 held."""
    _core.add(buffer, 1, out=buffer)


def _nvml_clocks(device: int) -> dict[str, Any] | None:
    try:
        from .. import _nvml
    except ImportError:
        return None
    try:
        live = _nvml.sample(device)
    except Exception:  # a failing NVML must not fail a measurement; clocks are extra
        return None
    if not live:
        return None
    return {"sm_mhz": live.get("sm_clock_mhz"), "memory_mhz": live.get("memory_clock_mhz")}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _relative_iqr(values: list[float]) -> float:
    if len(values) < 4:
        return math.inf
    m = Measurement(label="", times=tuple(values))
    return m.relative_iqr


class _Round:
    """Events and host times of one enqueued round of repeats."""

    def __init__(self, starts: list, ends: list, host: list[float], calls: int) -> None:
        self.starts, self.ends, self.host, self.calls = starts, ends, host, calls

    @property
    def count(self) -> int:
        return len(self.starts)


class _Runner:
    """The timing loop of one measurement (state shared by its phases)."""

    def __init__(self, fn: Callable[..., Any], args: tuple, device: int, flush_l2: bool):
        self.fn = fn
        self.args = args
        self.device = device
        self.flush = flush_l2
        props = get_device_properties(device)
        self.props = props
        self.clock_hz = props.clock_rate_khz * 1e3
        # Twice the L2, allocated per measurement (the pool caches it), so a
        # measurement leaves memory_allocated() as it found it.
        self.flush_buffer = (_core.zeros(max(2 * props.l2_cache_size, 1 << 22), dtype="uint8")
                             if flush_l2 else None)

    def call(self) -> Any:
        return self.fn(*self.args)

    def probe(self) -> tuple[float, float]:
        """(GPU seconds, host seconds) of one call."""
        start, end = _core.Event(), _core.Event()
        if self.flush:
            _flush_l2(self.flush_buffer)
        start.record()
        t0 = time.perf_counter()
        self.call()
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3, host

    def enqueue(self, count: int, calls: int, spin_cycles: int) -> _Round:
        """Enqueue `count` repeats of `calls` calls; the GPU may still be busy."""
        starts = [_core.Event() for _ in range(count)]
        ends = [_core.Event() for _ in range(count)]
        host = []
        fn, args = self.fn, self.args
        for start, end in zip(starts, ends):
            if spin_cycles:
                _core._spin(spin_cycles)
            if self.flush:
                _flush_l2(self.flush_buffer)
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            host.append((time.perf_counter() - t0) / calls)
            end.record()
        return _Round(starts, ends, host, calls)

    @staticmethod
    def collect(round_: _Round) -> tuple[list[float], list[float]]:
        """Wait for a round; its times and host times, per call."""
        round_.ends[-1].synchronize()
        times = [s.elapsed_time(e) * 1e-3 / round_.calls for s, e in zip(round_.starts, round_.ends)]
        return times, round_.host

    def spin_cycles_for(self, host_per_call: float, calls: int) -> int:
        """Cycles that outlast enqueueing one repeat (1.5x margin + 30 us)."""
        seconds = 1.5 * (host_per_call * calls + 30e-6)
        seconds = min(max(seconds, 20e-6), 0.05)
        return int(seconds * self.clock_hz)


def _measure(
    fn: Callable[..., Any],
    args: tuple,
    *,
    warmup: float,
    min_run_time: float,
    max_run_time: float | None,
    min_repeats: int,
    max_repeats: int,
    noise_threshold: float,
    flush_l2: bool,
    hold: bool,
    stream: Any,
    flops: float | None,
    bytes: float | None,
    ceiling: Any,
    label: str | None,
    sub_label: str | None,
    description: str | None,
    metadata: dict[str, Any] | None,
    progress: Callable[[float], None] | None = None,
) -> tuple[Measurement, Any]:
    """`measure()`, also returning the result of fn's first call.

    `progress`, when given, is called after every round of repeats with an
    estimate of the fraction done (0..1), for progress bars.
    """
    if not callable(fn):
        raise TypeError(f"measure() argument 'fn': expected a callable, got {type(fn).__name__}")
    warmup = _check_positive("warmup", warmup, allow_zero=True)
    min_run_time = _check_positive("min_run_time", min_run_time)
    if max_run_time is None:
        max_run_time = max(5 * min_run_time, 1.0)
    max_run_time = _check_positive("max_run_time", max_run_time)
    if max_run_time < min_run_time:
        raise ValueError(
            f"measure() argument 'max_run_time': expected >= min_run_time ({min_run_time}), "
            f"got {max_run_time}"
        )
    min_repeats = _check_count("min_repeats", min_repeats)
    max_repeats = _check_count("max_repeats", max_repeats)
    if max_repeats < min_repeats:
        raise ValueError(
            f"measure() argument 'max_repeats': expected >= min_repeats ({min_repeats}), "
            f"got {max_repeats}"
        )
    noise_threshold = _check_positive("noise_threshold", noise_threshold)
    for name, value in (("flops", flops), ("bytes", bytes)):
        if value is not None:
            _check_positive(name, value, allow_zero=True)
    if stream is not None and not isinstance(stream, _core.Stream):
        raise TypeError(
            f"measure() argument 'stream': expected a cudalab.Stream or None, "
            f"got {type(stream).__name__}"
        )
    from .ceilings import resolve_ceiling  # ceilings measure through this module

    ceiling_name, ceiling_value, ceiling_unit = resolve_ceiling(ceiling, flops, bytes, check_only=True)
    if label is None:
        label = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if not _core.is_available():
        raise _core.NoDeviceError("measure(): no CUDA device is available")

    context = stream if stream is not None else _NullContext()
    with context:
        device = _core.current_device()
        runner = _Runner(fn, args, device, flush_l2)
        ceiling_name, ceiling_value, ceiling_unit = resolve_ceiling(ceiling, flops, bytes)

        # 1. first call and warm-up
        result = runner.call()
        t_end = time.perf_counter() + warmup
        while time.perf_counter() < t_end:
            runner.call()
        # 2. probe (twice: the first may still pay for lazy work)
        runner.probe()
        gpu_probe, host_probe = runner.probe()

        # 3. calls per repeat and the hold
        if flush_l2 or gpu_probe >= TARGET_REPEAT_S:
            calls = 1
        else:
            calls = min(MAX_CALLS_PER_REPEAT, max(1, math.ceil(TARGET_REPEAT_S / max(gpu_probe, 1e-7))))
        # Hold only launch-bound calls: when the GPU time per call is not well
        # above the host's, the host cannot keep the queue ahead on its own.
        held = hold and gpu_probe < HOLD_RATIO * host_probe
        host_per_call = host_probe

        # 4-5. timed rounds. Unheld rounds are double-buffered: round i+1 is
        # enqueued before round i is read, so the GPU never drains between
        # rounds (an idle GPU cools down and clocks up: a power-capped kernel
        # would look faster than it runs back to back). Held rounds are not:
        # each repeat's spin outlasts its enqueueing, so the GPU is slower than
        # the host there, and queueing ahead would fill CUDA's launch queue and
        # block the host inside a timed repeat. They are also kept short
        # (<= HELD_ROUND_LAUNCHES launches) for the same reason.
        times: list[float] = []
        host_times: list[float] = []
        repeat_s = max(gpu_probe * calls, host_probe * calls, 1e-6)
        round_size = max(1, min(100, int(ROUND_S / repeat_s)))
        if held:
            round_size = max(1, min(round_size, HELD_ROUND_LAUNCHES // (calls + 3)))
        t_begin = time.perf_counter()

        def enqueue(queued: int) -> _Round | None:
            if queued >= max_repeats:
                return None
            spin = runner.spin_cycles_for(host_per_call, calls) if held else 0
            return runner.enqueue(min(round_size, max_repeats - queued), calls, spin)

        def stop_reason_now() -> str | None:
            elapsed = time.perf_counter() - t_begin
            if progress is not None:
                progress(min(1.0, max(len(times) / max_repeats, elapsed / max_run_time,
                                      0.9 * min(1.0, elapsed / min_run_time))))
            if len(times) >= max_repeats:
                return "max_repeats"
            if (elapsed >= min_run_time and len(times) >= min_repeats
                    and _relative_iqr(times) <= noise_threshold):
                return "converged"
            if elapsed >= max_run_time and len(times) >= min(min_repeats, 4):
                return "time_budget"
            return None

        pending = enqueue(0)
        while True:
            following = None if held else enqueue(len(times) + pending.count)
            new_times, new_host = runner.collect(pending)
            times += new_times
            host_times += new_host
            host_per_call = max(host_per_call, statistics.median(new_host))
            stop_reason = stop_reason_now()
            if stop_reason is not None:
                if following is not None:  # already enqueued: valid repeats, keep them
                    new_times, new_host = runner.collect(following)
                    times += new_times
                    host_times += new_host
                break
            pending = following if not held else enqueue(len(times))

        # 6. launch gap: the same repeats without the hold
        launch_gap = None
        if held and not flush_l2:
            unheld, _ = runner.collect(runner.enqueue(UNHELD_REPEATS, calls, 0))
            launch_gap = max(0.0, _median(unheld) - _median(times))
        clocks = _nvml_clocks(device)

    measurement = Measurement(
        label=label,
        sub_label=sub_label,
        description=description,
        times=tuple(times),
        number_per_run=calls,
        host_time=_median(host_times),
        launch_gap=launch_gap,
        flops=None if flops is None else float(flops),
        bytes=None if bytes is None else float(bytes),
        ceiling_name=ceiling_name,
        ceiling_value=ceiling_value,
        ceiling_unit=ceiling_unit,
        device=runner.props.name,
        device_index=device,
        clocks=clocks,
        flush_l2=flush_l2,
        held=held,
        stop_reason=stop_reason,
        metadata=dict(metadata or {}),
    )
    return measurement, result


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def measure(
    fn: Callable[..., Any],
    *args: Any,
    warmup: float = 0.1,
    min_run_time: float = 0.2,
    max_run_time: float | None = None,
    min_repeats: int = 10,
    max_repeats: int = 10_000,
    noise_threshold: float = 0.02,
    flush_l2: bool = False,
    hold: bool = True,
    stream: Any = None,
    flops: float | None = None,
    bytes: float | None = None,
    ceiling: Any = "auto",
    label: str | None = None,
    sub_label: str | None = None,
    description: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Measurement:
    """Time ``fn(*args)`` on the GPU with CUDA events; return a `Measurement`.

    The module docstring of ``cudalab.bench.timer`` describes the method
    (warm-up, calls per repeat, the spin-kernel hold, the stop rule).

    Parameters
    ----------
    fn : callable
        Enqueues the GPU work to time (cudalab ops, or another library's on
        the same stream). Use ``functools.partial`` or a lambda for keywords.
    *args
        Positional arguments for `fn`.
    warmup : float, optional
        Seconds of warm-up calls after the first call (default 0.1).
    min_run_time : float, optional
        Seconds of timed repeats before the noise criterion may stop timing
        (default 0.2).
    max_run_time : float, optional
        The time budget: stop after this many seconds of timed repeats even
        when still noisy (default ``max(5 * min_run_time, 1.0)``).
    min_repeats, max_repeats : int, optional
        Bounds on the number of timed repeats (default 10 and 10,000).
    noise_threshold : float, optional
        Stop once IQR / median is at most this (default 0.02).
    flush_l2 : bool, optional
        Overwrite a buffer twice the L2 size before every repeat, so every
        call starts with a cold cache (one call per repeat then).
    hold : bool, optional
        Queue each repeat behind a spin kernel so calls run back to back on
        the GPU (default True); False times what a host-bound caller sees.
    stream : cudalab.Stream, optional
        Run and time on this stream (default: the current stream).
    flops, bytes : float, optional
        Work per call: FLOPs and bytes moved (read + written); they give the
        TFLOP/s and GB/s of the result.
    ceiling : str, Ceiling, or None, optional
        The measured ceiling to place the result against: a name of
        `cudalab.bench.CEILING_NAMES` (``"copy"``, ``"matmul_float16"``, ...;
        measured once per process), a `Ceiling`, or None. ``"auto"`` (default)
        uses ``"copy"`` when only `bytes` is given, else none.
    label, sub_label, description : str, optional
        Names for `Compare` (label defaults to fn's name).
    metadata : dict, optional
        Extra JSON-able context stored with the result.

    Returns
    -------
    Measurement

    Raises
    ------
    TypeError, ValueError
        A bad argument (named in the message).
    NoDeviceError
        No CUDA device is available.
    """
    measurement, _ = _measure(
        fn, args, warmup=warmup, min_run_time=min_run_time, max_run_time=max_run_time,
        min_repeats=min_repeats, max_repeats=max_repeats, noise_threshold=noise_threshold,
        flush_l2=flush_l2, hold=hold, stream=stream, flops=flops, bytes=bytes, ceiling=ceiling,
        label=label, sub_label=sub_label, description=description, metadata=metadata,
    )
    return measurement
