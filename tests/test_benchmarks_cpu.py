"""benchmarks/ without a GPU: the modules import, fail clearly, and build rows from Measurements."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import cudalab
from cudalab.bench import Measurement
from _support import REPO_ROOT, fake_measurement, load_module, no_gpu_only

BENCH_DIR = REPO_ROOT / "benchmarks"
BENCH_MODULES = sorted(p.stem for p in BENCH_DIR.glob("bench_*.py"))


def _load(name: str):
    """benchmarks/<name>.py as a fresh module."""
    return load_module(BENCH_DIR / f"{name}.py", f"_benchmarks_{name}")


@pytest.fixture(scope="module")
def benchlib():
    return _load("benchlib")


def _m(**kw) -> Measurement:
    """'add' by 'cudalab', median 1 ms and min 0.9 ms, unless `kw` says otherwise."""
    kw = {"label": "add", "description": "cudalab", "times": (1e-3, 1e-3, 1.1e-3, 0.9e-3, 1e-3),
          **kw}
    return fake_measurement(**kw)


def test_the_expected_modules_exist():
    assert set(BENCH_MODULES) >= {"bench_elementwise", "bench_reduce", "bench_transpose",
                                  "bench_matmul", "bench_streams", "bench_transfer",
                                  "bench_pipeline", "bench_profiler"}
    assert not (BENCH_DIR / "timing.py").exists()


@pytest.mark.parametrize("name", BENCH_MODULES + ["run"])
def test_every_module_imports_without_a_gpu(name):
    module = _load(name)
    assert callable(module.run if name != "run" else module.main)


@no_gpu_only
@pytest.mark.parametrize("name", BENCH_MODULES)
def test_run_without_a_gpu_raises_no_device_error_naming_the_module(name):
    with pytest.raises(cudalab.NoDeviceError, match=f"^{name}: no CUDA device"):
        _load(name).run(True)


@no_gpu_only
@pytest.mark.parametrize("name", ["run", "bench_reduce", "bench_streams"])
def test_scripts_exit_1_with_a_message_without_a_gpu(name):
    proc = subprocess.run([sys.executable, str(BENCH_DIR / f"{name}.py"), "--quick"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "no CUDA device is available" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_benchmark_uses_a_named_preset(benchlib):
    from cudalab.bench import PRESETS

    assert benchlib.preset(True) is PRESETS["quick"]
    assert benchlib.preset(False) is PRESETS["sustained"]


def test_no_benchmark_module_copies_timing_numbers():
    # Warm-up and run times come from the presets, never from literals in benchmarks/.
    for path in BENCH_DIR.glob("*.py"):
        text = path.read_text()
        for word in ("warmup=0", "min_run_time=0", "max_run_time=", "WARMUP_S"):
            assert word not in text, f"{path.name} sets {word!r} by hand"


def test_shared_cases_are_used():
    for name in ("bench_matmul", "bench_transfer", "run"):
        text = (BENCH_DIR / f"{name}.py").read_text()
        assert any(case in text for case in ("MatmulCase", "TransferCase", "CopyCase")), name


def test_row_from_a_measurement(benchlib):
    m = _m(bytes=3e9, host_time=5e-6, launch_gap=1e-6, number_per_run=7, sub_label="v",
           ceiling_name="copy", ceiling_value=4e12, ceiling_unit="B/s")
    r = benchlib.row(m, (10, 3), "float32", extra_key=1)
    assert (r["op"], r["impl"], r["variant"], r["shape"], r["dtype"]) == (
        "add", "cudalab", "v", [10, 3], "float32")
    assert r["median_ms"] == pytest.approx(1.0)
    assert r["iqr_ms"] == pytest.approx(m.iqr * 1e3)
    assert r["min_ms"] == pytest.approx(0.9)
    assert (r["repeats"], r["calls_per_repeat"]) == (5, 7)
    assert r["host_us"] == pytest.approx(5.0) and r["launch_gap_us"] == pytest.approx(1.0)
    assert r["bytes"] == 3_000_000_000 and r["gb_per_s"] == pytest.approx(3000.0)
    assert r["ceiling"] == "copy"
    assert r["pct_of_ceiling"] == r["pct_of_copy_ceiling"] == pytest.approx(75.0)
    assert "tflops" not in r and "warning" not in r
    assert r["extra_key"] == 1
    assert r["measurement"] is m  # the results writer serialises it
    json.dumps({k: v for k, v in r.items() if k != "measurement"})


def test_row_per_op_divides_times_and_work_not_rates(benchlib):
    m = _m(bytes=1e6, flops=2e6, host_time=1e-4, ceiling_name="h2d", ceiling_value=1e9,
           ceiling_unit="B/s")
    r = benchlib.row(m, [8], "float32", ops_per_call=100)
    assert r["median_ms"] == pytest.approx(0.01)
    assert r["host_us"] == pytest.approx(1.0)
    assert (r["bytes"], r["flops"]) == (10_000, 20_000)
    assert r["gb_per_s"] == pytest.approx(1.0) and r["tflops"] == pytest.approx(0.002)
    assert r["ceiling"] == "h2d" and "pct_of_copy_ceiling" not in r
    assert "variant" not in r and "launch_gap_us" not in r


def test_row_carries_the_warning_and_the_timer(benchlib):
    noisy = _m(times=(1.0, 2.0, 1.0, 2.0, 1.5, 3.0), metadata={"timer": "host clock"})
    r = benchlib.row(noisy, [1], "float32")
    assert "noisy" in r["warning"] and r["timer"] == "host clock"
    assert benchlib.row(_m(), [1], "float32")["timer"] == benchlib.MEASURE_TIMER


def test_rows_go_through_the_results_writer(benchlib, tmp_path):
    from cudalab.bench import read_results, write_results

    m = _m(times=tuple(1e-3 + i * 1e-7 for i in range(500)), bytes=1e6)
    r = benchlib.row(m, [4], "float32", speedup_vs_torch=1.1)
    write_results(tmp_path / "c.json", "compute_benchmarks", [r], machine={},
                  max_times=benchlib.MAX_TIMES_IN_JSON)
    [back] = read_results(tmp_path / "c.json").rows
    assert back.get("speedup_vs_torch") == 1.1 and back.get("op") == "add"
    assert back.measurement.repeats == benchlib.MAX_TIMES_IN_JSON
    assert back.measurement.median == pytest.approx(m.median)


def test_format_rows_with_and_without_optional_keys(benchlib):
    full = benchlib.row(_m(bytes=1e9, host_time=1e-6, ceiling_name="copy", ceiling_value=1e12,
                           ceiling_unit="B/s"), [4], "float32")
    full["speedup_vs_torch"] = 1.02
    bare = {"op": "x", "impl": "torch", "shape": [1], "dtype": "float16",
            "median_ms": 1.0, "iqr_ms": 0.1, "warning": "noisy"}
    lines = benchlib.format_rows([full, bare]).splitlines()
    assert len(lines) == 3
    assert "100.0 copy" in lines[1] and "1.020" in lines[1]
    assert lines[2].endswith(" !")


@pytest.mark.parametrize("path", sorted((BENCH_DIR / "results").glob("*.json")), ids=lambda p: p.name)
def test_committed_results_read_back(path):
    from cudalab.bench import RESULTS_SCHEMA, read_results

    data = json.loads(path.read_text())
    if data.get("schema") == "cudalab.sanitizer/1":  # scripts/sanitize_summary.py's own file
        assert data["runs"] and all(
            {"tool", "part", "pass", "errors", "seconds", "commit", "command"} <= set(run)
            for run in data["runs"].values())
        return
    if data.get("schema") != RESULTS_SCHEMA:
        pytest.skip(f"{path.name} predates {RESULTS_SCHEMA}; regenerate it on a GPU")
    results = read_results(path)
    assert results.kind and results.machine["devices"]
    assert all(m.device == results.machine["devices"][0]["name"] for m in results.measurements)
