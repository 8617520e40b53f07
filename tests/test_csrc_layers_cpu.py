"""CPU tier: csrc/ is layered, and every #include points down.

The C extension's groups (a folder of csrc/ each) stand in one order,
bottom-up (LAYERS). A file may include its own group's headers and those of
groups below it, never a group above; the files directly in csrc/ (the
umbrella cudalab.h, module.c, devicearray.c) are the top. cuda/ (the
kernels' C ABI, kernels.h) is below them all. Reads the sources only: no
build, no GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
CUDA = ROOT / "cuda"

# Bottom-up. "" is csrc/ itself: the top, which may include everything.
LAYERS = ["core", "runtime", "array", "prof", "frame", "ops", "dist", ""]
KERNELS = "cuda"  # cuda/*.h: below every group of csrc/

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def group_of(path: Path) -> str:
    """The group of a file: its folder under csrc/ ("" directly in csrc/),
    or KERNELS for a header of cuda/."""
    if path.is_relative_to(CUDA):
        return KERNELS
    rel = path.relative_to(CSRC)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def rank(group: str) -> int:
    return -1 if group == KERNELS else LAYERS.index(group)


def resolve(including: Path, name: str) -> Path | None:
    """Where the compiler finds `#include "name"`: next to the including
    file first, then on the include path (csrc/, cuda/; CMakeLists.txt)."""
    for base in (including.parent, CSRC, CUDA):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    return None


def sources(root: Path = CSRC) -> list[Path]:
    return sorted(p.resolve() for p in root.rglob("*") if p.suffix in (".c", ".h"))


def include_graph(files: list[Path]) -> tuple[dict[Path, list[Path]], list[str]]:
    """File -> the files it includes; and the includes found nowhere."""
    graph, missing = {}, []
    for f in files:
        graph[f] = []
        for name in INCLUDE.findall(f.read_text()):
            target = resolve(f, name)
            if target is None:
                missing.append(f"{f.relative_to(ROOT)}: #include \"{name}\" not found")
            else:
                graph[f].append(target)
    return graph, missing


def upward_includes(graph: dict[Path, list[Path]]) -> list[str]:
    """Includes that point to a higher layer than the including file's."""
    bad = []
    for f, targets in graph.items():
        for t in targets:
            if rank(group_of(t)) > rank(group_of(f)):
                bad.append(f"{f.relative_to(ROOT)} ({group_of(f) or 'top'}) includes "
                           f"{t.relative_to(ROOT)} ({group_of(t) or 'top'}), a higher layer")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a directed graph, one per strongly connected component of
    more than one node (or a node with an edge to itself)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def group_edges(graph: dict[Path, list[Path]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for f, targets in graph.items():
        for t in targets:
            if group_of(t) != group_of(f):
                edges.setdefault(group_of(f) or "top", set()).add(group_of(t) or "top")
    return edges


def file_edges(graph: dict[Path, list[Path]]) -> dict[str, set[str]]:
    return {str(f.relative_to(ROOT)): {str(t.relative_to(ROOT)) for t in targets}
            for f, targets in graph.items()}


# ----------------------------------------------------------------- the tree ---

FILES = sources()
GRAPH, MISSING = include_graph(FILES)


def test_every_group_has_a_place_in_the_order():
    groups = {group_of(f) for f in FILES}
    assert groups <= set(LAYERS), f"put {sorted(groups - set(LAYERS))} into LAYERS"
    assert len(FILES) >= 30 and all(g in groups for g in LAYERS)


def test_every_include_is_found():
    assert MISSING == []


def test_no_include_points_to_a_higher_layer():
    assert upward_includes(GRAPH) == []


def test_no_cycle_between_groups():
    assert cycles(group_edges(GRAPH)) == []


def test_no_include_cycle_between_files():
    assert cycles(file_edges(GRAPH)) == []


def test_only_the_top_includes_the_umbrella():
    umbrella = (CSRC / "cudalab.h").resolve()
    users = sorted(str(f.relative_to(CSRC)) for f, ts in GRAPH.items() if umbrella in ts)
    assert users and all("/" not in u for u in users), users


def test_each_group_header_includes_only_lower_group_headers():
    """A group's header (core/core.h, array/array.h, ...) pulls in nothing of
    its own layer or above: a file that needs a group names it itself."""
    for group in LAYERS[:-1]:
        header = (CSRC / group / f"{group}.h").resolve()
        assert header in GRAPH, header
        for t in GRAPH[header]:
            if t.is_relative_to(CSRC):
                assert rank(group_of(t)) < rank(group), (header, t)


# ------------------------------------------------- the checker catches them ---

def fake_tree(tmp_path: Path, files: dict[str, str]) -> dict[Path, list[Path]]:
    graph = {}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for rel, text in files.items():
        f = tmp_path / rel
        graph[f.resolve()] = [(tmp_path / n).resolve() for n in INCLUDE.findall(text)]
    return graph


@pytest.fixture
def as_csrc(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CSRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "CUDA", tmp_path / "cuda")
    return tmp_path


def test_checker_flags_an_upward_include(as_csrc):
    graph = fake_tree(as_csrc, {
        "core/core.h": "",
        "array/array.h": '#include "core/core.h"\n',
        "runtime/device.c": '#include "core/core.h"\n  #  include "array/array.h"\n',
    })
    assert upward_includes(graph) == [
        "runtime/device.c (runtime) includes array/array.h (array), a higher layer"]


def test_checker_finds_cycles(as_csrc):
    graph = fake_tree(as_csrc, {
        "ops/ops.h": '#include "frame/frame.h"\n',
        "frame/frame.h": '#include "ops/ops.h"\n',
        "core/core.h": '/* #include "ops/ops.h" is only a comment here */\n',
    })
    assert cycles(group_edges(graph)) == [["frame", "ops"]]
    assert cycles(file_edges(graph)) == [["frame/frame.h", "ops/ops.h"]]
