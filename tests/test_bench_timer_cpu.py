"""cudalab.bench's timing loop without a GPU: a simulated device checks what timer.py promises.

A stand-in for cudalab._core keeps a simulated GPU clock: every call of the
timed function, spin kernel or L2 flush adds its duration to the clock, and
an event records the clock when it is enqueued. The loop then measures
exactly the simulated durations, so the tests can check the calls per
repeat, the hold, how rounds are buffered (double-buffered unheld,
single-buffered and at most 512 launches held), the stop rules and the
settings stored with the result, on any machine.
"""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from cudalab.bench import Timer
from cudalab.bench import timer as T

CLOCK_HZ = 1e9


class FakeGPU:
    """The simulated device: a clock, and a log of rounds enqueued and collected."""

    def __init__(self) -> None:
        self.t = 0.0
        self.log: list[tuple] = []
        self.launches = 0

    def run(self, seconds: float) -> None:
        self.t += seconds
        self.launches += 1


def fake_core(gpu: FakeGPU) -> types.SimpleNamespace:
    class Event:
        def record(self):
            self.t = gpu.t

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    class Stream:
        pass

    return types.SimpleNamespace(
        Event=Event, Stream=Stream, is_available=lambda: True, current_device=lambda: 0,
        _spin=lambda cycles: gpu.run(cycles / CLOCK_HZ),
        add=lambda buf, value, out=None: gpu.run(1e-6), zeros=lambda n, dtype=None: object(),
        NoDeviceError=RuntimeError)


@pytest.fixture
def gpu(monkeypatch):
    device = FakeGPU()
    monkeypatch.setattr(T, "_core", fake_core(device))
    props = types.SimpleNamespace(name="Fake GPU", clock_rate_khz=CLOCK_HZ / 1e3, l2_cache_size=1 << 20)
    monkeypatch.setattr(T, "get_device_properties", lambda index: props)
    monkeypatch.setattr(T, "_nvml_clocks", lambda index: {"sm_mhz": 1000, "memory_mhz": 2000})

    enqueue, collect = T._Runner.enqueue, T._Round.collect

    def logged_enqueue(self, count, spin_cycles):
        before = device.launches
        round_ = enqueue(self, count, spin_cycles)
        device.log.append(("enqueue", count, device.launches - before))
        return round_

    def logged_collect(self):
        device.log.append(("collect", self.count))
        return collect(self)

    monkeypatch.setattr(T._Runner, "enqueue", logged_enqueue)
    monkeypatch.setattr(T._Round, "collect", logged_collect)
    return device


def work(gpu: FakeGPU, seconds) -> callable:
    """A timed function: each call puts `seconds` (or the next of a sequence) on the GPU."""
    durations = iter(seconds) if not isinstance(seconds, float) else None

    def fn():
        gpu.run(next(durations) if durations is not None else seconds)
        return "first"
    return fn


def outstanding_at_collects(log: list[tuple]) -> list[int]:
    """Rounds enqueued but not yet collected, at each collect of the timed loop."""
    pending, seen = 0, []
    for entry in log:
        if entry[0] == "enqueue":
            pending += 1
        else:
            seen.append(pending)
            pending -= 1
    return seen


def test_long_calls_are_timed_one_per_repeat_unheld_and_double_buffered(gpu):
    timer = Timer("quick", warmup=0.0, min_run_time=0.005)
    m, first = timer.measure_result(work(gpu, 1e-3), flops=2e9, ceiling=None)
    assert first == "first"
    assert m.median == pytest.approx(1e-3) and m.number_per_run == 1
    assert not m.held and m.launch_gap is None
    assert m.stop_reason == "converged" and m.repeats >= 10
    assert m.tflops == pytest.approx(2.0)
    # Unheld: the next round is always enqueued before the host waits for the current one.
    waits = outstanding_at_collects(gpu.log)
    assert waits[:-1] == [2] * (len(waits) - 1) and waits[-1] == 1
    assert m.clocks == {"sm_mhz": 1000, "memory_mhz": 2000}
    assert m.settings == {**timer.settings.to_dict(), "hold": True}
    assert m.device == "Fake GPU"


def test_short_calls_are_batched_held_and_single_buffered(gpu):
    m = Timer("quick", warmup=0.0).measure(work(gpu, 1e-7), ceiling=None)
    assert m.number_per_run == T.MAX_CALLS_PER_REPEAT  # 200 us of 0.1 us calls, capped
    assert m.median == pytest.approx(1e-7)
    assert m.held and m.launch_gap == pytest.approx(0.0, abs=1e-12)
    timed = [e for e in gpu.log if e[0] == "enqueue"][:-1]  # the last round is the launch gap's
    assert all(launches <= T.HELD_ROUND_LAUNCHES for _, _, launches in timed)
    # Each held repeat: one spin kernel, then its calls.
    assert all(launches == count * (T.MAX_CALLS_PER_REPEAT + 1) for _, count, launches in timed)
    # Held: every round is read before the next one is enqueued.
    assert set(outstanding_at_collects(gpu.log)) == {1}


def test_hold_false_never_holds(gpu):
    m = Timer("quick", warmup=0.0, hold=False).measure(work(gpu, 1e-7), ceiling=None)
    assert not m.held and m.launch_gap is None and m.settings["hold"] is False


def test_exact_repeats_like_cli_iterations(gpu):
    timer = Timer("quick", warmup=0.0, min_repeats=25, max_repeats=25, min_run_time=1e-6,
                  max_run_time=1e9)
    m = timer.measure(work(gpu, 1e-3), ceiling=None)
    assert m.repeats == 25 and m.stop_reason in ("max_repeats", "converged")


def test_noisy_work_stops_at_the_time_budget_with_a_warning(gpu):
    # The budget is host time: with no repeat limit in reach, only it can stop
    # the loop, however fast this machine runs the simulated work.
    durations = np.random.default_rng(0).uniform(1e-3, 3e-3, 1000)
    m = Timer("quick", warmup=0.0, min_run_time=0.01, max_run_time=0.02,
              max_repeats=10**9).measure(work(gpu, itertools.cycle(durations)), ceiling=None)
    assert m.stop_reason == "time_budget"
    assert m.noisy and "noisy" in m.warning


def test_flush_l2_times_single_cold_calls(gpu):
    m = Timer("quick", warmup=0.0, flush_l2=True).measure(work(gpu, 1e-6), ceiling=None)
    assert m.flush_l2 and m.number_per_run == 1 and m.launch_gap is None
    assert m.median == pytest.approx(1e-6)  # the flush runs before the start event


def test_progress_is_reported_between_0_and_1(gpu):
    seen = []
    Timer("quick", warmup=0.0, progress=seen.append).measure(work(gpu, 1e-3), ceiling=None)
    assert seen and all(0.0 <= f <= 1.0 for f in seen)


def test_measure_uses_the_named_preset(gpu):
    m = T.measure(work(gpu, 1e-3), preset="quick", warmup=0.0, ceiling=None, label="x")
    assert m.settings["name"] == "quick" and m.label == "x"


def test_warm_up_keeps_at_most_one_call_queued_ahead_of_the_gpu(gpu, monkeypatch):
    # Events know how many launches preceded them; synchronizing on one marks
    # those launches done. A call queued while N earlier ones are not known to
    # be done would wait behind N calls on a real GPU.
    done = [0]
    base = T._core.Event

    class Event(base):
        def record(self):
            super().record()
            self.launches = gpu.launches

        def synchronize(self):
            done[0] = max(done[0], getattr(self, "launches", 0))

    monkeypatch.setattr(T._core, "Event", Event)
    warming, ahead = [True], []
    probe = T._Runner.probe

    def first_probe_ends_warm_up(self):
        warming[0] = False
        return probe(self)

    monkeypatch.setattr(T._Runner, "probe", first_probe_ends_warm_up)

    def fn():
        if warming[0]:
            ahead.append(gpu.launches - done[0])
        gpu.run(5e-3)

    Timer("quick", warmup=0.02, min_run_time=0.005).measure(fn)
    assert len(ahead) > 10  # many warm-up calls (instant on the host here)
    # Once the loop runs, each call waits for the one two back to finish (the
    # very first call has no event of its own, hence 2 once).
    assert max(ahead) <= 2 and max(ahead[3:]) <= 1
