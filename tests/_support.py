"""Shared test vocabulary and helpers: one copy for every test module.

Importable from any test module (pytest puts this folder on sys.path). Blocks:

* dtypes: ``DTYPES`` (every dtype a DeviceArray holds), ``FLOAT_DTYPES``,
  ``INT_DTYPES``, ids for parametrize, ``is_float`` / ``is_int``;
* random data: ``random_array`` (any dtype, never zeros by default);
* strided inputs: ``layouts`` / ``View`` (contiguous, offset, stepped,
  negative-stride, transposed views of one logical shape), ``strided_views``
  and ``device_and_host`` (the same values as a device view and a host view),
  ``view_recipes`` (a hypothesis strategy of random views);
* comparisons: ``tolerance(dtype)``, ``rel_err``, ``assert_close``,
  ``assert_bit_equal``; references (``widen``, ``erf``, ``gelu_reference``,
  ``philox4x32_10`` with ``PHILOX_KAT``);
* argument errors: ``arg_error`` (regex) and ``assert_arg_error`` (context
  manager) for the ``"<func>() argument '<param>': ..."`` messages;
* skips: ``HAS_GPU``, ``no_gpu_only``, ``torch_cuda`` / ``cupy_device`` /
  ``numba_cuda`` / ``jax_gpus`` (skip where the library or its GPU is missing);
* processes and files: ``load_module``, ``run_cli``, ``run_in_threads``,
  ``fake_measurement``, the python examples of README.md and docs/*.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest

import cudalab

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
DOCS = README.parent / "docs"


def readme_plugin_example() -> str:
    """The README's python example that uses the gpu_benchmark fixture."""
    [block] = [b for b in readme_python_blocks() if "gpu_benchmark" in b]
    return block


# ---- the CUDA driver (first-use tests) ------------------------------------------


def driver_library_loadable() -> bool:
    """Whether the NVIDIA driver's library loads in this process (Linux or Windows)."""
    import ctypes

    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


# ===================================================== dtype groups =========

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BOOL = np.dtype(np.bool_)
I8, U8, I32, I64 = (np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64))

# The float dtypes, widest first (the order tests report them in does not matter).
FLOAT_DTYPES = [F64, F32, F16, BF16]
# The integer dtypes; bool is neither an integer nor a float here.
INT_DTYPES = [I8, U8, I32, I64]
FLOAT_IDS = [d.name for d in FLOAT_DTYPES]
INT_IDS = [d.name for d in INT_DTYPES]


def dtype_id(dtype) -> str:
    """dtype_id(dtype) -> str

    The dtype's name, for ``pytest.mark.parametrize(..., ids=dtype_id)``.
    """
    return np.dtype(dtype).name


def is_int(dtype) -> bool:
    """Signed or unsigned integer (not bool)."""
    return np.dtype(dtype).kind in "iu"


# ===================================================== random arrays ========

# Default magnitude bound of random integers: int64 values stay exactly
# representable in float64, so float64 references of integer data are exact.
INT_LIMIT = 2**40

# Random floats closer to zero than this are moved away from it (see
# random_array): division, log and relative errors stay well conditioned.
_NEAR_ZERO = 1e-3


def random_array(rng: np.random.Generator, shape, dtype, *, low=None, high=None,
                 nonzero: bool = True) -> np.ndarray:
    """random_array(rng, shape, dtype, *, low=None, high=None, nonzero=True) -> ndarray

    Random C-contiguous host data of any cudalab dtype.

    Parameters
    ----------
    rng : numpy.random.Generator
        The source of randomness (the ``rng`` fixture: seeded per test).
    shape : int or tuple of int
        Shape of the result; ``()`` gives a 0-d array.
    dtype : dtype-like
        Any dtype of ``DTYPES`` (bfloat16 through ``BF16`` or ``"bfloat16"``).
    low, high : number, optional
        Half-open range ``[low, high)``. Integers: each defaults to the dtype's
        limit clipped to +-``INT_LIMIT``. Floats: with both, uniform in the
        range; with one, standard normal values folded to its side
        (``low + |N|`` or ``high - |N|``, e.g. ``low=1`` for log and sqrt);
        with neither, standard normal. bool ignores them.
    nonzero : bool
        No element is 0 (a kernel that writes nothing, or writes zeros, must
        not pass): integer zeros become 1 (or -1), floats nearer to zero than
        1e-3 (or a thousandth of the range) move to the middle of the wider
        side of zero. bool is a random mix of False and True, never all False.

    Returns
    -------
    numpy.ndarray
        C-contiguous, of `dtype` and `shape`.

    Raises
    ------
    ValueError
        An empty range, or one in which `nonzero` cannot hold (only zero, or
        zero after rounding).
    """
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        out = np.asarray(rng.integers(0, 2, size=shape)).astype(np.bool_)
        if nonzero and out.size and not out.any():
            out.reshape(-1)[0] = True
        return out
    if is_int(dtype):
        values = _random_ints(rng, shape, dtype, low, high, nonzero)
    else:
        values = _random_floats(rng, shape, low, high, nonzero)
    # Fresh draws are C-ordered and astype keeps that (np.ascontiguousarray
    # would turn a 0-d result into 1-d).
    out = np.asarray(values).astype(dtype)
    if nonzero and np.any(out == 0):
        raise ValueError(f"random_array: [{low}, {high}) rounds to 0 in {dtype.name}")
    return out


def _random_ints(rng, shape, dtype, low, high, nonzero) -> np.ndarray:
    info = np.iinfo(dtype)
    low = max(int(info.min), -INT_LIMIT) if low is None else int(low)
    high = min(int(info.max), INT_LIMIT) + 1 if high is None else int(high)
    if not int(info.min) <= low < high <= int(info.max) + 1:
        raise ValueError(f"random_array: [{low}, {high}) is empty or outside {dtype.name}")
    values = rng.integers(low, high, size=shape, dtype=np.int64)
    if nonzero and low <= 0 < high:
        if high > 1:
            values[values == 0] = 1
        elif low < 0:
            values[values == 0] = -1
        else:
            raise ValueError("random_array: [0, 1) holds no nonzero integer")
    return values


def _random_floats(rng, shape, low, high, nonzero) -> np.ndarray:
    if low is None or high is None:
        values = rng.standard_normal(size=shape)
        if low is not None:
            values = float(low) + np.abs(values)
        elif high is not None:
            values = float(high) - np.abs(values)
        if nonzero:
            # +-0.5 stays on the values' side of zero (>= low, <= high) when they reach it.
            near = np.abs(values) < _NEAR_ZERO
            if low is None and high is None:
                values[near] = np.copysign(0.5, values[near])
            else:
                values[near] = 0.5 if low is not None else -0.5
        return values
    low, high = float(low), float(high)
    if not low < high:
        raise ValueError(f"random_array: [{low}, {high}) is empty")
    values = rng.uniform(low, high, size=shape)
    near = min(_NEAR_ZERO, (high - low) * 1e-3)
    if nonzero and low < near and high > -near:
        # The middle of the wider side of zero: inside the range, far from 0.
        away = high / 2 if high >= -low else low / 2
        values[np.abs(values) < near] = away
    return values


# ===================================================== strided views ========


@dataclass(frozen=True)
class View:
    """A recipe for a view: ``root[key].transpose(perm)`` of a root array.

    The same recipe applied to a host root and to the DeviceArray holding the
    same values gives two views that must compare equal. A DeviceArray made by
    ``cudalab.asarray`` of a non-contiguous host array is C-contiguous, so
    strided device inputs have to be views of a device root like these.
    Recipes with `negative` steps give negative strides on both sides (a
    DeviceArray slices with any step, as NumPy does).

    Attributes
    ----------
    name : str
        What kind of layout it is ("transposed", "negative", ...).
    root_shape : tuple of int
        Shape of the root array to allocate.
    key : tuple of slice
        Basic-slicing key applied to the root.
    perm : tuple of int
        Axis permutation applied after slicing.
    """

    name: str
    root_shape: tuple
    key: tuple
    perm: tuple

    def __call__(self, root):
        """The view of `root` (a NumPy array or a DeviceArray)."""
        # Whole-axis keys are skipped: indexing a 0-d NumPy array with () gives a scalar.
        view = root if all(k == slice(None) for k in self.key) else root[self.key]
        if self.perm != tuple(range(len(self.perm))):
            view = view.transpose(self.perm)
        return view

    @property
    def negative(self) -> bool:
        """Whether a slice steps backwards (a negative stride)."""
        return any(k.step is not None and k.step < 0 for k in self.key)

    @property
    def shape(self) -> tuple:
        """The view's shape (computed on a zero-stride dummy, no allocation)."""
        return self(np.broadcast_to(np.empty((), np.int8), self.root_shape)).shape


def _view(name, shape, perm, extent, key) -> View:
    """A View of `shape`: root axis perm[i] holds extent(shape[i]) elements."""
    root = [0] * len(shape)
    for i, axis in enumerate(perm):
        root[axis] = extent(shape[i])
    return View(name, tuple(root), tuple(key(n) for n in root), tuple(perm))


def layouts(shape, *, negative: bool = False) -> list[View]:
    """layouts(shape, *, negative=False) -> list[View]

    Views that all have logical shape `shape`, one per memory layout a kernel
    must handle: "contiguous"; "offset" (inner axis starts one element in: a
    misaligned start, rows not dense); "stepped" (every axis step 2, offset 1);
    "transposed" (all axes reversed, F-order strides); from 3 axes on,
    "rotated" (axes rolled); with ``negative=True`` also "negative" (every
    axis reversed), "negative_stepped" (step -2) and "transposed_negative"
    (transposed and step -2).

    Parameters
    ----------
    shape : tuple of int
        Logical shape of every view; extents of 0 and 1 are allowed.
    negative : bool
        Include the layouts with negative strides.

    Returns
    -------
    list of View
        Just "contiguous" for a 0-d shape; no transposes for 1-D.
    """
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(map(int, shape))
    ndim = len(shape)
    ident, rev = tuple(range(ndim)), tuple(reversed(range(ndim)))
    views = [_view("contiguous", shape, ident, lambda n: n, lambda n: slice(None))]
    if ndim == 0:
        return views
    # Only the innermost axis is offset (3 spare elements); the others stay whole.
    offset_key = (slice(None),) * (ndim - 1) + (slice(1, 1 + shape[-1]),)
    views.append(View("offset", shape[:-1] + (shape[-1] + 3,), offset_key, ident))
    views.append(_view("stepped", shape, ident, lambda n: 2 * n + 1, lambda n: slice(1, None, 2)))
    views.append(_view("negative", shape, ident, lambda n: n, lambda n: slice(None, None, -1)))
    views.append(_view("negative_stepped", shape, ident, lambda n: 2 * n + 1,
                       lambda n: slice(-2, None, -2)))
    if ndim >= 2:
        views.append(_view("transposed", shape, rev, lambda n: n, lambda n: slice(None)))
        views.append(_view("transposed_negative", shape, rev, lambda n: 2 * n + 1,
                           lambda n: slice(-2, None, -2)))
    if ndim >= 3:
        rolled = (ndim - 1,) + tuple(range(ndim - 1))
        views.append(_view("rotated", shape, rolled, lambda n: n, lambda n: slice(None)))
    return [v for v in views if negative or not v.negative]


LAYOUT_NAMES = [v.name for v in layouts((2, 3, 4), negative=True)]


class StridedView(NamedTuple):
    """One layout of the same values on the device and on the host."""

    name: str
    device: Any
    host: np.ndarray


def strided_views(rng: np.random.Generator, shape, dtype, *, names=None, negative: bool = False,
                  to_device=None, **random_kw) -> list[StridedView]:
    """strided_views(rng, shape, dtype, *, names=None, negative=False, to_device=None, **random_kw)

    Every layout of `layouts(shape)` as a (device view, host view) pair.

    Each layout gets its own random root (``random_array(rng, root_shape,
    dtype, **random_kw)``), uploaded whole; the device view is then taken
    of the device root, so it really has the layout's strides.

    Parameters
    ----------
    rng : numpy.random.Generator
    shape : tuple of int
        Logical shape of every view.
    dtype : dtype-like
    names : iterable of str, optional
        Only these layouts (see ``LAYOUT_NAMES``; a named negative one is
        made too). Default: all of them, as `negative` says.
    negative : bool
        Include the negative-stride layouts. Off by default (the layouts
        existing tests were written for); tests of reversed views opt in.
    to_device : callable, optional
        Host array -> device array; default ``cudalab.asarray``.
    **random_kw
        ``low``, ``high``, ``nonzero`` for `random_array`.

    Returns
    -------
    list of StridedView
        ``(name, device, host)`` triples, in `layouts` order.
    """
    to_device = cudalab.asarray if to_device is None else to_device
    views = layouts(shape, negative=negative or names is not None)
    if names is not None:
        wanted = set(names)
        unknown = wanted - {v.name for v in views}
        if unknown:
            raise ValueError(f"strided_views: no layout {sorted(unknown)} for shape {shape}")
        views = [v for v in views if v.name in wanted]
    out = []
    for view in views:
        root = random_array(rng, view.root_shape, dtype, **random_kw)
        out.append(StridedView(view.name, view(to_device(root)), view(root)))
    return out


def device_and_host(rng: np.random.Generator, shape, dtype, *, layout: str = "contiguous",
                    to_device=None, **random_kw):
    """device_and_host(rng, shape, dtype, *, layout="contiguous", to_device=None, **random_kw)

    One random array of `shape` as ``(device, host)``, in one of `layouts`.

    Returns
    -------
    tuple
        ``(device_view, host_view)`` holding the same values.
    """
    [view] = strided_views(rng, shape, dtype, names=[layout], to_device=to_device, **random_kw)
    return view.device, view.host


def view_recipes(*, max_ndim: int = 4, max_extent: int = 9, max_step: int = 3,
                 negative: bool = False):
    """view_recipes(*, max_ndim=4, max_extent=9, max_step=3, negative=False) -> strategy

    A hypothesis strategy drawing a random `View`: a root of rank 1..max_ndim
    and extents 1..max_extent, a slice per axis (any start, step 1..max_step,
    with ``negative=True`` backwards steps too) and an axis
    permutation. The view is never empty.
    """
    from hypothesis import strategies as st

    @st.composite
    def recipe(draw):
        ndim = draw(st.integers(1, max_ndim))
        root = tuple(draw(st.integers(1, max_extent)) for _ in range(ndim))
        key = []
        for n in root:
            step = draw(st.integers(1, max_step))
            if negative and draw(st.booleans()):
                step = -step
            key.append(slice(draw(st.integers(0, n - 1)), None, step))
        perm = tuple(draw(st.permutations(range(ndim))))
        return View("random", root, tuple(key), perm)

    return recipe()


# ===================================================== comparisons ==========

# Largest relative error ||got - want|| / ||want|| per result dtype: a few
# roundings of the dtype (float32 ~6e-8, float16 ~5e-4, bfloat16 ~4e-3 each)
# over sums of up to millions of terms. Integers and bool are exact (0).
_TOLERANCE = {F64: 1e-12, F32: 1e-5, F16: 1e-2, BF16: 1e-2}


def tolerance(dtype) -> float:
    """tolerance(dtype) -> float

    The largest relative L2 error (`rel_err`) accepted for a result of
    `dtype`: float64 1e-12, float32 1e-5, float16 and bfloat16 1e-2; 0.0
    (exact) for integers and bool.
    """
    dtype = np.dtype(dtype)
    return _TOLERANCE.get(dtype, 0.0) if is_float(dtype) else 0.0


def to_host(x) -> np.ndarray:
    """to_host(x) -> ndarray

    `x` as a NumPy array: a DeviceArray through ``.get()`` (which must return
    an ndarray), anything else through ``np.asarray``.
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, cudalab.DeviceArray):
        host = x.get()
        assert isinstance(host, np.ndarray), type(host)
        return host
    return np.asarray(x)


def widen(x) -> np.ndarray:
    """widen(x) -> ndarray

    A lossless wide copy for references: float64 for floats (bfloat16 too),
    int64 for integers and bool.
    """
    x = to_host(x)
    return x.astype(np.float64 if is_float(x.dtype) else np.int64)


def rel_err(got, want) -> float:
    """rel_err(got, want) -> float

    ``||got - want|| / ||want||`` over all elements, in float64. Shapes must
    match. Where `want` is all zeros, the absolute ``||got - want||``.
    """
    got = np.asarray(to_host(got), dtype=np.float64)
    want = np.asarray(to_host(want), dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = float(np.linalg.norm((got - want).ravel()))
    denom = float(np.linalg.norm(want.ravel()))
    return diff / denom if denom > 0 else diff


def assert_close(got, want, dtype=None, *, tol=None) -> None:
    """assert_close(got, want, dtype=None, *, tol=None)

    `got` (DeviceArray or ndarray) equals the reference `want` within the
    tolerance of its dtype.

    Parameters
    ----------
    got : DeviceArray or array-like
        The result under test.
    want : array-like
        The reference, ideally computed in float64 / int64 (see `widen`).
    dtype : dtype-like, optional
        The dtype `got` must have; its `tolerance` applies. Default: `got`'s
        own dtype, unchecked.
    tol : float, optional
        Relative L2 bound instead of ``tolerance(dtype)``; 0 means exact.

    Notes
    -----
    Shapes must match. With a nonzero tolerance, NaN and infinities must be
    in the same places (with the same signs) and the relative L2 error of the
    finite rest must be below it. With tolerance 0 the values must be equal
    (compared as values: an int8 result may equal an int64 reference).
    """
    if isinstance(dtype, float):
        raise TypeError("assert_close: the third argument is a dtype; give a tolerance as tol=")
    got = to_host(got)
    want = to_host(want)
    if dtype is not None:
        assert got.dtype == np.dtype(dtype), (got.dtype, np.dtype(dtype))
    tol = tolerance(got.dtype) if tol is None else tol
    assert got.shape == want.shape, (got.shape, want.shape)
    if tol == 0:
        np.testing.assert_array_equal(got, want)
        return
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg="NaN positions differ")
    inf = np.isinf(w)
    np.testing.assert_array_equal(g[inf], w[inf], err_msg="infinities differ")
    finite = np.isfinite(w)
    err = rel_err(g[finite], w[finite])
    assert err < tol, f"relative error {err:.3g} >= {tol:g} ({got.dtype})"


def assert_bit_equal(got, expected) -> None:
    """assert_bit_equal(got, expected)

    Same dtype, shape and bytes (of C-ordered copies), so NaN payloads and
    -0.0 compare exactly. `got` may be a DeviceArray.
    """
    got = to_host(got)
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.tobytes(order="C") == expected.tobytes(order="C")


# ===================================================== references ===========


def erf(x) -> np.ndarray:
    """erf(x) -> ndarray: the error function in float64, element by element."""
    return np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x, dtype=np.float64))


def gelu_reference(x, approximate: str = "none") -> np.ndarray:
    """gelu_reference(x, approximate="none") -> ndarray

    GELU in float64: ``x * Phi(x)`` with the exact erf, or its tanh
    approximation with ``approximate="tanh"``.
    """
    x = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if approximate != "none":
        raise ValueError(f"gelu_reference: approximate={approximate!r}")
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key) -> tuple:
    """philox4x32_10(counter, key) -> tuple of 4 ints

    Philox4x32-10 (Salmon et al., SC'11) in pure Python, written from the
    definition: the reference for cudalab.random's device generator.
    `counter` is 4 and `key` 2 unsigned 32-bit words.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0 = (k0 + 0x9E3779B9) & _MASK32
            k1 = (k1 + 0xBB67AE85) & _MASK32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (
            ((p1 >> 32) ^ c1 ^ k0) & _MASK32,
            p1 & _MASK32,
            ((p0 >> 32) ^ c3 ^ k1) & _MASK32,
            p0 & _MASK32,
        )
    return (c0, c1, c2, c3)


# The published known-answer vectors (Random123's kat_vectors for philox4x32_10):
# (counter, key, expected output).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (_MASK32, _MASK32, _MASK32, _MASK32),
        (_MASK32, _MASK32),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


# ===================================================== argument errors ======


def arg_error(func: str, param: str) -> str:
    """arg_error(func, param) -> str

    A regex for the start of cudalab's argument errors,
    ``"<func>() argument '<param>': "`` (anchored at the start), for
    ``pytest.raises(..., match=arg_error(f, p) + "more regex")``.
    """
    return rf"^{re.escape(func)}\(\) argument '{re.escape(param)}': "


@contextlib.contextmanager
def assert_arg_error(exc_type, func: str, param: str, match: str | None = None):
    """assert_arg_error(exc_type, func, param, match=None)

    Context manager: the block must raise `exc_type` (or a subclass) whose
    message starts with ``"<func>() argument '<param>': "``.

    Parameters
    ----------
    exc_type : type of Exception
        Usually TypeError or ValueError.
    func, param : str
        The function and parameter the message must name.
    match : str, optional
        A regex that must also be found (``re.search``) in the rest of the
        message after the prefix.

    Yields
    ------
    pytest.ExceptionInfo
        For further checks after the block.
    """
    __tracebackhide__ = True
    with pytest.raises(exc_type) as info:
        yield info
    message = str(info.value)
    prefix = f"{func}() argument '{param}': "
    assert message.startswith(prefix), f"expected the prefix {prefix!r}, got {message!r}"
    if match is not None:
        rest = message[len(prefix):]
        assert re.search(match, rest), f"{match!r} not found in {rest!r}"


# ===================================================== skips and requirements


HAS_GPU = cudalab.is_available()

# For CPU-tier tests of what happens without a device (NoDeviceError, ...).
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="checks behaviour without a GPU")


def torch_cuda():
    """torch_cuda() -> module: torch, or skip where it is missing or has no CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def cupy_device():
    """cupy_device() -> module: cupy, or skip where it is missing or sees no device."""
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # any CuPy/driver failure means: no usable device
        pytest.skip("cupy without a usable device")
    return cupy


def numba_cuda():
    """numba_cuda() -> module: numba.cuda, or skip where it is missing or sees no GPU."""
    cuda = pytest.importorskip("numba.cuda")
    if not cuda.is_available():
        pytest.skip("numba.cuda sees no GPU")
    return cuda


def jax_gpus():
    """jax_gpus() -> (jax, list of devices): or skip where JAX has no GPU backend.

    Sets XLA_PYTHON_CLIENT_PREALLOCATE=false first (unless set), so JAX does
    not take most of the GPU's memory at start.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")
    return jax, gpus


# ===================================================== processes, modules ===

REPO_ROOT = Path(__file__).resolve().parent.parent


def load_module(path, name: str | None = None):
    """load_module(path, name=None) -> module

    Import a Python file by path (benchmark scripts, other test modules), so
    it works under any pytest import mode. `name` defaults to the file's stem.
    """
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or f"_loaded_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """run_cli(*args, timeout=600) -> CompletedProcess

    ``python -m cudalab *args`` in a subprocess, output captured as text.
    """
    return subprocess.run([sys.executable, "-m", "cudalab", *args], capture_output=True,
                          text=True, timeout=timeout)


def run_in_threads(target, count: int) -> None:
    """run_in_threads(target, count)

    Call ``target(i)`` for i in range(count), each in its own thread, all
    started before any is joined. If any raised, an AssertionError listing
    them all is raised from the first one (whose traceback is shown).
    """
    errors: list[BaseException] = []

    def run(i):
        try:
            target(i)
        except BaseException as exc:  # reported in the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(f"{len(errors)} of {count} threads failed: {errors!r}") from errors[0]


def fake_measurement(label: str = "op", *, median: float = 1e-3, times=None, **fields):
    """fake_measurement(label="op", *, median=1e-3, times=None, **fields) -> Measurement

    A ``cudalab.bench.Measurement`` without a GPU: `times` as given, or five
    times spread around `median` (whose median is exactly `median`).
    """
    from cudalab.bench import Measurement

    if times is None:
        times = [median * f for f in (0.97, 0.99, 1.0, 1.01, 1.03)]
    return Measurement(label=label, times=tuple(times), **fields)


# ===================================================== README ===============


def readme_python_blocks() -> list[str]:
    """readme_python_blocks() -> list[str]: the README's ```python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def doc_python_blocks(page: str) -> list[str]:
    """doc_python_blocks(page) -> list[str]: the ```python blocks of docs/<page>.md, in order."""
    return re.findall(r"```python\n(.*?)```", (DOCS / f"{page}.md").read_text(), flags=re.DOTALL)


# ===================================================== more helpers =========
# New general helpers go below, each topic in its own block.


# ---- element-wise results: dtype, NaN placement, then values ---------------


def check_result(got, ref, dtype=None) -> None:
    """`got` (a DeviceArray) against the NumPy result `ref`.

    Floating results: relative L2 error against ref in float64 (`tolerance`),
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
        assert err < tolerance(dtype), f"relative error {err:.3g} for {dtype}"
    else:
        np.testing.assert_array_equal(host, np.asarray(ref).astype(dtype))


# ===================================================== hand-picked views ====

# (root shape, name, view): each view takes the same basic indexing on a host
# root and on the DeviceArray holding it. Odd extents throughout.
_ASSORTED_VIEWS = [
    ((64, 131, 9), "stepped_middle", lambda a: a[:, 3:100:2, :]),
    ((64, 131, 9), "offset_outer_inner", lambda a: a[1:, :, 1:]),
    ((64, 131, 9), "transposed_102", lambda a: a.transpose(1, 0, 2)),
    ((64, 131, 9), "transposed_210", lambda a: a.transpose(2, 1, 0)),
    ((64, 131, 9), "indexed", lambda a: a[::3, 5, ::2]),
    ((257, 1031), "transposed", lambda a: a.T),
    ((257, 1031), "rows_misaligned", lambda a: a[:, 1:]),
    ((257, 1031), "offset_stepped", lambda a: a[3:, 5:1000:3]),
    ((257, 1031), "transposed_stepped", lambda a: a.T[::2, 1:]),
    ((100003,), "head_misaligned", lambda a: a[1:]),
    ((100003,), "stepped_7", lambda a: a[3::7]),
]


def assorted_views(make, *, to_device=None) -> list[StridedView]:
    """assorted_views(make, *, to_device=None) -> list[StridedView]

    Hand-picked views for kernels that work along an axis (reductions,
    softmax), of three roots: a (64, 131, 9) root with a stepped middle axis,
    offset outer and inner axes, two transposes and an integer index that
    drops an axis; a (257, 1031) root transposed, with every row misaligned,
    offset and stepped, transposed and stepped; a (100003,) root with a
    misaligned head and with a step of 7.

    Parameters
    ----------
    make : callable
        ``make(shape) -> ndarray``: the host data of a root, e.g.
        ``lambda shape: random_array(rng, shape, dtype)``. Called once per
        root, in the order above.
    to_device : callable, optional
        Host array -> device array; default ``cudalab.asarray``.

    Returns
    -------
    list of StridedView
        ``(name, device, host)`` triples; each device view is a view of the
        uploaded root, so it has the host view's strides.
    """
    to_device = cudalab.asarray if to_device is None else to_device
    roots = {}
    out = []
    for shape, name, view in _ASSORTED_VIEWS:
        if shape not in roots:
            host = make(shape)
            roots[shape] = (to_device(host), host)
        device, host = roots[shape]
        out.append(StridedView(name, view(device), view(host)))
    return out


# ===================================================== measurements on a named device


def fake_gpu_measurement(label: str, median: float, **fields):
    """fake_gpu_measurement(label, median, **fields) -> Measurement

    `fake_measurement` with `median` given by position and the device named
    "Fake GPU" unless `fields` names one: for results files and baselines,
    which record the device and compare it.
    """
    fields.setdefault("device", "Fake GPU")
    return fake_measurement(label, median=median, **fields)


# ===================================================== notebooks ===

# Roots of absolute paths that must not appear in a committed notebook.
ABSOLUTE_ROOTS = ("/home/", "/work/", "/tmp/", "/usr/", "/opt/", "/root/", "/var/", "/mnt/",
                  "/Users/", "/private/", "/scratch/", "/srv/", "/etc/", "/proc/", "/data/")


def notebook_texts(value):
    """notebook_texts(value) -> iterator of str

    Every string inside a notebook's JSON `value`, image data left out
    (base64 is not text; SVG is).
    """
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from notebook_texts(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not (isinstance(k, str) and k.startswith("image/") and k != "image/svg+xml"):
                yield from notebook_texts(v)


def absolute_paths(nb) -> list[str]:
    """absolute_paths(nb) -> list of str: the texts of `nb` that hold an absolute path."""
    return [t for t in notebook_texts(nb) if any(root in t for root in ABSOLUTE_ROOTS)]


# ===================================================== errors relative to the largest value


def max_rel_err(got, want) -> float:
    """max_rel_err(got, want) -> float

    ``max |got - want| / max |want|`` in float64: the error of a model's
    logits "relative to the largest |logit|" (one bad element counts in
    full, unlike `rel_err`'s L2 norm). Where `want` is all zeros, the
    absolute ``max |got - want|``.
    """
    got = np.asarray(to_host(got), dtype=np.float64)
    want = np.asarray(to_host(want), dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = float(np.abs(got - want).max(initial=0.0))
    scale = float(np.abs(want).max(initial=0.0))
    return diff / scale if scale > 0 else diff


# ---- sharding the suite over several calls (CUDALAB_TEST_SHARD=k/n) ---------------------------


def parse_shard(spec: str) -> tuple[int, int]:
    """'k/n' -> (k, n) with 1 <= k <= n; ValueError otherwise."""
    try:
        k, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"CUDALAB_TEST_SHARD must look like 'k/n', got {spec!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"CUDALAB_TEST_SHARD {spec!r}: need 1 <= k <= n")
    return k, n


def shard_of_files(counts: dict[str, int], n: int) -> dict[str, int]:
    """Whole test files to n shards (1..n) of about equal test counts: the largest file
    first, each to the shard with the fewest tests so far (ties: the lowest shard, then file
    name), so every machine computes the same split from the same collection."""
    totals = [0] * n
    shard = {}
    for name in sorted(counts, key=lambda f: (-counts[f], f)):
        k = min(range(n), key=lambda i: (totals[i], i))
        shard[name] = k + 1
        totals[k] += counts[name]
    return shard
