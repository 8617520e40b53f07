"""CPU tier: run_threads, the thread runner of test_threads_gpu.py, keeps its
promises: every thread runs, an exception in a thread reaches the test (its
own error before the BrokenBarrierErrors it caused), and a stuck thread fails
the test at the deadline instead of hanging it."""

from __future__ import annotations

import threading
import time

import pytest

from test_threads_gpu import run_threads


def test_every_thread_runs_and_they_overlap():
    barrier = threading.Barrier(8, timeout=10)
    seen = []

    def worker(i):
        barrier.wait()  # only returns once all eight are running at once
        seen.append(i)

    run_threads(worker, 8, barrier=barrier)
    assert sorted(seen) == list(range(8))


def test_an_exception_in_a_thread_is_raised_with_its_cause_first():
    barrier = threading.Barrier(4, timeout=10)

    def worker(i):
        if i == 2:
            raise ValueError("thread two failed")
        barrier.wait()  # broken by thread 2's failure instead of waiting 10 s

    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="4 of 4 threads failed; thread 2: ValueError") as info:
        run_threads(worker, 4, barrier=barrier)
    assert isinstance(info.value.__cause__, ValueError)
    assert time.monotonic() - t0 < 5


def test_a_stuck_thread_fails_at_the_deadline():
    release = threading.Event()

    def worker(i):
        if i == 1:
            release.wait(30)  # stuck until the test lets it go

    t0 = time.monotonic()
    try:
        with pytest.raises(pytest.fail.Exception, match=r"still running after 0 s.*worker-1"):
            run_threads(worker, 3, timeout=0.3)
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
