"""Lesson compilers without a GPU: registration, every parameter check, the pure functions
behind its rows and findings, labels and their torch pairing, the optional compilers' status,
the findings and claims from given numbers, and the notebook text."""

from __future__ import annotations

import types

import pytest

import cudalab
from cudalab import lessons
from cudalab.lessons import compilers as C
from cudalab.lessons import registry
from cudalab.lessons.versus import versus_torch

from _support import fake_measurement, no_gpu_only

# ---- registration and parameters -------------------------------------------------------------


def test_registered_as_lesson_28_with_plot_twin_and_check():
    x = lessons.get("compilers")
    assert x.number == 28 and x.plot is not None and x.torch_twin is C.torch_twin_label
    assert x.check is C.check_params and set(x.quick_params) <= set(x.params)


def test_full_defaults_fit_the_budget_and_quick_skips_resnet_compiles():
    x = lessons.get("compilers")
    full, quick = C.check_params(x.defaults(False)), C.check_params(x.defaults(True))
    assert full["compile_batches"] == (128,) and full["batches"] == (1, 128)
    assert full["resnet_modes"] == C.FULL_RESNET_MODES == ("default", "jit", "onnxruntime")
    assert "max-autotune" not in full["resnet_modes"] and "tensorrt" not in full["resnet_modes"]
    assert full["mlp_modes"] == ("default",)  # max-autotune: minutes on a fresh cache
    assert full["precision"] == "fp16" and full["sizes"] == (256, 1024, 1024, 16)
    assert quick["resnet_modes"] == () and quick["mlp_modes"] == ()  # no compile in seconds
    assert quick["batches"] == (8,) and quick["sizes"] == (64, 256, 16)


def _p(**over):
    return {**lessons.get("compilers").defaults(True), **over}


@pytest.mark.parametrize("over,match", [
    ({"batch_sizes": (0,)}, r"batch_sizes: each batch size must be in 1..256, got 0"),
    ({"batch_sizes": ()}, r"batch_sizes: expected at least one batch size"),
    ({"batch_sizes": "8"}, r"batch_sizes: expected integers, got '8'"),
    ({"compile_batch_sizes": (300,)}, r"compile_batch_sizes: each batch size must be in"),
    ({"compile_batch_sizes": (16,)}, r"compile_batch_sizes must be among batch_sizes \(8,\)"),
    ({"precision": "fp8"}, r"precision: unknown precision 'fp8'"),
    ({"resnet_modes": ("default", "fast")}, r"resnet_modes must be a sequence of distinct names"),
    ({"resnet_modes": ("jit", "jit")}, r"resnet_modes must be a sequence of distinct"),
    ({"resnet_modes": "default"}, r"resnet_modes must be a sequence"),
    ({"mlp_modes": ("jit",)}, r"mlp_modes must be a sequence of distinct names among default, "
                              r"reduce-overhead, max-autotune"),
    ({"hidden": ()}, r"hidden must be a non-empty sequence"),
    ({"in_features": 0}, r"layer sizes must be ints >= 1"),
    ({"classes": 1}, r"classes must be >= 2"),
    ({"batch": 0}, r"batch must be an int >= 1"),
    ({"mlp_precision": "fp16"}, r"mlp_precision must be one of fp32, tf32, bf16 \(fp16 needs"),
    ({"lr": 0}, r"lr must be a number in \(0, 1\)"),
    ({"lr": True}, r"lr must be a number"),
    ({"seed": -1}, r"seed must be an int >= 0"),
])
def test_every_parameter_is_checked(over, match):
    with pytest.raises(ValueError, match=match):
        C.check_params(_p(**over))


def test_the_error_names_lessons_run_before_the_gpu():
    with pytest.raises(ValueError, match=r"^lessons\.run\(\): lesson 'compilers': mlp_modes"):
        lessons.run("compilers", quick=True, mlp_modes=("nope",))


def test_empty_mode_lists_and_aliases_are_taken():
    got = C.check_params(_p(resnet_modes=(), mlp_modes=(), precision="float16",
                            batch_sizes=(1, 8), compile_batch_sizes=(8, 1)))
    assert got["resnet_modes"] == () and got["mlp_modes"] == () and got["precision"] == "fp16"
    assert got["compile_batches"] == (8, 1)
    every = C.check_params(_p(resnet_modes=C.RESNET_MODES, mlp_modes=C.MLP_MODES))
    assert every["resnet_modes"] == C.RESNET_MODES


def test_cli_set_values_parse_to_mode_tuples():
    from cudalab.cli.lessons import parse_value

    assert parse_value("default,max-autotune", C.FULL_RESNET_MODES) == ("default", "max-autotune")
    assert parse_value("", C.FULL_MLP_MODES) == ()
    p = registry.resolve_params(lessons.get("compilers"),
                                {"resnet_modes": parse_value("tensorrt", ())}, quick=True)
    assert p["resnet_modes"] == ("tensorrt",)


@no_gpu_only
def test_run_without_a_gpu_raises_after_the_checks():
    with pytest.raises(cudalab.NoDeviceError, match=r"^lessons\.run\(\): no CUDA device"):
        lessons.run("compilers", quick=True)


# ---- pure functions ---------------------------------------------------------------------------


def test_setup_cost_subtracts_the_warm_calls_and_never_goes_negative():
    assert C.setup_cost(10.0, 3, 0.5) == pytest.approx(8.5)
    assert C.setup_cost(1e-3, 3, 1e-3) == 0.0


@pytest.mark.parametrize("part,impl,variant,want", [
    ("resnet", "cudalab", "eager", None),
    ("resnet", "cudalab", "graph", ("cudalab", "eager")),
    ("mlp", "cudalab", "graph", ("cudalab", "eager")),
    ("resnet", "torch", "eager", None),
    ("resnet", "torch", "channels_last", None),
    ("resnet", "torch", "graph", ("torch", "channels_last")),
    ("resnet", "torch", "compile default", ("torch", "channels_last")),
    ("resnet", "torch", "jit", ("torch", "channels_last")),
    ("resnet", "onnxruntime", "onnxruntime", ("torch", "channels_last")),
    ("resnet", "tensorrt", "tensorrt", ("torch", "channels_last")),
    ("mlp", "torch", "eager", None),
    ("mlp", "torch", "compile max-autotune", ("torch", "eager")),
])
def test_baseline_of(part, impl, variant, want):
    assert C.baseline_of(part, impl, variant) == want


@pytest.mark.parametrize("args,label", [
    (("resnet", "cudalab", "eager", 1), "resnet eager b1"),
    (("resnet", "cudalab", "graph", 128), "resnet graph b128"),
    (("resnet", "torch", "compile default", 128), "torch resnet compile default b128"),
    (("resnet", "onnxruntime", "onnxruntime", 8), "onnxruntime resnet b8"),
    (("resnet", "tensorrt", "tensorrt", 8), "tensorrt resnet b8"),
    (("mlp", "cudalab", "graph", 1024), "mlp step graph"),
    (("mlp", "torch", "compile default", 1024), "torch mlp step compile default"),
])
def test_variant_labels(args, label):
    assert C.variant_label(*args) == label


@pytest.mark.parametrize("label,twin", [
    ("torch resnet channels_last b8", "resnet eager b8"),
    ("torch resnet jit b128", "resnet eager b128"),
    ("torch resnet compile max-autotune b128", "resnet graph b128"),
    ("torch mlp step compile default", "mlp step graph"),
    ("torch resnet eager b8", None),
    ("torch mlp step eager", None),
])
def test_torch_twin_label(label, twin):
    assert C.torch_twin_label(label) == twin


def test_break_even_text():
    n, text = C.break_even_text("torch resnet compile default b128", 40.0, "torch channels_last",
                                2e-3, 1.5e-3)
    assert n == 80001 and "pays off after 80,001 calls" in text and "40.00 s" in text
    n, text = C.break_even_text("x", 1.0, "y", 1e-3, 2e-3)
    assert n is None and "never pays off" in text


@pytest.mark.parametrize("ours,theirs,word", [(1.0, 1.5, "cudalab 1.50x faster"),
                                              (1.0, 1.0, "level"),
                                              (1.0, 0.5, "torch.compile 2.00x faster")])
def test_versus_text(ours, theirs, word):
    ratio, text = C.versus_text("b128", "graph", ours, "torch.compile default", theirs)
    assert ratio == pytest.approx(theirs / ours) and text.endswith(word)
    assert "vs torch.compile default" in text


def test_why_text_tells_fusion_from_launches():
    gain, text = C.why_text("b1", "default", 2e-3, 1.9e-3, 1e-3)
    assert gain == pytest.approx(2e-3 / 1.9e-3) and "launch-bound" in text
    assert "reduce-overhead, max-autotune" in text
    _, text = C.why_text("b128", "default", 2e-3, 1.5e-3, 1.98e-3)
    assert "compile wins by fused kernels" in text and "CUDA graph of the eager" not in text
    _, text = C.why_text("b1", "max-autotune", 2e-3, 0.9e-3, 1e-3)
    assert "replayed from CUDA graphs" in text
    _, text = C.why_text("b128", "default", 2e-3, 2e-3, None)
    assert "no gain" in text


def test_backend_status_says_not_installed_here():
    for module, name in (("onnxruntime", "onnxruntime"), ("tensorrt", "torch_tensorrt")):
        try:
            __import__(name)
        except ImportError:
            ok, why = C.backend_status(module)
            assert not ok and why.startswith(f"{name} not installed")


def test_backend_status_needs_the_cuda_provider(monkeypatch):
    fake = types.SimpleNamespace(__version__="1.0",
                                 get_available_providers=lambda: ["CPUExecutionProvider"])
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", fake)
    ok, why = C.backend_status("onnxruntime")
    assert not ok and "without CUDAExecutionProvider" in why and "onnxruntime-gpu" in why
    fake.get_available_providers = lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert C.backend_status("onnxruntime") == (True, "onnxruntime 1.0")


def test_failure_text_keeps_the_first_line():
    text = C.failure_text("jit at batch 8", RuntimeError("bad op\nmore detail"))
    assert text == "jit at batch 8 failed, so it has no row: RuntimeError: bad op"


def test_left_out_text_says_what_and_how():
    text = C.left_out_text(C.FULL_RESNET_MODES, C.FULL_MLP_MODES, False)
    assert "reduce-overhead, max-autotune, tensorrt" in text and "max-autotune benchmarks" in text
    assert "--set resnet_modes=reduce-overhead,max-autotune,tensorrt" in text
    assert "--set mlp_modes=reduce-overhead" in text
    text = C.left_out_text((), ("default",), True)
    assert "quick mode skips torch.compile of ResNet-50" in text
    assert C.left_out_text(C.RESNET_MODES, C.MLP_MODES, False) == "Every compiled mode ran"


def test_tolerances_cover_every_precision():
    from cudalab.lessons import resnet as R

    assert set(C.TOL_VS_CUDALAB) == set(R.PRECISIONS)
    assert set(C.MLP_LOSS_TOL) == set(C.MLP_PRECISIONS)


def test_compiling_uses_every_core_then_restores_and_resets(monkeypatch):
    import os
    import sys

    config = types.SimpleNamespace(compile_threads=3)
    resets = []
    monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    monkeypatch.setitem(sys.modules, "torch._dynamo",
                        types.SimpleNamespace(reset=lambda: resets.append(1)))
    with pytest.raises(RuntimeError, match="inside"):
        with C.compiling(None):
            assert config.compile_threads == (os.cpu_count() or 1)
            raise RuntimeError("inside")
    assert config.compile_threads == 3 and resets == [1]


# ---- rows, findings and claims from given numbers ---------------------------------------------


def _variants():
    """A run's variants with made-up times: cudalab graph fastest, compile beating eager."""
    times = [("resnet", "cudalab", "eager", 1, 2.0e-3, 1.0), ("resnet", "cudalab", "graph", 1,
                                                              1.0e-3, 1.2),
             ("resnet", "torch", "channels_last", 1, 4.0e-3, 2.0),
             ("resnet", "torch", "graph", 1, 1.5e-3, 2.2),
             ("resnet", "cudalab", "eager", 128, 20e-3, 1.0),
             ("resnet", "cudalab", "graph", 128, 19e-3, 1.0),
             ("resnet", "torch", "channels_last", 128, 30e-3, 2.0),
             ("resnet", "torch", "graph", 128, 29e-3, 2.0),
             ("resnet", "torch", "compile default", 128, 25e-3, 40.0),
             ("resnet", "onnxruntime", "onnxruntime", 128, 27e-3, 15.0),
             ("mlp", "cudalab", "eager", 1024, 0.3e-3, 0.5),
             ("mlp", "cudalab", "graph", 1024, 0.2e-3, 0.6),
             ("mlp", "torch", "eager", 1024, 0.6e-3, 0.5),
             ("mlp", "torch", "compile default", 1024, 0.4e-3, 8.0)]
    out = []
    for part, impl, variant, b, median, first in times:
        m = fake_measurement(C.variant_label(part, impl, variant, b), median=median)
        out.append(C.Variant(part, impl, variant, b, m, first + C.FIRST_CALLS * median,
                             C.HOST if impl == "onnxruntime" else C.EVENTS))
    return out


def _recorder(variants):
    x = lessons.get("compilers")
    r = registry.LessonRun(x, x.defaults(False), quick=False)
    for v in variants:
        r.add(v.m)
    return r


def test_rows_break_even_findings_and_claims_from_given_numbers():
    variants = _variants()
    r = _recorder(variants)
    cfg = C.check_params(r.params)
    C._rows_and_break_even(r, variants)
    C._versus_findings(r, variants, cfg)
    C._claims(r, variants, cfg)
    assert len(r.rows) == len(variants) and all(set(x) == set(C.ROW_KEYS) for x in r.rows)
    row = next(x for x in r.rows if x["variant"] == "compile default" and x["part"] == "resnet50")
    assert row["setup_s"] == pytest.approx(40.0) and row["vs"] == "torch channels_last"
    assert row["break_even_calls"] == 8001  # 40 s / (30 - 25) ms saved per call, + 1
    assert next(x for x in r.rows if x["impl"] == "cudalab" and x["variant"] == "eager"
                )["break_even_calls"] is None
    texts = [f.text for f in r.findings]
    assert any(t.startswith("torch resnet compile default b128: 40.00 s to get ready")
               for t in texts)
    assert not any(t.startswith("torch resnet graph") for t in texts), "a graph is no compiler"
    assert any("onnxruntime resnet b128" in t for t in texts)
    assert any(t.startswith("ResNet-50 fp16 batch 128: cudalab graph 19.000 ms vs "
                            "torch.compile default 25.000 ms: cudalab 1.32x faster")
               for t in texts)
    assert any(t.startswith("MLP training step, batch 1024: cudalab graph") for t in texts)
    assert any("compile wins by fused kernels" in t for t in texts)
    for f in r.findings:
        assert set(f.labels) <= set(r.measurements)
    assert len(r.claims) == 2 and all(c.held for c in r.claims)
    first = r.claims[0]
    assert first.measured == pytest.approx(30 / 25) and "compile default" in first.why


def test_versus_torch_pairs_every_torch_row():
    variants = _variants()
    r = _recorder(variants)
    result = types.SimpleNamespace(lesson="compilers", measurements=r.measurements)
    pairs = {(p.label, p.torch_label) for p in versus_torch(result)}
    assert ("resnet eager b1", "torch resnet channels_last b1") in pairs
    assert ("resnet graph b128", "torch resnet compile default b128") in pairs
    assert ("resnet graph b128", "torch resnet graph b128") in pairs
    assert ("mlp step graph", "torch mlp step compile default") in pairs
    assert ("mlp step eager", "torch mlp step eager") in pairs
    assert not any("onnxruntime" in t for _, t in pairs)


def test_plot_draws_every_row():
    plt = pytest.importorskip("matplotlib.pyplot")
    variants = _variants()
    r = _recorder(variants)
    C._rows_and_break_even(r, variants)
    result = types.SimpleNamespace(rows=tuple(r.rows))
    _, ax = plt.subplots()
    C.plot(result, ax)
    assert len(ax.patches) == len(variants)
    plt.close("all")


# ---- the notebook text ------------------------------------------------------------------------


def test_notebook_text_times_both_sides_and_resets_dynamo():
    from pathlib import Path

    text = (Path(C.__file__).parent / "notebooks" / "compilers.md").read_text()
    assert "## What the tutorial says" in text and "## The code being timed" in text
    assert "nn.Trainer" in text and "torch.compile(" in text and "dynamic=False" in text
    assert "timer.replace(hold=False).measure(" in text and "torch._dynamo.reset()" in text
    assert "cudalab.bench.torch_cuda()" in text
