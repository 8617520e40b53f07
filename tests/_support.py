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


# ---- element-wise helpers: argument-error patterns, random data, checks ----

RESULT_TOL = {  # relative L2 error allowed for a floating result
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float16): 1e-2,
    BF16: 1e-2,
}


def arg_error(func: str, param: str) -> str:
    """Regex for the "<func>() argument '<param>'" prefix of argument errors."""
    return rf"{re.escape(func)}\(\) argument '{re.escape(param)}'"


def random_array(rng, shape, dtype, positive=False, nonzero=True) -> np.ndarray:
    """Random host data of `dtype`: floats ~N(0,1) (|x| + 0.1 with positive),
    integers over a range that exercises wrapping, never 0 when nonzero."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.integers(0, 2, size=shape).astype(np.bool_))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo = 1 if positive or dtype.kind == "u" else max(int(info.min), -(2**40))
        hi = min(int(info.max), 2**40)
        x = rng.integers(lo, hi, size=shape, dtype=np.int64, endpoint=True)
        if nonzero:
            x[x == 0] = 1
        return np.asarray(x.astype(dtype))
    x = rng.standard_normal(size=shape)
    if positive:
        x = np.abs(x) + 0.1
    return np.asarray(x.astype(dtype))


def check_result(got, ref, dtype=None) -> None:
    """`got` (a DeviceArray) against the NumPy result `ref`.

    Floating results: relative L2 error against ref in float64 (RESULT_TOL),
    NaNs in the same places; integers and bool: exact. `dtype` (default
    ref's) is the dtype `got` must have."""
    dtype = np.dtype(ref.dtype if dtype is None else dtype)
    assert got.dtype == dtype, (got.dtype, dtype)
    host = got.get()
    assert host.shape == np.shape(ref), (host.shape, np.shape(ref))
    if is_float(dtype):
        ref64 = np.asarray(ref).astype(np.float64)
        h64 = host.astype(np.float64)
        nan = np.isnan(ref64)
        assert np.array_equal(np.isnan(h64), nan)
        ref64, h64 = ref64[~nan], h64[~nan]
        denom = np.linalg.norm(ref64)
        err = np.linalg.norm(h64 - ref64) / (denom if denom > 0 else 1.0)
        assert err < RESULT_TOL[dtype], f"relative error {err:.3g} for {dtype}"
    else:
        np.testing.assert_array_equal(host, np.asarray(ref).astype(dtype))
