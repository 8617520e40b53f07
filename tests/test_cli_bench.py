"""`cudalab bench ...` and `cudalab ceilings`, and the progress bar they draw."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import cudalab
from cudalab import cli
from cudalab._progress import ProgressBar
from cudalab._table import format_table
from cudalab.bench import CEILING_NAMES, MATMUL_DTYPES, PRESETS, read_results
from _support import no_gpu_only, run_cli

COMMANDS = [("bench",), ("bench", "matmul"), ("bench", "copy"), ("bench", "transfer"), ("ceilings",)]


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
    (("ceilings", "--only", "copy,warp"), "argument --only: invalid choice: 'warp'"),
    (("bench", "matmul", "--dtype", "float16,"), "argument --dtype: invalid choice: ''"),
    (("bench", "matmul", "--dtype"), "argument --dtype: expected at least one argument"),
    (("bench", "copy", "--preset", "slow"), "argument --preset: invalid choice: 'slow'"),
    (("bench", "copy", "--json", "/nonexistent-dir/r.json"),
     "argument --json: directory '/nonexistent-dir' does not exist; create it first"),
    (("ceilings", "--json", "."), "argument --json: '.' is a directory"),
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


def parse(*args: str):
    return cli.build_parser().parse_args(list(args))


@pytest.mark.parametrize("args", [
    ("--dtype", "float16", "bfloat16"),
    ("--dtype", "float16,bfloat16"),
    ("--dtype", "float16", "--dtype", "bfloat16"),
    ("--dtype", "float16", "--dtype", "bfloat16,float16"),  # repeats dropped
    ("--dtype", " float16 , bfloat16"),
])
def test_dtype_takes_several_values_in_every_documented_form(args):
    assert parse("bench", "matmul", *args).dtype == ["float16", "bfloat16"]


def test_only_takes_several_values_in_every_documented_form():
    for args in (("copy", "launch"), ("copy,launch",), ("copy", "--only", "launch")):
        assert parse("ceilings", "--only", *args).only == ["copy", "launch"]
    assert parse("ceilings").only is None


def test_help_shows_the_forms_the_parser_accepts():
    for command, option, metavar, example in ((("bench", "matmul"), "--dtype", "DTYPE", "float16"),
                                              (("ceilings",), "--only", "NAME", "copy")):
        text = " ".join(run_cli(*command, "--help").stdout.split())
        assert f"{option} {metavar} [{metavar} ...]" in text  # several values
        assert f"'{option} {example}," in text  # the comma form
        assert f"repeated {option}" in text
    matmul = " ".join(run_cli("bench", "matmul", "--help").stdout.split())
    assert all(d in matmul for d in MATMUL_DTYPES)
    ceilings = " ".join(run_cli("ceilings", "--help").stdout.split())
    assert all(n in ceilings for n in CEILING_NAMES)


def test_timing_options_default_to_the_sustained_preset():
    args = parse("bench", "copy")
    assert (args.preset, args.warmup, args.min_run_time, args.iterations) == ("sustained", None, None, None)
    assert parse("bench", "transfer", "--preset", "quick").preset == "quick"
    help_text = " ".join(run_cli("bench", "copy", "--help").stdout.split())
    assert PRESETS["sustained"].describe() in help_text


def test_timer_from_the_options():
    from cudalab.cli.bench import _timer

    timer = _timer(parse("bench", "copy", "--preset", "quick", "--warmup", "0.3"), None)
    assert timer.settings == PRESETS["quick"].replace(warmup=0.3)
    exact = _timer(parse("bench", "matmul", "--iterations", "25", "--flush-l2"), None).settings
    assert (exact.min_repeats, exact.max_repeats, exact.flush_l2) == (25, 25, True)
    assert exact.min_run_time < 1e-3 and exact.max_run_time > 1e6


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
    result = run_cli("bench", "matmul", "--matrix-size", "1031", "--dtype", "float16,float32",
                     "--iterations", "25", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "matmul 1031 x 1031 x 1031" in result.stdout
    data = json.loads(out.read_text())
    assert (data["schema"], data["kind"]) == ("cudalab.results/1", "bench matmul")
    ours = [r["measurement"] for r in data["rows"] if r["measurement"]["description"] == "cudalab"]
    assert [m["sub_label"] for m in ours] == ["float16", "float32"]
    assert all(len(m["times"]) == 25 for m in ours)
    assert all(m["derived"]["tflops"] > 0 for m in ours)
    assert all(m["settings"]["name"] == "sustained" for m in ours)
    assert data["machine"]["devices"][0]["name"] == cudalab.get_device_properties(0).name
    assert read_results(out).measurements[0].metadata["n"] == 1031


@pytest.mark.gpu
def test_bench_copy_and_transfer(tmp_path):
    out = tmp_path / "copy.json"
    result = run_cli("bench", "copy", "--size-mb", "64", "--preset", "quick", "--json", str(out))
    assert result.returncode == 0, result.stderr
    copy = read_results(out).measurements[0]
    assert copy.bytes == 2 * 64 * 2**20 and copy.gbps > 10
    assert copy.settings["name"] == "quick"
    result = run_cli("bench", "transfer", "--size-mb", "16", "--pageable", "--preset", "quick",
                     "--json", str(out))
    assert result.returncode == 0, result.stderr
    measured = read_results(out).measurements
    keys = {(m.label, m.sub_label, m.description) for m in measured}
    assert {("h2d", "pinned", "cudalab"), ("d2h", "pinned", "cudalab"),
            ("h2d", "pageable", "cudalab"), ("d2h", "pageable", "cudalab")} <= keys
    # Pageable copies synchronize: they are never held behind a spin kernel.
    assert not any(m.held for m in measured if m.sub_label == "pageable")


@pytest.mark.gpu
def test_ceilings_command(tmp_path):
    out = tmp_path / "ceilings.json"
    result = run_cli("ceilings", "--only", "copy", "launch", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "copy" in result.stdout and "launch" in result.stdout
    back = read_results(out)
    assert back.kind == "ceilings"
    assert [r.get("name") for r in back.rows] == ["copy", "launch"]
    assert [r.get("unit") for r in back.rows] == ["B/s", "s"]
    assert back.rows[0].get("value") == pytest.approx(back.rows[0].measurement.gbps * 1e9)


# ---- the commands' output, with synthetic measurements (no GPU needed) ----------------------


@pytest.fixture
def fake_device(monkeypatch):
    """cli_bench with device 0 'present' and measure_cases giving synthetic Measurements."""
    import types

    from cudalab.cli import bench as cli_bench
    from cudalab.bench import Measurement

    props = types.SimpleNamespace(name="Fake GPU", peak_flops={"float16": 1e15, "tfloat32": 5e14},
                                  peak_memory_bandwidth=4e12)
    monkeypatch.setattr(cli_bench, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_bench, "get_device_properties", lambda index: props)
    monkeypatch.setattr(cli_bench, "device_context", lambda index: contextlib.nullcontext())

    def measure_cases(cases, args):
        out = []
        for case in cases:
            for impl, scale in (("cudalab", 1.0), ("torch", 1.25)):
                work = {"flops": case.flops} if hasattr(case, "flops") else {"bytes": 2.0 * case.nbytes}
                out.append(Measurement(label=case.label, sub_label=case.sub_label, description=impl,
                                       times=(1e-3 * scale,) * 5, device="Fake GPU",
                                       settings={"name": args.preset}, **work))
        return out

    monkeypatch.setattr(cli_bench, "_measure_cases", measure_cases)
    return props


def test_bench_matmul_table_and_json(fake_device, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert cli.main(["bench", "matmul", "--matrix-size", "64", "--dtype", "float16,tf32",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "matmul 64 x 64 x 64 on Fake GPU (device 0)" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.split()}
    assert lines["float16"][-1] == "1.25" and lines["tf32"][-1] == "1.25"  # x torch
    back = read_results(out)
    assert back.kind == "bench matmul" and back.data["command"].startswith("cudalab ")
    assert [(m.sub_label, m.description) for m in back.measurements] == [
        ("float16", "cudalab"), ("float16", "torch"), ("tf32", "cudalab"), ("tf32", "torch")]
    assert back.measurements[0].settings == {"name": "sustained"}


def test_bench_copy_and_transfer_tables(fake_device, tmp_path, capsys):
    assert cli.main(["bench", "copy", "--size-mb", "64", "--preset", "quick"]) == 0
    text = capsys.readouterr().out
    assert "device-to-device copy of 64 MiB" in text and "cudalab" in text and "torch" in text
    out = tmp_path / "t.json"
    assert cli.main(["bench", "transfer", "--size-mb", "16", "--pageable", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for row in ("h2d pinned", "d2h pinned", "h2d pageable", "d2h pageable"):
        assert row in text
    assert {m.label for m in read_results(out).measurements} == {"h2d", "d2h"}


def test_ceilings_json_rows(monkeypatch, tmp_path, capsys):
    from cudalab.cli import bench as cli_bench
    from cudalab.bench import Ceiling, Ceilings, Measurement

    m = Measurement(label="ceiling", sub_label="copy", times=(1e-3,) * 5, bytes=2e9, device="Fake GPU")
    result = Ceilings("Fake GPU", 0, {"copy": Ceiling("copy", 2e12, "B/s", 4e12, m)})
    monkeypatch.setattr(cli_bench, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_bench, "ceilings", lambda device, names, progress: result)
    out = tmp_path / "c.json"
    assert cli.main(["ceilings", "--only", "copy", "--json", str(out)]) == 0
    assert "2000 GB/s" in capsys.readouterr().out
    [row] = read_results(out).rows
    assert (row.get("name"), row.get("value"), row.get("percent_of_theoretical")) == ("copy", 2e12, 50.0)
    assert row.measurement == m
