"""The pure logic of lessons 4 batching, 5 inplace, 7 access_patterns and 14 graphs,
without a GPU: finding and claim decisions from given numbers, break-even points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _common_b, batching, inplace


# ---- shared helpers -----------------------------------------------------------------


def test_rel_error_scales_by_the_reference():
    ref = np.array([1.0, -4.0, 2.0])
    assert _common_b.rel_error(ref, ref) == 0.0
    assert _common_b.rel_error(ref + [0.0, 0.4, 0.0], ref) == pytest.approx(0.1)
    assert _common_b.rel_error(np.ones(2), np.ones(3)) == math.inf
    assert _common_b.rel_error(np.full(2, 0.5), np.zeros(2)) == 0.5


def test_ratio_and_random_array():
    assert _common_b.ratio(6.0, 2.0) == 3.0
    assert _common_b.ratio(1.0, 0.0) == math.inf
    x = _common_b.random_array(3, (4, 5))
    assert x.dtype == np.float32 and x.shape == (4, 5) and np.all(x != 0)
    np.testing.assert_array_equal(x, _common_b.random_array(3, (4, 5)))


# ---- 4 batching ---------------------------------------------------------------------


def test_batching_is_registered_with_its_params():
    x = lessons.get("batching")
    assert x.number == 4 and x.plot is not None
    assert set(x.params) == {"batch", "sizes"}
    assert len(x.quick_params["sizes"]) < len(x.params["sizes"])


def test_batching_finding_names_the_winner():
    text = batching.compare_methods(64, loop_s=50e-6, batched_s=5e-6, graph_s=10e-6)
    assert "10.0x faster than the loop" in text and "graph-replayed loop is 5.0x" in text
    text = batching.compare_methods(1024, loop_s=100e-6, batched_s=95e-6, graph_s=99e-6)
    assert "about the same" in text and "changes little" in text
    text = batching.compare_methods(512, loop_s=10e-6, batched_s=30e-6, graph_s=10e-6)
    assert "the loop is 3.0x faster" in text


def test_batching_launch_overhead_never_negative():
    assert batching.launch_overhead(12e-6, 2e-6) == pytest.approx(10e-6)
    assert batching.launch_overhead(2e-6, 12e-6) == 0.0


def test_batching_reference_size_is_the_tutorials_or_closest():
    assert batching._reference_size((64, 256, 1024)) == 256
    assert batching._reference_size((512, 1024)) == 512
    assert batching._reference_size((64, 512)) == 64


# ---- 5 inplace ----------------------------------------------------------------------


def test_inplace_is_registered_with_its_params():
    x = lessons.get("inplace")
    assert x.number == 5 and x.plot is not None
    assert set(x.params) == {"sizes", "steps"}


def test_inplace_allocator_cost_per_extra_allocation():
    assert inplace.allocator_cost(30e-6, 10e-6, 13, 1) == pytest.approx(20e-6 / 12)
    assert inplace.allocator_cost(10e-6, 30e-6, 13, 1) is None  # not slower
    assert inplace.allocator_cost(30e-6, 10e-6, 1, 1) is None  # no extra allocations


def test_inplace_speed_finding_follows_the_threshold():
    assert "1.50x faster" in inplace.speed_finding(256, 1.5, 2e-6)
    assert "2.00 us per allocation" in inplace.speed_finding(256, 1.5, 2e-6)
    assert "same time" in inplace.speed_finding(8192, 1.01, None)
    assert "slower" in inplace.speed_finding(8192, 0.8, None)


def test_inplace_memory_finding_follows_the_threshold():
    mib = 2**20
    assert "3.00x the in-place" in inplace.memory_finding(2048, 48 * mib, 16 * mib)
    assert "peak alike" in inplace.memory_finding(2048, 17 * mib, 16 * mib)


def test_inplace_chains_match_numpy_reference_logic():
    # The NumPy reference applies relu(y * SCALE + SHIFT) `steps` times in float32.
    x = np.array([[-3.0, 1.0], [2.0, -0.1]], dtype=np.float32)
    y = inplace._numpy_chain(x, 2)
    one = np.maximum(x * 0.5 + 0.25, 0)
    np.testing.assert_allclose(y, np.maximum(one * 0.5 + 0.25, 0))
    assert y.dtype == np.float32


def test_inplace_pool_use_counts_peak_and_allocations():
    state = {"allocated": 100, "peak": 100, "count": 7}

    def fn():
        state["peak"] = 160
        state["count"] += 3
        return object()

    def reset():
        state["peak"] = state["allocated"]

    peak, allocs = inplace._pool_use(fn, lambda: state["allocated"], lambda: state["peak"],
                                     reset, lambda: state["count"], lambda: None)
    assert (peak, allocs) == (60, 3)
