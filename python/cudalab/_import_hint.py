"""What to do when the extension cannot load (used by cudalab/__init__.py).

cudalab._core links cuBLAS and cuBLASLt dynamically (cudart is linked in). It
looks for them where the build found them, then in NVIDIA's pip wheel next to
cudalab (the `cuda` extra), then wherever the loader looks (LD_LIBRARY_PATH).
A machine with neither the CUDA 13 toolkit nor the wheel gets the loader's
raw "libcublas.so.13: cannot open shared object file"; this says what to
install instead. Nothing here imports the extension.
"""

from __future__ import annotations

import re

_MISSING_LIBRARY = re.compile(r"(lib(?:cublasLt|cublas)\.so(?:\.\d+)*): cannot open shared object")


def import_hint(error: ImportError) -> str | None:
    """The advice for an ImportError of cudalab._core, or None if there is none."""
    found = _MISSING_LIBRARY.search(str(error))
    if found is None:
        return None
    return (f"cudalab's extension could not load {found.group(1)} (cuBLAS). Install "
            "NVIDIA's wheel with `pip install 'cudalab[cuda]'` (or `pip install "
            "nvidia-cublas`), or the CUDA 13 toolkit, or put the directory holding "
            "it on LD_LIBRARY_PATH.")
