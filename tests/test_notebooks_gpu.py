"""GPU tier: every notebook executes with quick parameters and raises nothing.

Each notebook of notebooks/ runs with nbclient (kernel ``python3``,
CUDALAB_NOTEBOOK_QUICK=1) as a copy in a temporary directory, so the committed
outputs stay as they are. Needs nbclient and ipykernel (``pip install
".[notebooks]"``); without them these tests are skipped with that reason, also
under CUDALAB_REQUIRE_GPU=1, which fails only a missing GPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import cudalab
from _support import REPO_ROOT, absolute_paths, load_module

pytestmark = pytest.mark.gpu

NOTEBOOKS = REPO_ROOT / "notebooks"
build = load_module(REPO_ROOT / "scripts" / "build_notebooks.py")
# (lesson name or None for the index, file name)
FILES = [(None, build.INDEX), *build.lesson_files().items()]
# Seconds one cell may take in quick mode (the slowest quick lessons take well under a minute).
CELL_TIMEOUT_S = 600


@pytest.fixture
def jupyter():
    """nbclient, nbformat, ipykernel and matplotlib, or a skip naming the extra to install."""
    for name in ("nbclient", "nbformat", "ipykernel", "matplotlib"):
        pytest.importorskip(name, reason=f"executing the notebooks needs {name}: "
                                         f"pip install \".[notebooks]\"")


def _outputs(nb: dict, kind: str) -> list[dict]:
    return [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]
            if kind in o.get("data", {}) or o.get("output_type") == kind]


@pytest.mark.parametrize(("name", "file"), FILES, ids=[f for _, f in FILES])
def test_notebook_executes_in_quick_mode(name, file, jupyter, tmp_path):
    copy = tmp_path / file
    shutil.copyfile(NOTEBOOKS / file, copy)
    # The kernel imports the cudalab these tests import, wherever it comes from.
    root = str(Path(cudalab.__file__).resolve().parent.parent)
    error = build.execute(copy, copy, quick=True, timeout=CELL_TIMEOUT_S,
                          env=build.kernel_env(True, [root]), cwd=tmp_path)
    assert error is None, f"{file}: a cell raised:\n{error[-4000:]}"
    nb = build.read(copy)
    assert nb["metadata"]["cudalab"]["executed"] == {"quick": True, "complete": True}
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    assert not _outputs(nb, "error")
    device = cudalab.get_device_name()
    assert any(device in o.get("text", "") for o in _outputs(nb, "stream")), "the device is shown"
    if name is not None:
        assert _outputs(nb, "image/png"), "the lesson's plot is a PNG"
        markdown = "".join(o["data"]["text/markdown"] for o in _outputs(nb, "text/markdown"))
        assert f"Lesson {cudalab.lessons.get(name).number} `{name}`" in markdown, "the result"
        assert device in markdown and "**Findings**" in markdown
    assert not absolute_paths(nb), "stripping leaves no absolute path"
