"""Finding and loading NCCL at run time.

cudalab is built and imported without NCCL; the C layer opens the library
with dlopen the first time something needs it. The candidates, in order:

1. ``CUDALAB_NCCL_LIBRARY``: a path to ``libnccl.so.2`` (or any NCCL build);
2. the ``nvidia-nccl-cu13`` wheel (``pip install "cudalab[distributed]"``):
   ``site-packages/nvidia/nccl/lib/libnccl.so.2``, found through the import
   system's search path for the ``nvidia`` namespace without importing it
   (or torch, which ships its own copy);
3. the system's ``libnccl.so.2`` (the C layer tries it last, by name).

Once one has loaded, every later call returns it at once.
"""

from __future__ import annotations

import importlib.util
import os

from .. import _core
from .._core import DistributedError

__all__ = ["ENV_VAR", "INSTALL_HINT", "candidates", "is_available", "load", "nccl_library",
           "nccl_version"]

ENV_VAR = "CUDALAB_NCCL_LIBRARY"
INSTALL_HINT = ('install NCCL with `pip install "cudalab[distributed]"` (the nvidia-nccl-cu13 '
                f"wheel), or set {ENV_VAR} to the path of a libnccl.so.2")

# Where NCCL wheels put the library, relative to a directory of the `nvidia` namespace.
_WHEEL_PATHS = (("nccl", "lib", "libnccl.so.2"), ("cu13", "lib", "libnccl.so.2"))


def candidates() -> list[str]:
    """candidates() -> list[str]

    The paths :func:`load` tries before the system's ``libnccl.so.2``:
    ``$CUDALAB_NCCL_LIBRARY`` when set, then the NCCL wheel's library when
    installed.
    """
    paths: list[str] = []
    explicit = os.environ.get(ENV_VAR, "").strip()
    if explicit:
        paths.append(explicit)
    paths.extend(_wheel_libraries())
    return paths


def _wheel_libraries() -> list[str]:
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for base in spec.submodule_search_locations:
        for parts in _WHEEL_PATHS:
            path = os.path.join(base, *parts)
            if os.path.isfile(path) and path not in found:
                found.append(path)
    return found


def load() -> str:
    """load() -> str

    Load NCCL (once per process) and return the path that loaded.

    Raises
    ------
    DistributedError
        No candidate loaded: the message lists what was tried and what to
        install.
    """
    loaded = _core._nccl_library()
    if loaded is not None:
        return loaded
    try:
        return _core._nccl_load(candidates())
    except DistributedError as exc:
        raise DistributedError(f"{exc}\nTo use cudalab.distributed, {INSTALL_HINT}.") from None


def is_available() -> bool:
    """is_available() -> bool

    Whether NCCL can be loaded in this process (it is loaded if so). Never
    raises; says nothing about GPUs (see ``cudalab.device_count()``).
    """
    try:
        load()
    except Exception:  # is_available() must never raise: any failure means "no"
        return False
    return True


def nccl_library() -> str:
    """nccl_library() -> str

    The path of the NCCL library in use, loading it if needed.

    Raises
    ------
    DistributedError
        NCCL cannot be loaded (see :func:`load`).
    """
    return load()


def nccl_version() -> tuple[int, int, int]:
    """nccl_version() -> tuple[int, int, int]

    NCCL's version as ``(major, minor, patch)``, e.g. ``(2, 28, 9)``,
    loading the library if needed.

    Raises
    ------
    DistributedError
        NCCL cannot be loaded (see :func:`load`).
    """
    load()
    return decode_version(_core._nccl_version())


def decode_version(code: int) -> tuple[int, int, int]:
    """NCCL's version code as a tuple: 22809 is (2, 28, 9); before 2.9, 2708 is (2, 7, 8)."""
    if code >= 10000:
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100
