"""CPU tier: the float -> integer conversion rule (saturation), without a GPU.

* the NumPy reference (``_conversions.saturating_cast``) against values worked
  out by hand, and against NumPy's own astype where NumPy's result is defined;
* the device's conversion code (``cuda/dtype_convert.cuh``, ``__host__
  __device__``) compiled for the host with nvcc (skipped without the CUDA
  toolkit), for every float source and integer/bool target, against the
  reference bit for bit;
* the host's copy of the rule (``_core._float_to_int``, what ``full`` uses for a
  float fill_value) against the reference.

The GPU tier (test_conversions_gpu.py) checks the same reference against
astype, reductions and full() on the device.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from _conversions import (FLOAT_SOURCES, INT_TARGETS, boundary_values, conversion_inputs,
                          saturating_cast)
from cudalab import _core

ROOT = Path(__file__).resolve().parent.parent
NAN, INF = float("nan"), float("inf")

# (value, {target: expected}) worked out by hand from the rule.
BY_HAND = [
    (NAN, {"int8": 0, "uint8": 0, "int32": 0, "int64": 0, "bool": True}),
    (INF, {"int8": 127, "uint8": 255, "int32": 2**31 - 1, "int64": 2**63 - 1, "bool": True}),
    (-INF, {"int8": -128, "uint8": 0, "int32": -2**31, "int64": -2**63, "bool": True}),
    (-0.0, {"int8": 0, "uint8": 0, "int32": 0, "int64": 0, "bool": False}),
    (-0.5, {"int8": 0, "uint8": 0, "int32": 0, "int64": 0, "bool": True}),
    (0.5, {"int8": 0, "uint8": 0, "int32": 0, "int64": 0, "bool": True}),
    (-1.0, {"int8": -1, "uint8": 0, "int32": -1, "int64": -1, "bool": True}),
    (-1.5, {"int8": -1, "uint8": 0, "int32": -1, "int64": -1, "bool": True}),
    (127.9, {"int8": 127, "uint8": 127, "int32": 127, "int64": 127}),
    (128.0, {"int8": 127, "uint8": 128, "int32": 128, "int64": 128}),
    (-128.9, {"int8": -128, "uint8": 0, "int32": -128, "int64": -128}),
    (-129.0, {"int8": -128, "uint8": 0, "int32": -129, "int64": -129}),
    (255.9, {"int8": 127, "uint8": 255, "int32": 255, "int64": 255}),
    (256.0, {"int8": 127, "uint8": 255, "int32": 256, "int64": 256}),
    (300.7, {"int8": 127, "uint8": 255, "int32": 300, "int64": 300}),
    (2.0**31 - 1, {"int32": 2**31 - 1, "int64": 2**31 - 1}),
    (2.0**31, {"int32": 2**31 - 1, "int64": 2**31}),
    (-(2.0**31), {"int32": -2**31, "int64": -2**31}),
    (-(2.0**31) - 1, {"int32": -2**31, "int64": -2**31 - 1}),
    (2.0**63 - 1024, {"int64": 2**63 - 1024}),  # the largest float64 below 2^63
    (2.0**63, {"int64": 2**63 - 1}),
    (-(2.0**63), {"int64": -2**63}),
    (1e300, {"int8": 127, "uint8": 255, "int32": 2**31 - 1, "int64": 2**63 - 1}),
    (-1e300, {"int8": -128, "uint8": 0, "int32": -2**31, "int64": -2**63}),
]


@pytest.mark.parametrize("value, expected", BY_HAND, ids=[repr(v) for v, _ in BY_HAND])
def test_reference_by_hand(value, expected):
    for target, want in expected.items():
        got = saturating_cast(np.array([value]), target)
        assert got.dtype == np.dtype(target)
        assert got[0] == want, (value, target, got[0], want)


@pytest.mark.parametrize("target", INT_TARGETS, ids=str)
def test_reference_agrees_with_numpy_in_range(rng, target):
    """Where NumPy's astype is defined (truncated value in range), the rule is NumPy's."""
    info = np.iinfo(target)
    x = rng.uniform(float(info.min), float(info.max), size=10_000)
    # Strictly inside (min - 1, max + 1): float(max) + 1 is 2^63 for int64, not above it.
    x = x[(x > float(info.min) - 1) & (x < float(info.max) + 1)]
    np.testing.assert_array_equal(saturating_cast(x, target), x.astype(target))


def test_reference_bool_is_numpy_nonzero():
    x = np.array([NAN, INF, -INF, -0.0, 0.0, -0.5, 0.5, 1e-300])
    np.testing.assert_array_equal(saturating_cast(x, np.bool_), x.astype(np.bool_))


def test_boundary_values_cover_both_sides_of_each_edge():
    for target in INT_TARGETS:
        info = np.iinfo(target)
        v = boundary_values(target)
        assert (v > info.max).any() and (v < info.min).any()
        assert (v == float(info.max)).any() and (v == float(info.min)).any()


# ---- the device header, compiled for the host -------------------------------------------


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                              "/usr/local/cuda"]):
        candidate = Path(root) / "bin" / "nvcc"
        if candidate.exists():
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def convert_on_host(tmp_path_factory):
    """A host program running cl::convert: (src values, target) -> converted values."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc (the CUDA toolkit)")
    exe = tmp_path_factory.mktemp("conversions") / "conversions_host"
    subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{ROOT / 'cuda'}",
                    str(ROOT / "tests" / "conversions_host.cu"), "-o", str(exe)],
                   check=True, capture_output=True, timeout=600)

    def run(values: np.ndarray, target) -> np.ndarray:
        target = np.dtype(target)
        done = subprocess.run([str(exe), values.dtype.name, target.name],
                              input=values.tobytes(), capture_output=True, check=True,
                              timeout=60)
        return np.frombuffer(done.stdout, dtype=target)

    return run


@pytest.mark.parametrize("target", [*INT_TARGETS, np.dtype(np.bool_)], ids=str)
@pytest.mark.parametrize("src", FLOAT_SOURCES, ids=str)
def test_device_rule_matches_reference(convert_on_host, src, target):
    x = conversion_inputs(src)
    got = convert_on_host(x, target)
    want = saturating_cast(x, target)
    assert got.shape == want.shape
    wrong = got != want
    assert not wrong.any(), (x[wrong], got[wrong], want[wrong])


# ---- the host's copy (full()'s fill_value) --------------------------------------------------


@pytest.mark.parametrize("target", INT_TARGETS, ids=str)
def test_host_rule_matches_reference(target):
    x = conversion_inputs(np.float64)
    got = np.array([_core._float_to_int(float(v), target) for v in x], dtype=target)
    np.testing.assert_array_equal(got, saturating_cast(x, target))


def test_host_rule_takes_numpy_float_scalars():
    assert _core._float_to_int(np.float16(300.5), "uint8") == 255
    assert _core._float_to_int(np.float32(-1e10), "int32") == -2**31
    assert _core._float_to_int(np.float64("nan"), np.int64) == 0


def test_host_rule_refuses_non_integer_targets():
    for dtype in ("bool", "float32"):
        with pytest.raises(TypeError, match="integer dtype"):
            _core._float_to_int(1.5, dtype)
