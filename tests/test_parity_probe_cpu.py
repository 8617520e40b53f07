"""benchmarks/parity_probe.py without a GPU: its ratios, trace summaries, table and runner."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _support import REPO_ROOT, load_module, no_gpu_only

PROBE = REPO_ROOT / "benchmarks" / "parity_probe.py"


@pytest.fixture(scope="module")
def pp():
    return load_module(PROBE, "_benchmarks_parity_probe")


def test_parity_is_the_lessons_rule(pp):
    from cudalab.lessons.versus import PARITY

    assert pp.PARITY == PARITY


def test_speedup_and_verdict(pp):
    assert pp.speedup(2.0, 3.0) == pytest.approx(1.5)
    assert pp.speedup(None, 3.0) is None
    assert pp.speedup(2.0, 0.0) is None
    assert pp.verdict(None) == "-"
    assert pp.verdict(pp.PARITY) == "parity"
    assert pp.verdict(0.9) == "slower"
    assert pp.verdict(1.3) == "parity"


def test_row_keeps_both_sides_and_rates_only_times(pp):
    r = pp.row("pinned", "h2d", 36.6, 28.5, unit="ms", note="n")
    assert r["speedup"] == pytest.approx(28.5 / 36.6)
    assert r["verdict"] == "slower"
    assert (r["cudalab"], r["torch"], r["note"]) == (36.6, 28.5, "n")
    rate = pp.row("pinned", "memcpy", 9.0, 8.0, unit="GB/s")
    assert rate["speedup"] is None and rate["verdict"] == "-"


def test_median_min(pp):
    assert pp.median_min([3e-6, 1e-6, 2e-6]) == pytest.approx((2.0, 1.0))
    assert pp.median_min([2e-3], 1e3) == pytest.approx((2.0, 2.0))
    with pytest.raises(ValueError, match="no times"):
        pp.median_min([])


def test_short_name_and_is_gemm(pp):
    assert pp.short_name("abc", 10) == "abc"
    cut = pp.short_name("x" * 50, 10)
    assert len(cut) == 10 and cut.endswith("...")
    assert pp.is_gemm("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32")
    assert pp.is_gemm("nvjet_tst_128x64_64x8_1x2_h_bz_NNT")
    assert not pp.is_gemm("void (anonymous namespace)::ew_contiguous<float, 5, 2u>")


def _ev(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_summarize_trace_groups_and_gaps(pp):
    events = [
        _ev("kernel", "ew_contiguous", 100, 10, grid=[4096, 1, 1], block=[256, 1, 1]),
        _ev("kernel", "ew_contiguous", 115, 10, grid=[4096, 1, 1], block=[256, 1, 1]),
        _ev("kernel", "sm90_xmma_gemm", 130, 20),
        _ev("cuda_runtime", "cudaLaunchKernel", 90, 4),
        _ev("cuda_runtime", "cudaLaunchKernel", 95, 2),
        _ev("cuda_driver", "cuLaunchKernelEx", 96, 6),
        _ev("cuda_runtime", "cudaDeviceSynchronize", 97, 5000),  # a wait: not host work
        _ev("cpu_op", "aten::mul", 80, 50),                 # not a kept category
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 1},  # not a complete event
    ]
    s = pp.summarize_trace(events, calls=2)
    by = {(g["category"], g["name"]): g for g in s["groups"]}
    assert set(by) == {("kernel", "ew_contiguous"), ("kernel", "sm90_xmma_gemm"),
                       ("cuda_runtime", "cudaLaunchKernel"), ("cuda_driver", "cuLaunchKernelEx"),
                       ("cuda_runtime", "cudaDeviceSynchronize")}
    ew = by[("kernel", "ew_contiguous")]
    assert (ew["count"], ew["total_us"], ew["per_call"], ew["us_per_call"], ew["mean_us"]) == \
        (2, 20.0, 1.0, 10.0, 10.0)
    assert ew["grid"] == [4096, 1, 1] and ew["block"] == [256, 1, 1]
    assert by[("cuda_runtime", "cudaLaunchKernel")]["max_us"] == 4
    assert [g["name"] for g in s["groups"][:2]] == ["cudaDeviceSynchronize", "ew_contiguous"]
    assert s["kernel_busy_us_per_call"] == pytest.approx(40 / 2)
    assert s["kernel_span_us_per_call"] == pytest.approx((150 - 100) / 2)
    assert s["gemm_us_per_call"] == pytest.approx(10.0)
    assert s["other_kernel_us_per_call"] == pytest.approx(10.0)
    assert s["api_us_per_call"] == pytest.approx(6.0)


def test_summarize_trace_without_kernels_and_bad_calls(pp):
    s = pp.summarize_trace([], calls=1)
    assert s["groups"] == [] and s["kernel_span_us_per_call"] == 0.0
    with pytest.raises(ValueError, match="calls must be >= 1"):
        pp.summarize_trace([], calls=0)


SMAPS = """\
7f0000000000-7f0010000000 rw-p 00000000 00:00 0
Size:             262144 kB
AnonHugePages:    260096 kB
7f0020000000-7f0030000000 rw-p 00000000 00:00 0
Size:             262144 kB
AnonHugePages:         0 kB
"""


def test_huge_page_kib(pp):
    assert pp.huge_page_kib(SMAPS, 0x7f0000001000) == 260096
    assert pp.huge_page_kib(SMAPS, 0x7f0020000000) == 0
    assert pp.huge_page_kib(SMAPS, 0x7f0010000000) is None  # between the mappings
    assert pp.huge_page_kib("", 1) is None


def test_format_table(pp):
    rows = [pp.row("timing", "idle", 167.2, 117.2), pp.row("pinned", "pages", None, None,
                                                         unit="MiB", note="x")]
    text = pp.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["pair", "variant", "cudalab", "torch", "unit", "speedup",
                                "verdict", "note"]
    assert "167.2" in lines[2] and "0.701" in lines[2] and "slower" in lines[2]
    assert lines[3].split()[:4] == ["pinned", "pages", "-", "-"]


def test_run_probes_isolates_failures_and_keeps_the_budget(pp):
    ticks = iter([0.0, 0.0, 1.0, 1.0, 2.0, 50.0])

    def boom():
        raise RuntimeError("no luck")

    probes = {"good": lambda: {"rows": [{"pair": "a"}], "details": {"k": 1}},
              "bad": boom,
              "late": lambda: {"rows": []}}
    out = pp.run_probes(probes, budget_s=10.0, clock=lambda: next(ticks))
    assert out["good"]["status"] == "ok" and out["good"]["rows"] == [{"pair": "a"}]
    assert out["good"]["details"] == {"k": 1} and out["good"]["seconds"] == 1.0
    assert out["bad"]["status"] == "error" and "RuntimeError: no luck" in out["bad"]["error"]
    assert out["late"]["status"] == "skipped" and "budget" in out["late"]["error"]


def test_every_probe_is_listed(pp):
    assert list(pp.PROBES) == ["timing", "pinned", "inplace", "streams", "checkpointing"]


@no_gpu_only
def test_script_exits_1_with_a_message_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(PROBE), "--json", str(tmp_path / "p.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "no CUDA device is available" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "p.json").exists()
