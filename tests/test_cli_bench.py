"""`cudalab bench ...` and `cudalab ceilings`, and the progress bar they draw."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

import cudalab
from cudalab._progress import ProgressBar
from cudalab._table import format_table

COMMANDS = [("bench",), ("bench", "matmul"), ("bench", "copy"), ("bench", "transfer"), ("ceilings",)]
no_gpu_only = pytest.mark.skipif(cudalab.is_available(), reason="checks behaviour without a GPU")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cudalab", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    assert f"usage: cudalab {' '.join(command)}" in result.stdout


def test_help_lists_bench_and_ceilings():
    out = run_cli("--help").stdout
    assert "bench" in out and "ceilings" in out


@pytest.mark.parametrize("args, message", [
    (("bench", "matmul", "--iterations", "0"), "--iterations: expected a positive integer, got 0"),
    (("bench", "matmul", "--matrix-size", "x"), "--matrix-size: expected a positive integer, got 'x'"),
    (("bench", "matmul", "--dtype", "int8"), "invalid choice: 'int8'"),
    (("bench", "copy", "--min-run-time", "-1"), "--min-run-time: expected a positive number"),
    (("ceilings", "--only", "warp"), "invalid choice: 'warp'"),
    (("bench",), "required: BENCHMARK"),
])
def test_bad_arguments_exit_2_with_the_reason(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr


@no_gpu_only
@pytest.mark.parametrize("command", [("bench", "matmul"), ("bench", "copy"), ("bench", "transfer"),
                                     ("ceilings",)], ids=" ".join)
def test_without_gpu_every_measuring_command_exits_1(command, tmp_path):
    out = tmp_path / "r.json"
    result = run_cli(*command, "--json", str(out))
    assert result.returncode == 1
    assert result.stderr == f"cudalab {' '.join(command)}: no CUDA device is available.\n"
    assert result.stdout == "" and not out.exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_and_erases_itself():
    stream = _Terminal()
    with ProgressBar(4, stream=stream, delay=0) as bar:
        bar.step("one")
        bar.update(0.5)
        assert "1/4  one" in bar.render()
        assert bar.render().startswith("[####")
        bar.step("two")
        assert "2/4  two" in bar.render()
    text = stream.getvalue()
    assert "\r" in text and "one" in text and "two" in text
    assert text.endswith("\r\033[K")


def test_progress_bar_is_silent_off_a_terminal_or_before_its_delay():
    plain = io.StringIO()
    with ProgressBar(2, stream=plain, delay=0) as bar:
        bar.step("x")
    assert plain.getvalue() == ""
    slow = _Terminal()
    with ProgressBar(2, stream=slow, delay=3600) as bar:
        bar.step("x")
    assert slow.getvalue() == ""


def test_format_table_aligns_columns():
    text = format_table(("name", "value"), [("a", "1"), ("long name", "12345")], title="T")
    lines = text.splitlines()
    assert lines[0] == "T"
    assert lines[1] == "name       value"
    assert lines[2] == "---------  -----"
    assert lines[3] == "a              1"
    assert lines[4] == "long name  12345"


@pytest.mark.gpu
def test_bench_matmul_prints_and_writes_json(tmp_path):
    out = tmp_path / "matmul.json"
    result = run_cli("bench", "matmul", "--matrix-size", "1031", "--dtype", "float16",
                     "--dtype", "float32", "--iterations", "25", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "matmul 1031 x 1031 x 1031" in result.stdout
    data = json.loads(out.read_text())
    ours = [m for m in data["measurements"] if m["description"] == "cudalab"]
    assert [m["sub_label"] for m in ours] == ["float16", "float32"]
    assert all(len(m["times"]) == 25 for m in ours)
    assert all(m["derived"]["tflops"] > 0 for m in ours)
    assert data["device"]["name"] == cudalab.get_device_properties().name


@pytest.mark.gpu
def test_bench_copy_and_transfer(tmp_path):
    out = tmp_path / "copy.json"
    result = run_cli("bench", "copy", "--size-mb", "64", "--json", str(out))
    assert result.returncode == 0, result.stderr
    copy = json.loads(out.read_text())["measurements"][0]
    assert copy["bytes"] == 2 * 64 * 2**20 and copy["derived"]["gbps"] > 10
    result = run_cli("bench", "transfer", "--size-mb", "16", "--pageable", "--json", str(out))
    assert result.returncode == 0, result.stderr
    rows = {(m["sub_label"], m["description"]) for m in json.loads(out.read_text())["measurements"]}
    assert {("h2d pinned", "cudalab"), ("d2h pinned", "cudalab"),
            ("h2d pageable", "cudalab"), ("d2h pageable", "cudalab")} <= rows


@pytest.mark.gpu
def test_ceilings_command(tmp_path):
    out = tmp_path / "ceilings.json"
    result = run_cli("ceilings", "--only", "copy", "--only", "launch", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "copy" in result.stdout and "launch" in result.stdout
    data = json.loads(out.read_text())
    assert set(data["ceilings"]) == {"copy", "launch"}
    assert data["ceilings"]["copy"]["unit"] == "B/s"
