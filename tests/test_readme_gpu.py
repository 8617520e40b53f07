"""The README's first example runs as written (GPU tier): README.md stays true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytestmark = pytest.mark.gpu


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_first_example_runs(capsys):
    blocks = _python_blocks(README.read_text())
    assert blocks, "README.md has no python example"
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "DeviceArray(shape=(3, 4), dtype=float32, device=0)" in out
    assert "float16" in out
