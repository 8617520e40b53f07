"""README and docs figures that come from committed result files must match them."""

from __future__ import annotations

import json

import pytest

from _support import DOCS, README, REPO_ROOT, load_module

RESULTS = REPO_ROOT / "benchmarks" / "results"
gpu_summary = load_module(REPO_ROOT / "scripts" / "gpu_summary.py")


def _gpu_check_files():
    files = []
    for path in sorted(RESULTS.glob("gpu_check_*.json")):
        data = json.loads(path.read_text())
        if data.get("schema", "").startswith("cudalab.results/"):
            files.append(pytest.param(data, id=path.name))
    return files


@pytest.mark.parametrize("results", _gpu_check_files())
def test_docs_gpu_check_row_matches_the_results_file(results):
    row = gpu_summary.readme_row(results)
    assert row in (DOCS / "results.md").read_text().splitlines(), (
        f"docs/results.md's GPU check table lacks the row of the committed results file; "
        f"it should read:\n{row}")


def test_there_is_a_gpu_check_results_file():
    assert _gpu_check_files(), "no gpu_check_*.json in the results schema is committed"


def _lessons_files():
    return [pytest.param(path, id=path.name) for path in sorted(RESULTS.glob("lessons_*.json"))]


@pytest.mark.parametrize("path", _lessons_files())
def test_readme_lessons_table_matches_the_results_file(path):
    from cudalab.lessons import read_results

    lessons_summary = load_module(REPO_ROOT / "scripts" / "lessons_summary.py")
    table = lessons_summary.readme_table(read_results(path))
    readme = README.read_text()
    message = (f"README's Lessons table differs from {path.name}; regenerate it with "
               f"python scripts/lessons_summary.py {path.relative_to(REPO_ROOT)}")
    assert table in readme, message


def test_lessons_table_has_the_two_tutorial_columns():
    lessons_summary = load_module(REPO_ROOT / "scripts" / "lessons_summary.py")
    header = lessons_summary.HEADER.splitlines()
    assert header[0] == ("| # | lesson | what it shows | tutorial claims | tutorial's T4 run "
                         "| measured here | held | why | cudalab vs PyTorch (same run) |")
    assert header[1].count("---") == header[0].count(" | ") + 1 == 9
    for path in _lessons_files():
        from cudalab.lessons import read_results

        table = lessons_summary.readme_table(read_results(path.values[0]))
        for row in table.splitlines()[2:]:
            assert len(row.split(" | ")) == 9, row


def test_gpu_summary_adds_the_shards_junit_counts(tmp_path):
    for name, (tests, failures, skipped) in {"a.xml": (10, 1, 2), "b.xml": (5, 0, 1)}.items():
        (tmp_path / name).write_text(
            f'<testsuites><testsuite tests="{tests}" failures="{failures}" errors="0" '
            f'skipped="{skipped}"/></testsuites>')
    total = gpu_summary.total_counts([tmp_path / "a.xml", tmp_path / "b.xml"])
    assert total == {"tests": 15, "failures": 1, "errors": 0, "skipped": 3, "passed": 11}
