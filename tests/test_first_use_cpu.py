"""CPU tier: what a new user meets first, on a machine with or without a GPU.

* The built module finds cuBLAS through its own RUNPATH, without
  LD_LIBRARY_PATH or the system linker cache.
* Without a driver every error says so, in the words `cudalab check` uses;
  a toolkit's stub libcuda is not mistaken for a driver.
* Errors name the public function the user called and are raised from its
  frame, not from a helper's; every "expected a DeviceArray" error shows the
  asarray() hint; CUDAGraph misuse raises CudalabError.
* The module documents what it offers; the license ships with the package;
  scripts/gpu_check.sh names missing prerequisites instead of failing in pip.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _support import HAS_GPU, assert_arg_error, driver_library_loadable, no_gpu_only

import cudalab
from cudalab import _core

ROOT = Path(__file__).resolve().parent.parent
NO_DRIVER_HERE = not HAS_GPU and not driver_library_loadable()
no_driver_only = pytest.mark.skipif(not NO_DRIVER_HERE, reason="needs a machine without a driver")


# ---- the module's RUNPATH ---------------------------------------------------


def _elf(path: Path) -> bytes | None:
    """The file's bytes when it is a little-endian ELF64 file, else None."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    return data


def _elf_runpath(data: bytes) -> list[str]:
    """DT_RUNPATH (or the older DT_RPATH) entries, from the section headers."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # name, type, flags, addr, offset, size, link, info, addralign, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = [s for s in sections if s[1] == 6]  # SHT_DYNAMIC
    if not dynamic:
        return []
    dyn = dynamic[0]
    strtab = sections[dyn[6]][4]  # sh_link: the .dynstr section
    found: dict[int, str] = {}
    for tag, value in struct.iter_unpack("<qQ", data[dyn[4] : dyn[4] + dyn[5]]):
        if tag in (15, 29):  # DT_RPATH, DT_RUNPATH
            end = data.index(b"\0", strtab + value)
            found[tag] = data[strtab + value : end].decode()
    text = found.get(29, found.get(15, ""))
    return [entry for entry in text.split(":") if entry]


def _elf_interpreter(data: bytes) -> str | None:
    """PT_INTERP of an executable: the dynamic loader's path."""
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    return None


def _module_elf() -> tuple[Path, bytes]:
    path = Path(_core.__file__)
    data = _elf(path)
    if data is None:
        pytest.skip(f"{path.name} is not an ELF64 shared object")
    return path, data


def test_runpath_names_the_directory_holding_cublas():
    path, data = _module_elf()
    entries = _elf_runpath(data)
    assert entries, f"{path.name} has no RUNPATH"
    dirs = [Path(e.replace("$ORIGIN", str(path.parent)).replace("${ORIGIN}", str(path.parent)))
            for e in entries]
    holding = [d for d in dirs if d.is_dir() and any(d.glob("libcublas.so*"))]
    assert holding, f"no RUNPATH entry of {path.name} holds libcublas: {entries}"


def test_runpath_covers_the_cublas_wheel_layout():
    """Installed next to NVIDIA's nvidia-cublas wheel, the module finds it there."""
    _, data = _module_elf()
    wheel_dirs = ("$ORIGIN/../nvidia/cublas/lib", "$ORIGIN/../nvidia/cu13/lib")
    assert any(e in wheel_dirs or e.startswith("$ORIGIN/../nvidia/cu") for e in _elf_runpath(data))


def test_cublas_loads_without_linker_cache_or_library_path():
    """The dynamic loader with its cache switched off still resolves every library."""
    path, _ = _module_elf()
    exe = _elf(Path(os.path.realpath(sys.executable)))
    loader = _elf_interpreter(exe) if exe is not None else None
    if loader is None or not os.access(loader, os.X_OK):
        pytest.skip("no dynamic loader to ask")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run([loader, "--inhibit-cache", "--list", str(path)],
                            capture_output=True, text=True, env=env)
    if "unrecognized option" in result.stderr:
        pytest.skip("this dynamic loader has no --inhibit-cache")
    assert result.returncode == 0, result.stderr
    assert "not found" not in result.stdout, result.stdout
    assert "libcublas" in result.stdout


# ---- no driver ------------------------------------------------------------------

NO_DRIVER = "no NVIDIA driver was found (libcuda.so.1 could not be loaded)"

NEEDS_GPU = {
    "zeros": lambda: cudalab.zeros((2, 3)),
    "asarray": lambda: cudalab.asarray(np.ones(3)),
    "synchronize": lambda: cudalab.synchronize(),
    "current_device": lambda: cudalab.current_device(),
    "memory_stats": lambda: cudalab.memory_stats(),
    "memory_summary": lambda: cudalab.memory_summary(),
    "get_device_properties": lambda: cudalab.get_device_properties(),
    "get_device_name": lambda: cudalab.get_device_name(0),
    "get_device_capability": lambda: cudalab.get_device_capability(),
    "device": lambda: cudalab.device(0).__enter__(),
    "Stream": lambda: cudalab.Stream(),
    "graph": lambda: cudalab.graph(cudalab.CUDAGraph()).__enter__(),
    "pinned_empty": lambda: cudalab.pinned_empty(3),
    "random.normal": lambda: cudalab.random.normal(3),
    "random.uniform": lambda: cudalab.random.uniform(3, seed=1),
}


@no_driver_only
@pytest.mark.parametrize("func", sorted(NEEDS_GPU))
def test_without_driver_errors_say_so(func):
    with pytest.raises(cudalab.NoDeviceError) as info:
        NEEDS_GPU[func]()
    message = str(info.value)
    assert message == f"{func}(): no CUDA device is available: {NO_DRIVER}"
    assert "insufficient" not in message


@no_driver_only
def test_without_driver_queries_agree():
    assert cudalab.is_available() is False
    assert cudalab.device_count() == 0
    assert cudalab.driver_version() == 0


@no_driver_only
def test_without_driver_check_gives_the_same_reason():
    env = {**os.environ, "PYTHONPATH": str(Path(cudalab.__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-m", "cudalab", "check"], capture_output=True,
                            text=True, env=env)
    assert result.returncode == 1
    assert f"no CUDA device is available: {NO_DRIVER}" in result.stderr


def _toolkit_stub() -> Path | None:
    """The CUDA toolkit's stub libcuda.so (links, never runs), if installed."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, roots):
        for sub in ("lib64/stubs", "lib/stubs", "targets/x86_64-linux/lib/stubs"):
            stub = Path(root) / sub / "libcuda.so"
            if stub.is_file():
                return stub
    return None


@no_driver_only
def test_toolkit_stub_is_not_taken_for_a_driver(tmp_path):
    stub = _toolkit_stub()
    if stub is None:
        pytest.skip("no CUDA toolkit stub library here")
    (tmp_path / "libcuda.so.1").symlink_to(stub)
    code = ("import cudalab\n"
            "assert not cudalab.is_available()\n"
            "try:\n    cudalab.zeros(3)\n"
            "except cudalab.NoDeviceError as e:\n    print(e)\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path),
           "PYTHONPATH": str(Path(cudalab.__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "zeros(): no CUDA device is available: no NVIDIA driver was found" in result.stdout
    assert "stub library" in result.stdout


# ---- errors name the public function, from its own frame -------------------------


def _last_frame(excinfo: pytest.ExceptionInfo) -> str:
    code = excinfo.traceback[-1].frame.code.raw
    return getattr(code, "co_qualname", code.co_name)


PUBLIC_ARG_ERRORS = [
    ("get_device_properties", lambda: cudalab.get_device_properties("0"), TypeError,
     "get_device_properties"),
    ("get_device_name", lambda: cudalab.get_device_name(-1), ValueError, "get_device_name"),
    ("get_device_capability", lambda: cudalab.get_device_capability(1.5), TypeError,
     "get_device_capability"),
    ("memory_summary", lambda: cudalab.memory_summary("x"), TypeError, "memory_summary"),
    ("device", lambda: cudalab.device("x"), TypeError, "device.__init__"),
    ("device", lambda: cudalab.device(-3), ValueError, "device.__init__"),
    ("graph", lambda: cudalab.graph(object()), TypeError, "graph.__init__"),
    ("stream", lambda: cudalab.stream(5), TypeError, "stream.__init__"),
    ("normal", lambda: cudalab.random.normal(3, seed=-1), ValueError, "normal"),
    ("uniform", lambda: cudalab.random.uniform(3, seed=1.5), TypeError, "uniform"),
    ("integers", lambda: cudalab.random.integers(3, 5, seed="x"), TypeError, "integers"),
]


@pytest.mark.parametrize(("func", "call", "exc", "frame"), PUBLIC_ARG_ERRORS,
                         ids=[f"{p[0]}-{i}" for i, p in enumerate(PUBLIC_ARG_ERRORS)])
def test_argument_errors_come_from_the_public_function(func, call, exc, frame):
    with pytest.raises(exc) as info:
        call()
    assert str(info.value).startswith(f"{func}() argument ")
    assert _last_frame(info) == frame


@no_gpu_only
@pytest.mark.parametrize(
    ("func", "frame"),
    [("get_device_properties", "get_device_properties"), ("get_device_name", "get_device_name"),
     ("get_device_capability", "get_device_capability"), ("memory_summary", "memory_summary"),
     ("device", "device.__enter__"), ("graph", "graph.__enter__"),
     ("random.normal", "normal"), ("random.uniform", "uniform")],
)
def test_no_device_errors_come_from_the_public_function(func, frame):
    with pytest.raises(cudalab.NoDeviceError) as info:
        NEEDS_GPU[func]()
    assert str(info.value).startswith(f"{func}(): no CUDA device is available: ")
    assert _last_frame(info) == frame


ARRAY_ARGS = {
    "asnumpy": lambda x: cudalab.asnumpy(x),
    "ascontiguousarray": lambda x: cudalab.ascontiguousarray(x),
    "empty_like": lambda x: cudalab.empty_like(x),
    "zeros_like": lambda x: cudalab.zeros_like(x),
    "ones_like": lambda x: cudalab.ones_like(x),
    "full_like": lambda x: cudalab.full_like(x, 2.0),
}


@pytest.mark.parametrize("func", sorted(ARRAY_ARGS))
@pytest.mark.parametrize("obj", [np.ones(3), [1.0, 2.0]], ids=["ndarray", "list"])
def test_expected_array_errors_give_the_asarray_hint(func, obj):
    hint = r"^expected a cudalab\.DeviceArray, got "
    with assert_arg_error(TypeError, func, "a", match=hint) as info:
        ARRAY_ARGS[func](obj)
    assert "cudalab.asarray()" in str(info.value)


def test_graph_misuse_raises_cudalab_error():
    g = cudalab.CUDAGraph()
    with pytest.raises(cudalab.CudalabError, match=r"^replay\(\): nothing captured yet"):
        g.replay()
    with pytest.raises(cudalab.CudalabError, match=r"^capture_end\(\): .*not capturing"):
        g.capture_end()


def test_parse_device_helper_checks_its_own_arguments():
    with assert_arg_error(TypeError, "_parse_device", "caller", match="^expected a str"):
        _core._parse_device(0, 5)
    assert _core._parse_device(None, "f", check_only=True) is None
    assert _core._parse_device(np.int32(2), "f", check_only=True) == 2
    with assert_arg_error(TypeError, "f", "device", match="^expected an int, got bool"):
        _core._parse_device(True, "f", check_only=True)
    with assert_arg_error(TypeError, "f", "device", match="^expected an int, got NoneType"):
        _core._exchange_device(None, "f")


# ---- documentation and packaging ----------------------------------------------------


def test_module_docstring_lists_every_public_name():
    doc = _core.__doc__
    public = [n for n in dir(_core) if not n.startswith("_")]
    missing = [n for n in public if n not in doc]
    assert not missing, f"cudalab._core.__doc__ does not mention {missing}"


def test_license_file_and_metadata():
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    assert "cudalab developers" in license_text
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_gpu_check_names_missing_prerequisites(tmp_path):
    """With no packages at all (python -S), the script stops before building."""
    pytest.importorskip("tomllib")  # the check reads pyproject.toml with it (Python 3.11+)
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    env = {**os.environ, "PYTHON": str(bare), "OUT": str(tmp_path / "logs")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "== build" not in result.stdout
    for name in ("scikit-build-core", "numpy", "pytest"):
        assert name in result.stderr
    assert "pip install" in result.stderr
