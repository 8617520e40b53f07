"""GPU tier: blocking copies and synchronizes release the GIL.

A copy into pageable host memory (get(), asarray of a NumPy array, the RNG's
seed read-back) waits for the stream inside the CUDA call itself; holding the
GIL there would freeze every other Python thread (a watchdog, a data loader,
a progress bar) for as long as the GPU is busy. Each test keeps the stream
busy with a spin kernel, makes the blocking call, and checks that a helper
thread ran Python code meanwhile.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import cudalab
from cudalab import _core

pytestmark = pytest.mark.gpu

# How long the spin kernel keeps the stream busy: long against a thread switch (5 ms).
BUSY_S = 0.3


def _busy_stream() -> None:
    clock_hz = cudalab.get_device_properties().clock_rate_khz * 1e3
    _core._spin(int(BUSY_S * clock_hz))


def _ticks_during(call) -> int:
    """How many times a helper thread ran a Python loop while `call()` ran."""
    ticks = 0
    stop = threading.Event()
    started = threading.Event()

    def count() -> None:
        nonlocal ticks
        started.set()
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    helper = threading.Thread(target=count)
    helper.start()
    started.wait(5)
    try:
        cudalab.synchronize()
        _busy_stream()
        before = ticks
        t0 = time.perf_counter()
        call()
        waited = time.perf_counter() - t0
        during = ticks - before
    finally:
        stop.set()
        helper.join(5)
    # The call really waited for the spin: otherwise the test proves nothing.
    assert waited > BUSY_S / 3, f"the call returned after {waited:.3f} s: it did not wait"
    return during


def test_get_into_pageable_memory_lets_other_threads_run():
    a = cudalab.asarray(np.arange(1, 1001, dtype=np.float32))
    assert _ticks_during(a.get) > 10


def test_asarray_from_pageable_memory_lets_other_threads_run():
    host = np.arange(1, 4 * 2**20 + 1, dtype=np.float32)
    assert _ticks_during(lambda: cudalab.asarray(host)) > 10


def test_synchronize_lets_other_threads_run():
    assert _ticks_during(cudalab.synchronize) > 10
