"""CPU tier: errors name the function the user called; arguments are checked before the GPU.

Issue 22, item 7. The public entry points (nn's layer constructors,
models.resnet50 / ResNet50, lessons.run / lessons.get, the CLI's lesson
commands) check every argument first, then, without a GPU, raise
cudalab's NoDeviceError worded ``func(): no CUDA device is available:
reason`` naming themselves, not a function they call inside. Without a
GPU, ``cudalab lesson NAME`` says where to read what the lesson measured on
one, and ``cudalab results [LESSON]`` prints the committed results.
"""

from __future__ import annotations

import pytest

import cudalab
from cudalab import cli, lessons, models, nn
from cudalab.cli import results as cli_results
from cudalab.lessons import registry
from _support import REPO_ROOT, assert_arg_error, no_gpu_only

NO_DEVICE = "(): no CUDA device is available"


# ---- nn and models ------------------------------------------------------------------------------


@no_gpu_only
@pytest.mark.parametrize("func, call", [
    ("Linear", lambda: nn.Linear(3, 4)),
    ("MLP", lambda: nn.MLP([4, 8, 2])),
    ("TeacherData", lambda: nn.TeacherData(4, 2, 8)),
    ("GradScaler", lambda: nn.GradScaler()),
    ("resnet50", lambda: models.resnet50()),
    ("resnet50", lambda: models.resnet50(precision="bf16", max_cached_shapes=None)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_no_device_error_names_the_constructor(func, call):
    with pytest.raises(cudalab.NoDeviceError) as info:
        call()
    assert str(info.value).startswith(func + NO_DEVICE + ": ")


@no_gpu_only
def test_resnet50_class_names_itself_without_a_gpu():
    params = models.fold(models.init_weights(seed=0))
    with pytest.raises(cudalab.NoDeviceError, match=r"^ResNet50\(\): no CUDA device"):
        models.ResNet50(params)


@pytest.mark.parametrize("exc, func, param, call", [
    (ValueError, "Linear", "in_features", lambda: nn.Linear(0, 4)),
    (ValueError, "MLP", "seed", lambda: nn.MLP([4, 8, 2], seed=-1)),
    (ValueError, "TeacherData", "classes", lambda: nn.TeacherData(4, 1, 8)),
    (ValueError, "GradScaler", "init_scale", lambda: nn.GradScaler(init_scale=0.0)),
    (ValueError, "resnet50", "max_cached_shapes", lambda: models.resnet50(max_cached_shapes=0)),
    (TypeError, "resnet50", "max_cached_bytes", lambda: models.resnet50(max_cached_bytes=1.5)),
    (ValueError, "resnet50", "seed", lambda: models.resnet50(seed=-1)),
    (TypeError, "resnet50", "weights", lambda: models.resnet50(weights=3.5)),
    (ValueError, "resnet50", "precision", lambda: models.resnet50(precision="fp8")),
    (TypeError, "ResNet50", "params", lambda: models.ResNet50({})),
], ids=lambda v: v if isinstance(v, str) else "")
def test_argument_errors_come_before_the_device_check(exc, func, param, call):
    """With or without a GPU: a bad argument is reported as such, naming the function."""
    with assert_arg_error(exc, func, param):
        call()


# ---- lessons ------------------------------------------------------------------------------------


def test_unknown_lesson_names_the_function_called():
    with pytest.raises(ValueError, match=r"^lessons\.run\(\) argument 'name': no lesson 'nosuch'"):
        lessons.run("nosuch")
    with pytest.raises(ValueError, match=r"^lessons\.get\(\) argument 'name': no lesson 'nosuch'"):
        lessons.get("nosuch")
    with pytest.raises(TypeError, match=r"^lessons\.run\(\) argument 'name': expected a str"):
        lessons.run(3)


def test_a_bad_parameter_value_is_reported_before_the_gpu():
    with pytest.raises(ValueError, match=r"^lessons\.run\(\): lesson 'dtypes': size must be an "
                                         r"int >= 1, got -1$"):
        lessons.run("dtypes", size=-1)
    with pytest.raises(ValueError, match=r"^lessons\.run\(\): lesson 'timing': dtype must be"):
        lessons.run("timing", quick=True, dtype="int8")


@pytest.mark.parametrize("name", lessons.names())
def test_every_lesson_checks_its_parameters_and_takes_its_defaults(name):
    x = lessons.get(name)
    assert x.check is not None, f"lesson {name!r} registers no parameter check"
    for quick in (False, True):
        merged = registry.resolve_params(x, {}, quick)
        assert merged == x.defaults(quick)


@pytest.mark.parametrize("name", lessons.names())
def test_every_lesson_refuses_a_wrong_type(name):
    """Each lesson's check refuses a str where its first parameter holds a number or names."""
    x = lessons.get(name)
    key, default = next((k, v) for k, v in x.params.items() if v is not None
                        and not isinstance(v, str))
    with pytest.raises((TypeError, ValueError), match=r"^lessons\.run\(\): "):
        registry.resolve_params(x, {key: "not a value"}, False)


# ---- the CLI ------------------------------------------------------------------------------------


def test_cli_lesson_reports_a_bad_value_before_the_device(capsys):
    assert cli.main(["lesson", "dtypes", "--set", "size=-1"]) == 2
    assert capsys.readouterr().err == ("cudalab lesson: lesson 'dtypes': size must be an int "
                                       ">= 1, got -1\n")
    assert cli.main(["lesson", "memory", "--set", "batch_sizes=0"]) == 2
    assert "batch_sizes must be positive ints" in capsys.readouterr().err


@no_gpu_only
def test_cli_lesson_without_a_gpu_points_at_the_notebook_and_the_results(capsys):
    assert cli.main(["lesson", "dtypes"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "cudalab lesson: no CUDA device is available."
    assert lines[1] == "Without a GPU, read what lesson 'dtypes' measured on one:"
    assert lines[2] == f"  the executed notebook: {REPO_ROOT / 'notebooks' / '02_dtypes.ipynb'}"
    assert lines[3].startswith("  the committed results: cudalab results dtypes (from ")
    assert "lessons_" in lines[3] and ".json" in lines[3]


def test_without_gpu_text_outside_a_checkout(monkeypatch):
    monkeypatch.setattr(cli_results, "repository_root", lambda: None)
    text = cli_results.without_gpu_text(lessons.get("dtypes"))
    assert "not part of the installed package" in text
    assert "notebooks/02_dtypes.ipynb" in text and "benchmarks/results/lessons_" in text


def test_cli_results_lists_the_committed_files(capsys):
    assert cli.main(["results"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Committed lesson results in {REPO_ROOT / 'benchmarks' / 'results'}:")
    assert "lessons_" in out and "dtypes" in out


def test_cli_results_prints_one_lessons_tables(capsys):
    assert cli.main(["results", "dtypes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("From ") and "Lesson 2 `dtypes`" in out


def test_cli_results_refuses_unknown_lessons_and_missing_files(tmp_path, capsys):
    assert cli.main(["results", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("cudalab results: no lesson 'nosuch'; the lessons")
    assert cli.main(["results", "--dir", str(tmp_path)]) == 1
    assert "no lessons results files in" in capsys.readouterr().err
    assert cli.main(["results", "dtypes", "--dir", str(tmp_path)]) == 1
    assert "no committed results for lesson 'dtypes'" in capsys.readouterr().err
    assert cli.main(["results", "--dir", str(tmp_path / "missing")]) == 1
    assert "not in the installed package" in capsys.readouterr().err


def test_a_regular_install_finds_the_clone_it_runs_in(tmp_path, monkeypatch):
    # Installed (not editable), the module sits in site-packages: the checkout is then the
    # current directory or one above it, as when `python -m pytest` runs in a clone.
    site = tmp_path / "venv" / "lib" / "site-packages" / "cudalab" / "cli" / "results.py"
    monkeypatch.setattr(cli_results, "__file__", str(site))
    monkeypatch.chdir(REPO_ROOT / "docs")
    assert cli_results.repository_root() == REPO_ROOT.resolve()
    monkeypatch.chdir(tmp_path)
    assert cli_results.repository_root() is None
