"""GPU tier: cudalab.random (Philox4x32-10 on the device).

* The device's Philox block is checked against the published known-answer
  vectors and a pure-Python reference, through _core._philox4x32_10, which
  runs the same device function the generators use.
* The stream layout is checked bit for bit: uniform and integers outputs are
  recomputed on the host with a vectorized NumPy Philox from the documented
  counter layout (counter = (g_lo, g_hi, offset_lo, offset_hi), key = seed).
* The float32 normal stream is checked against a float64 host Box-Muller of
  the same words (the device uses approximate log2/sqrt/sin/cos: close, not
  bit-equal).
* Reproducibility (same seed and offset: same bits; another seed or offset:
  other values), independence of the array size (a prefix of a long array
  equals a short array, odd sizes included), distribution moments and a
  Kolmogorov-Smirnov bound on 10**6 samples, a chi-square over the exact
  float16/bfloat16 uniform grids, strict [low, high) ranges (rounding to the
  dtype never reaches high), finiteness, every value hit for small integer
  ranges.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import cudalab
import cudalab.random as clr
from _support import (BF16, FLOAT_DTYPES, FLOAT_IDS, INT_DTYPES, INT_IDS, PHILOX_KAT, erf,
                      philox4x32_10)

pytestmark = pytest.mark.gpu

core = cudalab._core
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


def ref_normal_f32(n, key, offset):
    """The documented float32 Box-Muller, evaluated in float64 from the same words:
    u1 = float32(a) * 2**-32 + 2**-33 and theta = 2 pi int32(b) 2**-32, both in float32."""
    w = words(n, 4, key, offset).reshape(-1, 2)
    a, b = w[:, 0], w[:, 1]
    u1 = a.astype(np.float32) * np.float32(2.0**-32) + np.float32(2.0**-33)
    theta = b.astype(np.uint32).view(np.int32).astype(np.float32) * np.float32(
        2 * math.pi * 2.0**-32)
    radius = np.sqrt(-2.0 * np.log(u1.astype(np.float64)))
    theta = theta.astype(np.float64)
    return np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=1).reshape(-1)[:n]


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


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
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


@pytest.mark.parametrize("n", [1, 3, 4097, 100_003])
def test_normal_float32_matches_host_box_muller(n):
    got = clr.normal(n, seed=0xC0FFEE).get().astype(np.float64)
    ref = ref_normal_f32(n, 0xC0FFEE, 0)
    err = np.abs(got - ref)
    # The device's log2 is accurate to ~2**-22 absolute, so the radius is
    # within ~sqrt(3e-7) where it is near 0 and within ~1e-6 elsewhere; a
    # wrong word, lane or conversion would be off by O(1).
    assert err.max() < 1e-3
    assert np.quantile(err, 0.999) < 1e-5
    mean, std = 1.5, 3.0
    shifted = clr.normal(n, mean=mean, std=std, seed=0xC0FFEE).get().astype(np.float64)
    assert np.abs(shifted - (mean + std * ref)).max() < 3e-3


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


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=INT_IDS)
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
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
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


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=INT_IDS)
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
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_prefix_does_not_depend_on_size(func, dtype):
    """Element i depends only on (seed, offset, i): not on n or the grid."""
    long = CALLS[func](1_000_003, dtype, 9).get()
    for n in (1, 2, 3, 5, 7, 8, 9, 1000, 4097, 65_537):
        short = CALLS[func](n, dtype, 9).get()
        assert short.tobytes() == long[:n].tobytes()


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=INT_IDS)
@pytest.mark.parametrize("low,high", [(0, 100), (0, 3 * 2**40)], ids=["narrow", "wide"])
def test_integers_prefix_does_not_depend_on_size(dtype, low, high):
    """Also for int64 with 32-bit words, where neighbouring lanes swap group halves."""
    if high > np.iinfo(dtype).max:
        pytest.skip("wide ranges need int64")
    long = clr.integers(300_007, low, high, dtype=dtype, seed=13).get()
    for n in (1, 2, 3, 5, 17, 4097):
        short = clr.integers(n, low, high, dtype=dtype, seed=13).get()
        assert short.tobytes() == long[:n].tobytes()


@pytest.mark.parametrize("fn", [core._random_normal, core._random_uniform])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_offset_selects_an_independent_stream(fn, dtype):
    n = 50_001
    a = fn(n, dtype=dtype, seed=3, offset=0).get()
    b = fn(n, dtype=dtype, seed=3, offset=1).get()
    c = fn(n, dtype=dtype, seed=3, offset=1 << 40).get()
    assert a.tobytes() == fn(n, dtype=dtype, seed=3, offset=0).get().tobytes()
    for x, y in [(a, b), (a, c), (b, c)]:
        assert np.mean(x == y) < 0.1


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


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
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


def ks_statistic(x: np.ndarray, cdf) -> float:
    """Kolmogorov-Smirnov distance between the sample x and a continuous CDF."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    f = cdf(x)
    n = len(x)
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))


def ks_bound(n: int, alpha: float = 1e-6) -> float:
    """D above this has probability about alpha for a correct generator."""
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + erf(x / math.sqrt(2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (-2.0, 0.5)])
def test_normal_kolmogorov_smirnov(dtype, mean, std):
    n = 2**20
    x = clr.normal(n, mean=mean, std=std, dtype=dtype, seed=4242).get().astype(np.float64)
    assert ks_statistic((x - mean) / std, normal_cdf) < ks_bound(n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-3.0, 5.0)])
def test_uniform_kolmogorov_smirnov(dtype, low, high):
    n = 2**20
    x = clr.uniform(n, low, high, dtype=dtype, seed=4243).get().astype(np.float64)
    assert ks_statistic(x, lambda v: (v - low) / (high - low)) < ks_bound(n)


def test_normal_pairs_are_uncorrelated():
    """Box-Muller pairs (elements 2i, 2i+1) and neighbouring groups."""
    z = clr.normal(2**20, seed=77).get().astype(np.float64)
    for lag in (1, 2, 4):
        r = np.corrcoef(z[:-lag], z[lag:])[0, 1]
        assert abs(r) < 6 / math.sqrt(len(z))
    # Independent radius and angle: the squared pair sum is chi-square(2).
    r2 = z[0::2] ** 2 + z[1::2] ** 2
    assert ks_statistic(r2, lambda v: 1.0 - np.exp(-v / 2)) < ks_bound(len(r2))


@pytest.mark.parametrize("func", sorted(CALLS))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_every_value_is_finite(func, dtype):
    x = CALLS[func](4_000_037, dtype, 99).get().astype(np.float64)
    assert np.all(np.isfinite(x))


def test_normal_std_zero_gives_the_mean():
    x = clr.normal(1001, mean=2.5, std=0.0, seed=3).get()
    assert np.all(x == np.float32(2.5))


def test_normal_tails_are_reached_but_finite():
    x = clr.normal(4_000_000, seed=17).get()
    assert np.all(np.isfinite(x))
    assert 4.0 < np.abs(x).max() < 7.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
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
        # low + width * u rounds up to high for the top values of u
        (BF16, 1.0, 3.0),
        (BF16, -7.0, 300.0),
        (np.float16, 0.0, 1000.0),
        (np.float16, -2.0, 2049.0),
        (np.float32, 1e-3, 1e7),
        # high - low overflows the arithmetic type
        (np.float32, -3e38, 3e38),
        (BF16, -3e38, 3e38),
        (np.float64, -1e308, 1.5e308),
    ],
)
def test_uniform_never_returns_high(dtype, low, high):
    """Rounding up to `high` is impossible: narrow ranges give only `low`'s values."""
    # The guarantee is for the bounds rounded to the dtype.
    lo_r = float(np.array(low).astype(dtype).astype(np.float64))
    hi_r = float(np.array(high).astype(dtype).astype(np.float64))
    x = clr.uniform(1_000_003, low, high, dtype=dtype, seed=4).get().astype(np.float64)
    assert np.all(np.isfinite(x))
    assert x.min() >= lo_r
    assert x.max() < hi_r
    # Both ends of the range are reached or nearly so (when it holds more
    # than one value of the dtype).
    if len(np.unique(x)) > 1:
        width = hi_r - lo_r
        assert x.min() < lo_r + 0.01 * width and x.max() > hi_r - 0.01 * width


@pytest.mark.parametrize("dtype,digits", [(np.float16, 11), (BF16, 8)], ids=["float16", "bfloat16"])
def test_uniform_half_precision_default_range_is_an_exact_even_grid(dtype, digits):
    """[0, 1) in float16/bfloat16: the 2**digits multiples of 2**-digits,
    equally likely (chi-square over every grid value)."""
    x = clr.uniform(N, dtype=dtype, seed=6).get().astype(np.float64)
    assert x.max() < 1.0 and x.min() >= 0.0
    k = x * 2**digits
    assert np.all(k == np.floor(k))
    counts = np.bincount(k.astype(np.int64), minlength=2**digits)
    assert len(counts) == 2**digits
    df = 2**digits - 1
    expected = N / 2**digits
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < df + 8 * math.sqrt(2 * df)  # mean df, sd sqrt(2 df)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=INT_IDS)
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
