"""CPU tier: every name a cudalab package exports is the object its source and docs say.

A package's ``__init__`` binds each name of ``__all__`` (``from .baseline import
compare``); a later import of a submodule of the same name would rebind the
package attribute to the module (cudalab.bench.compare was once the module
bench/compare.py, not the documented function). These tests read each
package's ``__init__.py`` and its docstring and check the attributes against
them, without a GPU.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import types
from pathlib import Path

import pytest

import cudalab

PACKAGES = ["cudalab", "cudalab.bench", "cudalab.cli", "cudalab.distributed", "cudalab.lessons",
            "cudalab.models", "cudalab.nn"]


def _bindings(package: types.ModuleType) -> dict[str, tuple[str, str | None]]:
    """name -> (absolute module, attribute or None for the module itself), from the
    package's top-level ``from X import Y`` statements (the last one binding a name wins;
    ``if TYPE_CHECKING:`` blocks are skipped)."""
    tree = ast.parse(Path(package.__file__).read_text())
    out: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                           package.__name__) if node.level else node.module
        for alias in node.names:
            if alias.name == "*":
                continue
            submodule = f"{base}.{alias.name}"
            is_module = importlib.util.find_spec(submodule) is not None if _is_package(base) \
                else False
            out[alias.asname or alias.name] = (submodule, None) if is_module else (base,
                                                                                   alias.name)
    return out


def _is_package(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


def test_bench_compare_is_the_documented_baseline_function():
    from cudalab.bench import baseline

    assert cudalab.bench.compare is baseline.compare
    assert inspect.isfunction(cudalab.bench.compare)
    assert "compare" in cudalab.bench.__all__
    assert isinstance(cudalab.bench.Compare, type)  # the table class lives in compare_table


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_is_what_the_package_imports(name):
    package = importlib.import_module(name)
    bound = _bindings(package)
    for export in package.__all__:
        got = getattr(package, export)  # every name of __all__ exists (lazy ones load here)
        if export not in bound:
            continue  # assigned in the package itself, or loaded lazily by __getattr__
        module, attribute = bound[export]
        want = importlib.import_module(module)
        if attribute is not None:
            want = getattr(want, attribute)
        assert got is want, (f"{name}.{export} is {got!r}, but {name}/__init__.py binds it to "
                             f"{module}{'' if attribute is None else '.' + attribute}")


def _documented(package: types.ModuleType) -> tuple[set[str], set[str]]:
    """(names the docstring shows as calls or classes, names it shows as modules)."""
    doc = package.__doc__ or ""
    calls = set(re.findall(r":(?:func|class|meth):`~?(?:[\w.]+\.)?(\w+)`", doc))
    calls |= set(re.findall(r"`(?:[\w.]+\.)?(\w+)\(", doc))
    modules = set(re.findall(r":mod:`~?[\w.]*\.(\w+)`", doc))
    modules |= {m for m in re.findall(rf"`{re.escape(package.__name__)}\.(\w+)`", doc)}
    return calls, modules


@pytest.mark.parametrize("name", PACKAGES)
def test_names_the_docs_show_as_calls_are_callable_and_as_modules_are_modules(name):
    package = importlib.import_module(name)
    calls, modules = _documented(package)
    exported = set(package.__all__)
    for export in sorted(calls & exported):
        value = getattr(package, export)
        assert callable(value) and not isinstance(value, types.ModuleType), \
            f"{name}.{export}: the docstring shows a call, the attribute is {value!r}"
    for export in sorted(modules & exported):
        assert isinstance(getattr(package, export), types.ModuleType), \
            f"{name}.{export}: the docstring shows a module, the attribute is " \
            f"{getattr(package, export)!r}"


def _public_modules() -> list[str]:
    found = []
    for info in pkgutil.walk_packages(cudalab.__path__, "cudalab."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts[1:]):
            continue  # private modules (lesson workers run as scripts) export nothing
        found.append(info.name)
    return found


@pytest.mark.parametrize("name", _public_modules())
def test_every_public_module_exports_only_what_it_has(name):
    module = importlib.import_module(name)
    for export in getattr(module, "__all__", ()):
        assert hasattr(module, export), f"{name}.__all__ names {export!r}, which it lacks"
