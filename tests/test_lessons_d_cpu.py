"""Lessons pinned, streams, prefetch and roofline: their pure logic, without a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _overlap, roofline


# ---- overlap arithmetic ------------------------------------------------------------------

def test_overlap_full_partial_and_none():
    full = _overlap.overlap(2.0, 1.0, 2.0)  # the shorter task vanished entirely
    assert full.serialized == 3.0 and full.hidden == 1.0 and full.fraction == 1.0
    half = _overlap.overlap(2.0, 1.0, 2.5)
    assert half.hidden == pytest.approx(0.5) and half.fraction == pytest.approx(0.5)
    none = _overlap.overlap(1.0, 3.0, 4.0)
    assert none.hidden == 0.0 and none.fraction == 0.0
    worse = _overlap.overlap(1.0, 1.0, 2.5)  # overlapping cost time
    assert worse.hidden == pytest.approx(-0.5) and worse.fraction < 0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_overlap_rejects_non_positive_times(bad):
    with pytest.raises(ValueError, match="expected seconds > 0"):
        _overlap.overlap(bad, 1.0, 1.0)
    with pytest.raises(ValueError, match="'overlapped'"):
        _overlap.overlap(1.0, 1.0, bad)


def test_pipeline_bound_goes_from_the_sum_to_the_slowest_stage():
    stages = (3.0, 1.0, 2.0)
    assert _overlap.pipeline_bound(stages, 1) == pytest.approx(6.0)
    assert _overlap.pipeline_bound(stages, 2) == pytest.approx((6.0 + 3.0) / 2)
    assert _overlap.pipeline_bound(stages, 10_000) == pytest.approx(3.0, rel=1e-3)
    bounds = [_overlap.pipeline_bound(stages, c) for c in (1, 2, 4, 8, 16)]
    assert bounds == sorted(bounds, reverse=True)
    with pytest.raises(ValueError, match="'chunks'"):
        _overlap.pipeline_bound(stages, 0)
    with pytest.raises(ValueError, match="'stages'"):
        _overlap.pipeline_bound((), 2)
    with pytest.raises(ValueError, match="'stages'"):
        _overlap.pipeline_bound((1.0, -1.0), 2)


def test_max_rel_error():
    want = np.array([1.0, -4.0, 2.0])
    assert _overlap.max_rel_error(want, want) == 0.0
    assert _overlap.max_rel_error(want + [0.0, 0.4, 0.0], want) == pytest.approx(0.1)
    assert _overlap.max_rel_error(np.zeros(2), np.zeros(3)) == math.inf
    assert _overlap.max_rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert _overlap.max_rel_error(np.float32(3.0), 2.0) == pytest.approx(0.5)


# ---- roofline -------------------------------------------------------------------------------

PEAK = 100e12   # FLOP/s
BW = 2e12       # B/s: ridge at 50 FLOP/B
LAUNCH = 5e-6   # s


def test_ridge_point_and_attainable():
    assert roofline.ridge_point(PEAK, BW) == pytest.approx(50.0)
    assert roofline.attainable(10.0, PEAK, BW) == pytest.approx(20e12)  # on the slope
    assert roofline.attainable(500.0, PEAK, BW) == pytest.approx(PEAK)  # on the flat roof
    assert roofline.attainable(50.0, PEAK, BW) == pytest.approx(PEAK)
    with pytest.raises(ValueError):
        roofline.ridge_point(0.0, BW)


def test_classify_overhead_first():
    # 1 us for a tiny add: within 3 launch times, whatever the intensity says.
    p = roofline.classify(1e-6, 4096.0, 12 * 4096.0, PEAK, BW, LAUNCH)
    assert p.regime == "overhead-bound" and "launch" in p.why
    # Exactly at the threshold still counts; just above it does not.
    at = roofline.classify(roofline.OVERHEAD_LAUNCHES * LAUNCH, 1e6, 1e9, PEAK, BW, LAUNCH)
    assert at.regime == "overhead-bound"
    above = roofline.classify(roofline.OVERHEAD_LAUNCHES * LAUNCH * 1.01, 1e6, 1e9, PEAK, BW,
                              LAUNCH)
    assert above.regime != "overhead-bound"


def test_classify_memory_bound_by_bandwidth_and_by_intensity():
    nbytes = 1.2e9
    fast = roofline.classify(nbytes / (0.9 * BW), nbytes / 12, nbytes, PEAK, BW, LAUNCH)
    assert fast.regime == "memory-bound" and "copy bandwidth" in fast.why
    assert fast.pct_of_bandwidth == pytest.approx(90.0)
    assert fast.intensity == pytest.approx(1 / 12)
    assert fast.pct_of_roof == pytest.approx(90.0)
    # A slow low-intensity kernel (20% of bandwidth) is still memory-bound: below the ridge.
    slow = roofline.classify(nbytes / (0.2 * BW), nbytes / 12, nbytes, PEAK, BW, LAUNCH)
    assert slow.regime == "memory-bound" and "below the ridge" in slow.why


def test_classify_compute_bound_by_peak_and_by_intensity():
    flops = 2.0 * 8192 ** 3
    nbytes = 3 * 8192 ** 2 * 2.0
    fast = roofline.classify(flops / (0.7 * PEAK), flops, nbytes, PEAK, BW, LAUNCH)
    assert fast.regime == "compute-bound" and "of peak" in fast.why
    assert fast.pct_of_peak == pytest.approx(70.0) and fast.roof == PEAK
    slow = roofline.classify(flops / (0.1 * PEAK), flops, nbytes, PEAK, BW, LAUNCH)
    assert slow.regime == "compute-bound" and "above the ridge" in slow.why


def test_classify_same_numbers_differ_by_device():
    # The same kernel is memory-bound on a GPU with little bandwidth and
    # compute-bound on one with little compute: the label follows the roofs.
    seconds, flops, nbytes = 1e-3, 2e10, 1e9  # intensity 20
    slow_memory = roofline.classify(seconds, flops, nbytes, 1000e12, 1.5e12, LAUNCH)
    slow_compute = roofline.classify(seconds, flops, nbytes, 30e12, 10e12, LAUNCH)
    assert slow_memory.regime == "memory-bound"
    assert slow_compute.regime == "compute-bound"


def test_classify_rejects_bad_numbers():
    with pytest.raises(ValueError):
        roofline.classify(0.0, 1.0, 1.0, PEAK, BW, LAUNCH)
    with pytest.raises(ValueError):
        roofline.classify(1.0, 1.0, 0.0, PEAK, BW, LAUNCH)


# ---- registration --------------------------------------------------------------------------

@pytest.mark.parametrize("name,number", [("pinned", 11), ("streams", 12), ("roofline", 16)])
def test_lessons_registered_with_plot(name, number):
    x = lessons.get(name)
    assert x.number == number and x.plot is not None
    assert set(x.quick_params) <= set(x.params)
