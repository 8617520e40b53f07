"""Every lesson in quick mode on the GPU: structure, checks, findings tied to rows."""

from __future__ import annotations

import json

import pytest

from cudalab import lessons
from cudalab.lessons import LessonResult

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def results():
    """Each lesson runs once per module; tests share the results."""
    return {}


@pytest.mark.parametrize("name", lessons.names())
def test_lesson_runs_quick_and_is_complete(name, results):
    r = lessons.run(name, quick=True)
    results[name] = r
    x = lessons.get(name)
    assert (r.lesson, r.number, r.title) == (name, x.number, x.title)
    assert r.quick and r.params == x.defaults(True)
    assert r.device.get("name") and r.env.get("versions")
    assert r.rows, "a lesson shows a table"
    assert r.measurements, "a lesson measures something"
    unnamed = [label for label, m in r.measurements.items() if m.device != r.device["name"]]
    assert not unnamed, f"measurements without this device's name: {unnamed}"
    assert r.findings, "a lesson says what its numbers show"
    for f in r.findings:
        assert set(f.labels) <= set(r.measurements), f
    assert all(c.passed for c in r.checks)
    for c in r.claims:
        assert isinstance(c.held, bool) and c.why
    back = LessonResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.rows == tuple(json.loads(json.dumps(list(r.rows))))
    assert r.table().startswith(f"Lesson {x.number} `{name}`")


@pytest.mark.parametrize("name", lessons.names())
def test_lesson_parameters_override_the_defaults(name):
    x = lessons.get(name)
    with pytest.raises(ValueError, match="has no parameter"):
        lessons.run(name, quick=True, not_a_parameter=1)
    assert set(x.defaults(True)) == set(x.params)
