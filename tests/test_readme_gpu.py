"""The README's first example runs as written (GPU tier): README.md stays true."""

from __future__ import annotations

import pytest

from _support import README, readme_python_blocks

pytestmark = pytest.mark.gpu


def test_readme_first_example_runs(capsys):
    blocks = readme_python_blocks()
    assert blocks, "README.md has no python example"
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "DeviceArray(shape=(3, 4), dtype=float32, device=0)" in out
    assert "float16" in out
