"""CPU tier: cudalab's pytest plugin (cudalab.pytest_plugin, cudalab.bench.baseline).

The pure logic (threshold parsing, comparison, baselines, the summary table)
is tested directly with synthetic Measurements; the results file itself is
tested in test_bench_results_cpu.py. The pytest
side runs small generated test files through ``pytester`` in a subprocess
with ``CUDA_VISIBLE_DEVICES=""``, so the plugin sees no GPU even on a GPU
machine: the ``gpu`` marker and the fixture skip (or fail under
CUDALAB_REQUIRE_GPU=1), and a stand-in for the fixture records synthetic
Measurements to exercise the JSON file, the comparison and the regression
failure end to end.

Every run passes ``-p cudalab``: it loads the plugin through its entry point
(once, also when autoloading already did) and still loads it when
PYTEST_DISABLE_PLUGIN_AUTOLOAD is set.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys

import pytest

import cudalab
from cudalab import pytest_plugin
from cudalab.bench import Measurement
from cudalab.bench import baseline as B
from cudalab.bench import results as R
from _support import REPO_ROOT, readme_plugin_example
from _support import fake_gpu_measurement as fake

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "cudalab")
GPU_MARKER_LINE = (
    "@pytest.mark.gpu: needs a CUDA device (skipped without one; CUDALAB_REQUIRE_GPU=1 makes the skip a failure)"
)


# ---- thresholds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [("10%", 0.10), ("0.1", 0.10), (" 2.5 % ", 0.025), ("200%", 2.0), ("1", 1.0), ("0.05", 0.05),
     ("150%", 1.5)],
)
def test_parse_threshold_accepts_percent_and_fraction(text, expected):
    assert B.parse_threshold(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["10x", "", "%", "ten%", "1e", "10 %%"])
def test_parse_threshold_rejects_garbage(text):
    with pytest.raises(ValueError, match=r"--fail: expected a percentage such as '10%' or a fraction"):
        B.parse_threshold(text, option="--fail")


@pytest.mark.parametrize("text", ["0", "0%", "-5%", "-0.1", "nan", "inf%"])
def test_parse_threshold_rejects_zero_negative_and_non_finite(text):
    with pytest.raises(ValueError, match=r"greater than 0"):
        B.parse_threshold(text)


@pytest.mark.parametrize("text", ["10", "1.5"])
def test_parse_threshold_refuses_ambiguous_bare_numbers(text):
    with pytest.raises(ValueError, match=rf"'{text}' is ambiguous.*write '{text}%'"):
        B.parse_threshold(text)


def test_format_threshold():
    assert B.format_threshold(0.1) == "10%"
    assert B.format_threshold(2.0) == "200%"
    assert B.format_threshold(0.025) == "2.5%"


# ---- comparison ------------------------------------------------------------------------


BASELINE = {m.key: m for m in (fake("add", 1e-3), fake("mm", 2e-3, sub_label="float32"))}


def test_regression_beyond_threshold():
    c = B.compare(fake("add", 1.25e-3), BASELINE, threshold=0.10)
    assert c.baseline_median == pytest.approx(1e-3)
    assert c.current_median == pytest.approx(1.25e-3)
    assert c.change == pytest.approx(0.25)
    assert c.regressed and c.status == "regression"
    text = c.describe()
    assert "add: median 1.25 ms vs baseline 1 ms (+25.0%)" in text
    assert "more than the allowed +10%" in text


def test_slower_within_threshold_passes():
    c = B.compare(fake("add", 1.08e-3), BASELINE, threshold=0.10)
    assert c.change == pytest.approx(0.08)
    assert not c.regressed and c.status == "slower"
    assert "within the allowed +10%" in c.describe()


def test_exactly_at_threshold_is_not_a_regression():
    # Medians 1.5 and 1.0 give a change of exactly 0.5 in binary floating point.
    c = B.compare(Measurement(label="x", times=[1.5] * 4), {("x", None, None): Measurement(label="x", times=[1.0] * 4)},
                  threshold=0.5)
    assert c.change == 0.5
    assert not c.regressed
    assert B.compare(Measurement(label="x", times=[1.5001] * 4),
                     {("x", None, None): Measurement(label="x", times=[1.0] * 4)}, threshold=0.5).regressed


def test_improvement_passes():
    c = B.compare(fake("add", 0.4e-3), BASELINE, threshold=0.10)
    assert c.change == pytest.approx(-0.6)
    assert not c.regressed and c.status == "faster"
    assert "(-60.0%)" in c.describe()


def test_missing_baseline_is_reported_not_failed():
    # Same label, other sub_label: a different key.
    c = B.compare(fake("mm", 9e-3, sub_label="float16"), BASELINE, threshold=0.10)
    assert c.missing and c.status == "missing"
    assert c.change is None and not c.regressed
    assert "no baseline measurement" in c.describe()


def test_matching_uses_the_whole_key():
    c = B.compare(fake("mm", 2.2e-3, sub_label="float32"), BASELINE, threshold=0.5)
    assert c.baseline_median == pytest.approx(2e-3)
    assert c.change == pytest.approx(0.1)


def test_report_only_never_regresses():
    c = B.compare(fake("add", 5e-3), BASELINE, threshold=None)
    assert c.change == pytest.approx(4.0)
    assert not c.regressed and c.status == "slower"
    assert "allowed" not in c.describe()


def test_device_mismatch_is_noted():
    c = B.compare(fake("add", 1e-3, device="Other GPU"), BASELINE, threshold=0.1)
    assert "baseline measured on Fake GPU, now on Other GPU" in c.describe()


def test_zero_baseline_median():
    base = {("z", None, None): Measurement(label="z", times=[0.0] * 4)}
    c = B.compare(fake("z", 1e-6), base, threshold=0.1)
    assert math.isinf(c.change) and c.regressed
    assert "+inf%" in c.describe()


def test_comparison_to_dict():
    d = B.compare(fake("add", 1.25e-3), BASELINE, threshold=0.10).to_dict()
    assert d["status"] == "regression"
    assert d["change"] == pytest.approx(0.25)
    assert d["threshold"] == 0.10
    assert d["baseline_device"] == "Fake GPU"
    json.dumps(d)


# ---- baselines from results files ---------------------------------------------------------


def write(path, records, machine=None):
    """A results file of the plugin's kind holding `records`."""
    R.write_results(path, "pytest", [r.row() for r in records], machine=machine or {})


def _records():
    m1 = fake("add", 1e-3, bytes=3e6, metadata={"n": 250_000})
    m2 = fake("mm", 2e-3, sub_label="float32", flops=2e9)
    return [B.Record("t.py::test_add", m1, B.compare(m1, BASELINE, 0.1)), B.Record("t.py::test_mm", m2)]


def test_record_rows_carry_nodeid_and_comparison(tmp_path):
    write(tmp_path / "r.json", _records(), {"hostname": "h"})
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["kind"] == "pytest" and data["machine"] == {"hostname": "h"}
    assert [r["nodeid"] for r in data["rows"]] == ["t.py::test_add", "t.py::test_mm"]
    assert data["rows"][0]["comparison"]["status"] == "same"
    assert data["rows"][1]["comparison"] is None
    back = R.read_results(tmp_path / "r.json").rows
    assert [r.get("nodeid") for r in back] == ["t.py::test_add", "t.py::test_mm"]
    assert [r.measurement for r in back] == [r.measurement for r in _records()]


def test_load_baseline_by_key_merges_repeats(tmp_path):
    a1, a2 = fake("add", 1e-3), fake("add", 3e-3)
    write(tmp_path / "b.json", [B.Record("x", a1), B.Record("y", a2), B.Record("z", fake("mm", 1e-3))])
    base = B.load_baseline(tmp_path / "b.json")
    assert set(base) == {("add", None, None), ("mm", None, None)}
    assert base[("add", None, None)].repeats == 10  # both runs' times pooled


def test_load_baseline_of_an_empty_file(tmp_path):
    write(tmp_path / "r.json", [])
    assert B.load_baseline(tmp_path / "r.json") == {}


def test_load_baseline_reads_any_results_file(tmp_path):
    # A file of another kind (a CLI run, say) serves as a baseline too.
    R.write_results(tmp_path / "cli.json", "bench matmul", [fake("matmul", 1e-3, sub_label="float16")],
                    machine={})
    assert list(B.load_baseline(tmp_path / "cli.json")) == [("matmul", "float16", None)]


def test_load_baseline_refuses_disagreeing_work(tmp_path):
    write(tmp_path / "b.json", [B.Record("x", fake("add", 1e-3, flops=1.0)),
                                B.Record("y", fake("add", 1e-3, flops=2.0))])
    with pytest.raises(ValueError, match="b.json: .*disagree on flops"):
        B.load_baseline(tmp_path / "b.json")


# ---- the summary table -----------------------------------------------------------------


def test_summary_lines_without_comparison():
    lines = B.summary_lines([B.Record("a", fake("mm", 2e-3, flops=4e9)),
                             B.Record("b", fake("add", 1e-3, bytes=2e9))])
    assert lines[0].split() == ["benchmark", "median", "IQR", "rate"]
    assert lines[1].startswith("mm") and "2 ms" in lines[1] and "2 TFLOP/s" in lines[1]
    assert lines[2].startswith("add") and "2000 GB/s" in lines[2]


def test_summary_lines_with_comparison_and_noise():
    noisy = Measurement(label="noisy", times=[1e-3, 1e-3, 2e-3, 3e-3, 3e-3])
    records = [
        B.Record("a", fake("add", 2e-3), B.compare(fake("add", 2e-3), BASELINE, 0.1)),
        B.Record("b", noisy, B.compare(noisy, BASELINE, 0.1)),
    ]
    lines = B.summary_lines(records)
    assert "vs baseline" in lines[0]
    assert "1 ms -> +100.0% REGRESSION (> +10%)" in lines[1]
    assert "no baseline" in lines[2] and "(!)" in lines[2]
    assert lines[-1].startswith("(!) noisy")


# ---- the plugin's pieces ---------------------------------------------------------------


def test_session_from_options_defaults():
    s = pytest_plugin.session_from_options(None, None, None)
    assert s.json_path is None and s.baseline is None and s.threshold is None and s.records == []


@pytest.mark.parametrize(
    "fail, message",
    [("10x", "--gpu-benchmark-compare-fail: expected a percentage such as '10%'"),
     ("10", "--gpu-benchmark-compare-fail: '10' is ambiguous"),
     ("0%", "greater than 0")],
)
def test_session_from_options_bad_threshold(tmp_path, fail, message):
    write(tmp_path / "b.json", [])
    with pytest.raises(pytest.UsageError, match=message):
        pytest_plugin.session_from_options(None, str(tmp_path / "b.json"), fail)


def test_session_from_options_threshold_needs_a_baseline():
    with pytest.raises(pytest.UsageError, match="--gpu-benchmark-compare-fail needs --gpu-benchmark-compare"):
        pytest_plugin.session_from_options(None, None, "10%")


def test_session_from_options_bad_paths(tmp_path):
    with pytest.raises(pytest.UsageError, match="--gpu-benchmark-compare: .*nope.json does not exist"):
        pytest_plugin.session_from_options(None, str(tmp_path / "nope.json"), None)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(pytest.UsageError, match="--gpu-benchmark-compare: .*not a cudalab results file"):
        pytest_plugin.session_from_options(None, str(tmp_path / "bad.json"), None)
    with pytest.raises(pytest.UsageError, match="--gpu-benchmark-json: .* is a directory"):
        pytest_plugin.session_from_options(str(tmp_path), None, None)


def test_session_from_options_json_into_a_missing_directory_is_a_usage_error(tmp_path):
    missing = tmp_path / "no" / "such" / "r.json"
    with pytest.raises(pytest.UsageError,
                       match=r"--gpu-benchmark-json: the directory of .*r.json .* does not exist; "
                             "create it first"):
        pytest_plugin.session_from_options(str(missing), None, None)
    assert not (tmp_path / "no").exists()  # nothing was created


def test_session_from_options_preset(tmp_path):
    assert pytest_plugin.session_from_options(None, None, None).preset == "default"
    assert pytest_plugin.session_from_options(None, None, None, "quick").preset == "quick"
    with pytest.raises(pytest.UsageError, match="--gpu-benchmark-preset: unknown preset 'fast' "
                                                "\\(expected one of quick, default, sustained\\)"):
        pytest_plugin.session_from_options(None, None, None, "fast")


def test_session_records_and_compares(tmp_path):
    write(tmp_path / "b.json", [B.Record("x", fake("add", 1e-3))])
    s = pytest_plugin.session_from_options(str(tmp_path / "o.json"), str(tmp_path / "b.json"), "10%")
    assert s.threshold == pytest.approx(0.1)
    record = s.record("t.py::test_a", fake("add", 2e-3))
    assert record.comparison.regressed
    assert s.record("t.py::test_b", fake("new", 1e-3)).comparison.missing
    # A rerun of the same test replaces its entry; another test may not reuse the key.
    s.record("t.py::test_a", fake("add", 1e-3))
    assert [r.measurement.median for r in s.records] == pytest.approx([1e-3, 1e-3])
    with pytest.raises(ValueError, match=r"'add' was already recorded by t.py::test_a"):
        s.record("t.py::test_c", fake("add", 1e-3))


def test_fixture_takes_exactly_the_options_of_measure():
    import inspect

    from cudalab.bench import MEASURE_OPTIONS, WORK_OPTIONS, measure

    keyword_only = [n for n, p in inspect.signature(measure).parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert list(MEASURE_OPTIONS) == keyword_only
    assert set(WORK_OPTIONS) < set(MEASURE_OPTIONS)


def test_gpu_available_never_raises(monkeypatch):
    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(cudalab._core, "is_available", broken)
    assert pytest_plugin.gpu_available() is False


@pytest.mark.parametrize("value, required", [("1", True), (" 1 ", True), ("0", False), ("", False),
                                             ("yes", False)])
def test_gpu_required(monkeypatch, value, required):
    monkeypatch.setenv("CUDALAB_REQUIRE_GPU", value)
    assert pytest_plugin.gpu_required() is required


# ---- pytest runs (pytester, in a subprocess without a visible GPU) ---------------------------


@pytest.fixture
def no_gpu(monkeypatch):
    """A subprocess environment in which cudalab sees no device, GPU machine or not."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDALAB_REQUIRE_GPU", raising=False)
    return monkeypatch


MARKED = """
import pytest

@pytest.mark.gpu
def test_marked():
    raise AssertionError("a gpu test ran without a GPU")

def test_plain():
    pass

def test_fixture(gpu_benchmark):
    raise AssertionError("the gpu_benchmark fixture was set up without a GPU")
"""


def test_gpu_marker_and_fixture_skip_without_gpu(pytester, no_gpu):
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_subprocess(*PLUGIN, "--strict-markers", "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*needs a CUDA device (cudalab.is_available() is False)*"])


def test_gpu_marker_and_fixture_fail_under_require_gpu(pytester, no_gpu):
    no_gpu.setenv("CUDALAB_REQUIRE_GPU", "1")
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_subprocess(*PLUGIN, "--strict-markers")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([
        ("*CUDALAB_REQUIRE_GPU=1 but cudalab.is_available() is False: GPU test "
         "test_marked.py::test_marked cannot run (no CUDA device or driver visible to cudalab); "
         "refusing to skip it*"),
    ])
    result.stdout.fnmatch_lines(["*GPU test test_marked.py::test_fixture cannot run*"])


def test_marker_is_registered(pytester):
    result = pytester.runpytest_subprocess(*PLUGIN, "--markers")
    result.stdout.fnmatch_lines([GPU_MARKER_LINE])


def test_plugin_loads_without_autoload(pytester, no_gpu):
    no_gpu.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest_subprocess(*PLUGIN, "--strict-markers")
    result.assert_outcomes(passed=1, skipped=2)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpu-benchmark-compare-fail", "10%"], "--gpu-benchmark-compare-fail needs --gpu-benchmark-compare"),
        (["--gpu-benchmark-compare", "base.json", "--gpu-benchmark-compare-fail", "10x"],
         ("--gpu-benchmark-compare-fail: expected a percentage such as '10%' or a fraction such as "
          "'0.1', got '10x'")),
        (["--gpu-benchmark-compare", "base.json", "--gpu-benchmark-compare-fail", "25"],
         "--gpu-benchmark-compare-fail: '25' is ambiguous*write '25%'*"),
        (["--gpu-benchmark-compare", "missing.json"], "--gpu-benchmark-compare: missing.json does not exist"),
        (["--gpu-benchmark-compare", "test_ok.py"], "--gpu-benchmark-compare: test_ok.py is not valid JSON*"),
        (["--gpu-benchmark-json", "missing/r.json"],
         "--gpu-benchmark-json: the directory of missing/r.json (*missing) does not exist; create it first"),
        (["--gpu-benchmark-preset", "slow"], "--gpu-benchmark-preset: unknown preset 'slow'*"),
    ],
)
def test_option_errors_are_usage_errors(pytester, args, message):
    write(pytester.path / "base.json", [])
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest(*PLUGIN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}*"])


# A stand-in for gpu_benchmark without the GPU check: tests record synthetic
# Measurements through the fixture's own recording path.
FAKE_CONFTEST = """
import pytest
from cudalab.pytest_plugin import GpuBenchmark, benchmark_session

@pytest.fixture
def bench(request):
    return GpuBenchmark(request.node, benchmark_session(request.config))
"""

FAKE_TESTS = """
from cudalab.bench import Measurement

def fake(label, median, **fields):
    return Measurement(label=label, times=[median * f for f in (0.97, 0.99, 1.0, 1.01, 1.03)],
                       device="Fake GPU", **fields)

def test_slower(bench):
    bench.record(fake("slower", 1.5e-3, bytes=3e6))
    assert len(bench.measurements) == 1

def test_within(bench):
    bench.record(fake("within", 1.05e-3, flops=2e9))

def test_faster(bench):
    bench.record(fake("faster", 0.5e-3))

def test_new(bench):
    bench.record(fake("new", 0.7e-3))
"""


def _baseline(path):
    write(path, [B.Record("old::" + label, fake(label, 1e-3))
                 for label in ("slower", "within", "faster", "gone")], {"hostname": "old"})


def test_json_written_for_the_session(pytester, no_gpu):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_fake=FAKE_TESTS)
    (pytester.path / "results").mkdir()
    out = pytester.path / "results" / "run.json"
    result = pytester.runpytest_subprocess(*PLUGIN, "--gpu-benchmark-json", str(out))
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "*= cudalab gpu_benchmark =*",
        "benchmark*median*IQR*rate",
        "slower*1.5 ms*2 GB/s",
        "within*1.05 ms*1.905 TFLOP/s",
        "faster*500 us*",
        "new*700 us*",
        f"results written to {out}",
    ])
    data = json.loads(out.read_text())
    assert data["schema"] == R.RESULTS_SCHEMA == "cudalab.results/1"
    assert data["kind"] == "pytest" and data["command"].startswith("pytest ")
    assert data["preset"]["name"] == "default"
    assert data["machine"]["hostname"] == socket.gethostname()
    assert data["machine"]["cuda"]["available"] is False and data["machine"]["devices"] == []
    rows = R.read_results(out).rows
    assert [r.get("nodeid") for r in rows] == [f"test_fake.py::test_{n}" for n in ("slower", "within", "faster", "new")]
    assert [r.measurement.median for r in rows] == pytest.approx([1.5e-3, 1.05e-3, 0.5e-3, 0.7e-3])
    assert all(b["comparison"] is None for b in data["rows"])


def test_compare_fails_only_the_regressed_test(pytester, no_gpu):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_fake=FAKE_TESTS)
    _baseline(pytester.path / "base.json")
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--gpu-benchmark-compare", "base.json", "--gpu-benchmark-compare-fail", "10%",
        "--gpu-benchmark-json", str(out),
    )
    result.assert_outcomes(failed=1, passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*_ test_slower _*",
        ("test_fake.py:8: cudalab benchmark regression: slower: median 1.5 ms vs baseline 1 ms "
         "(+50.0%), more than the allowed +10%"),
        "(baseline: base.json; --gpu-benchmark-compare-fail 10%)",
    ])
    result.stdout.fnmatch_lines([
        "*= cudalab gpu_benchmark =*",
        "benchmark*vs baseline",
        "slower*1 ms -> +50.0% REGRESSION (> +10%)",
        "within*1 ms -> +5.0%",
        "faster*1 ms -> -50.0%",
        "new*no baseline",
        ("compared with base.json (fail above +10%): 1 regression(s), 1 without a baseline, "
         "1 baseline entry not measured in this run"),
        "FAILED test_fake.py::test_slower - Failed: test_fake.py:8: cudalab benchmark*",
    ])
    statuses = {b["measurement"]["label"]: b["comparison"]["status"] for b in json.loads(out.read_text())["rows"]}
    assert statuses == {"slower": "regression", "within": "slower", "faster": "faster", "new": "missing"}


def test_compare_with_a_generous_threshold_passes(pytester, no_gpu):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_fake=FAKE_TESTS)
    _baseline(pytester.path / "base.json")
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--gpu-benchmark-compare", "base.json", "--gpu-benchmark-compare-fail", "0.6",
    )
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["slower*1 ms -> +50.0%", "compared with base.json (fail above +60%): 0 regression(s)*"])


def test_compare_without_threshold_only_reports(pytester, no_gpu):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_fake=FAKE_TESTS)
    _baseline(pytester.path / "base.json")
    result = pytester.runpytest_subprocess(*PLUGIN, "--gpu-benchmark-compare", "base.json")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["slower*1 ms -> +50.0%", "compared with base.json (report only)*"])
    result.stdout.no_fnmatch_line("*REGRESSION*")


def test_regressed_test_that_fails_itself_keeps_its_own_failure(pytester, no_gpu):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_fake=FAKE_TESTS.replace(
        "    assert len(bench.measurements) == 1", "    assert False, 'the result is wrong'"))
    _baseline(pytester.path / "base.json")
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--gpu-benchmark-compare", "base.json", "--gpu-benchmark-compare-fail", "10%")
    result.assert_outcomes(failed=1, passed=3)
    result.stdout.fnmatch_lines(["*AssertionError: the result is wrong*", "slower*REGRESSION*"])


FIXTURE_MISUSE = """
import pytest
from cudalab.bench import Measurement

def m(label, **fields):
    return Measurement(label=label, times=[1e-3] * 4, **fields)

def test_unknown_option(bench):
    with pytest.raises(TypeError, match=r"gpu_benchmark\\(\\) got unexpected keyword argument\\(s\\) 'bogus'"):
        bench(lambda: None, bogus=1)

def test_record_needs_a_measurement(bench):
    with pytest.raises(TypeError, match="expected a cudalab.bench.Measurement, got dict"):
        bench.record({"label": "x"})

def test_same_key_twice_in_a_test(bench):
    bench.record(m("twice"))
    bench.record(m("twice", sub_label="other"))
    with pytest.raises(ValueError, match="this test already measured"):
        bench.record(m("twice"))
    with pytest.raises(ValueError, match="this test already measured"):
        bench(lambda: None, label="twice")

def test_key_of_another_test(bench):
    with pytest.raises(ValueError, match="already recorded by test_misuse.py::test_same_key_twice_in_a_test"):
        bench(lambda: None, label="twice", sub_label="other")
"""


def test_fixture_argument_errors(pytester, no_gpu):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_misuse=FIXTURE_MISUSE)
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=4)


def test_no_summary_without_benchmarks(pytester):
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*cudalab gpu_benchmark*")


def test_empty_json_when_nothing_was_measured(pytester, no_gpu):
    # The path is taken when pytest starts: a test that changes directory does not move it.
    pytester.makepyfile(test_ok="import os\n\ndef test_ok(tmp_path):\n    os.chdir(tmp_path)\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "--gpu-benchmark-json", "r.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "no gpu_benchmark measurements in this session",
        f"results written to {pytester.path / 'r.json'}",
    ])
    assert R.read_results(pytester.path / "r.json").rows == []

def test_readme_plugin_example_skips_without_gpu(pytester, no_gpu):
    pytester.makepyfile(test_readme_example=readme_plugin_example())
    result = pytester.runpytest_subprocess(*PLUGIN, "--strict-markers")
    result.assert_outcomes(skipped=1)


def test_project_suite_loads_the_plugin_without_autoload(monkeypatch):
    # tests/conftest.py registers the plugin itself when the entry point was not loaded.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strict-markers", "--markers"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert GPU_MARKER_LINE in done.stdout
    assert "--gpu-benchmark-json" in subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    ).stdout


# ---- gpu_benchmark.lesson ----------------------------------------------------------------

# cudalab.lessons.run is replaced by a stand-in whose result holds a "copy" of
# LESSON_SCALE ms and a "launch" whose own label differs from its key, so a
# lesson's measurements go through the fixture's recording path without a GPU.
LESSON_TESTS = """
import os
import pytest
import cudalab.lessons
from cudalab.bench import Measurement
from cudalab.lessons import LessonResult

def m(label, median):
    return Measurement(label=label, times=[median * f for f in (0.97, 0.99, 1.0, 1.01, 1.03)],
                       device="Fake GPU")

def fake_run(name, quick=False, **params):
    copy = float(os.environ["LESSON_SCALE"]) * 1e-3
    return LessonResult(lesson=name, number=1, title="t", seed="s", params=dict(params),
                        quick=quick, device={"name": "Fake GPU"}, env={},
                        measurements={"copy": m("copy", copy), "launch": m("host", 2e-6)},
                        rows=(), findings=(), claims=(), checks=(), wall_seconds=0.1,
                        created="now")

@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(cudalab.lessons, "run", fake_run)

def test_lesson(bench):
    result = bench.lesson("demo", size=3)
    assert result.lesson == "demo" and result.params == {"size": 3} and result.quick is True
    assert [m.label for m in bench.measurements] == ["demo: copy", "demo: launch"]
    assert bench.measurements[0].median == result.measurements["copy"].median

def test_other(bench):
    assert bench.lesson("other", quick=False).quick is False
    with pytest.raises(ValueError, match="this test already measured"):
        bench.lesson("other")
    assert len(bench.measurements) == 2
"""


def test_lesson_records_every_measurement_with_the_lesson_label(pytester, no_gpu):
    no_gpu.setenv("LESSON_SCALE", "1")
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_lesson=LESSON_TESTS)
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(*PLUGIN, "--gpu-benchmark-json", str(out))
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*= cudalab gpu_benchmark =*", "demo: copy*1 ms*",
                                 "demo: launch*2 us*", "other: copy*", "other: launch*"])
    rows = R.read_results(out).rows
    assert [(r.get("nodeid"), r.measurement.label) for r in rows] == [
        ("test_lesson.py::test_lesson", "demo: copy"),
        ("test_lesson.py::test_lesson", "demo: launch"),
        ("test_lesson.py::test_other", "other: copy"),
        ("test_lesson.py::test_other", "other: launch")]


def test_lesson_regression_against_a_lessons_file_fails_the_test(pytester, no_gpu):
    # The baseline is a lessons results file, as `cudalab run-all --json` writes.
    from cudalab.lessons import LessonResult, write_results

    base = LessonResult(lesson="demo", number=1, title="t", seed="s", params={}, quick=True,
                        device={"name": "Fake GPU"}, env={},
                        measurements={"copy": fake("copy", 1e-3), "launch": fake("host", 2e-6)},
                        rows=(), findings=(), claims=(), checks=(), wall_seconds=0.1,
                        created="now")
    write_results(pytester.path / "lessons.json", [base])
    no_gpu.setenv("LESSON_SCALE", "1.5")
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_lesson=LESSON_TESTS)
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--gpu-benchmark-compare", "lessons.json", "--gpu-benchmark-compare-fail", "10%")
    result.assert_outcomes(failed=1, passed=1)
    line = LESSON_TESTS.strip().splitlines().index('    result = bench.lesson("demo", size=3)') + 1
    result.stdout.fnmatch_lines([
        "*_ test_lesson _*",
        (f"test_lesson.py:{line}: cudalab benchmark regression: demo: copy: median 1.5 ms vs baseline "
         "1 ms (+50.0%), more than the allowed +10%"),
    ])
    result.stdout.fnmatch_lines(["demo: launch*2 us -> +0.0%", "other: copy*no baseline"])
