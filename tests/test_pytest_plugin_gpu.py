"""GPU tier: cudalab's pytest plugin measuring real GPU work.

The fixture in this process (returns the first call's result, records the
measurement), then whole pytest runs through ``pytester`` in subprocesses
(one CUDA process per run): a benchmark written with --gpu-benchmark-json,
a baseline tampered to 1/10 of the measured times that must make the run
fail under --gpu-benchmark-compare-fail 10%, and the untouched baseline that
passes with a generous 200%.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import cudalab as cl
from cudalab.bench import Measurement
from cudalab.bench import results as R
from _support import F32, random_array, readme_plugin_example

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.gpu

PLUGIN = ("-p", "cudalab")


def test_fixture_returns_the_first_result_and_records(gpu_benchmark, request, rng):
    x = random_array(rng, 100_003, F32)
    dx = cl.asarray(x)
    calls = []

    def add_call_count(v):
        calls.append(None)
        return cl.add(v, float(len(calls)))  # the first call adds 1.0

    result = gpu_benchmark(add_call_count, dx, min_run_time=0.05, bytes=2 * 4 * x.size)
    np.testing.assert_array_equal(result.get(), x + np.float32(1.0))
    assert len(calls) > 10  # warm-up, probes and timed repeats
    [m] = gpu_benchmark.measurements
    assert isinstance(m, Measurement)
    assert m.key == (request.node.nodeid, None, None)
    assert m.device == cl.get_device_name()
    assert m.median > 0 and m.gbps > 0
    assert gpu_benchmark.comparisons == []  # this session has no baseline


def test_fixture_takes_a_preset(gpu_benchmark, rng):
    x = cl.asarray(random_array(rng, 10_007, F32))
    gpu_benchmark(cl.neg, x, preset="quick", ceiling=None)
    gpu_benchmark(cl.abs, x, preset="quick", warmup=0.0, description="abs", ceiling=None)
    first, second = gpu_benchmark.measurements
    assert first.settings["name"] == second.settings["name"] == "quick"
    assert second.settings["warmup"] == 0.0


def test_fixture_passes_names_through(gpu_benchmark, rng):
    x = cl.asarray(random_array(rng, 4099, F32))
    gpu_benchmark(cl.neg, x, label="neg", sub_label="float32", description="4099",
                  min_run_time=0.02, ceiling=None)
    gpu_benchmark(cl.abs, x, label="neg", sub_label="float32", description="abs",
                  min_run_time=0.02, ceiling=None)
    keys = [m.key for m in gpu_benchmark.measurements]
    assert keys == [("neg", "float32", "4099"), ("neg", "float32", "abs")]


BENCH_TEST = """
import numpy as np
import cudalab as cl

def test_add(gpu_benchmark):
    rng = np.random.default_rng(7)
    n = (1 << 22) + 3
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    da, db = cl.asarray(a), cl.asarray(b)
    c = gpu_benchmark(cl.add, da, db, bytes=3 * 4 * n, ceiling=None, min_run_time=0.1)
    np.testing.assert_array_equal(c.get(), a + b)
"""


def test_json_then_compare_against_tampered_and_true_baselines(pytester):
    pytester.makepyfile(test_bench=BENCH_TEST)
    baseline = pytester.path / "baseline.json"

    result = pytester.runpytest_subprocess(*PLUGIN, "--gpu-benchmark-json", str(baseline))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= cudalab gpu_benchmark =*", "test_bench.py::test_add*GB/s*"])
    data = json.loads(baseline.read_text())
    assert (data["schema"], data["kind"]) == ("cudalab.results/1", "pytest")
    machine = data["machine"]
    assert machine["cuda"]["available"] is True
    assert machine["cuda"]["driver_version"] == cl.driver_version()
    assert machine["cuda"]["runtime_version"] == cl.runtime_version()
    assert machine["devices"][0]["name"] == cl.get_device_name(0)
    assert len(machine["devices"]) == cl.device_count()
    [entry] = data["rows"]
    assert entry["nodeid"] == "test_bench.py::test_add"
    measured = Measurement.from_dict(entry["measurement"])
    assert measured.key == ("test_bench.py::test_add", None, None)
    assert measured.device == cl.get_device_name(0)
    assert measured.bytes == 3 * 4 * ((1 << 22) + 3)
    assert measured.median > 0 and measured.repeats >= 10
    assert measured.settings["name"] == "default" and measured.settings["min_run_time"] == 0.1

    # A baseline 10x faster than what was measured: the same run now regresses.
    tampered = pytester.path / "tampered.json"
    fast = json.loads(baseline.read_text())
    fast["rows"][0]["measurement"]["times"] = [t / 10 for t in measured.times]
    tampered.write_text(json.dumps(fast))
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--gpu-benchmark-compare", str(tampered), "--gpu-benchmark-compare-fail", "10%",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("test_bench.py:*: cudalab benchmark regression: test_bench.py::test_add: median * vs "
         "baseline * (+*%), more than the allowed +10%"),
        "*REGRESSION (> +10%)*",
    ])

    # The session's preset applies to every fixture call without its own.
    quick = pytester.path / "quick.json"
    result = pytester.runpytest_subprocess(*PLUGIN, "--gpu-benchmark-preset", "quick",
                                           "--gpu-benchmark-json", str(quick))
    result.assert_outcomes(passed=1)
    assert R.read_results(quick).measurements[0].settings["name"] == "quick"

    # The true baseline with a generous threshold passes (and is compared).
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--gpu-benchmark-compare", str(baseline), "--gpu-benchmark-compare-fail", "200%",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*vs baseline*",
        f"compared with {baseline} (fail above +200%): 0 regression(s), 0 without a baseline*",
    ])
    result.stdout.no_fnmatch_line("*REGRESSION*")


def test_machine_info_on_a_gpu():
    info = R.machine_info()
    assert info["cuda"]["available"] is True
    first = info["devices"][0]
    props = cl.get_device_properties(0)
    assert first["name"] == props.name
    assert first["compute_capability"] == list(props.compute_capability)
    assert first["multi_processor_count"] == props.multi_processor_count
    json.dumps(info)


def test_readme_plugin_example_runs(pytester):
    pytester.makepyfile(test_readme_example=readme_plugin_example())
    result = pytester.runpytest_subprocess(*PLUGIN, "--strict-markers")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= cudalab gpu_benchmark =*", "test_readme_example.py::test_add*GB/s*"])
