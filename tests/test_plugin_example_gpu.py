"""An example of cudalab's pytest plugin: benchmark GPU code inside ordinary tests.

Copy this file to start benchmarking your own GPU code. Installing cudalab
gives pytest the ``gpu`` marker (skip without a GPU) and the ``gpu_benchmark``
fixture: ``result = gpu_benchmark(fn, *args, **measure_options)`` times
``fn(*args)`` with ``cudalab.bench.measure`` and returns the result of fn's
first call, so each test still checks that the GPU computed the right thing.

    python -m pytest tests/test_plugin_example_gpu.py --gpu-benchmark-json base.json
    # ... change something, then:
    python -m pytest tests/test_plugin_example_gpu.py \\
        --gpu-benchmark-compare base.json --gpu-benchmark-compare-fail 10%
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import cudalab as cl

pytestmark = pytest.mark.gpu


def test_matmul(gpu_benchmark):
    rng = np.random.default_rng(20261122)
    m, k, n = 1031, 777, 529  # odd sizes: no tile divides them
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    da, db = cl.asarray(a), cl.asarray(b)

    matmul = functools.partial(cl.matmul, precision="highest")  # true float32, not TF32
    c = gpu_benchmark(matmul, da, db, flops=2.0 * m * n * k)

    expected = a.astype(np.float64) @ b.astype(np.float64)
    error = np.linalg.norm(c.get() - expected) / np.linalg.norm(expected)
    assert error < 1e-5
    timing = gpu_benchmark.measurements[0]
    assert timing.tflops is not None and timing.tflops > 0


def test_add(gpu_benchmark):
    rng = np.random.default_rng(7)
    n = 3 * 1_000_003
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    da, db = cl.asarray(a), cl.asarray(b)

    # bytes read + written per call give GB/s and, by default, the share of
    # the measured device-to-device copy bandwidth.
    c = gpu_benchmark(cl.add, da, db, bytes=3 * 4 * n)

    np.testing.assert_array_equal(c.get(), a + b)
    timing = gpu_benchmark.measurements[0]
    assert timing.gbps is not None and timing.percent_of_ceiling is not None
