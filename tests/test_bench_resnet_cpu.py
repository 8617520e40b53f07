"""benchmarks/bench_resnet.py's torch.compile columns without a GPU: the settings and flags,
the results file's name, the ratio columns, the table and the summary from given rows."""

from __future__ import annotations

import pytest

from _support import REPO_ROOT, load_module


@pytest.fixture(scope="module")
def bench():
    return load_module(REPO_ROOT / "benchmarks" / "bench_resnet.py", "_bench_resnet_compile")


# ---- settings and flags ------------------------------------------------------------------------


def test_defaults_compile_both_modes_at_the_largest_batch_and_nothing_when_quick(bench):
    full = bench.settings(False)
    assert full == {"precisions": ("fp32", "tf32", "fp16", "bf16"), "batches": (1, 8, 32, 128),
                    "compile_modes": ("default", "max-autotune"), "compile_batches": (128,)}
    quick = bench.settings(True)
    assert quick["batches"] == (1, 8) and quick["compile_modes"] == ()
    assert quick["compile_batches"] == ()  # nothing compiled, no compile batch either
    asked = bench.settings(True, compile_modes=("default",))
    assert asked["compile_modes"] == ("default",) and asked["compile_batches"] == (8,)


def test_the_issue_run_is_one_invocation(bench):
    args = bench.build_parser().parse_args(
        ["--precisions", "fp16,bf16,tf32", "--batches", "128",
         "--compile-modes", "default,max-autotune"])
    cfg = bench.settings_of(args)
    assert cfg == {"precisions": ("fp16", "bf16", "tf32"), "batches": (128,),
                   "compile_modes": ("default", "max-autotune"), "compile_batches": (128,)}
    assert bench.command_of(args) == ("python benchmarks/bench_resnet.py --precisions "
                                      "fp16,bf16,tf32 --batches 128 --compile-modes "
                                      "default,max-autotune")


@pytest.mark.parametrize("text,want", [("default,max-autotune", ("default", "max-autotune")),
                                       (" Max-Autotune , default,max-autotune",
                                        ("max-autotune", "default")),
                                       ("none", ()), ("reduce-overhead", ("reduce-overhead",))])
def test_parse_compile_modes(bench, text, want):
    assert bench.parse_compile_modes(text) == want


@pytest.mark.parametrize("text,match", [("", "comma list"), ("fast", "unknown mode 'fast'"),
                                        ("default,none", "unknown mode 'none'")])
def test_parse_compile_modes_rejects(bench, text, match):
    with pytest.raises(ValueError, match=match):
        bench.parse_compile_modes(text)


@pytest.mark.parametrize("kwargs,match", [
    ({"batches": (1, 8), "compile_batches": (128,)}, r"among the batches \(1, 8\).*\[128\]"),
    ({"precisions": ("fp8",)}, "unknown precision 'fp8'"),
    ({"batches": (0,)}, "got 0"),
    ({"compile_modes": ("fast",)}, "unknown mode"),
    ({"compile_batches": ()}, "at least one batch size"),
])
def test_settings_reject(bench, kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench.settings(False, **kwargs)


@pytest.mark.parametrize("argv,match", [
    (["--compile-modes", "fastest"], "unknown mode 'fastest'"),
    (["--batches", "1,8", "--compile-batches", "32"], "among the batches"),
    (["--precisions", "int8"], "unknown precision"),
    (["--batches", "x"], "'x'"),
])
def test_bad_flags_exit_2_before_any_gpu(bench, argv, match, capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(argv)
    assert info.value.code == 2 and match in capsys.readouterr().err


def test_a_subset_gets_its_own_file_name(bench):
    assert bench.stem("NVIDIA H200", False, bench.settings(False)) == "resnet_NVIDIA_H200"
    assert bench.stem("NVIDIA H200", True, bench.settings(True)) == "resnet_NVIDIA_H200_quick"
    # compiling or not leaves the name alone: the rows are a superset
    assert bench.stem("NVIDIA H200", False, bench.settings(False, compile_modes=())) == \
        "resnet_NVIDIA_H200"
    cfg = bench.settings(False, precisions=("fp16", "bf16", "tf32"), batches=(128,))
    assert bench.stem("NVIDIA H100 80GB HBM3", False, cfg) == \
        "resnet_NVIDIA_H100_80GB_HBM3_fp16-bf16-tf32_b128"


def test_labels(bench):
    assert bench.compiled_impl("max-autotune") == "torch compile max-autotune"
    assert bench.compile_key("max-autotune") == "vs_compile_max_autotune"
    assert bench.compile_key("default") == "vs_compile_default"
    assert set(bench.COMPILE_COLUMN) == set(bench.COMPILE_MODES)
    assert set(bench.DEFAULT_COMPILE_MODES) <= set(bench.COMPILE_MODES)


# ---- rows -> columns, table, summary -------------------------------------------------------------


def _rows():
    def r(impl, ms, **extra):
        return {"impl": impl, "precision": "fp16", "batch": 128, "median_ms": ms,
                "iqr_ms": 0.01, "images_per_s": 128 / ms * 1e3, **extra}
    return [r("cudalab", 6.0), r("cudalab graph", 5.0), r("torch", 12.0),
            r("torch channels_last", 8.0), r("torch graph", 7.5),
            r("torch compile default", 4.0, compile_s=15.5, fx_cache="cold"),
            r("torch compile max-autotune", 3.5, compile_s=190.0, fx_cache=None)]


def test_compile_ratios_on_the_graph_row_and_vs_torch_stays_uncompiled(bench):
    rows = _rows()
    bench.compare_with_torch(rows)
    eager, graph = rows[0], rows[1]
    assert graph["vs_compile_default"] == pytest.approx(4.0 / 5.0)
    assert graph["vs_compile_max_autotune"] == pytest.approx(3.5 / 5.0)
    assert "vs_compile_default" not in eager  # the graph row only
    # vs_torch: torch's fastest uncompiled mode (graph, 7.5 ms), as before the compile rows
    assert graph["vs_torch"] == pytest.approx(7.5 / 5.0)
    assert eager["vs_torch_channels_last"] == pytest.approx(8.0 / 6.0)
    assert not any(k.startswith("vs_") for k in rows[-1])


def test_table_has_compile_columns_only_when_compiled(bench):
    rows = _rows()
    bench.compare_with_torch(rows)
    text = bench.table(rows)
    head = text.splitlines()[0]
    assert "compile s" in head and "vs c.def" in head and "vs c.max" in head
    assert "torch compile max-autotune" in text and "190.0" in text and "0.700" in text
    assert "autotuning included" in text
    plain = bench.table(rows[:5])
    assert "compile s" not in plain and "vs c." not in plain


def test_compile_text_says_the_time_the_cache_and_who_wins(bench):
    rows = _rows()
    text = bench.compile_text(rows)
    lines = text.splitlines()
    assert lines[0].startswith("torch.compile (compile s:") and len(lines) == 3
    assert ("fp16 batch 128, torch.compile default: 4.000 ms per call after 15.5 s of "
            "compiling (autotuning included; FX graph cache cold); cudalab graph 5.000 ms: "
            "torch.compile 1.25x faster") in lines[1]
    assert "FX graph cache state unknown" in lines[2]
    faster = [dict(x, median_ms=10.0) if x["impl"].startswith("torch compile") else x
              for x in rows]
    assert "cudalab 2.00x faster" in bench.compile_text(faster)
    assert bench.compile_text(rows[:5]) == ""


def test_targets_ignore_the_compile_rows(bench):
    rows = _rows()
    [t] = [t for t in bench.evaluate_targets(rows) if t["target"].startswith("fp16 batch 128")]
    assert t["measured"] == pytest.approx(8.0 / 5.0) and t["held"] is True
