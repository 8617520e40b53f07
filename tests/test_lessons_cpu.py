"""The lesson registry and LessonResult, without a GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

import cudalab
from cudalab import lessons
from cudalab.lessons import registry
from cudalab.lessons.result import Check, Claim, Finding, LessonResult

from _support import fake_measurement, no_gpu_only


def test_names_are_in_lesson_order_and_unique():
    numbers = [lessons.get(n).number for n in lessons.names()]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) == len(numbers) == len(lessons.names())


def test_every_lesson_declares_its_parameters():
    for name in lessons.names():
        x = lessons.get(name)
        assert x.title and x.seed, name
        assert set(x.quick_params) <= set(x.params), name
        with pytest.raises(TypeError):
            x.params["new"] = 1  # read-only


def test_get_unknown_lists_the_lessons():
    with pytest.raises(ValueError, match=r"no lesson 'nope'; the lessons are") as info:
        lessons.get("nope")
    for name in lessons.names():
        assert name in str(info.value)
    with pytest.raises(TypeError, match="expected a str"):
        lessons.get(3)


def test_run_rejects_unknown_parameters_before_the_gpu():
    for name in lessons.names():
        with pytest.raises(ValueError, match=r"has no parameter 'bogus'; its parameters are"):
            lessons.run(name, bogus=1)


@no_gpu_only
def test_run_without_gpu_raises_no_device_error():
    for name in lessons.names():
        with pytest.raises(cudalab.NoDeviceError, match=r"^lessons\.run\(\): no CUDA device"):
            lessons.run(name, quick=True)


def test_quick_defaults_override_full_ones():
    for name in lessons.names():
        x = lessons.get(name)
        quick = x.defaults(True)
        assert set(quick) == set(x.params)
        assert all(quick[k] == v for k, v in x.quick_params.items())


def test_a_lesson_cannot_register_twice_or_with_stray_quick_params():
    name = lessons.names()[0] if lessons.names() else None
    with pytest.raises(ValueError, match="are not params"):
        registry.lesson(999, "stray", title="t", seed="s", params={"a": 1},
                        quick_params={"b": 2})
    if name is not None:
        with pytest.raises(ValueError, match="registered twice"):
            registry.lesson(lessons.get(name).number, "other", title="t", seed="s",
                            params={})(lambda r: None)


def _result() -> LessonResult:
    m = fake_measurement("matmul float16", median=2e-3, flops=2.0 * 4096**3, device="Fake GPU")
    return LessonResult(
        lesson="demo", number=99, title="Demo", seed="none", params={"sizes": (1, 2)},
        quick=True, device={"name": "Fake GPU"}, env={"versions": {"python": "3"}},
        measurements={"matmul float16": m},
        rows=({"dtype": "float16", "tflops": m.tflops, "ok": True},),
        findings=(Finding("float16 reaches 68.7 TFLOP/s", 68.7, "TFLOP/s", ("matmul float16",)),),
        claims=(Claim("fp16 is 2x fp32", 2.0, 7.9, "x", True, "7.9x >= 1.5x"),),
        checks=(Check("float16 vs float64 reference", 1e-3, 1e-2, True),),
        wall_seconds=1.5, created="2026-11-23T00:00:00+00:00")


def test_result_json_round_trip():
    r = _result()
    back = LessonResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.measurements["matmul float16"].median == r.measurements["matmul float16"].median
    assert back.findings == r.findings and back.claims == r.claims and back.checks == r.checks
    assert back.rows == r.rows and back.params == {"sizes": [1, 2]}
    with pytest.raises(ValueError, match="missing keys"):
        LessonResult.from_dict({"lesson": "x"})


def test_result_is_immutable_and_renders():
    r = _result()
    with pytest.raises(AttributeError):
        r.lesson = "other"
    text = r.table()
    assert "Lesson 99 `demo`" in text and "float16 reaches 68.7 TFLOP/s" in text
    assert "fp16 is 2x fp32" in text and "ok" in text
    md = r._repr_markdown_()
    assert md.count("|---") >= 1 and "Fake GPU" in md
    assert r._repr_html_().startswith("<pre>")


def test_failed_check_raises_lesson_check_error():
    x = registry.Lesson(98, "check-demo", "t", "s", {}, {}, lambda r: None)
    r = registry.LessonRun(x, {}, quick=True)
    r.check("fine", 1e-4, 1e-3)
    with pytest.raises(lessons.LessonCheckError, match="check failed: bad: max error 0.5"):
        r.check("bad", 0.5, 1e-3)
    with pytest.raises(lessons.LessonCheckError):
        r.check("nan", float("nan"), 1.0)
    assert [c.passed for c in r.checks] == [True, False, False]
    assert issubclass(lessons.LessonCheckError, cudalab.CudalabError)


def test_findings_must_rest_on_recorded_measurements():
    x = registry.Lesson(97, "finding-demo", "t", "s", {}, {}, lambda r: None)
    r = registry.LessonRun(x, {}, quick=True)
    with pytest.raises(ValueError, match="unknown measurements"):
        r.finding("x", 1.0, "x", labels=("missing",))
    r.add(fake_measurement("a"))
    r.finding("x", 1.0, "x", labels=("a",))
    with pytest.raises(ValueError, match="recorded twice"):
        r.add(fake_measurement("a"))


def test_repr_is_one_short_line_without_host_details():
    r = _result()
    text = repr(r)
    assert text.startswith("<LessonResult 99 'demo' on Fake GPU, quick:")
    assert "1 rows, 1 findings, 1 claims, 1 checks" in text
    assert "\n" not in text and "node" not in text and len(text) < 200


# ---- versus_torch: PyTorch timings paired with cudalab's by label ----------------------


def _timed(label: str, seconds: float):
    return fake_measurement(label, median=seconds)


def test_versus_torch_pairs_by_the_naming_rules_and_the_lessons_twin():
    from cudalab.lessons.versus import summary, versus_torch

    measurements = {label: _timed(label, s) for label, s in (
        ("add", 1.0), ("torch add", 2.0),                          # "torch X" -> "X"
        ("context (cudalab)", 1.0), ("context (torch)", 0.5),      # "(torch)" -> "(cudalab)"
        ("mlp step", 1.0), ("mlp step torch", 1.0),                # "X torch" -> "X"
        ("matmul float16 gpu", 1.0), ("matmul float16 torch", 1.0),  # -> "X gpu"
        ("overlap: copy", 1.0), ("overlap: torch copy", 1.0),      # first "torch " dropped
        ("torch host randn", 9.0),                                 # no twin: left out
        ("copy + sum axis 0 (the fix)", 1.0), ("torch copy + sum dim 0 (the fix)", 3.0),
    )}
    r = dataclasses.replace(_result(), lesson="access_patterns", measurements=measurements)
    pairs = {p.torch_label: p for p in versus_torch(r)}
    assert pairs["torch add"].label == "add" and pairs["torch add"].speedup == pytest.approx(2.0)
    assert pairs["context (torch)"].label == "context (cudalab)"
    assert pairs["mlp step torch"].label == "mlp step"
    assert pairs["matmul float16 torch"].label == "matmul float16 gpu"
    assert pairs["overlap: torch copy"].label == "overlap: copy"
    # the lesson's own twin (access_patterns spells PyTorch's axis "dim")
    assert pairs["torch copy + sum dim 0 (the fix)"].speedup == pytest.approx(3.0)
    assert "torch host randn" not in pairs
    line = summary(list(pairs.values()))
    assert line.startswith("5 of 6 at parity or faster")
    assert line.endswith("slowest 0.50x (context (cudalab))")
    assert summary([]) == "-"
