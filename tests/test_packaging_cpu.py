"""CPU tier: packaging facts (one version source, the cuBLAS import hint)."""

from __future__ import annotations

import re

import pytest

import cudalab
from _support import REPO_ROOT
from cudalab._import_hint import import_hint

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None


def test_the_version_has_one_source():
    package = REPO_ROOT / "python" / "cudalab"
    sources = {p.name: p.read_text() for p in package.rglob("*.py")}
    defined = {name for name, text in sources.items()
               if re.search(r'^__version__ = "', text, re.M)}
    assert defined == {"_version.py"}
    assert re.findall(r'^__version__ = "([^"]+)"$', sources["_version.py"], re.M) == [
        cudalab.__version__]
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and project["dynamic"] == ["version"]


@pytest.mark.parametrize("library", ["libcublas.so.13", "libcublasLt.so.13"])
def test_a_missing_cublas_names_what_to_install(library):
    error = ImportError(f"{library}: cannot open shared object file: No such file or directory")
    hint = import_hint(error)
    assert hint.startswith(f"cudalab's extension could not load {library} (cuBLAS).")
    assert "pip install 'cudalab[cuda]'" in hint and "LD_LIBRARY_PATH" in hint


def test_other_import_errors_are_left_alone():
    assert import_hint(ImportError("No module named 'numpy'")) is None
    assert import_hint(ImportError("libfoo.so.1: cannot open shared object file")) is None


def test_the_cuda_extra_pulls_cublas():
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(req.startswith("nvidia-cublas") for req in extras["cuda"])
