"""Lesson compilers on the GPU: the variants' rows and checks without compiling anything,
the status of the optional compilers said in findings, and torch's compile settings restored
after a quick run (tests/test_lessons_gpu.py runs the quick lesson itself)."""

from __future__ import annotations

import importlib

import pytest

from cudalab import lessons
from cudalab.bench import torch_cuda
from cudalab.lessons import compilers as C

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


def test_a_quick_run_restores_the_inductor_threads():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    config = importlib.import_module("torch._inductor.config")
    before = config.compile_threads
    r = lessons.run("compilers", quick=True, resnet_modes=())
    assert config.compile_threads == before
    assert any(x["variant"] == "compile default" for x in r.rows)
    assert any(t.startswith("MLP training step, batch 256: cudalab") for t in
               (f.text for f in r.findings))
    assert C.MLP_LOSS_TOL[r.params["mlp_precision"]] > 0
