"""Build, execute and clean the lesson notebooks in notebooks/.

The notebooks' text lives beside the lessons, in python/cudalab/lessons/notebooks/
(its README.md gives the format): ``<name>.md`` holds lesson `name`'s own prose
and code, ``_lesson.md`` the frame every lesson notebook shares, ``_index.md``
the index. This script turns them into cells and writes notebooks/::

    python scripts/build_notebooks.py             # write notebooks/ from those files
    python scripts/build_notebooks.py --check     # exit 1 if notebooks/ differs from them
    python scripts/build_notebooks.py --execute [--quick] [--timeout S] [NOTEBOOK ...]
    python scripts/build_notebooks.py --strip [NOTEBOOK ...]

Names: ``00_all_lessons.ipynb`` is the index, first in any listing; each
lesson is ``NN_<name>.ipynb`` with NN its own number in `cudalab.lessons`
(``00_context.ipynb`` to ``25_pipeline_parallel.ipynb``). Building keeps the
outputs of a notebook whose code cells did not change (only its text did) and
clears them otherwise.

``--execute`` runs notebooks in place with nbclient (kernel ``python3``),
quick parameters when ``--quick`` (the notebooks read CUDALAB_NOTEBOOK_QUICK),
prints each notebook's wall time and the total, strips what `strip_notebook`
drops, and exits 1 if any cell raised. ``--strip`` cleans executed notebooks
in place: outputs and execution counts stay; cell timing, widget state,
editor metadata, the kernel's Python version and absolute paths in outputs go.

Writing, stripping and checking need only the standard library (and cudalab,
for the lessons' numbers, titles and parameters); building validates with
nbformat when it is installed; executing needs nbclient and ipykernel
(``pip install ".[notebooks]"``).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The notebooks' text: <lesson>.md, the frame _lesson.md, the index _index.md.
TEXT = ROOT / "python" / "cudalab" / "lessons" / "notebooks"
# The index: it sorts before every lesson (00_context.ipynb too) whatever the file browser's
# collation, since it differs from them by a letter, not by punctuation.
INDEX = "00_all_lessons.ipynb"
QUICK_ENV = "CUDALAB_NOTEBOOK_QUICK"
DEFAULT_TIMEOUT_S = 1800
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# What ipykernel reports for Python, less its version (which changes from machine to machine).
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3"}
# Notebook metadata kept by strip_notebook; "cudalab" records how the outputs were made.
KEPT_METADATA = ("kernelspec", "language_info", "cudalab")
# The two headings of a lesson's text file after its introduction, in this order.
SECTIONS = ("What the tutorial says", "The code being timed")


def notebook_name(number: int, name: str) -> str:
    """The file name of lesson `name` (number `number`): ``NN_name.ipynb``."""
    return f"{number:02d}_{name}.ipynb"


def lesson_files() -> dict[str, str]:
    """Lesson name -> its notebook's file name, for every registered lesson, in order."""
    from cudalab import lessons

    return {name: notebook_name(lessons.get(name).number, name) for name in lessons.names()}


# ---- text files to cells -----------------------------------------------------------------------


class Cell(NamedTuple):
    kind: str  # "markdown" or "code"
    source: str
    tags: tuple[str, ...] = ()


FIELD = re.compile(r"\{\{(.*?)\}\}")
CODE_FENCE = re.compile(r"```python(?:[ \t]+(.*?))?[ \t]*")


def expand(text: str, names: dict[str, Any]) -> str:
    """`text` with every ``{{ expr }}`` replaced by the f-string field ``{expr}`` (format spec
    and conversion included) evaluated over `names`. Replacements are not expanded again."""
    def field(match: re.Match) -> str:
        return eval("f" + repr("{" + match.group(1).strip() + "}"), names)  # noqa: S307 - our own files

    return FIELD.sub(field, text)


def _trim(lines: list[str]) -> str:
    """The lines joined, less leading and trailing blank lines."""
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def cells(text: str) -> list[Cell]:
    """The cells of `text`: each ```` ```python ```` block (words after ``python`` are the cell's
    tags) is a code cell; the rest is markdown, split into cells at lines that read ``+++``."""
    out: list[Cell] = []
    markdown: list[str] = []
    code: list[str] | None = None
    tags: tuple[str, ...] = ()
    other_fence = False  # inside a ``` block that is not python: markdown text

    def end_markdown() -> None:
        if source := _trim(markdown):
            out.append(Cell("markdown", source))
        markdown.clear()

    for line in text.split("\n"):
        if code is not None:
            if line.rstrip() == "```":
                out.append(Cell("code", _trim(code), tags))
                code = None
            else:
                code.append(line)
        elif not other_fence and (match := CODE_FENCE.fullmatch(line.rstrip())):
            end_markdown()
            code, tags = [], tuple((match.group(1) or "").split())
        elif not other_fence and line.rstrip() == "+++":
            end_markdown()
        else:
            if line.startswith("```"):
                other_fence = not other_fence
            markdown.append(line)
    if code is not None:
        raise ValueError("a ```python block is not closed")
    end_markdown()
    return out


def read_lesson_text(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """Lesson `name`'s text file: its settings (the ``key: value`` lines of its front matter)
    and its parts: ``intro`` (before the first heading), ``claim`` and ``timed`` (the sections
    headed by SECTIONS), each with its ``{{ }}`` fields expanded over the lesson's module."""
    path = TEXT / f"{name}.md"
    if not path.exists():
        raise SystemExit(f"build_notebooks: lesson {name} has no text: write "
                         f"{os.path.relpath(path, ROOT)} (see README.md there)")
    text = path.read_text(encoding="utf-8")
    settings = {}
    if text.startswith("---\n"):
        front, text = text[4:].split("\n---\n", 1)
        for line in filter(str.strip, front.splitlines()):
            key, _, value = line.partition(":")
            settings[key.strip()] = value.strip()
    module = importlib.import_module(f"cudalab.lessons.{name}")
    text = expand(text, dict(vars(module)))
    intro, *sections = re.split(r"^## (.*?)[ \t]*$", text, flags=re.MULTILINE)
    if tuple(sections[0::2]) != SECTIONS:
        raise SystemExit(f"build_notebooks: {path.name}: after its introduction come the headings "
                         f"{', '.join('## ' + s for s in SECTIONS)}, and no other")
    return settings, {"intro": intro.strip(), "claim": sections[1].strip(),
                      "timed": sections[3].strip()}


def _call(name: str, quick: str, *args: str) -> str:
    return f'cudalab.lessons.run("{name}", quick={quick}' + "".join(f", {a}" for a in args if a) + ")"


def _params_text(params: Any) -> str:
    return ", ".join(f"`{k}={v!r}`" for k, v in params.items()) or "nothing"


def lesson_cells(name: str) -> list[Cell]:
    """The cells of lesson `name`'s notebook: _lesson.md around the lesson's own text."""
    from cudalab import lessons

    settings, parts = read_lesson_text(name)
    names = dict(parts, name=name, lesson=lessons.get(name), index=INDEX, params_text=_params_text,
                 run_call=_call(name, "QUICK", settings.get("run", "")),
                 try_call=_call(name, "True", settings.get("try", ""), settings.get("run", "")))
    return cells(expand((TEXT / "_lesson.md").read_text(encoding="utf-8"), names))


def index_cells(files: dict[str, str]) -> list[Cell]:
    """The cells of the index notebook (_index.md), linking every lesson notebook in `files`."""
    from cudalab import lessons

    rows = "\n".join(f"| {lessons.get(n).number} | [{f}]({f}) | {lessons.get(n).title} | "
                     f"{lessons.get(n).seed} |" for n, f in files.items())
    return cells(expand((TEXT / "_index.md").read_text(encoding="utf-8"), {"rows": rows}))


# ---- notebooks as JSON -------------------------------------------------------------------------


def _cell_id(stem: str, i: int) -> str:
    return f"{stem.replace('_', '-')}-{i:02d}"[-64:]


def make_notebook(stem: str, cells: list[Cell]) -> dict[str, Any]:
    """An unexecuted nbformat 4.5 notebook of `cells`; cell ids are stable (stem and position)."""
    out = []
    for i, c in enumerate(cells):
        cell: dict[str, Any] = {"cell_type": c.kind, "id": _cell_id(stem, i), "metadata": {},
                                "source": c.source}
        if c.tags:
            cell["metadata"]["tags"] = list(c.tags)
        if c.kind == "code":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)
    return {"cells": out, "metadata": {"kernelspec": dict(KERNELSPEC),
                                       "language_info": copy.deepcopy(LANGUAGE_INFO)},
            "nbformat": 4, "nbformat_minor": 5}


def generate() -> dict[str, dict[str, Any]]:
    """File name -> notebook, for the index and every registered lesson."""
    files = lesson_files()
    out = {INDEX: make_notebook("index", index_cells(files))}
    for name, file in files.items():
        out[file] = make_notebook(Path(file).stem, lesson_cells(name))
    return out


def _split(value: Any) -> Any:
    return value.splitlines(True) if isinstance(value, str) else value


def dumps(nb: dict[str, Any]) -> str:
    """The notebook as nbformat writes it: multi-line strings split into lines, sorted
    keys, one-space indent, a final newline."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        cell["source"] = _split(cell["source"])
        for output in cell.get("outputs", []):
            if output.get("output_type") in ("execute_result", "display_data"):
                data = output.get("data", {})
                for key in data:
                    if key.startswith("text/") or key in ("application/javascript", "image/svg+xml"):
                        data[key] = _split(data[key])
            elif output.get("output_type") == "stream":
                output["text"] = _split(output["text"])
    return json.dumps(nb, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def joined(nb: dict[str, Any]) -> dict[str, Any]:
    """`nb` with multi-line strings (lists of lines in files) joined back into one string."""
    for cell in nb.get("cells", []):
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for key, value in data.items():
                if isinstance(value, list) and not key.endswith("json"):
                    data[key] = "".join(value)
            if isinstance(output.get("text"), list):
                output["text"] = "".join(output["text"])
    return nb


def read(path: Path) -> dict[str, Any]:
    """A notebook file as a dict, multi-line strings joined."""
    return joined(json.loads(Path(path).read_text(encoding="utf-8")))


def write(path: Path, nb: dict[str, Any]) -> None:
    """Validate `nb` with nbformat when it is installed, then write it as nbformat does."""
    try:
        import nbformat
    except ImportError:
        nbformat = None
    if nbformat is not None:
        nbformat.validate(nbformat.from_dict(nb))
    Path(path).write_text(dumps(nb), encoding="utf-8")


# ---- strip ---------------------------------------------------------------------------------------

# An absolute path of at least two parts ("/x/y"), not part of a longer token.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~/-])/(?:[\w.+@-]+/)+[\w.+@-]*")


def _short_path(match: re.Match) -> str:
    path = match.group(0)
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path[path.index(marker) + len(marker):]
    return ".../" + path.rstrip("/").rsplit("/", 1)[-1]


# Terminal colour codes (tracebacks have them): a path may start right after one.
ANSI = re.compile(r"(\x1b\[[0-9;]*[A-Za-z])")


def scrub(text: str) -> str:
    """`text` with every absolute path cut to its last part (``.../name``), or to the part
    after site-packages for installed modules."""
    parts = ANSI.split(text)
    return "".join(p if i % 2 else ABSOLUTE_PATH.sub(_short_path, p) for i, p in enumerate(parts))


def _scrub_output(output: dict[str, Any]) -> None:
    if isinstance(output.get("text"), str):
        output["text"] = scrub(output["text"])
    for key, value in output.get("data", {}).items():
        if isinstance(value, str) and (not key.startswith("image/") or key == "image/svg+xml"):
            output["data"][key] = scrub(value)
    if "traceback" in output:
        output["traceback"] = [scrub(line) for line in output["traceback"]]
    output.get("metadata", {}).pop("execution", None)


def strip_notebook(nb: dict[str, Any]) -> dict[str, Any]:
    """A copy of `nb` without what changes from run to run or machine to machine.

    Kept: sources, outputs, execution counts, cell tags, and the notebook's
    kernelspec, language_info and "cudalab" metadata. Dropped: every other cell
    and notebook metadata (execution timing, widget state, editor state), the
    Python version in language_info; the kernelspec becomes the standard
    ``python3`` one; absolute paths in outputs are cut (`scrub`).
    """
    nb = copy.deepcopy(nb)
    meta = nb.get("metadata", {})
    kept = {k: meta[k] for k in KEPT_METADATA if k in meta}
    kept["kernelspec"] = dict(KERNELSPEC)
    info = kept.get("language_info")
    kept["language_info"] = ({k: v for k, v in info.items() if k != "version"}
                             if isinstance(info, dict) else copy.deepcopy(LANGUAGE_INFO))
    nb["metadata"] = json.loads(scrub(json.dumps(kept)))
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = {"tags": tags} if tags else {}
        for output in cell.get("outputs", []):
            _scrub_output(output)
    return nb


# ---- execute -------------------------------------------------------------------------------------


def kernel_env(quick: bool, extra_path: Iterable[str] = ()) -> dict[str, str]:
    """The kernel's environment: this one, CUDALAB_NOTEBOOK_QUICK set, PYTHONPATH made
    absolute (the kernel starts in the notebook's directory) with `extra_path` first."""
    env = dict(os.environ)
    env[QUICK_ENV] = "1" if quick else "0"
    paths = [*extra_path, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths)
    # debugpy (in ipykernel) warns on stderr about frozen modules otherwise.
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    return env


def execute(source: Path, target: Path, quick: bool, timeout: float,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> str | None:
    """Execute notebook `source` with nbclient, write it (stripped) to `target`.

    The kernel (``python3``) starts in `cwd` (default: `target`'s directory)
    with `env` (default: `kernel_env(quick)`). Returns None, or the error of
    the cell that raised (the notebook is written up to that cell).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(str(source), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(cwd or Path(target).parent)}})
    error = None
    try:
        client.execute(env=env if env is not None else kernel_env(quick))
    except CellExecutionError as exc:
        error = ANSI.sub("", str(exc))
    except Exception as exc:  # a dead kernel or a timeout: report it like a failing cell
        error = f"{type(exc).__name__}: {exc}"
    data = joined(json.loads(json.dumps(nb)))
    data["metadata"]["cudalab"] = {"executed": {"quick": quick, "complete": error is None}}
    write(target, strip_notebook(data))
    return error


# ---- commands ------------------------------------------------------------------------------------


def _paths(args: list[str]) -> list[Path]:
    if args:
        return [Path(p) for p in args]
    return [NOTEBOOKS / INDEX] + [NOTEBOOKS / f for f in lesson_files().values()]


def _code_sources(nb: dict[str, Any]) -> list[str]:
    return [c["source"] for c in nb["cells"] if c["cell_type"] == "code"]


def differences(path: Path, want: dict[str, Any]) -> list[str]:
    """How the notebook at `path` differs from `want` in its cells (sources, types, tags)."""
    if not path.exists():
        return [f"{path.name}: missing"]
    have = read(path)
    if len(have["cells"]) != len(want["cells"]):
        return [f"{path.name}: {len(have['cells'])} cells, expected {len(want['cells'])}"]
    out = []
    for i, (h, w) in enumerate(zip(have["cells"], want["cells"])):
        for key in ("cell_type", "source"):
            if h.get(key) != w.get(key):
                out.append(f"{path.name}: cell {i}: {key} differs")
        if h.get("metadata", {}).get("tags") != w["metadata"].get("tags"):
            out.append(f"{path.name}: cell {i}: tags differ")
    return out


def build(directory: Path = NOTEBOOKS) -> list[str]:
    """Write every notebook; keep the outputs of one whose code cells are unchanged.
    Returns the names written."""
    directory.mkdir(exist_ok=True)
    written, notebooks = [], generate()
    for file, nb in notebooks.items():
        path = directory / file
        if path.exists():
            old = read(path)
            if _code_sources(old) == _code_sources(nb) and len(old["cells"]) == len(nb["cells"]):
                for new_cell, old_cell in zip(nb["cells"], old["cells"]):
                    if new_cell["cell_type"] == "code":
                        new_cell["outputs"] = old_cell.get("outputs", [])
                        new_cell["execution_count"] = old_cell.get("execution_count")
                if "cudalab" in old.get("metadata", {}):
                    nb["metadata"]["cudalab"] = old["metadata"]["cudalab"]
            if dumps(read(path)) == dumps(nb):
                continue
        write(path, nb)
        written.append(file)
    stale = sorted(p.name for p in directory.glob("*.ipynb") if p.name not in notebooks)
    if stale:
        print(f"not a lesson notebook any more (remove them): {', '.join(stale)}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if notebooks/ is not up to date")
    mode.add_argument("--execute", action="store_true", help="execute notebooks in place")
    mode.add_argument("--strip", action="store_true", help="strip volatile metadata in place")
    parser.add_argument("--quick", action="store_true", help="with --execute: quick parameters")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"with --execute: seconds per cell (default {DEFAULT_TIMEOUT_S})")
    parser.add_argument("notebooks", nargs="*", help="notebooks (default: all of notebooks/)")
    args = parser.parse_args(argv)
    if args.check:
        problems = [d for f, nb in generate().items() for d in differences(NOTEBOOKS / f, nb)]
        print("\n".join(problems) or "notebooks/ is up to date")
        return 1 if problems else 0
    if args.strip:
        for path in _paths(args.notebooks):
            write(path, strip_notebook(read(path)))
        return 0
    if args.execute:
        return run_all(_paths(args.notebooks), args.quick, args.timeout)
    for file in build():
        print(f"wrote notebooks/{file}")
    return 0


def run_all(paths: list[Path], quick: bool, timeout: float) -> int:
    """Execute each notebook in place; print its wall time, then the total; 1 on any error."""
    failed, total = [], 0.0
    print(f"executing {len(paths)} notebook(s) with {'quick' if quick else 'full'} parameters",
          flush=True)
    for path in paths:
        start = time.perf_counter()
        error = execute(path, path, quick, timeout)
        seconds = time.perf_counter() - start
        total += seconds
        print(f"{seconds:8.1f} s  {path.name}{'  FAILED' if error else ''}", flush=True)
        if error:
            failed.append(path.name)
            tail = "\n".join(error.strip().splitlines()[-12:])
            print(textwrap.indent(tail, "    "), file=sys.stderr, flush=True)
    print(f"{total:8.1f} s  total, {len(paths) - len(failed)} of {len(paths)} notebooks ran "
          f"without error", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
