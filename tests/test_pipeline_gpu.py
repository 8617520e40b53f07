"""The 3-stream copy/compute/copy pipeline gives the same values as NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from _support import REPO_ROOT, assert_close, gelu_reference, load_module, random_array

pytestmark = pytest.mark.gpu


def _pipeline():
    return load_module(REPO_ROOT / "benchmarks" / "bench_pipeline.py").pipeline


@pytest.mark.parametrize("nstreams", [1, 3])
def test_pipeline_matches_numpy(rng, nstreams):
    n = 100_003  # not a multiple of the chunk count: the last chunk is longer
    host_in = cudalab.pinned_empty(n, dtype=np.float32)
    host_in[:] = random_array(rng, n, np.float32)
    host_out = cudalab.pinned_empty(n, dtype=np.float32)
    host_out[:] = np.nan  # every element must be written: a NaN left fails assert_close
    streams = [cudalab.Stream() for _ in range(nstreams)]
    _pipeline()(cudalab, streams, host_in, host_out, chunks=7)
    assert_close(host_out, gelu_reference(2.0 * host_in.astype(np.float64) + 1.0), np.float32)
