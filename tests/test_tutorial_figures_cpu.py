"""CPU tier: cudalab.lessons.tutorial_figures and the README table's two tutorial columns."""

from __future__ import annotations

import dataclasses

import pytest

from cudalab import lessons
from cudalab.lessons import tutorial_figures as TF
from cudalab.lessons.result import Claim, LessonResult
from _support import REPO_ROOT, load_module

lessons_summary = load_module(REPO_ROOT / "scripts" / "lessons_summary.py")

# Lessons 0-25 as registered today, and 26-29 as they are being written.
NAMED = ("context", "creation", "dtypes", "transfers", "batching", "inplace", "tensor_cores",
         "access_patterns", "profiling", "cpu_vs_gpu", "memory", "pinned", "streams",
         "prefetch", "graphs", "timing", "roofline", "amp", "grad_accumulation", "inference",
         "conv_as_gemm", "p2p", "allreduce", "data_parallel", "multi_gpu_inference",
         "pipeline_parallel", "checkpointing", "amp_memory", "compilers", "determinism")

# Only the Colab notebook shows a run (on a Tesla T4): its lessons 0-8, and its lesson 2's
# float16 GEMM for amp.
WITH_T4_RUN = {"context", "creation", "dtypes", "transfers", "batching", "inplace",
               "tensor_cores", "access_patterns", "profiling", "amp"}


def test_every_lesson_named_has_an_entry():
    assert set(NAMED) <= set(TF.FIGURES)
    for name in lessons.names():  # the registered ones among them have one too
        if name in NAMED:
            assert TF.figure(name) is TF.FIGURES[name]


def test_entries_name_known_tutorials_and_read_as_one_cell():
    for name, entry in TF.FIGURES.items():
        assert entry.tutorials and set(entry.tutorials) <= set(TF.TUTORIALS), name
        assert entry.claim and "|" not in entry.claim and "\n" not in entry.claim
        assert entry.claim_text() == f"{', '.join(entry.tutorials)}: {entry.claim}"
        assert entry.t4_run is None or (entry.t4_run and "|" not in entry.t4_run)
    assert TF.FIGURES["cpu_vs_gpu"].claim_text() == (
        "step-by-step guide: matrix multiplication 50-100x faster on the GPU (expected)")


def test_t4_figures_only_where_the_notebook_shows_a_run():
    assert {name for name, e in TF.FIGURES.items() if e.t4_run is not None} == WITH_T4_RUN
    # seed 001's 50-100x is a claim, not a T4 measurement
    assert TF.FIGURES["cpu_vs_gpu"].t4_run is None


@pytest.mark.parametrize("name, claim, t4", [
    ("context", "1-2 GB", "0.0 MB"),
    ("creation", "~16 GB/s", "206x"),
    ("dtypes", "16x", "15.6x"),
    ("transfers", "~10 us", "75x"),
    ("tensor_cores", "16x penalty", "18.70 TFLOP/s"),
    ("access_patterns", "faster", "0.21x"),
])
def test_claims_and_t4_figures_are_the_notebooks(name, claim, t4):
    entry = TF.FIGURES[name]
    assert claim in entry.claim and entry.tutorials[0] == "Colab notebook"
    assert entry.t4_run.startswith(t4) or t4 in entry.t4_run


def test_a_frozen_entry():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TF.FIGURES["context"].claim = "x"  # type: ignore[misc]


# ---- lessons the module has no entry for -----------------------------------------------------


def test_an_unknown_lesson_has_no_entry_and_dashes_in_the_table():
    assert TF.figure("a_lesson_from_the_future") is None
    assert lessons_summary.tutorial_cells("a_lesson_from_the_future") == ("-", "-")


def result(name: str, claims=()) -> LessonResult:
    return LessonResult(
        lesson=name, number=99, title="A new lesson", seed="a guide", params={}, quick=True,
        device={"name": "Fake GPU", "index": 0}, env={}, measurements={}, rows=(),
        findings=(), claims=tuple(claims), checks=(), wall_seconds=0.1,
        created="2026-11-23T00:00:00+00:00")


def test_rows_of_lessons_with_and_without_entries():
    claim = Claim("it is fast", 2.0, 3.0, "x", True, "3x here")
    row = lessons_summary.readme_row(result("a_lesson_from_the_future", [claim]))
    assert row == ("| 99 | `a_lesson_from_the_future` | A new lesson: it is fast | - | - | 3 x | yes "
                   "| 3x here | - |")
    row = lessons_summary.readme_row(result("cpu_vs_gpu", [claim]))
    assert row.split(" | ")[3:6] == [
        "step-by-step guide: matrix multiplication 50-100x faster on the GPU (expected)", "-",
        "3 x"]
    row = lessons_summary.readme_row(result("creation"))
    assert row.split(" | ")[4:7] == [TF.FIGURES["creation"].t4_run, "-", "-"]
