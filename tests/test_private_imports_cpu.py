"""CPU tier: no private name crosses a package line (issue 22).

The rule, read from the source (ast), imports inside functions included:

* Inside python/cudalab, a module may import an underscore-prefixed module
  or name (``_measuring``, ``_gelu_aux_row``) only from its own package
  (cudalab.nn for nn/layers.py; cudalab itself for cudalab/devices.py). The
  one exception are cudalab's top-level private modules (cudalab/_core,
  _check, _buffers, _table, _progress, _nvml, _version, ...): the package's
  shared internals, importable from anywhere inside cudalab, names and all.
  A name bound by such an import is also not used for a private attribute
  (``M._helper`` with M another package's module).
* benchmarks/*.py and scripts/*.py import nothing private from cudalab but
  cudalab._core (its test kernels and internals, where nothing public
  exists), and the exceptions listed in OUTSIDE_EXCEPTIONS, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOT = ROOT / "python"

# (file, private module) pairs outside the package that may stay, and why.
OUTSIDE_EXCEPTIONS = {
    # A one-shot NVML clock sample around the timer check, inside one NVML session:
    # cudalab.monitor's GpuMonitor samples on a thread instead.
    ("benchmarks/validate_measurement.py", "cudalab._nvml"),
}


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _module_name(path: Path) -> tuple[str, bool]:
    """(dotted name, is a package's __init__) of a file under python/."""
    parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_package(dotted: str) -> bool:
    return (PACKAGE_ROOT.joinpath(*dotted.split(".")) / "__init__.py").exists()


def _imports(tree: ast.AST, module: str | None, is_init: bool):
    """(line, imported dotted path, bound name) for every cudalab import in the tree."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_init else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "cudalab":
                continue
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}", alias.asname or alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cudalab":
                    yield node.lineno, alias.name, alias.asname or alias.name.split(".")[0]


def _owner(dotted: str) -> str | None:
    """The package whose private thing `dotted` is, or None when nothing in it is private.

    ``cudalab.lessons._measuring.rel_error`` -> cudalab.lessons;
    ``cudalab.nn.layers._backward`` -> cudalab.nn; ``cudalab.distributed._x`` ->
    cudalab.distributed.
    """
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        if _private(parts[i]):
            parent = ".".join(parts[:i])
            return parent if _is_package(parent) else ".".join(parts[:i - 1])
    return None


def _shared_internal(dotted: str) -> bool:
    """cudalab._x or something in it: a top-level private module of cudalab."""
    parts = dotted.split(".")
    return len(parts) >= 2 and parts[0] == "cudalab" and _private(parts[1])


def _package_files() -> list[Path]:
    return sorted((PACKAGE_ROOT / "cudalab").rglob("*.py"))


def _violations(path: Path) -> list[str]:
    module, is_init = _module_name(path)
    package = module if is_init else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    foreign: dict[str, str] = {}  # bound name -> another package's module it names
    for line, dotted, bound in _imports(tree, module, is_init):
        owner = _owner(dotted)
        if owner is not None and owner != package and not _shared_internal(dotted):
            found.append(f"{path.relative_to(ROOT)}:{line}: imports {dotted} "
                         f"(private to {owner})")
        target = dotted if _is_package(dotted) or PACKAGE_ROOT.joinpath(
            *dotted.split(".")).with_suffix(".py").exists() else None
        if target and not _shared_internal(target):
            home = target if _is_package(target) else target.rpartition(".")[0]
            if home != package:
                foreign[bound] = target
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in foreign and _private(node.attr)
                and not _shared_internal(f"{foreign[node.value.id]}.{node.attr}")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: uses "
                         f"{foreign[node.value.id]}.{node.attr}")
    return found


def test_the_rule_sees_a_crossing():
    """The checker itself: a models module importing nn's private helper is caught, the same
    import inside nn and an import of cudalab._check from anywhere are not."""
    assert _owner("cudalab.nn._util.check_int") == "cudalab.nn"
    assert _owner("cudalab.nn.layers._backward") == "cudalab.nn"
    assert _owner("cudalab.lessons.registry.get") is None
    assert _shared_internal("cudalab._check.check_int")
    assert not _shared_internal("cudalab.lessons._measuring")


@pytest.mark.parametrize("path", _package_files(), ids=lambda p: str(p.relative_to(PACKAGE_ROOT)))
def test_no_private_name_crosses_a_package_line(path):
    assert _violations(path) == []


def _outside_files() -> list[Path]:
    return sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")])


@pytest.mark.parametrize("path", _outside_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_benchmarks_and_scripts_import_nothing_private_but_core(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = str(path.relative_to(ROOT))
    found = []
    for line, dotted, _ in _imports(tree, None, False):
        parts = dotted.split(".")
        first = next((i for i in range(1, len(parts)) if _private(parts[i])), None)
        if first is None:
            continue
        private = ".".join(parts[:first + 1])
        if private != "cudalab._core" and (rel, private) not in OUTSIDE_EXCEPTIONS:
            found.append(f"{rel}:{line}: imports {dotted}")
    assert found == []
