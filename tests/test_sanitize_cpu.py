"""CPU tier: scripts/sanitize.sh's bookkeeping (how reports are counted and
which test files each part runs), checked on made-up sanitizer logs."""

from __future__ import annotations

import json
import re
import subprocess

from _support import REPO_ROOT, load_module

summary = load_module(REPO_ROOT / "scripts" / "sanitize_summary.py")

MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 16 bytes
=========     at <unnamed>::load_unaligned16(const void *)+0xa70 in pad.cu:54
=========     by thread (127,0,0) in block (0,1022,0)
=========     Access to 0x49046669f0 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaGetLastError.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 130 errors
========= ERROR SUMMARY: 128 errors were not printed. Use --print-limit option to adjust the number of printed errors
"""


def test_errors_are_summed_over_processes_and_the_not_printed_line_is_not_counted(tmp_path):
    (tmp_path / "memcheck_ops_main.101.log").write_text(MEMCHECK_LOG)
    (tmp_path / "memcheck_ops_main.102.log").write_text(
        "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    (tmp_path / "memcheck_ops_main.103.log").write_text("")  # never touched CUDA
    (tmp_path / "memcheck_ops_main.pytest.log").write_text("ERROR SUMMARY: 9 errors\n")
    got = summary.read_logs(tmp_path, "memcheck_ops_main")
    assert got["errors"] == 130
    assert got["processes"] == 2
    reports = {r["report"]: r["count"] for r in got["reports"]}
    assert reports == {
        "Invalid __global__ read of size 16 bytes @ "
        "<unnamed>::load_unaligned16(const void *)+0xa70 in pad.cu:54": 1,
        'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" '
        "on CUDA API call to cudaGetLastError.": 1,
    }


def test_a_clean_run_has_no_reports(tmp_path):
    (tmp_path / "racecheck_nn_main.7.log").write_text(
        "========= COMPUTE-SANITIZER\n"
        "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
        "========= ERROR SUMMARY: 0 errors\n")
    assert summary.read_logs(tmp_path, "racecheck_nn_main") == {
        "errors": 0, "processes": 1, "reports": []}


def test_cell_sums_passes():
    runs = [{"errors": 0, "seconds": 20, "pytest_rc": 0,
             "tests": {"passed": 5, "failures": 0, "errors": 0}},
            {"errors": 2, "seconds": 3, "pytest_rc": 1,
             "tests": {"passed": 1, "failures": 1, "errors": 0}}]
    assert summary.cell(runs) == "**2** errors, 23 s, 6 passed, 1 failed"
    assert summary.cell([]) == "not run"
    stopped = {"errors": 0, "seconds": 240, "pytest_rc": 124, "tests": {}}
    assert summary.cell(runs + [stopped]) == "stopped by the time limit after 240 s"


def test_every_gpu_test_file_is_in_exactly_one_part():
    listing = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "sanitize.sh"), "-p", "list"],
                             capture_output=True, text=True, cwd=REPO_ROOT, check=True).stdout
    files = [f for line in listing.splitlines() for f in line.split(": ", 1)[1].split()]
    assert len(files) == len(set(files)), "a file is in two parts"
    on_disk = sorted(p.relative_to(REPO_ROOT).as_posix()
                     for p in (REPO_ROOT / "tests").glob("*_gpu.py"))
    assert sorted(files) == on_disk


def test_deliberate_and_misjudged_tests_exist():
    """The node ids sanitize.sh treats specially name tests that exist."""
    script = (REPO_ROOT / "scripts" / "sanitize.sh").read_text()
    ids = re.findall(r'^  "(tests/[^"]+)"$', script, re.M)
    assert len(ids) >= 4
    for node in ids:
        path, _, name = node.partition("::")
        source = (REPO_ROOT / path).read_text()
        if name:
            assert f"def {name.split('[')[0]}(" in source, node


def test_record_and_table_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SANITIZE_DEVICE", "Test GPU")
    summary.device_tag.cache_clear()  # read once per process: this test sets it
    monkeypatch.setenv("SANITIZE_COMMIT", "abc1234")
    monkeypatch.setattr(summary, "RESULTS", tmp_path / "results")
    (tmp_path / "memcheck_ops_main.5.log").write_text(MEMCHECK_LOG)
    (tmp_path / "memcheck_ops_main.junit.xml").write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1"/></testsuites>')
    rc = summary.main(["record", "--tool", "memcheck", "--part", "ops", "--pass", "main",
                       "--logs", str(tmp_path), "--tag", "memcheck_ops_main", "--rc", "1",
                       "--seconds", "7", "--command", "scripts/sanitize.sh -t memcheck -p ops"])
    assert rc == 1  # errors were reported
    data = json.loads((tmp_path / "results" / "sanitizer_Test_GPU.json").read_text())
    run = data["runs"]["memcheck/ops/main"]
    assert (run["errors"], run["commit"], run["tests"]["passed"]) == (130, "abc1234", 2)
    assert summary.main(["table"]) == 0
    table = (tmp_path / "results" / "sanitizer_Test_GPU.md").read_text()
    assert "| ops | **130** errors, 7 s, 2 passed, 1 failed | not run | not run | not run |" in table
