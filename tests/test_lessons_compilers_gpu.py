"""Lesson compilers on the GPU: the variants' rows and checks without compiling anything
(cheap under compute-sanitizer too), and the status of the optional compilers said in
findings (tests/test_lessons_gpu.py runs the quick lesson itself, torch.compile included)."""

from __future__ import annotations

import pytest

from cudalab import lessons
from cudalab.bench import torch_cuda

pytestmark = pytest.mark.gpu


def test_without_compiled_modes_every_uncompiled_variant_has_a_row():
    r = lessons.run("compilers", quick=True, batch_sizes=(1, 3), compile_batch_sizes=(3,),
                    resnet_modes=(), mlp_modes=())
    got = {(x["part"], x["impl"], x["variant"], x["batch"]) for x in r.rows}
    for b in (1, 3):
        assert {("resnet50", "cudalab", "eager", b), ("resnet50", "cudalab", "graph", b)} <= got
    assert {("mlp step", "cudalab", "eager", 256), ("mlp step", "cudalab", "graph", 256)} <= got
    assert all(x["setup_s"] >= 0 and x["ms"] > 0 for x in r.rows)
    assert all(c.passed for c in r.checks) and len(r.checks) >= 5
    texts = [f.text for f in r.findings]
    assert any(t.startswith("ONNX Runtime: ") for t in texts)
    assert any(t.startswith("TensorRT: ") for t in texts)
    assert any(t.startswith("This run left out") for t in texts)
    if torch_cuda() is None:
        assert any("only cudalab's side ran" in t for t in texts)
    else:
        assert ("mlp step", "torch", "eager", 256) in got
