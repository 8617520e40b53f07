"""The 3-stream copy/compute/copy pipeline gives the same values as NumPy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import cudalab

pytestmark = pytest.mark.gpu

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_pipeline.py"


def _pipeline():
    spec = importlib.util.spec_from_file_location("bench_pipeline", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pipeline


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    erf_v = np.vectorize(erf)
    return 0.5 * x * (1.0 + erf_v(x / sqrt(2.0)))


@pytest.mark.parametrize("nstreams", [1, 3])
def test_pipeline_matches_numpy(rng, nstreams):
    n = 100_003  # not a multiple of the chunk count: the last chunk is longer
    host_in = cudalab.pinned_empty(n, dtype=np.float32)
    host_in[:] = rng.standard_normal(n, dtype=np.float32)
    host_out = cudalab.pinned_empty(n, dtype=np.float32)
    host_out[:] = np.nan  # every element must be written
    streams = [cudalab.Stream() for _ in range(nstreams)]
    _pipeline()(cudalab, streams, host_in, host_out, chunks=7)
    ref = _gelu(2.0 * host_in.astype(np.float64) + 1.0)
    assert np.isfinite(host_out).all()
    err = np.linalg.norm(host_out - ref) / np.linalg.norm(ref)
    assert err < 1e-5
