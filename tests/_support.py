"""Shared test vocabulary: the dtypes cudalab supports and how to name them.

Importable from any test module (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)

# Every dtype a DeviceArray can hold, in cudalab's own order.
DTYPES = [
    np.dtype(np.bool_),
    np.dtype(np.int8),
    np.dtype(np.uint8),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.float16),
    BF16,
    np.dtype(np.float32),
    np.dtype(np.float64),
]
DTYPE_IDS = [d.name for d in DTYPES]


def is_float(dtype) -> bool:
    """float16/32/64 and bfloat16 (whose NumPy kind is 'V', not 'f')."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BF16


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_plugin_example() -> str:
    """The README's python example that uses the gpu_benchmark fixture."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    [block] = [b for b in blocks if "gpu_benchmark" in b]
    return block


# ---- reductions and softmax (added with softmax; fold into the shared set) ----

FLOAT_DTYPES = [d for d in DTYPES if is_float(d)]
FLOAT_IDS = [d.name for d in FLOAT_DTYPES]


def arg_error(func: str, param: str) -> str:
    """Regex for the start of an argument error: ``<func>() argument '<param>': ``."""
    return rf"^{re.escape(func)}\(\) argument '{re.escape(param)}': "
