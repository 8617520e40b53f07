"""``cudalab results [LESSON]``: the lesson results committed to the repository.

Lessons need a GPU; what they measured on one is committed beside the code:
lessons results files (``benchmarks/results/lessons_<device>.json``, each
with a Markdown report ``.md`` beside it; multi-GPU runs in
``multi_gpu_*.json``) and the executed notebooks (``notebooks/NN_name.ipynb``).
This command prints those results, without a GPU. The files live in the
repository, not in the installed package: from a source checkout (or an
editable install) they are found next to ``python/``, from a regular install
in the clone the current directory is in; elsewhere ``--dir`` points at a
copy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import lessons
from ..lessons.registry import Lesson
from ..lessons.results import KIND

__all__ = ["add_parsers", "committed_results", "notebook_path", "repository_root",
           "without_gpu_text"]


def _is_checkout(root: Path) -> bool:
    return (root / "benchmarks" / "results").is_dir() and (root / "python" / "cudalab").is_dir()


def repository_root() -> Path | None:
    """The cudalab checkout (where benchmarks/ and notebooks/ are): the one cudalab runs from
    (a source tree or an editable install), else the current directory or one above it (a
    regular install used inside a clone); None when there is none."""
    here = Path(__file__).resolve().parents[3]  # cli/ -> cudalab/ -> python/ -> the checkout
    cwd = Path.cwd().resolve()
    for root in (here, cwd, *cwd.parents):
        if _is_checkout(root):
            return root
    return None


def _default_dir() -> Path | None:
    root = repository_root()
    return None if root is None else root / "benchmarks" / "results"


def notebook_path(x: Lesson) -> Path | None:
    """The executed notebook of lesson `x` in the checkout (notebooks/NN_name.ipynb), or None."""
    root = repository_root()
    path = None if root is None else root / "notebooks" / f"{x.number:02d}_{x.name}.ipynb"
    return path if path is not None and path.is_file() else None


def committed_results(directory: Path) -> list[tuple[Path, list[lessons.LessonResult]]]:
    """(file, its results) for every lessons results file in `directory`, by file name."""
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            continue  # not a results file
        if kind == KIND:
            found.append((path, lessons.read_results(path)))
    return found


def _files_with(name: str, directory: Path | None) -> list[Path]:
    if directory is None or not directory.is_dir():
        return []
    return [path for path, results in committed_results(directory)
            if any(r.lesson == name for r in results)]


def _with_report(path: Path) -> str:
    report = path.with_suffix(".md")
    return f"{path}, report {report.name}" if report.is_file() else str(path)


def without_gpu_text(x: Lesson) -> str:
    """What `cudalab lesson NAME` suggests without a GPU: lesson `x`'s executed notebook and
    its committed results, where this checkout has them."""
    root = repository_root()
    if root is None:
        return (f"Without a GPU, read what lesson {x.name!r} measured on one in the cudalab "
                f"repository (not part of the installed package): the executed notebook "
                f"notebooks/{x.number:02d}_{x.name}.ipynb and the committed results "
                f"benchmarks/results/lessons_<device>.json (and .md).")
    lines = [f"Without a GPU, read what lesson {x.name!r} measured on one:"]
    notebook = notebook_path(x)
    if notebook is not None:
        lines.append(f"  the executed notebook: {notebook}")
    files = _files_with(x.name, _default_dir())
    if files:
        lines.append(f"  the committed results: cudalab results {x.name} "
                     f"(from {', '.join(_with_report(p) for p in files)})")
    else:
        lines.append(f"  (no committed results for it in {_default_dir()} yet)")
    return "\n".join(lines)


def _cmd_results(args: argparse.Namespace) -> int:
    directory = Path(args.dir) if args.dir is not None else _default_dir()
    if directory is None or not directory.is_dir():
        where = "this installation" if directory is None else str(directory)
        print(f"cudalab results: no committed results in {where}: the results files "
              f"(benchmarks/results/lessons_<device>.json and .md) are in the cudalab "
              f"repository, not in the installed package; --dir DIR reads a copy.",
              file=sys.stderr)
        return 1
    if args.lesson is not None and args.lesson not in lessons.names():
        print(f"cudalab results: no lesson {args.lesson!r}; the lessons are "
              f"{', '.join(lessons.names())}", file=sys.stderr)
        return 2
    found = committed_results(directory)
    if args.lesson is None:
        if not found:
            print(f"cudalab results: no lessons results files in {directory}", file=sys.stderr)
            return 1
        print(f"Committed lesson results in {directory}:")
        for path, results in found:
            devices = sorted({r.device.get("name", "?") for r in results})
            count = f"{len(results)} lesson{'s' if len(results) != 1 else ''}"
            print(f"  {path.name} ({', '.join(devices)}; {count}): "
                  f"{', '.join(r.lesson for r in results)}")
        print("cudalab results LESSON prints one lesson's tables, findings and checks.")
        return 0
    shown = 0
    for path, results in found:
        for r in results:
            if r.lesson == args.lesson:
                print(f"From {_with_report(path)}:")
                print()
                print(r.table())
                print()
                shown += 1
    if not shown:
        print(f"cudalab results: no committed results for lesson {args.lesson!r} in "
              f"{directory}", file=sys.stderr)
        return 1
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``results`` to the CLI."""
    parser = sub.add_parser(
        "results", help="print the lesson results committed to the repository (no GPU needed)",
        description="Print the lesson results committed to the repository "
                    "(benchmarks/results/lessons_<device>.json): with LESSON, that lesson's "
                    "tables, findings, claims and checks; without, which lessons each file "
                    "holds. Needs no GPU.")
    parser.add_argument("lesson", metavar="LESSON", nargs="?", default=None,
                        help="the lesson's name (see cudalab lessons); default: list the files")
    parser.add_argument("--dir", metavar="DIR", default=None,
                        help="read the results files in DIR (default: benchmarks/results of "
                             "the checkout cudalab runs from)")
    parser.set_defaults(func=_cmd_results)
