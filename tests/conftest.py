"""Shared pytest setup for cudalab.

* The ``gpu`` marker comes from cudalab's pytest plugin
  (``cudalab.pytest_plugin``, loaded through its entry point once cudalab is
  installed): tests marked ``gpu`` are skipped when ``cudalab.is_available()``
  is False; with ``CUDALAB_REQUIRE_GPU=1`` in the environment that skip becomes
  a failure, so a GPU run can never pass by silently skipping its GPU tier.
* ``rng``: a NumPy Generator seeded from the test's node id, so a failing test
  sees the same data on every run.
* ``memory_baseline``: a clean device pool for memory tests.
* ``restore_precision``: the float32 matmul precision is put back afterwards.
* ``restore_padding``: the matmul padding mode is put back afterwards.
* ``no_profile_left_running``: no profile keeps recording after the test
  (modules use it with ``pytest.mark.usefixtures``).
* ``CUDALAB_TEST_SHARD=k/n`` runs only the k-th of n parts of the suite (whole
  test files, about equal test counts): a GPU machine lent for a few minutes at a
  time runs the tier in n calls (scripts/gpu_check.sh; gpu_summary.py adds up
  their JUnit files).

Helpers that are not fixtures (random arrays, strided views, tolerances,
argument-error assertions, skips) live in ``_support.py``.
"""

from __future__ import annotations

import gc
import hashlib
import os

import numpy as np
import pytest

import cudalab
from _support import parse_shard, shard_of_files


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Load cudalab's pytest plugin if its entry point did not.

    Installing cudalab registers the plugin (the `gpu` marker and its skip,
    the `gpu_benchmark` fixture); with PYTEST_DISABLE_PLUGIN_AUTOLOAD set it
    is not loaded, so load it here. Registering it while options are being
    collected lets its own options take part. ``-p no:cudalab`` is respected.
    """
    if not pluginmanager.has_plugin("cudalab") and not pluginmanager.is_blocked("cudalab"):
        from cudalab import pytest_plugin

        pluginmanager.register(pytest_plugin, "cudalab")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    spec = os.environ.get("CUDALAB_TEST_SHARD", "").strip()
    if not spec:
        return
    k, n = parse_shard(spec)
    counts: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        counts[path] = counts.get(path, 0) + 1
    shard = shard_of_files(counts, n)
    keep, drop = [], []
    for item in items:
        (keep if shard[item.nodeid.split("::")[0]] == k else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


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


@pytest.fixture
def restore_precision():
    """Put the float32 matmul precision back after the test, even if it failed."""
    saved = cudalab.get_float32_matmul_precision()
    try:
        yield
    finally:
        cudalab.set_float32_matmul_precision(saved)


@pytest.fixture
def restore_padding():
    """Put the matmul padding mode back after the test, even if it failed."""
    saved = cudalab.get_matmul_padding()
    try:
        yield
    finally:
        cudalab.set_matmul_padding(saved)


@pytest.fixture
def no_profile_left_running():
    """A failing test must not leave a profile recording for the next one."""
    yield
    if cudalab._core._profiler_is_enabled():
        cudalab._core._profiler_disable()
