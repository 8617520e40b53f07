"""Lessons inference and conv_as_gemm and the ``cudalab inference`` command without a GPU:
registration, argument parsing, the findings' decisions from given numbers, torch's settings
restored, and the command's no-GPU exit."""

from __future__ import annotations

import math
import types

import pytest

import cudalab
from cudalab import cli, lessons
from cudalab.cli.inference import lesson_params
from cudalab.lessons import resnet as R
from cudalab.models import torch_twin as TW
from cudalab.lessons import conv_as_gemm as CG
from cudalab.lessons import inference as INF
from _support import no_gpu_only

# ---- registration and parameters -------------------------------------------------------------


@pytest.mark.parametrize("name,number", [("inference", 19), ("conv_as_gemm", 20)])
def test_registered_after_the_others_with_plot_and_quick_params(name, number):
    x = lessons.get(name)
    assert x.number == number and x.plot is not None
    assert set(x.quick_params) <= set(x.params) and x.quick_params
    assert lessons.names().index(name) == len([n for n in lessons.names()
                                               if lessons.get(n).number < number])


def test_inference_quick_is_small_and_full_covers_every_precision():
    x = lessons.get("inference")
    full, quick = x.defaults(False), x.defaults(True)
    assert INF.check_params(full) == ((1, 8, 16, 32), ("fp32", "tf32", "fp16", "bf16"), (1, 8))
    assert INF.check_params(quick) == ((1, 8), ("fp16",), ())  # the CPU side: full mode


@pytest.mark.parametrize("change,match", [
    ({"batch_sizes": (0, 8)}, "in 1..256, got 0"),
    ({"batch_sizes": (1, 512)}, "got 512"),
    ({"batch_sizes": ()}, "at least one batch size"),
    ({"batch_sizes": (1.5,)}, "expected integers"),
    ({"precisions": ("fp8",)}, "unknown precision 'fp8'"),
    ({"precisions": ()}, "at least one precision"),
    ({"cpu_batch_sizes": (300,)}, "cpu_batch_sizes"),
])
def test_inference_params_are_checked(change, match):
    p = {**lessons.get("inference").defaults(True), **change}
    with pytest.raises(ValueError, match=match):
        INF.check_params(p)


@pytest.mark.parametrize("change,match", [
    ({"compile_modes": ("fastest",)}, "compile_modes must be a sequence of distinct names"),
    ({"compile_modes": "default"}, "compile_modes"),
    ({"compile_modes": ("default", "default")}, "distinct"),
    ({"compile_precisions": ("fp8",)}, "compile_precisions: unknown precision 'fp8'"),
    ({"compile_precisions": "fp16"}, "compile_precisions must be a sequence"),
])
def test_inference_compile_params_are_checked(change, match):
    p = {**lessons.get("inference").defaults(False), **change}
    with pytest.raises(ValueError, match=match):
        INF.check_params(p)


def test_inference_compiles_fp16_in_default_mode_at_the_largest_batch_full_only():
    x = lessons.get("inference")
    full, quick = x.defaults(False), x.defaults(True)
    assert INF.check_compile(full) == (("default",), ("fp16",))
    assert INF.check_compile(quick)[0] == ()  # quick stays under 10 s: nothing compiled
    batches, precisions, _ = INF.check_params(full)
    assert INF.compile_plan(precisions, batches, *INF.check_compile(full)) == [
        ("fp16", 32, "default")]
    assert INF.check_compile({**full, "compile_modes": ("max-autotune",),
                              "compile_precisions": ()}) == (("max-autotune",), ())
    # the CLI's --dtype picks the run's precisions: the others in compile_precisions are skipped
    assert INF.compile_plan(("fp32",), (1, 8), ("default",), ("fp16",)) == []
    assert INF.compile_plan(("bf16", "fp16"), (8, 1), ("default", "max-autotune"),
                            ("fp16", "bf16")) == [
        ("bf16", 8, "default"), ("bf16", 8, "max-autotune"), ("fp16", 8, "default"),
        ("fp16", 8, "max-autotune")]


def test_compile_note_says_what_was_left_out_and_how_to_run_it():
    plan = [("fp16", 32, "default")]
    text = INF.compile_note(plan, ("fp32", "fp16"), ("default",), ("fp16",))
    assert text.startswith("torch.compile ran in default mode for fp16 at batch 32 only")
    assert ("`cudalab lesson inference --set compile_precisions=fp32,fp16 --set "
            "compile_modes=default,reduce-overhead,max-autotune`") in text
    quick = INF.compile_note([], ("fp16",), (), ("fp16",))
    assert "did not run (compile_modes is empty)" in quick
    assert "compile_precisions" not in quick  # fp16 is already among them
    text = INF.compile_note([], ("fp32",), ("default",), ("fp16",))
    assert "no precision of this run" in text and "--set compile_precisions=fp32 " in text
    every = INF.COMPILE_MODES
    assert INF.compile_note([("fp16", 8, m) for m in every], ("fp16",), every,
                            ("fp16", "bf16")) is None


@pytest.mark.parametrize("ours,theirs,word", [(1.0, 1.5, "cudalab 1.50x faster"),
                                              (1.0, 1.0, "level"),
                                              (1.0, 0.5, "torch.compile 2.00x faster")])
def test_compiled_text(ours, theirs, word):
    ratio, text = INF.compiled_text("fp16", 32, "default", "graph", ours * 1e-3,
                                    theirs * 1e-3, 15.0, "cold", "graph", 2e-3)
    assert ratio == pytest.approx(theirs / ours) and word in text
    assert text.startswith(f"fp16 batch 32: cudalab graph {ours:.3f} ms vs torch.compile "
                           f"default {theirs:.3f} ms: ")
    assert "after 15.0 s of compiling (inductor's FX graph cache cold)" in text
    # 15 s saved at (2 - theirs) ms per call
    n = math.floor(15.0 / ((2.0 - theirs) * 1e-3)) + 1
    assert f"against torch graph (2.000 ms) the compile pays off after {n:,} calls" in text


def test_compiled_text_without_a_cache_state_or_a_gain():
    _, text = INF.compiled_text("bf16", 8, "max-autotune", "eager", 1e-3, 3e-3, 200.0, None,
                                "channels_last", 2e-3)
    assert "compiling;" in text and "FX graph" not in text and "never pays off" in text
    _, text = INF.compiled_text("bf16", 8, "default", "eager", 1e-3, 3e-3, 2.0, None)
    assert text.endswith("after 2.0 s of compiling")


def test_inference_allows_no_cpu_batch():
    p = {**lessons.get("inference").defaults(True), "cpu_batch_sizes": ()}
    assert INF.check_params(p)[2] == ()


@pytest.mark.parametrize("change,match", [({"batch": 0}, "batch"), ({"batch": True}, "batch"),
                                          ({"dtype": "float64"}, "dtype")])
def test_conv_as_gemm_params_are_checked(change, match):
    with pytest.raises(ValueError, match=match):
        CG.check_params({**lessons.get("conv_as_gemm").defaults(True), **change})
    assert CG.check_params(lessons.get("conv_as_gemm").defaults(False)) == (32, "float16")


# ---- argument parsing -----------------------------------------------------------------------


@pytest.mark.parametrize("text,want", [("1,8,16,32", (1, 8, 16, 32)), (" 32 , 1 ", (32, 1)),
                                       ("8,8,1", (8, 1)), ("256", (256,)), ("1,", (1,))])
def test_parse_batch_sizes(text, want):
    assert R.parse_batch_sizes(text) == want


@pytest.mark.parametrize("text,match", [("", "at least one"), ("0", "got 0"), ("257", "got 257"),
                                        ("1,x", "'x'"), ("1.5", "'1.5'"), ("-4", "got -4")])
def test_parse_batch_sizes_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        R.parse_batch_sizes(text)


@pytest.mark.parametrize("text,want", [("fp16", ("fp16",)), ("float16", ("fp16",)),
                                       ("FP32,bfloat16", ("fp32", "bf16")),
                                       ("half,fp16,tf32", ("fp16", "tf32"))])
def test_parse_precisions(text, want):
    assert R.parse_precisions(text) == want


@pytest.mark.parametrize("text", ["", "fp8", "fp16,int8"])
def test_parse_precisions_rejects(text):
    with pytest.raises(ValueError):
        R.parse_precisions(text)


def test_every_precision_has_a_measured_ceiling_and_tolerance():
    from cudalab.bench import CEILING_NAMES

    assert set(R.CEILING_OF) == set(R.PRECISIONS) == set(INF.TOLERANCE) == set(R.DTYPE_OF)
    assert set(R.CEILING_OF.values()) <= set(CEILING_NAMES)
    assert all(f"matmul_{d}" in CEILING_NAMES for d in CG.DTYPES)


# ---- rates and decisions from given numbers ------------------------------------------------


def test_rates():
    assert R.images_per_s(32, 0.016) == pytest.approx(2000.0)
    assert R.images_per_s(1, 0.0) == math.inf
    assert R.pct_of_peak(1e12, 0.01, 1e15) == pytest.approx(10.0)
    assert R.pct_of_peak(1e12, 0.01, None) is None and R.pct_of_peak(1e12, 0.0, 1e15) is None


def test_images_are_reproducible_normalised_nhwc():
    a, b = R.images(3, 2), R.images(3, 2)
    assert a.shape == (2, 224, 224, 3) and a.dtype == "float32"
    assert (a == b).all() and (a != 0).all() and abs(float(a.mean())) < 0.01


def test_graph_text_decides_from_the_ratio():
    gain, text = INF.graph_text(1, "fp16", 1.0e-3, 0.5e-3)
    assert gain == pytest.approx(2.0) and "real share" in text and "2.00x" in text
    gain, text = INF.graph_text(1, "fp16", 1.0e-3, 0.95e-3)
    assert gain < INF.GRAPH_HELPS and "back to back" in text


def test_half_text_decides_from_the_ratio():
    s, text = INF.half_text("fp16", 32, 10e-3, 4e-3)
    assert s == pytest.approx(2.5) and "tensor cores" in text
    s, text = INF.half_text("bf16", 1, 1e-3, 0.9e-3)
    assert s < INF.HALF_FASTER and "not in the GEMMs" in text


def test_scaling_text_flags_a_low_share_of_the_ceiling():
    gain, text = INF.scaling_text("fp16", (1, 1000.0), (32, 8000.0), 2.0, 10.0)
    assert gain == pytest.approx(8.0) and "2.0% then 10.0%" in text and "bound by more" in text
    _, text = INF.scaling_text("fp16", (1, 1000.0), (32, 8000.0), 5.0, 60.0)
    assert "bound by more" not in text
    _, text = INF.scaling_text("fp16", (1, 1000.0), (32, 8000.0), None, None)
    assert "ceiling" not in text


@pytest.mark.parametrize("ours,theirs,word", [(1.0, 1.5, "1.50x faster than torch"),
                                              (1.0, 1.0, "level with torch"),
                                              (1.0, 0.5, "torch is 2.00x faster")])
def test_torch_text(ours, theirs, word):
    ratio, text = INF.torch_text("fp16", 128, ours, theirs, "channels_last")
    assert ratio == pytest.approx(theirs / ours) and word in text


def test_cpu_text():
    s, text = INF.cpu_text(1, 0.5, 1e-3, "NumPy")
    assert s == pytest.approx(500.0) and "500x" in text and "NumPy" in text


def test_torch_labels_pair_with_ours():
    assert INF._torch_twin_label("torch channels_last fp16 b8") == "eager fp16 b8"
    assert INF.compile_mode("max-autotune") == "compile-max-autotune"
    label = INF._label("torch", INF.compile_mode("max-autotune"), "fp16", 32)
    assert label == "torch compile-max-autotune fp16 b32"
    assert INF._torch_twin_label(label) == "graph fp16 b32"  # compiled beside compiled
    assert INF._torch_twin_label("torch compile-default bf16 b128") == "graph bf16 b128"
    assert INF._torch_twin_label("torch graph fp16 b8") is None  # the usual rule pairs it
    assert INF._label("cudalab", "graph", "fp16", 8) == "graph fp16 b8"
    assert INF._label("torch", "graph", "fp16", 8) == "torch graph fp16 b8"
    assert INF._cpu_label("numpy", 1) == "numpy cpu fp32 b1"


def test_conv_bytes_and_texts():
    # layer2.1.conv2 at batch 8: M = 8*28*28, K = 9*128, input 8*28*28*128 elements.
    m, k, cin = 8 * 28 * 28, 9 * 128, 128
    assert CG.im2col_bytes(m, k, m * cin, 2) == 2 * (m * cin + m * k)
    assert CG.gemm_bytes(m, k, 128, 2) == 2 * (m * k + 128 * k + m * 128)
    share, text = CG.im2col_text("l", 1e-3, 3e-3, 0.6)
    assert share == pytest.approx(0.25) and "25% of the time and 60% of the bytes" in text
    assert "real cost" in text
    share, text = CG.im2col_text("l", 1e-3, 9e-3, 0.6)
    assert share == pytest.approx(0.1) and "small tax" in text
    gain, text = CG.fusion_text("l", 3e-3, 1e-3, 4)
    assert gain == pytest.approx(3.0) and "4 element-wise kernels" in text and "again" in text
    gain, text = CG.fusion_text("l", 1.05e-3, 1e-3, 2)
    assert gain < CG.FUSION_PAYS and "cheap" in text


# ---- torch's settings ----------------------------------------------------------------------


def _fake_torch(tf32: bool, bench: bool):
    matmul = types.SimpleNamespace(allow_tf32=tf32)
    cudnn = types.SimpleNamespace(allow_tf32=tf32, benchmark=bench)
    return types.SimpleNamespace(backends=types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=matmul), cudnn=cudnn))


@pytest.mark.parametrize("precision,inside", [("fp32", False), ("tf32", True), ("fp16", False)])
def test_torch_precision_pins_tf32_and_restores(precision, inside):
    torch = _fake_torch(tf32=not inside, bench=False)
    with TW.TorchPrecision(torch, precision):
        b = torch.backends
        assert b.cuda.matmul.allow_tf32 is inside and b.cudnn.allow_tf32 is inside
        assert b.cudnn.benchmark is True
    b = torch.backends
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == (
        not inside, not inside, False)


def test_torchvision_twin_holds_our_weights():
    torch = pytest.importorskip("torch")
    tv = TW.torchvision_or_none()
    if tv is None:
        pytest.skip("torchvision does not import")
    import cudalab.models as models

    state = models.init_weights(seed=1, random_stats=True)
    module = TW.torch_resnet50(torch, tv, state)
    assert not module.training
    back = models.from_torchvision(module)
    assert all((back[k] == v).all() for k, v in state.items())


# ---- the command -----------------------------------------------------------------------------


def _args(*argv: str):
    return cli.build_parser().parse_args(["inference", *argv])


def test_command_defaults_are_the_guides():
    args = _args()
    assert args.model == "resnet50"
    assert lesson_params(args) == {"batch_sizes": (1, 8, 16, 32), "precisions": ("fp32",),
                                   "graph": False, "cpu_batch_sizes": (1,)}


def test_command_options_become_lesson_params():
    args = _args("--model", "resnet50", "--batch-sizes", "32,8", "--dtype", "fp16,bf16",
                 "--graph", "--cpu-batch-sizes", "1,8")
    params = lesson_params(args)
    assert params == {"batch_sizes": (32, 8), "precisions": ("fp16", "bf16"), "graph": True,
                      "cpu_batch_sizes": (1, 8)}
    lessons.registry.check_params(lessons.get("inference"), params)
    # the lesson runs them over its full defaults (torch.compile's parameters included)
    assert INF.check_params({**lessons.get("inference").defaults(False), **params})[0] == (32, 8)


def test_command_smallest_batch_runs_on_the_cpu():
    assert lesson_params(_args("--batch-sizes", "16,4,64"))["cpu_batch_sizes"] == (4,)


@pytest.mark.parametrize("argv,match", [
    (("--batch-sizes", "0,8"), "in 1..256, got 0"), (("--batch-sizes", "a"), "'a'"),
    (("--dtype", "fp8"), "unknown precision 'fp8'"), (("--model", "vgg16"), "invalid choice"),
])
def test_command_rejects_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["inference", *argv])
    assert info.value.code == 2
    assert match in capsys.readouterr().err


@no_gpu_only
def test_command_without_a_gpu_exits_1_in_one_line(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["inference", "--model", "resnet50", "--batch-sizes", "1,8,16,32",
                     "--dtype", "fp16", "--graph", "--json", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err == "cudalab inference: no CUDA device is available.\n"
    assert captured.out == "" and not out.exists()


@no_gpu_only
@pytest.mark.parametrize("name", ["inference", "conv_as_gemm"])
def test_lessons_without_a_gpu_raise_no_device_error(name):
    with pytest.raises(cudalab.NoDeviceError):
        lessons.run(name, quick=True)


# ---- benchmarks/bench_resnet.py: the targets from given rows ---------------------------------


@pytest.fixture(scope="module")
def bench():
    from _support import REPO_ROOT, load_module

    return load_module(REPO_ROOT / "benchmarks" / "bench_resnet.py", "_bench_resnet_test")


def _rows(**ms):
    """Rows {'impl precision batch': median_ms}, e.g. cudalab_graph_fp16_1=0.4."""
    rows = []
    for key, value in ms.items():
        *impl, precision, batch = key.split("_")
        impl = " ".join(impl).replace("channels last", "channels_last")
        rows.append({"impl": impl, "precision": precision, "batch": int(batch),
                     "median_ms": value})
    return rows


def test_bench_targets_held_missed_and_not_measured(bench):
    rows = _rows(cudalab_graph_fp16_1=0.45, cudalab_fp32_1=1.6, cudalab_fp16_128=10.0,
                 cudalab_graph_fp16_128=9.0, torch_channels_last_fp16_128=12.0)
    got = {t["target"].split(" ")[0] + str(i): t for i, t in
           enumerate(bench.evaluate_targets(rows))}
    assert [t["held"] for t in got.values()] == [True, False, True, None]
    assert got["fp160"]["measured"] == pytest.approx(0.45) and got["fp160"]["unit"] == "ms"
    assert got["fp321"]["measured"] == pytest.approx(1.6)
    # fp16 b128: the fastest cudalab mode (graph, 9 ms) vs torch channels_last's 12 ms.
    assert got["fp162"]["measured"] == pytest.approx(12.0 / 9.0)
    assert got["fp162"]["impl"] == "cudalab graph"
    assert got["bf163"]["measured"] is None and got["bf163"]["impl"] is None


def test_bench_target_missed_below_the_ratio(bench):
    rows = _rows(cudalab_bf16_128=10.0, torch_channels_last_bf16_128=11.0)
    [t] = [t for t in bench.evaluate_targets(rows) if t["target"].startswith("bf16")]
    assert t["measured"] == pytest.approx(1.1) and t["held"] is False


def test_bench_compare_with_torch(bench):
    rows = _rows(cudalab_fp16_8=2.0, torch_fp16_8=4.0, torch_channels_last_fp16_8=3.0,
                 torch_graph_fp16_8=2.5, cudalab_fp16_1=1.0)
    bench.compare_with_torch(rows)
    ours = rows[0]
    assert ours["vs_torch"] == pytest.approx(1.25) and ours["vs_torch_channels_last"] == 1.5
    assert "vs_torch" not in rows[1] and "vs_torch" not in rows[-1]  # no torch at batch 1
    text = bench.targets_text(bench.evaluate_targets(rows))
    assert text.count("not measured") == 4


def test_torch_session_without_torch_yields_none():
    with TW.torch_session(None, object(), "fp16") as twin:
        assert twin is None
    with TW.torch_session(object(), None, "fp16") as twin:
        assert twin is None


# ---- torch.compile's finding and pairing from given numbers ----------------------------------


def test_compile_finding_and_versus_pairing_from_given_numbers():
    from _support import fake_measurement
    from cudalab.lessons import registry
    from cudalab.lessons.versus import versus_torch

    x = lessons.get("inference")
    r = registry.LessonRun(x, x.defaults(False), quick=False)
    times = {"cudalab eager": 2.0e-3, "cudalab graph": 1.8e-3, "torch eager": 4.0e-3,
             "torch channels_last": 3.0e-3, "torch graph": 2.5e-3}
    for key, median in times.items():
        impl, mode = key.split(" ")
        label = INF._label(impl, mode, "fp16", 32)
        r.add(fake_measurement(label, median=median), label)
    label = INF._label("torch", INF.compile_mode("default"), "fp16", 32)
    r.add(fake_measurement(label, median=1.2e-3), label)
    INF._compile_findings(r, {"fp16": {32: times}},
                          {("fp16", 32, "default"): {"s": 1.2e-3, "setup_s": 15.0,
                                                     "cache": "cold"}})
    [f] = r.findings
    assert f.text.startswith("fp16 batch 32: cudalab graph 1.800 ms vs torch.compile default "
                             "1.200 ms: torch.compile 1.50x faster, after 15.0 s of compiling")
    assert "against torch graph (2.500 ms) the compile pays off after 11,539 calls" in f.text
    assert f.value == pytest.approx(1.2 / 1.8) and label in f.labels
    result = types.SimpleNamespace(lesson="inference", measurements=r.measurements)
    pairs = {(p.label, p.torch_label) for p in versus_torch(result)}
    assert ("graph fp16 b32", label) in pairs
    assert ("eager fp16 b32", "torch channels_last fp16 b32") in pairs
