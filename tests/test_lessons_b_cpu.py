"""The pure logic of lessons 4 batching, 5 inplace, 7 access_patterns and 14 graphs,
without a GPU: finding and claim decisions from given numbers, break-even points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _common_b, batching


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
