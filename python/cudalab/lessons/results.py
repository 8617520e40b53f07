"""Lesson results files and reports: `write_results`, `read_results`, `markdown`.

A lessons file is a `cudalab.bench` results file of kind ``"lessons"``::

    {"schema": "cudalab.results/1", "kind": "lessons", "created": ..., "command": ...,
     "machine": {...},
     "rows": [{"lesson": "dtypes", "label": "matmul float16",
               "measurement": {...label "dtypes: matmul float16", every raw time...}}, ...],
     "lessons": [{...LessonResult.to_dict(), but "measurements": {"matmul float16":
                  "matmul float16", ...}, each label mapped to the Measurement's own label}],
     "failures": [{"lesson": "streams", "error": "LessonCheckError: ..."}]}

Each measurement is stored once, as a row whose label is prefixed with its
lesson's name (`benchmark_label`). So the file is also a baseline for
`cudalab.bench.load_baseline` and pytest's ``--gpu-benchmark-compare``:
the plugin's ``gpu_benchmark.lesson(...)`` records the same labels.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .. import bench
from ..bench import Measurement, Row
from .result import LessonResult

__all__ = ["KIND", "benchmark_label", "labelled_measurements", "markdown", "read_results",
           "write_results"]

KIND = "lessons"


def benchmark_label(lesson: str, label: str) -> str:
    """The label a lesson's measurement carries outside the lesson: ``"dtypes: matmul float16"``."""
    return f"{lesson}: {label}"


def labelled_measurements(result: LessonResult) -> list[tuple[str, Measurement]]:
    """``(label, measurement)`` for each measurement of `result`, in order, the
    Measurement relabelled with `benchmark_label` (unique across lessons)."""
    return [(label, dataclasses.replace(m, label=benchmark_label(result.lesson, label)))
            for label, m in result.measurements.items()]


def _failure(entry: Mapping[str, Any]) -> dict[str, str]:
    if set(entry) != {"lesson", "error"}:
        raise ValueError(f"lessons.write_results() argument 'failures': expected dicts with "
                         f"'lesson' and 'error', got keys {sorted(entry)}")
    return {"lesson": str(entry["lesson"]), "error": str(entry["error"])}


def write_results(path: str | os.PathLike[str], results: Iterable[LessonResult], *,
                  failures: Iterable[Mapping[str, Any]] = (), command: str | None = None,
                  max_times: int | None = None) -> Path:
    """write_results(path, results, *, failures=(), command=None, max_times=None) -> Path

    Write lesson results as a ``"lessons"`` results file (layout in the
    module docstring) through `cudalab.bench.write_results`.

    Parameters
    ----------
    path : path
        The file; its directory must exist.
    results : iterable of LessonResult
    failures : iterable of dict
        Lessons that did not finish: ``{"lesson": name, "error": text}``.
    command : str, optional
        The command that ran (default: this process's argv).
    max_times : int, optional
        Keep at most this many raw times per measurement (see
        `cudalab.bench.results_dict`).

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        As `cudalab.bench.write_results`.
    """
    results = list(results)
    rows, documents = [], []
    for r in results:
        if not isinstance(r, LessonResult):
            raise TypeError(f"lessons.write_results() argument 'results': expected "
                            f"LessonResults, got {type(r).__name__}")
        for label, m in labelled_measurements(r):
            rows.append(Row(m, {"lesson": r.lesson, "label": label}))
        document = r.to_dict()
        document["measurements"] = {label: m.label for label, m in r.measurements.items()}
        documents.append(document)
    extra = {"lessons": documents, "failures": [_failure(f) for f in failures]}
    return bench.write_results(path, KIND, rows, command=command, extra=extra,
                               max_times=max_times)


def _lesson_measurements(path: Any, document: Mapping[str, Any],
                         rows: Mapping[tuple[str, str], Measurement]) -> dict[str, Measurement]:
    name = document.get("lesson")
    own_labels = document.get("measurements")
    if not isinstance(own_labels, dict):
        raise ValueError(f"{path}: lesson {name!r} has no 'measurements' mapping")
    measurements = {}
    for label, own in own_labels.items():
        m = rows.get((name, label))
        if m is None:
            raise ValueError(f"{path}: lesson {name!r}: no row holds measurement {label!r}")
        measurements[label] = dataclasses.replace(m, label=own)
    return measurements


def read_results(path: str | os.PathLike[str]) -> list[LessonResult]:
    """read_results(path) -> list of LessonResult

    Read a file written by `write_results` (or ``cudalab lesson ... --json``,
    ``cudalab run-all --json``) back into results, in the order written.

    Raises
    ------
    ValueError
        Not a cudalab results file, not one of lessons, or malformed; the
        message says why.
    OSError
        The file cannot be read.
    """
    read = bench.read_results(path)
    if read.kind != KIND:
        raise ValueError(f"{path} is a results file of kind {read.kind!r}, not {KIND!r} "
                         "(write one with cudalab run-all --json)")
    documents = read.data.get("lessons")
    if not isinstance(documents, list):
        raise ValueError(f"{path}: expected a 'lessons' list")
    rows = {(row.get("lesson"), row.get("label")): row.measurement for row in read.rows}
    results = []
    for document in documents:
        if not isinstance(document, dict):
            raise ValueError(f"{path}: expected each lesson as an object")
        data = dict(document, measurements={})
        result = LessonResult.from_dict(data)
        results.append(dataclasses.replace(
            result, measurements=_lesson_measurements(path, document, rows)))
    return results


def markdown(results: Sequence[LessonResult], *, device: str | None = None,
             failures: Iterable[Mapping[str, Any]] = ()) -> str:
    """markdown(results, *, device=None, failures=()) -> str

    One Markdown report: a header naming the device (`device`, else the
    devices the results ran on), then each result's ``_repr_markdown_()``,
    then the lessons that failed.
    """
    failures = [_failure(f) for f in failures]
    if device is None:
        names = list(dict.fromkeys(str(r.device.get("name", "?")) for r in results))
        device = ", ".join(names) or "an unknown device"
    modes = sorted({"quick" if r.quick else "full" for r in results})
    versions = results[0].env.get("versions", {}) if results else {}
    facts = [f"{len(results)} lesson{'s' if len(results) != 1 else ''} ran"]
    if modes:
        facts.append(" and ".join(modes) + " mode")
    if versions.get("cudalab"):
        facts.append(f"cudalab {versions['cudalab']}")
    if results:
        facts.append(f"finished {results[-1].created}")
    if failures:
        facts.append(f"{len(failures)} failed")
    parts = [f"# cudalab lessons on {device}", ", ".join(facts) + "."]
    parts.extend(r._repr_markdown_() for r in results)
    if failures:
        parts.append("## Lessons that failed\n\n" + "\n".join(
            f"- `{f['lesson']}`: {f['error']}" for f in failures))
    return "\n\n".join(parts) + "\n"
