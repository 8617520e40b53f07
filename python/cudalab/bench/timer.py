"""`Timer` and `measure()`: time a callable on the GPU with CUDA events.

How a measurement runs (all on the current stream, or `stream`), with the
numbers of the chosen preset (`cudalab.bench.presets`):

1. One call, then warm-up calls for `warmup` seconds of GPU time (lazy
   initialisation, cuBLAS heuristics, pool growth, and the clock settling
   under load), never more than one call queued ahead of the GPU.
2. A probe, twice (the first may still pay for lazy work): one call between
   two events gives a GPU-time estimate, and the host clock around the call
   gives the host (enqueue) time per call.
3. Calls per repeat (`number_per_run`): 1 for calls of 200 us or more, else
   enough back-to-back calls for a ~200 us repeat (at most 256), so event
   resolution (~0.5 us) stays under 1%. With `flush_l2` every repeat is one
   cold call.
4. The hold: when a call's GPU time is under 4x its host time (launch-bound
   calls), each repeat is put behind a one-thread spin kernel
   (cuda/prof/timing.cu) that outlasts the host's enqueueing of the repeat,
   so its calls run back to back on the GPU and the time is the GPU's, free
   of launch gaps (nvbench's "blocking kernel"). Longer calls keep the queue
   full by themselves and are not held (`hold=False` never holds).
5. Repeats are enqueued in rounds of about 20 ms of work (at most 100
   repeats): [spin] [L2 flush] event, calls, event, per repeat. How rounds
   are buffered depends on the hold:

   * unheld: double-buffered. Round i+1 is enqueued before the host waits
     for round i, so the GPU never drains between rounds (an idle GPU cools
     down and clocks up: a power-capped GEMM looks faster with gaps than it
     runs back to back).
   * held: single-buffered, and at most 512 launches per round. The spin
     of every repeat outlasts its enqueueing, so the GPU runs behind the
     host; queueing a second round ahead would fill CUDA's queue of pending
     launches and block the host inside a timed repeat. The GPU idles only
     while the host reads one round and enqueues the next.

6. Stop after a round when at least `min_run_time` seconds and `min_repeats`
   repeats are done and IQR / median <= `noise_threshold` ("converged"), at
   `max_repeats` repeats, or when `max_run_time` is spent ("time_budget";
   the result then carries a warning if it is noisy). A round already
   enqueued when timing stops is read and kept.
7. Held measurements then time 5 repeats without the spin: the per-call time
   a host-bound caller sees; the difference is reported as `launch_gap`.

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
from .measurement import Measurement, quartiles
from .presets import SETTING_NAMES, Preset, check_number, get_preset

__all__ = ["MEASURE_OPTIONS", "WORK_OPTIONS", "Timer", "measure"]

# A repeat of short calls aims at this much GPU time (event resolution ~0.5 us).
TARGET_REPEAT_S = 200e-6
MAX_CALLS_PER_REPEAT = 256
# Launches per held round (well under CUDA's queue of pending launches).
HELD_ROUND_LAUNCHES = 512
# Work per round of repeats, and the most repeats in one round.
ROUND_S = 0.02
ROUND_REPEATS = 100
# Calls are held behind a spin kernel when their GPU time is under this many
# times their host (enqueue) time.
HOLD_RATIO = 4.0
# Unheld repeats used to estimate the launch gap.
UNHELD_REPEATS = 5

# The keywords of measure(): the preset, its settings, how to run, and what the work is.
TIMING_OPTIONS = (*SETTING_NAMES, "hold", "stream")
WORK_OPTIONS = ("flops", "bytes", "ceiling", "label", "sub_label", "description", "metadata")
MEASURE_OPTIONS: tuple[str, ...] = ("preset", *TIMING_OPTIONS, *WORK_OPTIONS)

# How measure() turns its `ceiling` argument into (name, value, unit). The ceilings
# are measured through Timer, so cudalab.bench.ceilings imports this module; it
# installs its resolve_ceiling here when it loads (cudalab.bench imports it before
# any Timer can run) instead of this module importing it back.
_resolve_ceiling: Callable[..., tuple[Any, Any, Any]] | None = None


def set_ceiling_resolver(resolve: Callable[..., tuple[Any, Any, Any]]) -> None:
    """Install `resolve` (cudalab.bench.ceilings.resolve_ceiling) for measure()'s `ceiling`."""
    global _resolve_ceiling
    _resolve_ceiling = resolve


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


def _relative_iqr(values: list[float]) -> float:
    if len(values) < 4:
        return math.inf
    q1, median, q3 = quartiles(values)
    return (q3 - q1) / median if median > 0 else 0.0


class _Round:
    """Events and host times of one enqueued round of repeats."""

    def __init__(self, starts: list, ends: list, host: list[float], calls: int) -> None:
        self.starts, self.ends, self.host, self.calls = starts, ends, host, calls

    @property
    def count(self) -> int:
        return len(self.starts)

    def collect(self) -> tuple[list[float], list[float]]:
        """Wait for the round; its times and host times, per call."""
        self.ends[-1].synchronize()
        times = [s.elapsed_time(e) * 1e-3 / self.calls for s, e in zip(self.starts, self.ends)]
        return times, self.host


class _Runner:
    """The timing loop of one measurement: its phases share this state."""

    def __init__(self, fn: Callable[..., Any], args: tuple, device: int, settings: Preset,
                 hold: bool, progress: Callable[[float], None] | None) -> None:
        self.fn, self.args, self.device, self.settings = fn, args, device, settings
        self.hold, self.progress = hold, progress
        self.props = get_device_properties(device)
        self.clock_hz = self.props.clock_rate_khz * 1e3
        # Twice the L2, allocated per measurement (the pool caches it), so a
        # measurement leaves memory_allocated() as it found it.
        self.flush_buffer = (_core.zeros(max(2 * self.props.l2_cache_size, 1 << 22), dtype="uint8")
                             if settings.flush_l2 else None)
        self.times: list[float] = []
        self.host_times: list[float] = []
        self.calls = 1
        self.held = False
        self.host_per_call = 0.0

    def probe(self) -> tuple[float, float]:
        """(GPU seconds, host seconds) of one call."""
        start, end = _core.Event(), _core.Event()
        if self.flush_buffer is not None:
            _flush_l2(self.flush_buffer)
        start.record()
        t0 = time.perf_counter()
        self.fn(*self.args)
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3, host

    def warm_up(self) -> Any:
        """Steps 1-4: first call, warm-up, probes, calls per repeat and the hold."""
        result = self.fn(*self.args)
        # Warm up for `warmup` seconds of GPU time: keep at most one call
        # queued ahead of the GPU. A loop on the host clock alone would
        # enqueue calls as fast as they launch, up to the launch queue's
        # depth (about a thousand): seconds of backlog for a long call.
        t_end = time.perf_counter() + self.settings.warmup
        ahead = None
        while time.perf_counter() < t_end:
            self.fn(*self.args)
            done = _core.Event()
            done.record()
            if ahead is not None:
                ahead.synchronize()
            ahead = done
        self.probe()
        gpu, host = self.probe()
        if self.settings.flush_l2 or gpu >= TARGET_REPEAT_S:
            self.calls = 1
        else:
            self.calls = min(MAX_CALLS_PER_REPEAT, max(1, math.ceil(TARGET_REPEAT_S / max(gpu, 1e-7))))
        self.held = self.hold and gpu < HOLD_RATIO * host
        self.host_per_call = host
        repeat_s = max(gpu * self.calls, host * self.calls, 1e-6)
        self.round_size = max(1, min(ROUND_REPEATS, int(ROUND_S / repeat_s)))
        if self.held:
            self.round_size = max(1, min(self.round_size, HELD_ROUND_LAUNCHES // (self.calls + 3)))
        return result

    def spin_cycles(self) -> int:
        """Cycles that outlast enqueueing one repeat (1.5x margin + 30 us); 0 unheld."""
        if not self.held:
            return 0
        seconds = 1.5 * (self.host_per_call * self.calls + 30e-6)
        return int(min(max(seconds, 20e-6), 0.05) * self.clock_hz)

    def enqueue(self, count: int, spin_cycles: int) -> _Round:
        """Enqueue `count` repeats; the GPU may still be busy with earlier ones."""
        starts = [_core.Event() for _ in range(count)]
        ends = [_core.Event() for _ in range(count)]
        host = []
        fn, args, calls = self.fn, self.args, self.calls
        for start, end in zip(starts, ends):
            if spin_cycles:
                _core._spin(spin_cycles)
            if self.flush_buffer is not None:
                _flush_l2(self.flush_buffer)
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            host.append((time.perf_counter() - t0) / calls)
            end.record()
        return _Round(starts, ends, host, calls)

    def next_round(self, queued: int) -> _Round | None:
        if queued >= self.settings.max_repeats:
            return None
        return self.enqueue(min(self.round_size, self.settings.max_repeats - queued),
                            self.spin_cycles())

    def keep(self, round_: _Round) -> None:
        times, host = round_.collect()
        self.times += times
        self.host_times += host
        self.host_per_call = max(self.host_per_call, statistics.median(host))

    def stop_reason(self, elapsed: float) -> str | None:
        s, done = self.settings, len(self.times)
        if self.progress is not None:
            self.progress(min(1.0, max(done / s.max_repeats, elapsed / s.max_run_time,
                                       0.9 * min(1.0, elapsed / s.min_run_time))))
        if done >= s.max_repeats:
            return "max_repeats"
        if elapsed >= s.min_run_time and done >= s.min_repeats and _relative_iqr(self.times) <= s.noise_threshold:
            return "converged"
        if elapsed >= s.max_run_time and done >= min(s.min_repeats, 4):
            return "time_budget"
        return None

    def timed_rounds(self) -> str:
        """Steps 5-6: rounds until a stop reason (the buffering is in the module docstring)."""
        t_begin = time.perf_counter()
        pending = self.next_round(0)
        while True:
            following = None if self.held else self.next_round(len(self.times) + pending.count)
            self.keep(pending)
            reason = self.stop_reason(time.perf_counter() - t_begin)
            if reason is not None:
                if following is not None:  # already enqueued: valid repeats, keep them
                    self.keep(following)
                return reason
            pending = following if not self.held else self.next_round(len(self.times))

    def launch_gap(self) -> float | None:
        """Step 7: per-call time of unheld repeats minus the held median, floored at 0."""
        if not self.held or self.flush_buffer is not None:
            return None
        unheld, _ = self.enqueue(UNHELD_REPEATS, 0).collect()
        return max(0.0, statistics.median(unheld) - statistics.median(self.times))


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


class Timer:
    """A timing configuration: a named preset, overrides, and how to run.

    ``Timer("sustained").measure(fn, *args, flops=...)`` is
    ``measure(fn, *args, preset="sustained", flops=...)``; a Timer is made
    once and used for many measurements with the same settings. The module
    docstring of ``cudalab.bench.timer`` describes the method.

    Parameters
    ----------
    preset : str or Preset, optional
        ``"quick"``, ``"default"`` (default) or ``"sustained"`` (see
        `cudalab.bench.PRESETS`), or a `Preset`.
    warmup, min_run_time, max_run_time, min_repeats, max_repeats, noise_threshold, flush_l2 : optional
        Override the preset's value (None keeps it). A larger `min_run_time`
        without `max_run_time` raises the budget to ``5 * min_run_time``.
    hold : bool, optional
        Queue repeats of launch-bound calls behind a spin kernel so they run
        back to back on the GPU (default True); False times what a
        host-bound caller sees (use it for calls that synchronize, such as
        pageable copies).
    stream : cudalab.Stream, optional
        Run and time on this stream (default: the current stream).
    progress : callable, optional
        Called after every round of repeats with an estimate of the fraction
        of the measurement done (0..1), for progress bars.

    Attributes
    ----------
    settings : Preset
        The resolved settings (the preset with the overrides applied).
    hold, stream, progress
        As given.
    """

    def __init__(self, preset: str | Preset = "default", *, warmup: float | None = None,
                 min_run_time: float | None = None, max_run_time: float | None = None,
                 min_repeats: int | None = None, max_repeats: int | None = None,
                 noise_threshold: float | None = None, flush_l2: bool | None = None,
                 hold: bool = True, stream: Any = None,
                 progress: Callable[[float], None] | None = None) -> None:
        self._configure("Timer", preset, hold, stream, progress, warmup=warmup,
                        min_run_time=min_run_time, max_run_time=max_run_time,
                        min_repeats=min_repeats, max_repeats=max_repeats,
                        noise_threshold=noise_threshold, flush_l2=flush_l2)

    def _configure(self, func: str, preset: str | Preset, hold: bool, stream: Any,
                   progress: Callable[[float], None] | None, **overrides: Any) -> None:
        self._func = func
        self.settings = get_preset(preset, func).replace(func=func, **overrides)
        if not isinstance(hold, bool):
            raise TypeError(f"{func}() argument 'hold': expected a bool, got {type(hold).__name__}")
        if stream is not None and not isinstance(stream, _core.Stream):
            raise TypeError(f"{func}() argument 'stream': expected a cudalab.Stream or None, "
                            f"got {type(stream).__name__}")
        if progress is not None and not callable(progress):
            raise TypeError(f"{func}() argument 'progress': expected a callable or None, "
                            f"got {type(progress).__name__}")
        self.hold, self.stream, self.progress = hold, stream, progress

    def replace(self, **overrides: Any) -> Timer:
        """A Timer with these settings and `overrides` (any of the constructor's keywords
        but `preset`)."""
        options = {"hold": self.hold, "stream": self.stream, "progress": self.progress}
        options.update({k: overrides.pop(k) for k in list(overrides) if k in options})
        timer = Timer.__new__(Timer)
        timer._configure("Timer.replace", self.settings, **options, **overrides)
        return timer

    def to_dict(self) -> dict[str, Any]:
        """The settings as stored with every Measurement: the preset's fields and `hold`."""
        return {**self.settings.to_dict(), "hold": self.hold}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "name")
        return f"Timer({self.settings.name!r}, {fields})"

    def measure(self, fn: Callable[..., Any], *args: Any, flops: float | None = None,
                bytes: float | None = None, ceiling: Any = "auto", label: str | None = None,
                sub_label: str | None = None, description: str | None = None,
                metadata: dict[str, Any] | None = None) -> Measurement:
        """Time ``fn(*args)``; return a `Measurement` (keywords as for `measure`)."""
        measurement, _ = self.measure_result(
            fn, *args, flops=flops, bytes=bytes, ceiling=ceiling, label=label,
            sub_label=sub_label, description=description, metadata=metadata)
        return measurement

    def measure_result(self, fn: Callable[..., Any], *args: Any, flops: float | None = None,
                       bytes: float | None = None, ceiling: Any = "auto", label: str | None = None,
                       sub_label: str | None = None, description: str | None = None,
                       metadata: dict[str, Any] | None = None) -> tuple[Measurement, Any]:
        """`measure`, also returning the result of fn's first call (for checking it)."""
        resolve_ceiling = _resolve_ceiling
        func = self._func
        if not callable(fn):
            raise TypeError(f"{func}() argument 'fn': expected a callable, got {type(fn).__name__}")
        for name, value in (("flops", flops), ("bytes", bytes)):
            if value is not None:
                check_number(func, name, value, allow_zero=True)
        resolve_ceiling(ceiling, flops, bytes, check_only=True)
        if label is None:
            label = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        if not _core.is_available():
            raise _core.NoDeviceError(f"{func}(): no CUDA device is available")

        with self.stream if self.stream is not None else _NullContext():
            device = _core.current_device()
            runner = _Runner(fn, args, device, self.settings, self.hold, self.progress)
            ceiling_name, ceiling_value, ceiling_unit = resolve_ceiling(ceiling, flops, bytes)
            result = runner.warm_up()
            stop_reason = runner.timed_rounds()
            launch_gap = runner.launch_gap()
            clocks = _nvml_clocks(device)

        measurement = Measurement(
            label=label, sub_label=sub_label, description=description,
            times=tuple(runner.times), number_per_run=runner.calls,
            host_time=statistics.median(runner.host_times), launch_gap=launch_gap,
            flops=None if flops is None else float(flops),
            bytes=None if bytes is None else float(bytes),
            ceiling_name=ceiling_name, ceiling_value=ceiling_value, ceiling_unit=ceiling_unit,
            device=runner.props.name, device_index=device, clocks=clocks,
            flush_l2=self.settings.flush_l2, held=runner.held, stop_reason=stop_reason,
            settings=self.to_dict(), metadata=dict(metadata or {}),
        )
        return measurement, result


def measure(
    fn: Callable[..., Any],
    *args: Any,
    preset: str | Preset = "default",
    warmup: float | None = None,
    min_run_time: float | None = None,
    max_run_time: float | None = None,
    min_repeats: int | None = None,
    max_repeats: int | None = None,
    noise_threshold: float | None = None,
    flush_l2: bool | None = None,
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
    (warm-up, calls per repeat, the spin-kernel hold, buffering, the stop
    rule). ``measure(fn, *args, preset=p, **kw)`` is ``Timer(p, ...).measure(...)``.

    Parameters
    ----------
    fn : callable
        Enqueues the GPU work to time (cudalab ops, or another library's on
        the same stream). Use ``functools.partial`` or a lambda for keywords.
    *args
        Positional arguments for `fn`.
    preset : str or Preset, optional
        Named timing settings: ``"quick"``, ``"default"`` (default) or
        ``"sustained"``; `cudalab.bench.PRESETS` holds their numbers.
    warmup : float, optional
        Seconds of warm-up calls after the first call (default: the preset's;
        0.1 s in "default").
    min_run_time : float, optional
        Seconds of timed repeats before the noise criterion may stop timing
        (default: the preset's; 0.2 s in "default").
    max_run_time : float, optional
        The time budget: stop after this many seconds of timed repeats even
        when still noisy (default: the preset's, 1 s in "default"; at least
        ``5 * min_run_time`` when only `min_run_time` is given).
    min_repeats, max_repeats : int, optional
        Bounds on the number of timed repeats (default: the preset's, 10 and 10,000).
    noise_threshold : float, optional
        Stop once IQR / median is at most this (default: the preset's, 0.02).
    flush_l2 : bool, optional
        Overwrite a buffer twice the L2 size before every repeat, so every
        call starts with a cold cache (one call per repeat then).
    hold : bool, optional
        Queue each repeat of launch-bound calls behind a spin kernel so they
        run back to back on the GPU (default True); False times what a
        host-bound caller sees.
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
        A bad argument (named in the message), before any GPU work.
    NoDeviceError
        No CUDA device is available.
    """
    timer = Timer.__new__(Timer)
    timer._configure("measure", preset, hold, stream, None, warmup=warmup,
                     min_run_time=min_run_time, max_run_time=max_run_time,
                     min_repeats=min_repeats, max_repeats=max_repeats,
                     noise_threshold=noise_threshold, flush_l2=flush_l2)
    return timer.measure(fn, *args, flops=flops, bytes=bytes, ceiling=ceiling, label=label,
                         sub_label=sub_label, description=description, metadata=metadata)
