"""GPU tier: the lesson commands and gpu_benchmark.lesson on a real device."""

from __future__ import annotations

import pytest

import cudalab
from cudalab import lessons
from _support import run_cli

pytestmark = pytest.mark.gpu


def _first() -> str:
    if not lessons.names():
        pytest.skip("no lesson is registered")
    return lessons.names()[0]


def _guide_lesson(name: str) -> None:
    if name not in lessons.names():
        pytest.skip(f"lesson {name} is not registered")


def test_lesson_quick_writes_a_file_read_results_reads_back(tmp_path):
    name = _first()
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = run_cli("lesson", name, "--quick", "--json", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr
    [back] = lessons.read_results(out)
    assert back.lesson == name and back.quick is True
    assert back.measurements and all(c.passed for c in back.checks)
    assert back.heading in done.stdout
    assert back.device["name"] == cudalab.get_device_name(cudalab.current_device())
    assert md.read_text().startswith(f"# cudalab lessons on {back.device['name']}\n")


def test_set_overrides_a_parameter(tmp_path):
    name = _first()
    x = lessons.get(name)
    if not x.quick_params:
        pytest.skip(f"lesson {name} has no quick parameter to set")
    key, value = next(iter(x.quick_params.items()))
    text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    out = tmp_path / "r.json"
    done = run_cli("lesson", name, "--quick", "--set", f"{key}={text}", "--json", str(out))
    assert done.returncode == 0, done.stderr
    [back] = lessons.read_results(out)
    got = back.params[key]
    assert (tuple(got) if isinstance(value, tuple) else got) == value


def test_cpu_vs_gpu_passes_its_options(tmp_path):
    _guide_lesson("cpu_vs_gpu")
    out = tmp_path / "r.json"
    done = run_cli("cpu-vs-gpu", "--quick", "--matrix-size", "512", "--iterations", "3",
                   "--json", str(out))
    assert done.returncode == 0, done.stderr
    [back] = lessons.read_results(out)
    assert (back.lesson, back.params["matrix_size"], back.params["iterations"]) == (
        "cpu_vs_gpu", 512, 3)


def test_memory_passes_its_batch_sizes(tmp_path):
    _guide_lesson("memory")
    out = tmp_path / "r.json"
    done = run_cli("memory", "--quick", "--batch-sizes", "16,32", "--json", str(out))
    assert done.returncode == 0, done.stderr
    [back] = lessons.read_results(out)
    assert back.lesson == "memory" and list(back.params["batch_sizes"]) == [16, 32]


def test_gpu_benchmark_lesson_records_each_measurement(gpu_benchmark):
    name = _first()
    result = gpu_benchmark.lesson(name)
    assert result.lesson == name and result.quick is True
    assert [m.label for m in gpu_benchmark.measurements] == [
        f"{name}: {label}" for label in result.measurements]
    assert [m.median for m in gpu_benchmark.measurements] == [
        m.median for m in result.measurements.values()]
