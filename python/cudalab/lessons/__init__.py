"""cudalab.lessons: the tutorials' lessons as callable, measured benchmarks.

* `names()` lists the lessons in order; `get(name)` gives a `Lesson` (number,
  title, the tutorial section it comes from, full and quick parameters).
* `run(name, quick=False, **params)` runs one on the current GPU and returns
  an immutable `LessonResult`: its measurements, table rows, findings computed
  from its own numbers, the tutorial's claims beside the values measured here,
  and its correctness checks.
* `write_results(path, results)` / `read_results(path)`: lesson results
  files (``cudalab run-all --json``); `markdown(results)`: one report.

Every lesson is a module of this package that declares itself with
`registry.lesson`; importing the package registers them all.
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import Lesson, LessonCheckError, LessonRun, get, names, run
from .result import Check, Claim, Finding, LessonResult
from .results import markdown, read_results, write_results

__all__ = ["Check", "Claim", "Finding", "Lesson", "LessonCheckError", "LessonResult",
           "LessonRun", "get", "markdown", "names", "read_results", "run", "write_results"]

# The lessons' machinery and shared helpers: modules of this package that are not lessons.
_FRAMEWORK = {"analysis", "multi_gpu", "registry", "resnet", "result", "results", "training",
              "tutorial_figures"}

# Each lesson module registers itself on import; a new lesson is a new module.
for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_") and _info.name not in _FRAMEWORK:
        importlib.import_module(f"{__name__}.{_info.name}")
