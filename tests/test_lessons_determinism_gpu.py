"""GPU tier: what lesson 29 `determinism` rests on. cudalab's reductions, softmax and
matmuls give bit-identical results run after run on random, odd-sized inputs (and the right
ones, against NumPy); nn.fusion.forget() makes the next step measure its problems again."""

from __future__ import annotations

import numpy as np
import pytest
from _support import F16, F32, random_array, rel_err

import cudalab
import cudalab.nn as nn
from cudalab.lessons import determinism as D
from cudalab.nn import fusion

pytestmark = pytest.mark.gpu

RUNS = 6


def _repeat(fn):
    t = D.tally(lambda: fn().get(), RUNS)
    assert t.runs == RUNS
    return t


@pytest.mark.parametrize("op", D.REDUCTIONS)
@pytest.mark.parametrize("n", [1, 1_000_003, 9_000_011])
def test_reductions_repeat_bit_for_bit(rng, op, n):
    host = random_array(rng, (n,), F32, low=0.5, high=1.5)
    a = cudalab.asarray(host)
    t = _repeat(lambda: getattr(cudalab, op)(a))
    assert t.count == 1
    assert rel_err(t.distinct[0], getattr(np, op)(host.astype(np.float64))) < 1e-5


@pytest.mark.parametrize("axis", [0, 1])
def test_axis_reductions_and_softmax_repeat_bit_for_bit(rng, axis):
    host = random_array(rng, (517, 1031), F32)
    a = cudalab.asarray(host)
    t = _repeat(lambda: cudalab.sum(a, axis=axis))
    assert t.count == 1 and rel_err(t.distinct[0], host.astype(np.float64).sum(axis)) < 1e-5
    t = _repeat(lambda: cudalab.softmax(a, axis=axis))
    x = host.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    assert t.count == 1 and rel_err(t.distinct[0], e / e.sum(axis=axis, keepdims=True)) < 1e-5


@pytest.mark.parametrize("mode", list(D.MATMUL_MODES))
def test_matmul_repeats_bit_for_bit(rng, mode):
    dtype, precision = D.MATMUL_MODES[mode]
    ha = random_array(rng, (131, 67), F16 if dtype == "float16" else F32)
    hb = random_array(rng, (67, 129), F16 if dtype == "float16" else F32)
    a, b = cudalab.asarray(ha), cudalab.asarray(hb)
    t = _repeat(lambda: cudalab.matmul(a, b, precision=precision))
    assert t.count == 1
    want = ha.astype(np.float64) @ hb.astype(np.float64)
    assert rel_err(t.distinct[0], want) < D.MATMUL_TOL[mode]


def test_forget_measures_again_on_the_next_step(monkeypatch):
    monkeypatch.setattr(fusion, "_mode", "auto")
    monkeypatch.setattr(fusion, "_measured", {})
    sizes = (40, 72, 56, 24)
    model = nn.MLP(sizes, "gelu", seed=3)
    opt = nn.SGD(model.parameters(), lr=D.LR, momentum=D.MOMENTUM)
    [(x, labels)] = list(nn.TeacherData(sizes[0], sizes[-1], 37, batches=1, seed=1))
    fusion.forget()  # the teacher network that made the labels ran a GELU layer of its own
    nn.train_step(model, opt, x, labels, "fp32")
    first = fusion.decisions()
    assert len(first) == 4  # 2 GELU layers forward, 2 input gradients through a GELU
    fusion.forget()
    assert fusion.decisions() == {}
    nn.train_step(model, opt, x, labels, "fp32")
    assert set(fusion.decisions()) == set(first)
    cudalab.synchronize()
