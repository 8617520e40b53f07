"""CPU tier: the notebooks in notebooks/ as files, without executing them.

Every registered lesson has exactly one notebook (``NN_name.ipynb``) besides
the index ``00_all_lessons.ipynb``, which sorts first; each is valid nbformat 4
JSON, matches what scripts/build_notebooks.py generates, compiles, uses only
cudalab's public API, holds no absolute path and no error output, and, once
executed, has every code cell's output in execution order. Needs no Jupyter package: nbformat validates
when it is installed, a structural check of the JSON stands in otherwise.
"""

from __future__ import annotations

import ast
import json
import re

import pytest

import cudalab
from cudalab import lessons
from _support import REPO_ROOT, absolute_paths, load_module

NOTEBOOKS = REPO_ROOT / "notebooks"
build = load_module(REPO_ROOT / "scripts" / "build_notebooks.py")

LESSON_FILES = build.lesson_files()
ALL_FILES = [build.INDEX, *LESSON_FILES.values()]


def _load(name: str) -> dict:
    path = NOTEBOOKS / name
    if not path.exists():
        pytest.fail(f"notebooks/{name} is missing: run python scripts/build_notebooks.py")
    return build.read(path)


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _python(source: str) -> str:
    """A code cell's source without IPython magics (``%...``, ``!...``), which compile() rejects."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _executed(nb: dict) -> bool:
    """Whether the notebook was ever executed: the executor's mark, or any code cell run."""
    return ("executed" in nb["metadata"].get("cudalab", {})
            or any(c.get("execution_count") is not None or c.get("outputs")
                   for c in _code_cells(nb)))


def _check_structure(nb: dict) -> None:
    """The parts of the nbformat 4 schema a notebook here relies on (without nbformat)."""
    assert nb.get("nbformat") == 4 and isinstance(nb.get("nbformat_minor"), int)
    assert isinstance(nb.get("metadata"), dict) and isinstance(nb.get("cells"), list)
    ids = [c.get("id") for c in nb["cells"]]
    if nb["nbformat_minor"] >= 5:
        assert all(isinstance(i, str) and re.fullmatch(r"[a-zA-Z0-9-_]{1,64}", i) for i in ids)
        assert len(set(ids)) == len(ids), "cell ids are unique"
    for c in nb["cells"]:
        assert c["cell_type"] in ("markdown", "code", "raw"), c["cell_type"]
        assert isinstance(c["source"], str) and isinstance(c["metadata"], dict)
        if c["cell_type"] == "code":
            assert isinstance(c["outputs"], list)
            assert c["execution_count"] is None or isinstance(c["execution_count"], int)
            for o in c["outputs"]:
                assert o["output_type"] in ("stream", "display_data", "execute_result", "error")
        else:
            assert "outputs" not in c and "execution_count" not in c


# ---- the set of notebooks ---------------------------------------------------------------------


def test_every_lesson_has_one_notebook_and_there_is_no_other():
    assert set(LESSON_FILES) == set(lessons.names())
    for name, file in LESSON_FILES.items():
        assert file == f"{lessons.get(name).number:02d}_{name}.ipynb"
    present = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert present == sorted(ALL_FILES), "notebooks/ holds the index and one notebook per lesson"
    assert len(present) == len(lessons.names()) + 1


def test_the_index_sorts_first_whatever_the_collation():
    present = [p.name for p in NOTEBOOKS.glob("*.ipynb")]
    for key in (str, str.lower, str.upper, lambda s: s.replace("_", " ")):
        assert min(present, key=key) == build.INDEX


def test_notebooks_are_what_the_build_script_generates():
    problems = [d for file, nb in build.generate().items()
                for d in build.differences(NOTEBOOKS / file, nb)]
    assert not problems, ("notebooks/ is out of date with scripts/build_notebooks.py (run it, "
                          "then execute the notebooks again):\n" + "\n".join(problems))


def test_build_writes_every_notebook(tmp_path):
    """What `python scripts/build_notebooks.py` does, into an empty directory."""
    written = build.build(tmp_path)
    assert sorted(written) == sorted(ALL_FILES)
    for file, nb in build.generate().items():
        assert not build.differences(tmp_path / file, nb), file
    assert build.build(tmp_path) == [], "a second build writes nothing"


def test_index_links_every_lesson_notebook():
    text = "\n".join(c["source"] for c in _load(build.INDEX)["cells"] if c["cell_type"] == "markdown")
    for file in LESSON_FILES.values():
        assert f"]({file})" in text, file


# ---- each notebook ----------------------------------------------------------------------------


@pytest.mark.parametrize("file", ALL_FILES)
def test_nbformat_4_structure(file):
    _check_structure(_load(file))


@pytest.mark.parametrize("file", ALL_FILES)
def test_valid_nbformat_4(file):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the structure "
                                                      "test checks the JSON without it)")
    nbformat.validate(nbformat.reads((NOTEBOOKS / file).read_text(encoding="utf-8"),
                                     as_version=4))


@pytest.mark.parametrize("file", ALL_FILES)
def test_no_absolute_paths(file):
    found = absolute_paths(_load(file))
    assert not found, f"{file}: absolute paths in {[t[:200] for t in found]}"


@pytest.mark.parametrize("file", ALL_FILES)
def test_every_code_cell_compiles(file):
    for i, cell in enumerate(_code_cells(_load(file))):
        compile(_python(cell["source"]), f"{file}[code cell {i}]", "exec")


def _cudalab_names(source: str) -> set[str]:
    """Dotted names starting at `cudalab` (``cudalab.bench.Timer``) used in `source`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "cudalab":
                names.add(".".join(["cudalab", *reversed(parts)]))
    return names


@pytest.mark.parametrize("file", ALL_FILES)
def test_only_the_public_api(file):
    for cell in _code_cells(_load(file)):
        source = _python(cell["source"])
        assert not re.search(r"\bcudalab(\.\w+)*\._(?!_)", source), source
        assert not re.search(r"\bimport\s+_|from\s+cudalab\S*\s+import\s+_", source), source
        for name in _cudalab_names(source):
            obj = cudalab
            for part in name.split(".")[1:]:
                assert hasattr(obj, part), f"{file}: {name} does not exist"
                obj = getattr(obj, part)
            if name.startswith("cudalab.lessons."):
                assert name.split(".")[2] in lessons.__all__, f"{file}: {name} is not public"


@pytest.mark.parametrize("file", ALL_FILES)
def test_no_error_outputs(file):
    for cell in _code_cells(_load(file)):
        for output in cell["outputs"]:
            assert output["output_type"] != "error", f"{file}: {output.get('ename')}"
            if output["output_type"] == "stream":
                assert "Traceback" not in output["text"], f"{file}: {output['text'][:500]}"


@pytest.mark.parametrize("file", ALL_FILES)
def test_executed_notebook_has_every_output_in_order(file):
    nb = _load(file)
    if not _executed(nb):
        pytest.skip(f"{file} has not been executed yet (scripts/run_notebooks.sh on a GPU "
                    f"machine fills in its outputs)")
    mark = nb["metadata"].get("cudalab", {}).get("executed", {})
    assert mark.get("complete", True), f"{file}: its last execution stopped at an error"
    counts = [c["execution_count"] for c in _code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{file}: execution counts {counts}"
    for i, cell in enumerate(_code_cells(nb)):
        for output in cell["outputs"]:
            if output["output_type"] == "execute_result":
                assert output["execution_count"] == cell["execution_count"]
    assert not any("execution" in c["metadata"] for c in nb["cells"]), "strip the notebook"


# ---- the lesson notebooks ---------------------------------------------------------------------


@pytest.mark.parametrize("name", lessons.names())
def test_lesson_notebook_has_its_parts(name):
    nb = _load(LESSON_FILES[name])
    code = [c["source"] for c in _code_cells(nb)]
    text = "\n".join(c["source"] for c in nb["cells"] if c["cell_type"] == "markdown")
    x = lessons.get(name)
    assert nb["cells"][0]["cell_type"] == "markdown"
    assert nb["cells"][0]["source"].startswith(f"# Lesson {x.number} `{name}`: {x.title}")
    assert "## What the tutorial says" in text and f"]({build.INDEX})" in text
    parameters = [c for c in _code_cells(nb) if "parameters" in c["metadata"].get("tags", [])]
    assert len(parameters) == 1 and build.QUICK_ENV in parameters[0]["source"]
    assert any("cudalab.get_device_name()" in c for c in code), "a cell shows the device"
    timed = [c for c in code if "timer.measure(" in c or "cudalab.bench." in c]
    assert timed, "a cell shows the calls being timed through cudalab.bench"
    assert any(f'cudalab.lessons.run("{name}", quick=QUICK' in c for c in code)
    assert any("result.plot()" in c for c in code)
    assert any("result.findings" in c and "result.claims" in c for c in code)
    assert "lessons.get(" in code[-1], "the last cell is the one to try other parameters"


def _run_calls(source: str) -> list[ast.Call]:
    """Every ``cudalab.lessons.run(...)`` call in `source`, commented-out lines included."""
    lines = [re.sub(r"^(\s*)# ?(?=\w+ = cudalab\.lessons\.run\(|cudalab\.lessons\.run\()", r"\1",
                    line) for line in _python(source).splitlines()]
    return [node for node in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "cudalab.lessons.run"]


@pytest.mark.parametrize("name", lessons.names())
def test_lesson_runs_name_real_parameters(name):
    calls = [call for cell in _code_cells(_load(LESSON_FILES[name]))
             for call in _run_calls(cell["source"])]
    assert len(calls) == 2, "the lesson run and the suggestion of the last cell"
    for call in calls:
        assert ast.literal_eval(call.args[0]) == name
        keywords = {k.arg for k in call.keywords} - {"quick"}
        assert keywords <= set(lessons.get(name).params), keywords


# ---- strip --------------------------------------------------------------------------------------


def _synthetic() -> dict:
    """An executed notebook as Jupyter and nbclient leave it, with what strip must drop."""
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "venv", "display_name": "Python (/home/me/venv)",
                           "language": "python", "argv": ["/home/me/venv/bin/python"]},
            "language_info": {"name": "python", "version": "3.12.3", "mimetype": "text/x-python"},
            "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}},
            "vscode": {"interpreter": {"hash": "abc"}},
            "cudalab": {"executed": {"quick": False, "complete": True}},
        },
        "cells": [
            {"cell_type": "markdown", "id": "m", "metadata": {"jupyter": {"source_hidden": True}},
             "source": "# Title"},
            {"cell_type": "code", "id": "c", "execution_count": 3,
             "metadata": {"tags": ["parameters"], "scrolled": True,
                          "execution": {"iopub.execute_input": "2026-01-01T00:00:00Z"}},
             "source": "x = 1",
             "outputs": [
                 {"output_type": "stream", "name": "stderr",
                  "text": "/usr/lib/python3.12/site-packages/pkg/mod.py:3: Warning\n"
                          "trace written to /tmp/cudalab_profiling_x1/trace.json\n"},
                 {"output_type": "execute_result", "execution_count": 3, "metadata": {},
                  "data": {"text/plain": "'/home/me/file.txt'", "image/png": "iVBOR/home/w=="}},
                 {"output_type": "error", "ename": "E", "evalue": "v",
                  "traceback": ["\x1b[32m/work/x/y.py\x1b[39m: in f"]},
             ]},
        ],
    }


def test_strip_keeps_outputs_and_drops_volatile_metadata():
    nb = build.strip_notebook(_synthetic())
    assert nb["metadata"]["kernelspec"] == build.KERNELSPEC
    assert nb["metadata"]["language_info"] == {"name": "python", "mimetype": "text/x-python"}
    assert nb["metadata"]["cudalab"] == {"executed": {"quick": False, "complete": True}}
    assert set(nb["metadata"]) == {"kernelspec", "language_info", "cudalab"}
    markdown, code = nb["cells"]
    assert markdown["metadata"] == {} and markdown["source"] == "# Title"
    assert code["metadata"] == {"tags": ["parameters"]}
    assert code["execution_count"] == 3 and len(code["outputs"]) == 3
    stream, result, error = code["outputs"]
    assert stream["text"] == "pkg/mod.py:3: Warning\ntrace written to .../trace.json\n"
    assert result["data"]["text/plain"] == "'.../file.txt'"
    assert result["data"]["image/png"] == "iVBOR/home/w==", "image data is not text"
    assert error["traceback"] == ["\x1b[32m.../y.py\x1b[39m: in f"]
    assert not absolute_paths(nb)
    assert build.strip_notebook(nb) == nb, "stripping twice changes nothing"


@pytest.mark.parametrize("text", ["1/32 of the float32 rate", "GB/s", "h2d/d2h", "a / b",
                                  "x[:, ::8]", "https://example.org/a/b", "notebooks/01_a.ipynb"])
def test_scrub_leaves_text_that_is_no_absolute_path(text):
    assert build.scrub(text) == text


def test_strip_command_rewrites_a_file_in_place(tmp_path):
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(_synthetic()), encoding="utf-8")
    assert build.main(["--strip", str(path)]) == 0
    text = path.read_text(encoding="utf-8")
    assert text == build.dumps(build.strip_notebook(_synthetic()))
    assert text.endswith("\n") and '"widgets"' not in text and '"execution"' not in text
    _check_structure(build.read(path))


def test_dumps_writes_what_nbformat_writes():
    nbformat = pytest.importorskip("nbformat")
    for file in ALL_FILES[:3]:
        nb = _load(file)
        assert build.dumps(nb) == nbformat.writes(nbformat.from_dict(nb)) + "\n"
    stripped = build.strip_notebook(_synthetic())
    assert build.dumps(stripped) == nbformat.writes(nbformat.from_dict(stripped)) + "\n"


# ---- the notebooks' text files (python/cudalab/lessons/notebooks/) ---------------------------


def test_every_lesson_has_a_text_file_and_every_text_file_a_use():
    present = {p.stem for p in build.TEXT.glob("*.md")}
    assert present == {*lessons.names(), "_index", "_lesson", "README"}


def test_text_to_cells():
    text = ("intro\n\n+++\n\n## How\n\n```bash\nls notebooks/\n+++\n```\n\n"
            "```python parameters\nA = 1\n\n\nB = 2\n\n```\n\n```python\nprint(A)\n```\nend\n")
    assert build.cells(text) == [
        build.Cell("markdown", "intro"),
        build.Cell("markdown", "## How\n\n```bash\nls notebooks/\n+++\n```"),
        build.Cell("code", "A = 1\n\n\nB = 2", ("parameters",)),
        build.Cell("code", "print(A)"),
        build.Cell("markdown", "end"),
    ]
    assert build.cells("\n+++\n\n+++\n") == [], "empty markdown cells are dropped"
    with pytest.raises(ValueError, match="not closed"):
        build.cells("```python\nx = 1\n")


def test_fields_expand_as_f_string_fields():
    names = {"X": 1 / 3, "s": "a", "f": lambda n: n * 2}
    assert build.expand("{{ X:.2f }}x, {{s!r}}, {{ f(2) }}, {{ '{{' }}", names) == "0.33x, 'a', 4, {{"
    assert build.expand("{x} {'a': {'b': 1}}", {}) == "{x} {'a': {'b': 1}}", "single braces stay"


def test_a_lesson_text_without_its_headings_is_refused(tmp_path, monkeypatch):
    (tmp_path / "creation.md").write_text("intro\n\n## The code being timed\n\ntext\n")
    monkeypatch.setattr(build, "TEXT", tmp_path)
    with pytest.raises(SystemExit, match="What the tutorial says"):
        build.read_lesson_text("creation")
    with pytest.raises(SystemExit, match="dtypes.md"):
        build.read_lesson_text("dtypes")
