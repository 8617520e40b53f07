"""CPU tier: the op tables drive everything that lists ops.

The element-wise table (cuda/ops/elementwise_ops.h) and the reduction table
(cuda/ops/reduce_ops.h) are the one list of their ops: the extension exposes
them as _core._ELEMENTWISE_OPS and _core._REDUCTIONS, and every op of them
must be exported, stubbed, documented (docstring and docs/api.md), filed by
the profiler and, for element-wise ops, have a NumPy reference. The recipe in
docs/design.md ("Adding an element-wise op") names the files a new op
touches; they must be exactly the files that name every table op.
"""

from __future__ import annotations

import re

import pytest

import cudalab
from cudalab import profiler
from _references import FORMS, NUMPY_REFERENCES
from _support import REPO_ROOT

core = cudalab._core
ELEMENTWISE = core._ELEMENTWISE_OPS
REDUCTIONS = core._REDUCTIONS
TABLE_OPS = ELEMENTWISE + REDUCTIONS

EW_HEADER = REPO_ROOT / "cuda" / "ops" / "elementwise_ops.h"
REDUCE_HEADER = REPO_ROOT / "cuda" / "ops" / "reduce_ops.h"
STUB = REPO_ROOT / "python" / "cudalab" / "_core.pyi"
API_DOC = REPO_ROOT / "docs" / "api.md"
DESIGN_DOC = REPO_ROOT / "docs" / "design.md"


def _table_body(header, macro: str) -> str:
    """The text of `#define macro(X) ...` up to the first blank line."""
    text = header.read_text()
    start = text.index(f"#define {macro}(X)")
    return text[start:text.index("\n\n", start)]


def test_the_tuples_are_the_tables():
    """_ELEMENTWISE_OPS: the table's lines with a signature, in table order (forms
    such as gelu's tanh one have no function); _REDUCTIONS: every reduction line."""
    lines = re.findall(r"\bX\((\w+),\s*(\w+),\s*(\w+),", _table_body(EW_HEADER, "CL_EW_OPS"))
    assert len(lines) >= 20
    assert ELEMENTWISE == tuple(name for _enum, name, sig in lines if sig != "NONE")
    reductions = re.findall(r'\bX\((\w+),\s*"(\w+)"', _table_body(REDUCE_HEADER, "CL_REDUCE_OPS"))
    assert REDUCTIONS == tuple(name for _id, name in reductions) and len(REDUCTIONS) >= 5
    assert len(set(TABLE_OPS)) == len(TABLE_OPS)


@pytest.mark.parametrize("name", TABLE_OPS)
def test_every_table_op_is_exported(name):
    assert getattr(cudalab, name) is getattr(core, name)
    assert name in cudalab.__all__


@pytest.mark.parametrize("name", TABLE_OPS)
def test_every_table_op_has_a_stub(name):
    assert re.search(rf"^def {name}\(", STUB.read_text(), re.M), f"no stub for {name} in _core.pyi"


@pytest.mark.parametrize("name", TABLE_OPS)
def test_every_table_op_has_a_docstring(name):
    f = getattr(core, name)
    assert f.__text_signature__ is not None and f.__text_signature__.endswith("out=None)")
    doc = f.__doc__ or ""
    assert "Parameters" in doc and "Returns" in doc, name
    assert len(doc.split("\n", 1)[0]) > 10, name  # a summary line


def _api_row(kind: str) -> str:
    rows = [line for line in API_DOC.read_text().splitlines() if line.startswith(f"| {kind} |")]
    assert len(rows) == 1, kind
    return rows[0]


@pytest.mark.parametrize("kind,names", [("element-wise", ELEMENTWISE),
                                        ("reductions", REDUCTIONS)])
def test_every_table_op_is_in_the_api_table(kind, names):
    row = _api_row(kind)
    missing = [n for n in names if not re.search(rf"`{n}[`(]", row)]
    assert not missing, f"docs/api.md's {kind} row does not name {missing}"


@pytest.mark.parametrize("name", TABLE_OPS)
def test_every_table_op_is_in_the_profilers_categories(name):
    expected = "element-wise" if name in ELEMENTWISE else "reduction"
    assert profiler.op_category(name) == expected
    assert profiler.ELEMENTWISE_OPS == ELEMENTWISE
    assert set(REDUCTIONS) <= set(profiler.REDUCTION_OPS)


def test_profiler_categories_name_each_op_once_and_publicly():
    names = [n for ops in profiler.OP_CATEGORIES.values() for n in ops]
    assert len(names) == len(set(names))
    assert not [n for n in names if n.startswith("_")]  # private entry points are not records
    assert profiler.op_category("_spin") == "other"


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_op_has_a_numpy_reference(name):
    assert name in NUMPY_REFERENCES, f"tests/_references.py has no NumPy reference for {name}"


def test_references_are_of_table_ops_or_their_forms():
    for key, (func, kw) in FORMS.items():
        assert func in ELEMENTWISE and key in NUMPY_REFERENCES
        assert set(kw) <= set(re.findall(r"(\w+)=", getattr(core, func).__text_signature__))
    assert set(NUMPY_REFERENCES) == set(ELEMENTWISE) | set(FORMS)


# ---- the recipe: the files a new op touches --------------------------------------------

# Where hand-written code and docs live (benchmarks/results and executed notebooks hold
# generated output).
_SCANNED = ("csrc", "cuda", "python", "tests", "docs", "scripts", "benchmarks")
_SUFFIXES = {".py", ".pyi", ".c", ".h", ".cu", ".cuh", ".md", ".txt", ".toml", ".cmake"}
# Files that name every op one test at a time, not in a list a new op must join: their
# op families come from the table (test_elementwise_cpu.py's ALL_BINARY, ...), and this
# file names the ones it checks.
_PER_OP_TESTS = {"tests/test_elementwise_cpu.py", "tests/test_op_tables_cpu.py"}


def _source_files():
    for path in REPO_ROOT.iterdir():
        if path.is_file() and path.suffix in _SUFFIXES:
            yield path
    for top in _SCANNED:
        for path in sorted((REPO_ROOT / top).rglob("*")):
            rel = path.relative_to(REPO_ROOT)
            if (path.is_file() and path.suffix in _SUFFIXES and "__pycache__" not in rel.parts
                    and rel.parts[:2] != ("benchmarks", "results")):
                yield path


def _recipe_files() -> list[str]:
    """The numbered list of files under "A new unary op therefore touches" in the
    design doc's "Adding an element-wise op" section, each item's first `path`."""
    text = DESIGN_DOC.read_text()
    section = text[text.index("## Adding an element-wise op"):]
    section = section[:section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    listing = section[section.index("A new unary op therefore touches"):]
    return re.findall(r"^\d+\. `([^`]+)`", listing, re.M)


def test_the_recipe_lists_the_files_that_name_every_op():
    """Each file the recipe names lists every element-wise op, and no other file does
    (so a new op needs exactly the recipe's files, and the CPU tier fails until each is
    done)."""
    recipe = _recipe_files()
    assert len(recipe) >= 3 and recipe[0] == "cuda/ops/elementwise_ops.h", recipe
    naming_all = set()
    for path in _source_files():
        words = set(re.findall(r"\w+", path.read_text(errors="replace")))
        rel = path.relative_to(REPO_ROOT).as_posix()
        if words.issuperset(ELEMENTWISE) and rel not in _PER_OP_TESTS:
            naming_all.add(rel)
    assert naming_all == set(recipe), (
        "files that name every element-wise op must be exactly docs/design.md's recipe; "
        f"recipe only: {sorted(set(recipe) - naming_all)}, "
        f"not in the recipe: {sorted(naming_all - set(recipe))}")
    assert "touches these files" in DESIGN_DOC.read_text()
