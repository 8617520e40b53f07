"""GPU tier: cudalab.random (Philox4x32-10 on the device).

* The device's Philox block is checked against the published known-answer
  vectors and a pure-Python reference, through _core._philox4x32_10, which
  runs the same device function the generators use.
* The stream layout is checked bit for bit: uniform and integers outputs are
  recomputed on the host with a vectorized NumPy Philox from the documented
  counter layout (counter = (g_lo, g_hi, offset_lo, offset_hi), key = seed).
* Reproducibility, independence of the array size (a prefix of a long array
  equals a short array), distribution moments on 10**6 samples (within a few
  standard errors), strict ranges, every value hit for small integer ranges,
  float16/bfloat16 outputs and odd sizes.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import cudalab
import cudalab.random as clr


def _load_reference():
    """The pure-Python Philox and the published vectors live in the CPU-tier
    module; load it by path so this works under any pytest import mode."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("test_transpose_random_cpu.py")
    spec = importlib.util.spec_from_file_location("_cudalab_philox_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ref = _load_reference()
KAT, philox4x32_10 = _ref.KAT, _ref.philox4x32_10

pytestmark = pytest.mark.gpu

core = cudalab._core
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
FLOAT_IDS = [d.name for d in FLOATS]
INTS = [np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.int64)]
INT_IDS = [d.name for d in INTS]
M32 = np.uint64(0xFFFFFFFF)


# ------------------------------------------------ host reference ------------


def philox_np(g: np.ndarray, key: int, offset: int, attempt: int = 0):
    """Vectorized Philox4x32-10 of groups g (uint64) in cudalab's layout."""
    u = np.uint64
    c0 = g & M32
    c1 = (g >> u(32)) | u(attempt << 24)
    c2 = np.full_like(g, offset & 0xFFFFFFFF)
    c3 = np.full_like(g, offset >> 32)
    k0, k1 = u(key & 0xFFFFFFFF), u(key >> 32)
    for rnd in range(10):
        if rnd:
            k0 = (k0 + u(0x9E3779B9)) & M32
            k1 = (k1 + u(0xBB67AE85)) & M32
        p0 = c0 * u(0xD2511F53)
        p1 = c2 * u(0xCD9E8D57)
        c0, c1, c2, c3 = ((p1 >> u(32)) ^ c1 ^ k0), p1 & M32, ((p0 >> u(32)) ^ c3 ^ k1), p0 & M32
    return c0, c1, c2, c3


def words(n: int, per_group: int, key: int, offset: int) -> np.ndarray:
    """The (groups, 4) random words behind n elements, `per_group` per block."""
    groups = (n + per_group - 1) // per_group
    return np.stack(philox_np(np.arange(groups, dtype=np.uint64), key, offset), axis=1)


def ref_uniform01_f32(n, key, offset):
    w = words(n, 4, key, offset).reshape(-1)[:n]
    return ((w >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)


def ref_uniform01_f64(n, key, offset):
    w = words(n, 2, key, offset).reshape(-1, 2)[:n]
    bits = ((w[:, 0] >> np.uint64(5)) << np.uint64(26)) | (w[:, 1] >> np.uint64(6))
    return bits.astype(np.float64) * 2.0**-53


def ref_integers32(n, low, high, key, offset, dtype):
    """Lemire's method with the documented redraws (lane k of attempt 1, 2, ...)."""
    rng = high - low
    assert 0 < rng < 2**32
    groups = (n + 3) // 4
    w = np.stack(philox_np(np.arange(groups, dtype=np.uint64), key, offset), axis=1)
    x = w.reshape(-1)[:n]
    m = x * np.uint64(rng)
    lo = m & M32
    threshold = (2**32) % rng
    for idx in np.nonzero(lo < np.uint64(threshold))[0]:
        g, lane = divmod(int(idx), 4)
        attempt = 1
        xi = int(x[idx])
        while (xi * rng) & 0xFFFFFFFF < threshold:
            w2 = philox_np(np.array([g], dtype=np.uint64), key, offset, attempt)
            xi = int(w2[lane][0])
            attempt += 1
        m[idx] = np.uint64(xi * rng)
    return (np.int64(low) + (m >> np.uint64(32)).astype(np.int64)).astype(dtype)


# ---------------------------------------------------- Philox KAT ------------


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_device_philox_matches_published_vectors(counter, key, expected):
    assert core._philox4x32_10(counter, key) == expected


def test_device_philox_matches_python_reference(rng):
    for _ in range(16):
        counter = tuple(int(v) for v in rng.integers(0, 2**32, size=4))
        key = tuple(int(v) for v in rng.integers(0, 2**32, size=2))
        assert core._philox4x32_10(list(counter), list(key)) == philox4x32_10(counter, key)


# ------------------------------------------------- exact stream layout ------


@pytest.mark.parametrize("n", [1, 7, 1_000_003])
def test_uniform_float32_matches_host_reference(n):
    key = 0x0123456789ABCDEF
    got = clr.uniform(n, seed=key).get()
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_array_equal(got, ref_uniform01_f32(n, key, 0))


def test_uniform_float64_matches_host_reference():
    n = 100_001
    got = clr.uniform(n, dtype=np.float64, seed=42).get()
    np.testing.assert_array_equal(got, ref_uniform01_f64(n, 42, 0))


def test_default_generator_offsets_match_host_reference():
    clr.seed(2024)
    a = clr.uniform(1000).get()
    b = clr.uniform(1000).get()
    c = clr.uniform(1000).get()
    np.testing.assert_array_equal(a, ref_uniform01_f32(1000, 2024, 0))
    np.testing.assert_array_equal(b, ref_uniform01_f32(1000, 2024, 1))
    np.testing.assert_array_equal(c, ref_uniform01_f32(1000, 2024, 2))
    # The private function with an offset beyond 32 bits.
    big = core._random_uniform(1000, seed=7, offset=(5 << 32) | 9).get()
    np.testing.assert_array_equal(big, ref_uniform01_f32(1000, 7, (5 << 32) | 9))


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integers_match_host_reference(dtype):
    n = 200_003
    for low, high in [(0, 10), (3, 100), (-5, 6)]:
        if np.iinfo(dtype).min > low:
            low, high = 0, high - low
        got = clr.integers(n, low, high, dtype=dtype, seed=11).get()
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, ref_integers32(n, low, high, 11, 0, dtype))


def test_integers_rejection_path_matches_host_reference():
    """A range just above 2**31 redraws about half of the first words."""
    n = 4_000
    low, high = 0, 2**31 + 12345
    got = clr.integers(n, low, high, seed=5).get()
    np.testing.assert_array_equal(got, ref_integers32(n, low, high, 5, 0, np.int64))


# ------------------------------------------------ reproducibility -----------


CALLS = {
    "normal": lambda n, dt, s: clr.normal(n, dtype=dt, seed=s),
    "uniform": lambda n, dt, s: clr.uniform(n, dtype=dt, seed=s),
}


@pytest.mark.parametrize("func", sorted(CALLS))
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_same_seed_same_bytes_different_seed_differs(func, dtype):
    n = 100_003
    a = CALLS[func](n, dtype, 123).get()
    b = CALLS[func](n, dtype, 123).get()
    c = CALLS[func](n, dtype, 124).get()
    assert a.dtype == dtype
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    # Not just a different permutation of a few values.
    assert np.mean(a == c) < 0.1


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integers_reproducible(dtype):
    a = clr.integers(50_001, 100, dtype=dtype, seed=1).get()
    b = clr.integers(50_001, 100, dtype=dtype, seed=1).get()
    c = clr.integers(50_001, 100, dtype=dtype, seed=2).get()
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()


def test_seed_makes_the_default_sequence_repeat():
    clr.seed(77)
    first = [clr.normal(1000).get(), clr.uniform(1000).get(), clr.integers(1000, 50).get()]
    clr.seed(77)
    again = [clr.normal(1000).get(), clr.uniform(1000).get(), clr.integers(1000, 50).get()]
    for x, y in zip(first, again):
        assert x.tobytes() == y.tobytes()
    # Successive calls without a seed differ.
    p, q = clr.normal(1000).get(), clr.normal(1000).get()
    assert not np.array_equal(p, q)
    # An explicit seed equals seed(s) followed by the first default call.
    clr.seed(31)
    np.testing.assert_array_equal(clr.normal(500).get(), clr.normal(500, seed=31).get())


@pytest.mark.parametrize("func", sorted(CALLS))
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_prefix_does_not_depend_on_size(func, dtype):
    """Element i depends only on (seed, offset, i): not on n or the grid."""
    long = CALLS[func](1_000_003, dtype, 9).get()
    for n in (1, 7, 1000):
        short = CALLS[func](n, dtype, 9).get()
        assert short.tobytes() == long[:n].tobytes()


def test_shapes_and_sizes():
    for shape in [(), 1, 7, (3, 5, 7), (0,), (2, 0, 3), [4, 1]]:
        expected = (shape,) if isinstance(shape, int) else tuple(shape)
        for arr in (clr.normal(shape, seed=1), clr.uniform(shape, seed=1),
                    clr.integers(shape, 9, seed=1)):
            assert arr.shape == expected
            assert arr.is_contiguous
            assert arr.get().shape == expected


def test_half_precision_normal_is_the_rounded_float32_stream():
    """float16/bfloat16 normals are float32 normals rounded to nearest."""
    n = 100_003
    f32 = clr.normal(n, mean=0.5, std=3.0, seed=8).get()
    f16 = clr.normal(n, mean=0.5, std=3.0, dtype=np.float16, seed=8).get()
    b16 = clr.normal(n, mean=0.5, std=3.0, dtype=BF16, seed=8).get()
    assert f16.tobytes() == f32.astype(np.float16).tobytes()
    assert b16.tobytes() == f32.astype(BF16).tobytes()


# ------------------------------------------------------ distributions -------

N = 1_000_000


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (3.0, 2.0), (-1.5, 0.25)])
def test_normal_moments(dtype, mean, std):
    x = clr.normal(N, mean=mean, std=std, dtype=dtype, seed=1000).get().astype(np.float64)
    assert np.all(np.isfinite(x))
    # Standard errors: mean std/sqrt(n), std std/sqrt(2n); rounding to
    # float16/bfloat16 adds at most half an ulp of relative error.
    tol_round = {np.dtype(np.float16): 2**-11, BF16: 2**-8}.get(np.dtype(dtype), 0.0)
    assert abs(x.mean() - mean) < 5 * std / math.sqrt(N) + tol_round * abs(mean)
    assert abs(x.std() - std) < 5 * std / math.sqrt(2 * N) + 2 * tol_round * std
    z = (x - mean) / std
    within1 = np.mean(np.abs(z) < 1.0)
    p = math.erf(1 / math.sqrt(2))
    assert abs(within1 - p) < 5 * math.sqrt(p * (1 - p) / N) + 4 * tol_round
    assert abs(np.mean(z**3)) < 0.02  # skewness ~ 0 (SE ~ 0.0025)
    assert abs(np.mean(z**4) - 3.0) < 0.05  # kurtosis ~ 3 (SE ~ 0.005)


def test_normal_std_zero_gives_the_mean():
    x = clr.normal(1001, mean=2.5, std=0.0, seed=3).get()
    assert np.all(x == np.float32(2.5))


def test_normal_tails_are_reached_but_finite():
    x = clr.normal(4_000_000, seed=17).get()
    assert np.all(np.isfinite(x))
    assert 4.0 < np.abs(x).max() < 7.0


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-3.0, 5.0), (100.0, 101.0)])
def test_uniform_moments_and_range(dtype, low, high):
    x = clr.uniform(N, low, high, dtype=dtype, seed=2000).get()
    assert x.dtype == dtype
    xf = x.astype(np.float64)
    assert xf.min() >= low and xf.max() < high
    width = high - low
    ulp = {np.dtype(np.float16): 2**-10, BF16: 2**-7}.get(np.dtype(dtype), 0.0) * max(
        abs(low), abs(high))
    se = width / math.sqrt(12 * N)
    assert abs(xf.mean() - (low + high) / 2) < 5 * se + ulp
    assert abs(xf.var() - width**2 / 12) < 5 * width**2 / (math.sqrt(180 * N)) + 2 * width * ulp
    # The lowest and highest tenths are both populated (float16/bfloat16 put
    # values on a grid as coarse as `ulp`).
    assert np.mean(xf < low + width / 10 + ulp) > 0.05
    assert np.mean(xf >= high - width / 10 - ulp) > 0.05


@pytest.mark.parametrize(
    "dtype,low,high",
    [
        (np.float32, 1.0, 1.0 + 2.0**-23),  # one representable value in range
        (np.float32, -3.0, -3.0 + 2.0**-22),
        (np.float16, 1.0, 1.0 + 2.0**-10),
        (BF16, 1.0, 1.0 + 2.0**-7),
        (np.float64, 1.0, 1.0 + 2.0**-52),
        (np.float32, 0.0, 1e-40),  # subnormal range
    ],
)
def test_uniform_never_returns_high(dtype, low, high):
    """Rounding up to `high` is impossible: narrow ranges give only `low`'s values."""
    # The guarantee is for the bounds rounded to the dtype.
    lo_r = float(np.array(low).astype(dtype).astype(np.float64))
    hi_r = float(np.array(high).astype(dtype).astype(np.float64))
    x = clr.uniform(200_001, low, high, dtype=dtype, seed=4).get().astype(np.float64)
    assert x.min() >= lo_r
    assert x.max() < hi_r


def test_uniform_half_precision_default_range_is_exact_grid():
    x16 = clr.uniform(N, dtype=np.float16, seed=6).get().astype(np.float64)
    assert x16.max() < 1.0 and x16.min() >= 0.0
    # 11 random bits: every value is a multiple of 2**-11, and most of the
    # 2048 grid points appear.
    assert np.all(np.mod(x16 * 2048, 1.0) == 0.0)
    assert len(np.unique(x16)) > 2000


@pytest.mark.parametrize("dtype", INTS, ids=INT_IDS)
def test_integers_small_range_hits_every_value(dtype):
    low, high = (-3, 4) if np.iinfo(dtype).min < 0 else (250, 256)
    x = clr.integers(700_001, low, high, dtype=dtype, seed=12).get()
    assert x.dtype == dtype
    values, counts = np.unique(x.astype(np.int64), return_counts=True)
    np.testing.assert_array_equal(values, np.arange(low, high))
    expected = len(x) / (high - low)
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < 40.0  # df <= 6: P(chi2 > 40) < 1e-6


def test_integers_high_none_is_zero_to_low():
    x = clr.integers(100_000, 5, seed=3).get()
    assert x.dtype == np.int64
    assert set(np.unique(x).tolist()) == {0, 1, 2, 3, 4}


@pytest.mark.parametrize(
    "dtype,low,high",
    [
        (np.uint8, 0, 256),
        (np.int8, -128, 128),
        (np.int32, -(2**31), 2**31),
        (np.int64, -(2**63), 2**63),
        (np.int64, 0, 3 * 2**40),
        (np.int64, -(2**62), 2**62 + 12345),
    ],
)
def test_integers_full_and_wide_ranges(dtype, low, high):
    x = clr.integers(N, low, high, dtype=dtype, seed=21).get()
    assert x.dtype == dtype
    xf = x.astype(np.float64)
    assert x.min() >= low and int(x.max()) <= high - 1
    width = float(high) - float(low)
    se = width / math.sqrt(12 * N)
    assert abs(xf.mean() - (float(low) + float(high) - 1) / 2) < 5 * se
    if high - low <= 256:
        assert len(np.unique(x)) == high - low
    else:
        assert len(np.unique(x)) > 0.99 * N  # wide ranges: practically no repeats


def test_integers_bounds_one_value():
    x = clr.integers(1000, 7, 8, seed=1).get()
    assert np.all(x == 7)
    y = clr.integers(1000, 2**63 - 1, 2**63, seed=1).get()
    assert np.all(y == 2**63 - 1)


def test_random_runs_on_the_current_device_and_pool():
    before = cudalab.memory_allocated()
    x = clr.normal((1024, 256), seed=1)
    assert x.device == cudalab.current_device()
    assert cudalab.memory_allocated() >= before + x.nbytes
