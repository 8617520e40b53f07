"""CPU tier: ``cudalab lessons | lesson | run-all | cpu-vs-gpu | memory`` and lesson results files.

The commands run in this process (`cli.main`) against fake lessons registered
in a registry of their own (the real one is put back after each test). Where
a lesson would run, `cudalab.lessons.run` is replaced by a stand-in that
returns a synthetic result or raises, and the device check by one that finds
device 0, so the run loop, the output files and the exit status are checked
without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest

import cudalab
from cudalab import cli, lessons
from cudalab.cli import lessons as cli_lessons
from cudalab.bench import read_results as read_bench_results
from cudalab.bench.baseline import load_baseline
from cudalab.lessons import registry
from cudalab.lessons.result import Check, Claim, Finding, LessonResult
from _support import fake_measurement, no_gpu_only, run_cli

FAKES = [
    (900, "demo", {"size": 8192, "sizes": (1024, 2048), "dtype": "float32", "scale": 1.0,
                   "flush": False, "limit": None}, {"size": 512}),
    (901, "cpu_vs_gpu", {"matrix_size": 4096, "iterations": 10}, {"matrix_size": 256}),
    (902, "memory", {"batch_sizes": (8, 16)}, {}),
    (903, "broken", {}, {}),
]


@pytest.fixture
def fake_lessons(monkeypatch):
    """A registry holding only the fake lessons, for this test."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    for number, name, params, quick in FAKES:
        registry.lesson(number, name, title=f"The {name} lesson", seed=f"guide section {number}",
                        params=params, quick_params=quick)(lambda r: None)
    return [name for _, name, _, _ in FAKES]


def fake_result(name: str = "demo", params=None, quick: bool = True, median: float = 1e-3):
    m = fake_measurement("copy", median=median, bytes=2e9, device="Fake GPU")
    host = fake_measurement("host clock", median=5e-3, device="Fake GPU")
    return LessonResult(
        lesson=name, number=900, title="Demo", seed="guide", params=dict(params or {}),
        quick=quick, device={"name": "Fake GPU", "index": 0}, env={"versions": {"cudalab": "1"}},
        measurements={"copy 1 GiB": m, "numpy": host},
        rows=({"what": "copy", "ms": m.median * 1e3, "gbps": m.gbps},),
        findings=(Finding("copy runs at 2000 GB/s", 2000.0, "GB/s", ("copy 1 GiB",)),),
        claims=(Claim("copies are fast", 300.0, 2000.0, "GB/s", True, "6.7x the T4"),),
        checks=(Check("copy is exact", 0.0, 0.0, True),),
        wall_seconds=0.5, created="2026-11-23T00:00:00+00:00")


def main(*args: str) -> int:
    return cli.main(list(args))


# ---- listing ----------------------------------------------------------------------------


def test_lessons_lists_number_name_title_and_section(fake_lessons, capsys):
    assert main("lessons") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["#", "name", "title", "tutorial", "section"]
    assert [line.split()[:2] for line in out[2:]] == [["900", "demo"], ["901", "cpu_vs_gpu"],
                                                       ["902", "memory"], ["903", "broken"]]
    assert out[3].startswith("901  cpu_vs_gpu  The cpu_vs_gpu lesson  guide section 901")


def test_lessons_params_lists_full_and_quick_values(fake_lessons, capsys):
    assert main("lessons", "--params") == 0
    out = capsys.readouterr().out
    assert "size=8192 (quick 512), sizes=(1024, 2048), dtype='float32'" in out
    assert "batch_sizes=(8, 16)" in out and "none" in out  # broken takes no parameter


def test_lessons_with_none_registered(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", {})
    assert main("lessons") == 0
    assert capsys.readouterr().out == "No lessons are registered.\n"


# ---- --set ------------------------------------------------------------------------------


@pytest.mark.parametrize("default, text, value", [
    (8192, "4096", 4096),
    (1.0, "1e-3", 1e-3),
    (None, "None", None),
    (None, "float16", "float16"),
    ("float32", "16", "16"),                      # a str parameter keeps the text
    ("float32", "bfloat16", "bfloat16"),
    (False, "True", True),
    (False, "false", False),
    ((1024, 2048), "1024,2048", (1024, 2048)),
    ((1024, 2048), "4096", (4096,)),
    ((1024, 2048), "(4096, 8192)", (4096, 8192)),
    ((1024, 2048), "[7]", (7,)),
    ((1024, 2048), "16,", (16,)),
    (("float16",), "float16,bfloat16", ("float16", "bfloat16")),
    (("float16",), " float16 , 3", ("float16", 3)),
    ((1,), "", ()),
    (3, "x y", "x y"),                            # not a literal: the text
])
def test_parse_value(default, text, value):
    got = cli_lessons.parse_value(text, default)
    assert got == value and type(got) is type(value)


def test_parse_params_reads_each_value_against_its_default(fake_lessons):
    x = lessons.get("demo")
    params = cli_lessons.parse_params(x, [("sizes", "1024,2048,4096"), ("size", "64"),
                                          ("size", "128"), ("dtype", "float16")])
    assert params == {"sizes": (1024, 2048, 4096), "size": 128, "dtype": "float16"}
    with pytest.raises(ValueError, match=r"lesson 'demo' has no parameter 'bogus'; its "
                                         r"parameters are size, sizes, dtype, scale, flush, limit"):
        cli_lessons.parse_params(x, [("size", "1"), ("bogus", "2")])


def test_set_is_parsed_as_key_value_pairs(fake_lessons):
    args = cli.build_parser().parse_args(["lesson", "demo", "--set", "size=1", "--set", "a=b=c"])
    assert args.set == [("size", "1"), ("a", "b=c")] and args.name == "demo"
    assert cli.build_parser().parse_args(["lesson", "demo"]).set == []


@pytest.mark.parametrize("value", ["size", "=3", " =3"])
def test_set_without_key_value_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as info:
        main("lesson", "demo", "--set", value)
    assert info.value.code == 2
    assert f"argument --set: expected KEY=VALUE, got {value!r}" in capsys.readouterr().err


# ---- usage errors (exit 2, before any GPU work) -----------------------------------------


def test_unknown_lesson_exits_2_naming_the_lessons(fake_lessons, capsys):
    assert main("lesson", "nope", "--quick") == 2
    captured = capsys.readouterr()
    assert captured.err == ("cudalab lesson: no lesson 'nope'; the lessons are demo, cpu_vs_gpu, "
                            "memory, broken\n")
    assert captured.out == ""


def test_unknown_parameter_exits_2_with_the_value_error(fake_lessons, capsys):
    assert main("lesson", "demo", "--set", "bogus=1") == 2
    assert capsys.readouterr().err == (
        "cudalab lesson: lesson 'demo' has no parameter 'bogus'; its parameters are size, sizes, "
        "dtype, scale, flush, limit\n")


def test_guide_command_whose_lesson_lacks_the_option_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", {})
    registry.lesson(950, "cpu_vs_gpu", title="t", seed="s", params={"matrix_size": 1})(
        lambda r: None)
    assert main("cpu-vs-gpu", "--iterations", "5") == 2
    assert "cudalab cpu-vs-gpu: lesson 'cpu_vs_gpu' has no parameter 'iterations'" in \
        capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (("lesson", "demo", "--json", "/nonexistent-dir/r.json"),
     "argument --json: directory '/nonexistent-dir' does not exist; create it first"),
    (("run-all", "--markdown", "/nonexistent-dir/r.md"),
     "argument --markdown: directory '/nonexistent-dir' does not exist; create it first"),
    (("cpu-vs-gpu", "--matrix-size", "0"), "argument --matrix-size: expected a positive integer"),
    (("memory", "--batch-sizes", "16,x"), "argument --batch-sizes: expected a positive integer"),
    (("lesson",), "the following arguments are required: NAME"),
    (("run-all", "--max-times", "4"), "argument --max-times: expected an integer >= 5, got 4"),
])
def test_bad_arguments_exit_2_before_running(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stdout == ""


def test_guide_commands_pass_only_the_options_given():
    args = cli.build_parser().parse_args(["cpu-vs-gpu", "--matrix-size", "8192",
                                          "--iterations", "100"])
    assert (args.lesson, args.matrix_size, args.iterations) == ("cpu_vs_gpu", 8192, 100)
    args = cli.build_parser().parse_args(["memory", "--batch-sizes", "16,32,64,128"])
    assert (args.lesson, args.batch_sizes) == ("memory", (16, 32, 64, 128))
    assert cli.build_parser().parse_args(["memory"]).batch_sizes is None


@pytest.mark.parametrize("command", [("lessons",), ("lesson",), ("run-all",), ("cpu-vs-gpu",),
                                     ("memory",)], ids=" ".join)
def test_every_lesson_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0
    assert f"usage: cudalab {' '.join(command)}" in result.stdout


# ---- without a GPU ----------------------------------------------------------------------


@no_gpu_only
@pytest.mark.parametrize("args", [("run-all",),
                                  ("cpu-vs-gpu", "--matrix-size", "8192", "--iterations", "100"),
                                  ("memory", "--batch-sizes", "16,32,64,128")], ids=" ".join)
def test_without_gpu_each_command_exits_1_in_one_line(args, fake_lessons, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(*args, "--json", str(out), "--markdown", str(tmp_path / "r.md")) == 1
    captured = capsys.readouterr()
    assert captured.err == f"cudalab {args[0]}: no CUDA device is available.\n"
    assert captured.out == "" and not out.exists() and not (tmp_path / "r.md").exists()


@no_gpu_only
def test_without_gpu_lesson_says_where_to_read_its_results(fake_lessons, tmp_path, capsys):
    """`cudalab lesson NAME` adds what to read instead (issue 22 item 7; see
    test_errors_name_caller_cpu.py for a real lesson's notebook and results)."""
    out = tmp_path / "r.json"
    assert main("lesson", "demo", "--quick", "--json", str(out), "--markdown",
                str(tmp_path / "r.md")) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0] == "cudalab lesson: no CUDA device is available."
    assert "Without a GPU" in lines[1] and "'demo'" in lines[1]
    assert captured.out == "" and not out.exists() and not (tmp_path / "r.md").exists()


# ---- the run loop, with a stand-in for lessons.run -----------------------------------------


@pytest.fixture
def stand_in(fake_lessons, monkeypatch):
    """lessons.run returns fake results ("broken" raises); the device check finds device 0."""
    calls = []

    def run(name, quick=False, **params):
        calls.append((name, quick, params))
        if name == "broken":
            raise lessons.LessonCheckError("lesson 'broken': check failed: sum: max error 1")
        if name == "memory" and params.get("batch_sizes") == (13,):
            raise KeyError("a bug in the lesson")
        return fake_result(name, params, quick)

    monkeypatch.setattr(lessons, "run", run)
    monkeypatch.setattr(cli_lessons, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_lessons, "device_context", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(cli_lessons, "get_device_properties",
                        lambda index: type("Props", (), {"name": "Fake GPU"})())
    return calls


def test_lesson_prints_the_table_and_writes_json_and_markdown(stand_in, tmp_path, capsys):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert main("lesson", "demo", "--quick", "--set", "sizes=1024,2048", "--set", "size=64",
                "--json", str(out), "--markdown", str(md)) == 0
    assert stand_in == [("demo", True, {"sizes": (1024, 2048), "size": 64})]
    captured = capsys.readouterr()
    assert captured.out == fake_result("demo", {"sizes": (1024, 2048), "size": 64}).table() + "\n\n"
    assert captured.err == ""
    [back] = lessons.read_results(out)
    assert back.lesson == "demo" and back.params == {"sizes": [1024, 2048], "size": 64}
    text = md.read_text()
    assert text.startswith("# cudalab lessons on Fake GPU\n\n1 lesson ran, quick mode, cudalab 1")
    assert "copy runs at 2000 GB/s" in text and "| what | ms | gbps |" in text


def test_max_times_caps_the_raw_times_kept(stand_in, tmp_path, monkeypatch, capsys):
    many = fake_measurement("copy", times=[1e-3 + 1e-6 * i for i in range(101)])
    monkeypatch.setattr(lessons, "run", lambda name, quick=False, **params: dataclasses.replace(
        fake_result(name), measurements={"copy": many}))
    out = tmp_path / "r.json"
    assert main("lesson", "demo", "--json", str(out), "--max-times", "5") == 0
    [back] = lessons.read_results(out)
    assert back.measurements["copy"].times == pytest.approx([1e-3, 1.025e-3, 1.05e-3, 1.075e-3,
                                                            1.1e-3])
    assert back.measurements["copy"].median == many.median


def test_guide_commands_run_their_lessons_with_the_options(stand_in, capsys):
    assert main("cpu-vs-gpu", "--matrix-size", "8192", "--iterations", "100") == 0
    assert main("memory", "--batch-sizes", "16,32,64,128", "--quick") == 0
    assert main("cpu-vs-gpu") == 0
    assert stand_in == [("cpu_vs_gpu", False, {"matrix_size": 8192, "iterations": 100}),
                        ("memory", True, {"batch_sizes": (16, 32, 64, 128)}),
                        ("cpu_vs_gpu", False, {})]
    assert capsys.readouterr().out.count("Lesson 900 `") == 3


def test_a_failing_lesson_exits_1_after_one_line(stand_in, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main("lesson", "broken", "--json", str(out)) == 1
    captured = capsys.readouterr()
    assert captured.err == ("cudalab lesson: lesson 'broken' failed: LessonCheckError: lesson "
                            "'broken': check failed: sum: max error 1\n")
    assert captured.out == ""
    assert lessons.read_results(out) == []
    assert json.loads(out.read_text())["failures"] == [
        {"lesson": "broken", "error": "LessonCheckError: lesson 'broken': check failed: sum: "
                                      "max error 1"}]


def test_a_lesson_bug_shows_its_traceback(stand_in, capsys):
    assert main("memory", "--batch-sizes", "13") == 1
    err = capsys.readouterr().err
    assert err.startswith("cudalab memory: lesson 'memory' failed: KeyError: "
                          "'a bug in the lesson'\n")
    assert "Traceback (most recent call last)" in err


def test_run_all_runs_every_lesson_in_order_and_carries_on(stand_in, tmp_path, capsys):
    out, md = tmp_path / "all.json", tmp_path / "all.md"
    assert main("run-all", "--quick", "--json", str(out), "--markdown", str(md)) == 1
    assert [c[0] for c in stand_in] == ["demo", "cpu_vs_gpu", "memory", "broken"]
    assert all(c[1] is True and c[2] == {} for c in stand_in)
    captured = capsys.readouterr()
    assert captured.out.count("Lesson 900 `") == 3
    assert captured.err.splitlines() == [
        "cudalab run-all: lesson 'broken' failed: LessonCheckError: lesson 'broken': check "
        "failed: sum: max error 1",
        "cudalab run-all: 1 of 4 lessons failed: broken"]
    assert [r.lesson for r in lessons.read_results(out)] == ["demo", "cpu_vs_gpu", "memory"]
    text = md.read_text()
    assert text.startswith("# cudalab lessons on Fake GPU\n\n3 lessons ran, quick mode, "
                           "cudalab 1, finished 2026-11-23T00:00:00+00:00, 1 failed.")
    assert text.rstrip().endswith("- `broken`: LessonCheckError: lesson 'broken': check failed: "
                                  "sum: max error 1")


def test_run_all_with_every_lesson_passing_exits_0(stand_in, monkeypatch, capsys):
    del registry._REGISTRY["broken"]
    assert main("run-all", "--no-progress") == 0
    assert capsys.readouterr().err == ""


def test_run_all_with_no_lessons(stand_in, monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", {})
    assert main("run-all") == 1
    assert capsys.readouterr().err == "cudalab run-all: no lessons are registered.\n"


# ---- results files ----------------------------------------------------------------------


def test_read_results_round_trip(tmp_path):
    first, second = fake_result("demo", {"sizes": (1, 2)}), fake_result("other", median=2e-3)
    path = lessons.write_results(tmp_path / "r.json", [first, second],
                                 failures=[{"lesson": "x", "error": "E: why"}], command="cudalab x")
    back = lessons.read_results(path)
    assert [r.lesson for r in back] == ["demo", "other"]
    for got, want in zip(back, (first, second)):
        assert got.measurements == want.measurements  # labels, times and every field
        assert got.rows == want.rows and got.findings == want.findings
        assert got.claims == want.claims and got.checks == want.checks
        assert (got.device, got.env, got.quick, got.created) == (want.device, want.env,
                                                                 want.quick, want.created)
    assert back[0].params == {"sizes": [1, 2]}
    data = json.loads(path.read_text())
    assert data["kind"] == "lessons" and data["command"] == "cudalab x"
    assert data["machine"]["cuda"]["available"] == cudalab.is_available()
    assert data["failures"] == [{"lesson": "x", "error": "E: why"}]


def test_results_file_rows_are_a_baseline_with_lesson_labels(tmp_path):
    path = lessons.write_results(tmp_path / "r.json", [fake_result("demo"), fake_result("other")])
    rows = read_bench_results(path).rows
    assert [(r.get("lesson"), r.get("label"), r.measurement.label) for r in rows] == [
        ("demo", "copy 1 GiB", "demo: copy 1 GiB"), ("demo", "numpy", "demo: numpy"),
        ("other", "copy 1 GiB", "other: copy 1 GiB"), ("other", "numpy", "other: numpy")]
    baseline = load_baseline(path)
    assert baseline[("other: copy 1 GiB", None, None)].median == pytest.approx(1e-3)
    # each measurement is stored once: the lessons hold only their labels
    assert json.loads(path.read_text())["lessons"][0]["measurements"] == {
        "copy 1 GiB": "copy", "numpy": "host clock"}


def test_read_results_refuses_other_files(tmp_path):
    other = tmp_path / "bench.json"
    cudalab.bench.write_results(other, "ceilings", [fake_measurement("copy")])
    with pytest.raises(ValueError, match="is a results file of kind 'ceilings', not 'lessons'"):
        lessons.read_results(other)
    path = lessons.write_results(tmp_path / "r.json", [fake_result()])
    data = json.loads(path.read_text())
    data["rows"] = data["rows"][:1]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="lesson 'demo': no row holds measurement 'numpy'"):
        lessons.read_results(path)
    del data["lessons"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="expected a 'lessons' list"):
        lessons.read_results(path)


def test_write_results_checks_its_arguments(tmp_path):
    with pytest.raises(TypeError, match="expected LessonResults, got dict"):
        lessons.write_results(tmp_path / "r.json", [{}])
    with pytest.raises(ValueError, match="expected dicts with 'lesson' and 'error'"):
        lessons.write_results(tmp_path / "r.json", [], failures=[{"lesson": "x"}])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        lessons.write_results(tmp_path / "missing" / "r.json", [fake_result()])


def test_markdown_names_the_device_and_every_result():
    text = lessons.markdown([fake_result("demo"), fake_result("other", quick=False)])
    assert text.startswith("# cudalab lessons on Fake GPU\n\n2 lessons ran, full and quick mode")
    assert text.count("**Lesson 900 `") == 2
    assert lessons.markdown([], device="H200", failures=[{"lesson": "a", "error": "E"}]) == (
        "# cudalab lessons on H200\n\n0 lessons ran, 1 failed.\n\n"
        "## Lessons that failed\n\n- `a`: E\n")


# ---- the guide's commands against the registered lessons ----------------------------------


@pytest.mark.parametrize("lesson, options", [("cpu_vs_gpu", {"matrix_size", "iterations"}),
                                             ("memory", {"batch_sizes"})])
def test_guide_commands_match_their_lessons_parameters(lesson, options):
    if lesson not in lessons.names():
        pytest.skip(f"lesson {lesson} is not registered")
    assert options <= set(lessons.get(lesson).params)


def test_run_all_only_and_skip_choose_lessons_in_lesson_order(stand_in, capsys):
    assert main("run-all", "--only", "memory,demo") == 0
    assert main("run-all", "--skip", "broken", "--skip", "demo") == 0
    assert [c[0] for c in stand_in] == ["demo", "memory", "cpu_vs_gpu", "memory"]
    with pytest.raises(SystemExit) as info:
        main("run-all", "--only", "nope")
    assert info.value.code == 2
    assert ("argument --only: invalid choice: 'nope' (choose from demo, cpu_vs_gpu, memory, "
            "broken)") in capsys.readouterr().err


# ---- a lesson through the real lessons.run, its device calls stood in for -------------------


@pytest.fixture
def host_lesson(monkeypatch):
    """Lesson "host_sum": sums with NumPy on the host clock, through the real lessons.run
    (whose device check and device description are stood in for)."""
    import types

    import numpy as np

    from cudalab.bench import Measurement, host_clock

    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_core", types.SimpleNamespace(_parse_device=lambda *a: 0))
    monkeypatch.setattr(registry, "_device_and_env",
                        lambda: ({"name": "Fake GPU", "index": 0}, {"versions": {}}))
    monkeypatch.setattr(cli_lessons, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_lessons, "device_context", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(cli_lessons, "get_device_properties",
                        lambda index: types.SimpleNamespace(name="Fake GPU"))

    @registry.lesson(960, "host_sum", title="Host sums", seed="none",
                     params={"sizes": (1000, 5000), "tolerance": 1e-12},
                     quick_params={"sizes": (100,)})
    def run(r):
        for n in r.params["sizes"]:
            x = np.random.default_rng(n).standard_normal(n) + 2.0
            times = host_clock({"sum": lambda: x.sum()}, repeats=5, warmup=0.0)["sum"]
            m = r.add(Measurement(label=f"sum {n}", times=times, bytes=8.0 * n), f"numpy sum {n}")
            r.row(n=n, us=m.median * 1e6)
            r.check(f"sum of {n}", abs(x.sum() - np.sum(x[::-1])) / abs(x.sum()),
                    r.params["tolerance"])
        r.finding(f"{len(r.params['sizes'])} sizes summed", len(r.params["sizes"]), "sizes",
                  labels=tuple(r.measurements))


def test_a_lesson_run_for_real_round_trips_through_the_cli(host_lesson, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main("lesson", "host_sum", "--set", "sizes=300,700", "--json", str(out)) == 0
    [back] = lessons.read_results(out)
    assert back.params == {"sizes": [300, 700], "tolerance": 1e-12} and back.quick is False
    assert list(back.measurements) == ["numpy sum 300", "numpy sum 700"]
    assert [m.label for m in back.measurements.values()] == ["sum 300", "sum 700"]
    assert [r["n"] for r in back.rows] == [300, 700] and len(back.checks) == 2
    out_text = capsys.readouterr().out
    assert out_text.startswith("Lesson 960 `host_sum`: Host sums (Fake GPU, full, ")
    assert "2 sizes summed" in out_text and "sum of 700" in out_text
    assert main("lesson", "host_sum", "--quick", "--json", str(out)) == 0
    assert [r["n"] for r in lessons.read_results(out)[0].rows] == [100]


def test_a_failed_check_of_a_real_run_exits_1(host_lesson, capsys):
    assert main("lesson", "host_sum", "--set", "tolerance=-1") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("cudalab lesson: lesson 'host_sum' failed: LessonCheckError: "
                                   "lesson 'host_sum': check failed: sum of 1000: max error ")
    assert len(captured.err.splitlines()) == 1
