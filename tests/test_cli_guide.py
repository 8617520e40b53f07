"""CPU tier: ``cudalab guide`` and the guide's spelling ``inference --model-name``.

The guide command runs in this process (`cli.main`). Where its steps would run,
either the step runner is replaced by a recorder, or (for the whole path through
each command) `cudalab.lessons.run` and the check command by stand-ins and the
device checks by ones that find device 0.
"""

from __future__ import annotations

import contextlib

import pytest

from cudalab import cli, lessons
from cudalab.cli import check as cli_check
from cudalab.cli import guide as cli_guide
from cudalab.cli import lessons as cli_lessons
from cudalab.cli.inference import lesson_params
from cudalab.lessons.result import Claim, Finding, LessonResult
from _support import fake_measurement, no_gpu_only, run_cli

# The guide's own command lines (seed 001, Quick Start), as cudalab runs them.
GUIDE_ARGV = [
    ["check"],
    ["cpu-vs-gpu", "--matrix-size", "8192", "--iterations", "100"],
    ["memory", "--batch-sizes", "16,32,64,128"],
    ["inference", "--model-name", "resnet50", "--batch-sizes", "1,8,16,32"],
]


def main(*args: str) -> int:
    return cli.main(list(args))


# ---- inference --model-name ----------------------------------------------------------------


def test_model_name_is_the_model_option_as_the_guide_spells_it():
    parse = cli.build_parser().parse_args
    by_name = parse(["inference", "--model-name", "resnet50", "--batch-sizes", "1,8,16,32"])
    by_model = parse(["inference", "--model", "resnet50", "--batch-sizes", "1,8,16,32"])
    assert by_name.model == by_model.model == "resnet50"
    assert lesson_params(by_name) == lesson_params(by_model)
    assert by_name.batch_sizes == (1, 8, 16, 32)


def test_model_name_takes_only_the_models_there_are():
    result = run_cli("inference", "--model-name", "vgg16")
    assert result.returncode == 2 and result.stdout == ""
    assert "argument --model/--model-name: invalid choice: 'vgg16'" in result.stderr


def test_inference_help_shows_both_spellings():
    result = run_cli("inference", "--help")
    assert result.returncode == 0
    assert "--model {resnet50}, --model-name {resnet50}" in result.stdout
    assert "as the guide spells it" in result.stdout


# ---- the steps -------------------------------------------------------------------------------


def test_the_steps_are_the_guides_scripts_in_run_benchmarks_order():
    assert [s.script.split()[0] for s in cli_guide.GUIDE_STEPS] == [
        "check_gpu.py", "cpu_vs_gpu_benchmark.py", "memory_management.py",
        "model_inference_comparison.py"]
    assert [cli_guide.step_argv(s, quick=False) for s in cli_guide.GUIDE_STEPS] == GUIDE_ARGV
    for step in cli_guide.GUIDE_STEPS:  # each step's flags are the guide's own
        assert step.script.split()[1:] == list(step.argv[1:])


def test_every_step_parses_as_a_command_line():
    parse = cli.build_parser().parse_args
    for step in cli_guide.GUIDE_STEPS:
        for quick in (False, True):
            args = parse(cli_guide.step_argv(step, quick, device=0, no_progress=True))
            assert callable(args.func)
            assert getattr(args, "quick", False) is (quick and step.lesson_step)


def test_quick_steps_use_the_lessons_quick_sizes():
    quick = [cli_guide.step_argv(s, quick=True) for s in cli_guide.GUIDE_STEPS]
    assert quick == [["check"], ["cpu-vs-gpu", "--quick"], ["memory", "--quick"],
                     ["inference", "--quick", "--model-name", "resnet50", "--batch-sizes", "1,8"]]
    if "inference" in lessons.names():  # the quick batch sizes are the lesson's
        assert lessons.get("inference").quick_params["batch_sizes"] == (1, 8)


def test_device_and_no_progress_go_to_the_lesson_steps_only():
    check, cpu_vs_gpu = cli_guide.GUIDE_STEPS[:2]
    assert cli_guide.step_argv(check, False, device=1, no_progress=True) == ["check"]
    assert cli_guide.step_argv(cpu_vs_gpu, True, device=1, no_progress=True) == [
        "cpu-vs-gpu", "--quick", "--device", "1", "--no-progress"]


# ---- the command, with a recorder for the steps -----------------------------------------------


@pytest.fixture
def recorder(monkeypatch):
    """The device check finds device 0; each step is recorded and gives the status set here."""
    ran = []
    statuses = {}

    def run_step(argv):
        ran.append(list(argv))
        print(f"output of {argv[0]}")
        return statuses.get(argv[0], 0)

    monkeypatch.setattr(cli_guide, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_guide, "_run_step", run_step)
    return ran, statuses


def test_guide_runs_the_four_steps_in_order_and_sums_up(recorder, capsys):
    ran, _ = recorder
    assert main("guide") == 0
    assert ran == [argv + (["--device", "0"] if argv[0] != "check" else [])
                   for argv in GUIDE_ARGV]
    out = capsys.readouterr().out
    assert out.index("output of check") < out.index("output of cpu-vs-gpu") \
        < out.index("output of memory") < out.index("output of inference")
    assert "== Step 1 of 4: the guide's check_gpu.py\n== cudalab check\n" in out
    assert ("== Step 4 of 4: the guide's model_inference_comparison.py --model-name resnet50 "
            "--batch-sizes 1,8,16,32\n== cudalab inference --model-name resnet50 "
            "--batch-sizes 1,8,16,32 --device 0\n") in out
    summary = out[out.index("The guide's 4 steps: all ran"):].splitlines()
    assert summary[1].split() == ["step", "the", "guide's", "script", "cudalab", "command",
                                  "status", "seconds"]
    assert [line.split()[:3] for line in summary[3:]] == [
        ["1", "check_gpu.py", "cudalab"], ["2", "cpu_vs_gpu_benchmark.py", "cudalab"],
        ["3", "memory_management.py", "cudalab"], ["4", "model_inference_comparison.py",
                                                   "cudalab"]]
    assert all(" ok " in line for line in summary[3:])


def test_a_failed_step_does_not_stop_the_others_and_the_guide_exits_1(recorder, capsys):
    ran, statuses = recorder
    statuses.update({"check": 1, "memory": 2})
    assert main("guide", "--quick", "--no-progress", "--device", "0") == 1
    assert [argv[0] for argv in ran] == ["check", "cpu-vs-gpu", "memory", "inference"]
    assert ran[1] == ["cpu-vs-gpu", "--quick", "--device", "0", "--no-progress"]
    out = capsys.readouterr().out
    summary = out[out.index("The guide's 4 steps (quick): 2 failed"):].splitlines()
    assert "failed (exit 1)" in summary[3] and "failed (exit 2)" in summary[5]
    assert " ok " in summary[4] and " ok " in summary[6]


def test_a_step_that_raises_is_reported_and_the_next_ones_run(monkeypatch, capsys):
    monkeypatch.setattr(cli_guide, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_check, "_cmd_check", lambda args: 1 / 0)
    ran = []
    monkeypatch.setattr(cli_lessons, "run_lessons",
                        lambda args, command, jobs, without_gpu=None: ran.append(command) or 0)
    monkeypatch.setattr("cudalab.cli.inference.run_lessons",
                        lambda args, command, jobs: ran.append(command) or 0)
    assert main("guide") == 1
    assert ran == ["cpu-vs-gpu", "memory", "inference"]
    captured = capsys.readouterr()
    assert captured.err.startswith(
        "cudalab guide: cudalab check failed: ZeroDivisionError: division by zero\n")
    assert "Traceback (most recent call last)" in captured.err
    assert "1 failed" in captured.out


# ---- the command through each real command, with stand-ins for the GPU -----------------------


def fake_result(name: str, params, quick: bool) -> LessonResult:
    m = fake_measurement("copy", median=1e-3, bytes=2e9, device="Fake GPU")
    return LessonResult(
        lesson=name, number=900, title=f"Stand-in for {name}", seed="guide", params=dict(params),
        quick=quick, device={"name": "Fake GPU", "index": 0}, env={"versions": {"cudalab": "1"}},
        measurements={"copy": m}, rows=({"what": "copy", "ms": 1.0},),
        findings=(Finding("copy runs at 2000 GB/s", 2000.0, "GB/s", ("copy",)),),
        claims=(Claim("copies are fast", 300.0, 2000.0, "GB/s", True, "6.7x"),),
        checks=(), wall_seconds=0.5, created="2026-11-23T00:00:00+00:00")


@pytest.fixture
def stand_in(monkeypatch):
    """lessons.run gives fake results; device 0 is found; check prints one line."""
    for name in ("cpu_vs_gpu", "memory", "inference"):
        if name not in lessons.names():
            pytest.skip(f"lesson {name} is not registered")
    calls = []

    def run(name, quick=False, **params):
        calls.append((name, quick, params))
        return fake_result(name, params, quick)

    def check(args):
        calls.append(("check",))
        print("the check report")
        return 0

    monkeypatch.setattr(lessons, "run", run)
    monkeypatch.setattr(cli_check, "_cmd_check", check)
    monkeypatch.setattr(cli_guide, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_lessons, "_check_device", lambda args, command: 0)
    monkeypatch.setattr(cli_lessons, "device_context", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(cli_lessons, "get_device_properties",
                        lambda index: type("Props", (), {"name": "Fake GPU"})())
    return calls


def test_each_step_runs_its_lesson_with_the_guides_flags(stand_in, capsys):
    assert main("guide", "--no-progress") == 0
    assert stand_in == [
        ("check",),
        ("cpu_vs_gpu", False, {"matrix_size": 8192, "iterations": 100}),
        ("memory", False, {"batch_sizes": (16, 32, 64, 128)}),
        ("inference", False, {"batch_sizes": (1, 8, 16, 32), "precisions": ("fp32",),
                              "graph": False, "cpu_batch_sizes": (1,)}),
    ]
    out = capsys.readouterr().out
    assert "the check report" in out
    for name in ("cpu_vs_gpu", "memory", "inference"):  # each command's own table
        assert f"Stand-in for {name}" in out


def test_quick_runs_each_lesson_quick(stand_in, capsys):
    assert main("guide", "--quick", "--no-progress") == 0
    assert stand_in[1:] == [
        ("cpu_vs_gpu", True, {}),
        ("memory", True, {}),
        ("inference", True, {"batch_sizes": (1, 8), "precisions": ("fp32",), "graph": False,
                             "cpu_batch_sizes": (1,)}),
    ]


# ---- arguments and no GPU --------------------------------------------------------------------


def test_guide_help_names_the_steps():
    result = run_cli("guide", "--help")
    assert result.returncode == 0
    assert "usage: cudalab guide" in result.stdout
    for word in ("check_gpu.py", "cpu_vs_gpu_benchmark.py", "memory_management.py",
                 "model_inference_comparison.py", "--quick"):
        assert word in result.stdout
    assert "guide" in run_cli("--help").stdout


@pytest.mark.parametrize("args, message", [
    (("guide", "--device", "x"), "argument --device: invalid int value: 'x'"),
    (("guide", "--matrix-size", "8192"), "unrecognized arguments: --matrix-size 8192"),
])
def test_bad_arguments_exit_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stdout == ""


@no_gpu_only
@pytest.mark.parametrize("args", [("guide",), ("guide", "--quick"), ("guide", "--device", "3")],
                         ids=" ".join)
def test_without_gpu_the_guide_exits_1_in_one_line_before_any_step(args, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(cli_guide, "_run_step", lambda argv: ran.append(argv) or 0)
    assert main(*args) == 1
    captured = capsys.readouterr()
    assert captured.err == "cudalab guide: no CUDA device is available.\n"
    assert captured.out == "" and ran == []


@no_gpu_only
def test_without_gpu_the_guide_command_line_exits_1():
    result = run_cli("guide", "--quick")
    assert result.returncode == 1
    assert result.stderr == "cudalab guide: no CUDA device is available.\n"
    assert result.stdout == ""
