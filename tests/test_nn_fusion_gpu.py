"""GPU tier: nn.fusion. The fused (epilogue) and split (GEMM + GELU kernel)
forms give the same forward and backward in every precision; "auto" measures
each problem once, outside captures only."""

from __future__ import annotations

import numpy as np
import pytest
from _support import F32, random_array, rel_err

import cudalab
import cudalab.nn as nn
from cudalab.nn import fusion

pytestmark = pytest.mark.gpu

SIZES = (40, 72, 56, 24)
ROWS = 37
TOL = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 1e-2, "bf16": 3e-2}


@pytest.fixture(autouse=True)
def restore_fusion(monkeypatch):
    monkeypatch.setattr(fusion, "_mode", "auto")
    monkeypatch.setattr(fusion, "_measured", {})


def forward_backward(rng_seed, precision):
    rng = np.random.default_rng(rng_seed)
    model = nn.MLP(SIZES, "gelu", seed=5)
    x = cudalab.asarray(random_array(rng, (ROWS, SIZES[0]), F32))
    labels = cudalab.asarray(rng.integers(0, SIZES[-1], ROWS))
    logits = model.forward(x, precision)
    out = logits.astype(np.float32).get()
    nn.functional.cross_entropy(logits, labels, grad=logits)
    model.backward(logits)
    return out, [p.grad.get() for p in model.parameters()]


@pytest.mark.parametrize("precision", list(nn.PRECISIONS))
def test_fused_and_split_agree(precision):
    results = {}
    for mode in ("fused", "split"):
        fusion.set_gelu_fusion(mode)
        results[mode] = forward_backward(11, precision)
    (lf, gf), (ls, gs) = results["fused"], results["split"]
    assert rel_err(ls, lf) < TOL[precision]
    for a, b in zip(gs, gf):
        assert rel_err(a, b) < TOL[precision]


def test_auto_measures_each_problem_once():
    forward_backward(3, "bf16")
    made = fusion.decisions()
    # 2 GELU layers forward; the 2 input-gradient GEMMs that apply a GELU derivative.
    assert sorted(k[0] for k in made) == ["gelu backward"] * 2 + ["gelu forward"] * 2
    for d in made.values():
        assert d["fused_ms"] > 0 and d["split_ms"] > 0
        assert d["fused"] == (d["fused_ms"] <= d["split_ms"])
    forward_backward(4, "bf16")
    assert fusion.decisions() == made


def test_nothing_is_measured_inside_a_capture():
    model = nn.MLP(SIZES, "gelu", seed=5)
    x = cudalab.random.normal((ROWS, SIZES[0]), dtype=np.float32)
    fusion.set_gelu_fusion("fused")
    want = model.forward(x, "fp32").get()  # buffers and plans made outside the capture
    fusion.set_gelu_fusion("auto")
    assert not cudalab.is_current_stream_capturing()
    g = cudalab.CUDAGraph()
    with cudalab.graph(g):
        assert cudalab.is_current_stream_capturing()
        y = model.forward(x, "fp32")
    assert not cudalab.is_current_stream_capturing()
    assert fusion.decisions() == {}
    g.replay()
    assert rel_err(y.get(), want) < 1e-6
