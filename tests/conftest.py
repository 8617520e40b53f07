"""Shared pytest setup for cudalab.

* Tests marked ``gpu`` (the marker is declared in pyproject.toml) are skipped
  when ``cudalab.is_available()`` is False; with ``CUDALAB_REQUIRE_GPU=1`` in the
  environment that skip becomes a failure, so a GPU run can never pass by
  silently skipping its GPU tier.
* ``rng``: a NumPy Generator seeded from the test's node id, so a failing test
  sees the same data on every run.
* ``memory_baseline``: a clean device pool for memory tests.
"""

from __future__ import annotations

import gc
import hashlib
import os

import numpy as np
import pytest

import cudalab


def _gpu_available() -> bool:
    try:
        return bool(cudalab.is_available())
    except Exception:  # is_available() must never raise; treat it as "no GPU"
        return False


def _gpu_required() -> bool:
    return os.environ.get("CUDALAB_REQUIRE_GPU", "").strip() == "1"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, with CUDALAB_REQUIRE_GPU=1, fail) ``gpu`` tests without a GPU.

    Runs before fixture setup, so GPU-only fixtures never run without a GPU.
    """
    if item.get_closest_marker("gpu") is None:
        return
    if _gpu_available():
        return
    if _gpu_required():
        pytest.fail(
            "CUDALAB_REQUIRE_GPU=1 but cudalab.is_available() is False: "
            f"GPU test {item.nodeid} cannot run (no CUDA device or driver visible "
            "to cudalab); refusing to skip it",
            pytrace=False,
        )
    pytest.skip("needs a CUDA device (cudalab.is_available() is False)")


def _seed_from_nodeid(nodeid: str) -> int:
    return int.from_bytes(hashlib.sha256(nodeid.encode("utf-8")).digest()[:8], "little")


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A NumPy Generator seeded from the test's node id (reproducible per test)."""
    return np.random.default_rng(_seed_from_nodeid(request.node.nodeid))


@pytest.fixture
def memory_baseline():
    """Drop cached pool memory and yield ``memory_allocated()`` as the baseline.

    Afterwards the per-process memory fraction is reset to 1.0, even when the
    test failed, so one test's limit cannot leak into the next.
    """
    gc.collect()
    cudalab.synchronize()
    cudalab.empty_cache()
    try:
        yield cudalab.memory_allocated()
    finally:
        cudalab.set_per_process_memory_fraction(1.0)
        gc.collect()
        cudalab.synchronize()
