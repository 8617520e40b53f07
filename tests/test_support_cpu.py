"""CPU tier: the shared test helpers in _support.py do what they promise.

Everything here is pure NumPy (device arrays are stood in for by NumPy copies
through ``to_device``), so it runs without a GPU.
"""

from __future__ import annotations

import math
import os
import re
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings

import _support as S
import cudalab

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 3), (2, 3, 4), (1, 2, 1, 3)]


def host_copy(a: np.ndarray) -> np.ndarray:
    """A stand-in for cudalab.asarray: a separate C-contiguous copy."""
    return np.array(a, copy=True, order="C")


# ------------------------------------------------------------- dtypes -------


def test_dtype_groups_cover_every_dtype_once():
    groups = S.FLOAT_DTYPES + S.INT_DTYPES + [S.BOOL]
    assert sorted(d.name for d in groups) == sorted(S.DTYPE_IDS)
    assert all(S.is_float(d) and not S.is_int(d) for d in S.FLOAT_DTYPES)
    assert all(S.is_int(d) and not S.is_float(d) for d in S.INT_DTYPES)
    assert not S.is_int(S.BOOL) and not S.is_float(S.BOOL)
    assert S.FLOAT_IDS == [d.name for d in S.FLOAT_DTYPES]
    assert S.INT_IDS == [d.name for d in S.INT_DTYPES]
    assert S.dtype_id(np.float16) == "float16" and S.dtype_id("bfloat16") == "bfloat16"


# ------------------------------------------------------ random_array -------


@pytest.mark.parametrize("dtype", S.DTYPES, ids=S.DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_random_array_dtype_shape_layout_never_zero(rng, dtype, shape):
    x = S.random_array(rng, shape, dtype)
    assert isinstance(x, np.ndarray)
    assert x.dtype == dtype and x.shape == shape
    assert x.flags.c_contiguous
    if dtype == S.BOOL:
        assert x.size == 0 or x.any()
    else:
        assert not np.any(x == 0)
    if S.is_float(dtype):
        assert np.all(np.abs(x.astype(np.float64)) >= 1e-3 * (1 - 2**-7))


def test_random_array_int_shape_and_reproducible():
    a = S.random_array(np.random.default_rng(3), 11, np.int32)
    b = S.random_array(np.random.default_rng(3), 11, np.int32)
    assert a.shape == (11,)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", S.INT_DTYPES, ids=S.INT_IDS)
def test_random_array_default_int_range(rng, dtype):
    x = S.random_array(rng, 10_000, dtype).astype(np.int64)
    info = np.iinfo(dtype)
    assert x.min() >= max(info.min, -S.INT_LIMIT) and x.max() <= min(info.max, S.INT_LIMIT)
    if dtype.kind == "i":
        assert x.min() < 0 < x.max()  # both signs
    if dtype.itemsize == 1:
        assert len(np.unique(x)) > 200  # the whole range is used


def test_random_array_bounds(rng):
    x = S.random_array(rng, 10_000, np.int8, low=-3, high=4)
    assert set(np.unique(x)) == {-3, -2, -1, 1, 2, 3}
    f = S.random_array(rng, 10_000, np.float32, low=2.0, high=3.0)
    assert f.min() >= 2.0 and f.max() < 3.0
    g = S.random_array(rng, 10_000, np.float64, low=-1.0, high=1.0)
    assert g.min() < -0.9 and g.max() > 0.9 and np.abs(g).min() >= 1e-3
    h = S.random_array(rng, 10_000, np.float64, low=-3.0, high=1e-4)
    assert h.max() < 1e-4 and np.all(h != 0)
    assert S.random_array(rng, 1000, np.uint8, low=0, high=2).tolist() == [1] * 1000
    assert set(S.random_array(rng, 1000, np.int8, low=-1, high=1).tolist()) == {-1}


def test_random_array_one_float_bound_folds_a_normal(rng):
    up = S.random_array(rng, 10_000, np.float32, low=1)
    assert up.min() >= 1 and 1.7 < up.mean() < 1.9  # 1 + E|N| = 1.798
    down = S.random_array(rng, 10_000, np.float64, high=-2.0)
    assert down.max() <= -2.0
    for low in (-1.0, -1e-4, 0.0, 1e-4):  # folds reaching zero are moved off it, inside
        x = S.random_array(rng, 10_000, np.float64, low=low)
        assert x.min() >= low and np.abs(x).min() >= 1e-3
    x = S.random_array(rng, 10_000, S.BF16, high=0.0)
    assert x.astype(np.float64).max() <= -1e-3


def test_random_array_nonzero_false_allows_zeros(rng):
    x = S.random_array(rng, 1000, np.uint8, low=0, high=2, nonzero=False)
    assert set(np.unique(x)) == {0, 1}
    b = [S.random_array(np.random.default_rng(s), 1, np.bool_, nonzero=False)[0]
         for s in range(20)]
    assert set(b) == {False, True}


def test_random_array_bool_never_all_false():
    for seed in range(50):
        assert S.random_array(np.random.default_rng(seed), (1,), np.bool_)[0]
    x = S.random_array(np.random.default_rng(0), 1000, np.bool_, low=5, high=9)  # bounds ignored
    assert 300 < x.sum() < 700


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dtype=np.float32, low=1.0, high=1.0), "empty"),
        (dict(dtype=np.int8, low=0, high=200), "outside int8"),
        (dict(dtype=np.uint8, low=-1, high=3), "outside uint8"),
        (dict(dtype=np.int32, low=5, high=5), "empty"),
        (dict(dtype=np.int64, low=0, high=1), "no nonzero"),
        (dict(dtype=np.float16, low=1e-9, high=2e-9), "rounds to 0 in float16"),
    ],
)
def test_random_array_errors(rng, kwargs, message):
    with pytest.raises(ValueError, match=message):
        S.random_array(rng, 100, **kwargs)


# ------------------------------------------------------------- layouts ------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_layout_has_the_logical_shape(shape):
    views = S.layouts(shape, negative=True)
    names = [v.name for v in views]
    assert len(set(names)) == len(names)
    assert names[0] == "contiguous"
    assert set(names) <= set(S.LAYOUT_NAMES)
    if shape == ():
        assert names == ["contiguous"]
    if len(shape) < 2:
        assert "transposed" not in names
    for v in views:
        assert v.shape == shape
        root = np.arange(math.prod(v.root_shape)).reshape(v.root_shape)
        view = v(root)
        assert view.shape == shape
        assert view.size == 0 or np.shares_memory(view, root)


def test_layouts_strides():
    """Each layout really has the strides its name says (shape (3, 4, 5), int64)."""
    strides = {}
    for v in S.layouts((3, 4, 5), negative=True):
        view = v(np.zeros(v.root_shape, np.int64))
        strides[v.name] = view.strides
        assert view.flags.c_contiguous == (v.name == "contiguous")
        assert v.negative == any(s < 0 for s in view.strides)
    assert strides["contiguous"] == (160, 40, 8)
    assert strides["offset"] == (256, 64, 8)
    assert strides["stepped"] == (2 * 9 * 11 * 8, 2 * 11 * 8, 16)
    assert strides["transposed"] == (8, 24, 96)
    assert strides["negative"] == (-160, -40, -8)
    assert strides["rotated"] == (8, 120, 24)
    assert all(s < 0 for s in strides["transposed_negative"])


def test_layouts_without_negative():
    names = [v.name for v in S.layouts((3, 4))]
    assert names == ["contiguous", "offset", "stepped", "transposed"]
    assert [v.name for v in S.layouts(7)] == ["contiguous", "offset", "stepped"]
    assert not any(v.negative for v in S.layouts((2, 3, 4)))


def test_offset_layout_starts_one_element_in():
    v = S.layouts((4, 6))[1]
    root = np.arange(4 * 9).reshape(4, 9)
    assert v.name == "offset" and v(root)[0, 0] == 1 and v(root)[1, 0] == 10


# ------------------------------------------------------ strided_views ------


@pytest.mark.parametrize("dtype", S.DTYPES, ids=S.DTYPE_IDS)
def test_strided_views_pairs_hold_equal_values(rng, dtype):
    pairs = S.strided_views(rng, (5, 7), dtype, negative=True, to_device=host_copy)
    assert [p.name for p in pairs] == [v.name for v in S.layouts((5, 7), negative=True)]
    for name, dev, host in pairs:
        assert dev.shape == host.shape == (5, 7)
        assert dev.dtype == host.dtype == dtype
        assert dev.strides == host.strides  # the same recipe on equal roots
        assert not np.shares_memory(dev, host)
        S.assert_bit_equal(dev, host)
        if dtype != S.BOOL:
            assert not np.any(host == 0)


def test_strided_views_default_and_names(rng):
    names = [p.name for p in S.strided_views(rng, (2, 3, 4), np.float32, to_device=host_copy)]
    assert names == ["contiguous", "offset", "stepped", "transposed", "rotated"]
    [only] = S.strided_views(rng, (3, 3), np.int8, names=["negative"], to_device=host_copy)
    assert only.name == "negative" and only.host.strides == (-3, -1)
    with pytest.raises(ValueError, match="no layout"):
        S.strided_views(rng, (3,), np.int8, names=["transposed"], to_device=host_copy)


def test_strided_views_random_kw_reach_random_array(rng):
    for _, dev, host in S.strided_views(rng, (9, 4), np.int32, low=100, high=105,
                                        to_device=host_copy):
        assert host.min() >= 100 and host.max() < 105


def test_device_and_host(rng):
    dev, host = S.device_and_host(rng, (4, 6), np.float64, layout="transposed",
                                  to_device=host_copy)
    assert host.shape == (4, 6) and host.flags.f_contiguous
    S.assert_bit_equal(dev, host)
    dev, host = S.device_and_host(rng, 5, np.int64, to_device=host_copy)
    assert host.shape == (5,) and host.flags.c_contiguous


@settings(max_examples=60, deadline=None)
@given(view=S.view_recipes(max_ndim=3, max_extent=6))
def test_view_recipes_positive_steps(view):
    assert not view.negative
    root = np.arange(math.prod(view.root_shape)).reshape(view.root_shape)
    out = view(root)
    assert out.shape == view.shape and out.size > 0
    assert all(s >= 0 for s in out.strides)


@settings(max_examples=60, deadline=None)
@given(view=S.view_recipes(negative=True))
def test_view_recipes_negative_steps(view):
    root = np.arange(math.prod(view.root_shape)).reshape(view.root_shape)
    assert view(root).shape == view.shape and view(root).size > 0
    # Before the permutation, an axis strides backwards exactly where its step is negative.
    for key, stride in zip(view.key, root[view.key].strides):
        assert (stride < 0) == (key.step < 0)


# ------------------------------------------------------------ comparisons ---


def test_tolerance_table():
    assert S.tolerance(np.float64) == 1e-12
    assert S.tolerance(np.float32) == 1e-5
    assert S.tolerance(np.float16) == S.tolerance(S.BF16) == 1e-2
    for d in S.INT_DTYPES + [S.BOOL]:
        assert S.tolerance(d) == 0.0


def test_rel_err():
    assert S.rel_err([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert S.rel_err([3.0, 4.0], [0.0, 5.0]) == pytest.approx(math.sqrt(9 + 1) / 5)
    assert S.rel_err([0.5, 0.0], [0.0, 0.0]) == 0.5  # absolute where the reference is 0
    assert S.rel_err(np.ones(3, S.BF16), np.ones(3)) == 0.0
    with pytest.raises(AssertionError):
        S.rel_err(np.ones(3), np.ones(4))


def test_assert_close_floats():
    want = np.linspace(1, 2, 101)
    S.assert_close(want.astype(np.float32), want, np.float32)
    S.assert_close((want * (1 + 3e-3)).astype(S.BF16), want)  # within 1e-2
    with pytest.raises(AssertionError, match="relative error"):
        S.assert_close((want * (1 + 1e-4)).astype(np.float32), want)
    with pytest.raises(AssertionError):
        S.assert_close(want.astype(np.float32), want, np.float64)  # wrong dtype
    with pytest.raises(AssertionError):
        S.assert_close(want[:100], want)  # wrong shape
    S.assert_close(want * (1 + 1e-4), want, tol=1e-3)
    with pytest.raises(TypeError, match="tol="):
        S.assert_close(want, want, 1e-5)  # a tolerance where the dtype goes


def test_assert_close_nan_and_inf():
    want = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    S.assert_close(want.astype(np.float16), want)
    with pytest.raises(AssertionError, match="NaN"):
        S.assert_close(np.array([1.0, 0.0, np.inf, -np.inf, 2.0]), want)
    with pytest.raises(AssertionError, match="infinities"):
        S.assert_close(np.array([1.0, np.nan, -np.inf, -np.inf, 2.0]), want)
    with pytest.raises(AssertionError, match="relative error"):
        S.assert_close(np.array([1.0, np.nan, np.inf, -np.inf, np.inf]), want)


def test_assert_close_integers_are_exact():
    S.assert_close(np.array([1, -2, 3], np.int8), np.array([1, -2, 3], np.int64), np.int8)
    S.assert_close(np.array([True, False]), np.array([1, 0]))
    with pytest.raises(AssertionError):
        S.assert_close(np.array([1, 2, 4], np.int32), np.array([1, 2, 3]))


def test_assert_bit_equal():
    S.assert_bit_equal(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    S.assert_bit_equal(np.arange(6).reshape(2, 3).T, np.arange(6).reshape(2, 3).T.copy())
    with pytest.raises(AssertionError):
        S.assert_bit_equal(np.array([-0.0]), np.array([0.0]))
    with pytest.raises(AssertionError):
        S.assert_bit_equal(np.ones(2, np.float32), np.ones(2, np.float64))
    with pytest.raises(AssertionError):
        S.assert_bit_equal(np.ones((2, 1)), np.ones(2))


def test_widen_and_to_host():
    assert S.widen(np.ones(2, S.BF16)).dtype == np.float64
    assert S.widen(np.ones(2, np.uint8)).dtype == np.int64
    assert S.widen(np.ones(2, np.bool_)).dtype == np.int64
    x = np.ones(3)
    assert S.to_host(x) is x
    assert S.to_host([1, 2]).tolist() == [1, 2]


def test_philox_reference_matches_published_vectors():
    for counter, key, expected in S.PHILOX_KAT:
        assert S.philox4x32_10(counter, key) == expected


def test_float64_references():
    x = np.array([-3.0, -0.5, 0.0, 0.7, 4.0])
    np.testing.assert_allclose(S.erf(x), [math.erf(v) for v in x], rtol=0, atol=0)
    g = S.gelu_reference(x)
    np.testing.assert_allclose(g, x * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x])))
    assert g[2] == 0.0 and g[-1] == pytest.approx(4.0, abs=1e-3)
    np.testing.assert_allclose(S.gelu_reference(x, "tanh"), g, atol=1e-3)
    assert S.gelu_reference(np.ones(2, np.float16)).dtype == np.float64
    with pytest.raises(ValueError, match="approximate"):
        S.gelu_reference(x, "fast")


# ------------------------------------------------------- argument errors ---


def raise_(exc):
    raise exc


def test_arg_error_regex():
    pattern = S.arg_error("add", "b")
    assert re.search(pattern, "add() argument 'b': bad")
    assert not re.search(pattern, "xadd() argument 'b': bad")
    assert not re.search(pattern, "add() argument 'a': bad")
    assert not re.search(S.arg_error("f.g", "x"), "fag() argument 'x': ")


def test_assert_arg_error_accepts_the_right_error():
    with S.assert_arg_error(ValueError, "empty", "shape", match="negative") as info:
        raise_(ValueError("empty() argument 'shape': negative dimensions are not allowed"))
    assert isinstance(info.value, ValueError)
    with S.assert_arg_error(TypeError, "f", "x"):
        raise_(TypeError("f() argument 'x': anything"))


@pytest.mark.parametrize(
    "exc, match",
    [
        (TypeError("g() argument 'x': wrong function"), None),
        (TypeError("f() argument 'y': wrong parameter"), None),
        (TypeError("prefix f() argument 'x': not at the start"), None),
        (TypeError("f() argument 'x': message"), "other text"),
        (ValueError("f() argument 'x': wrong type"), None),
    ],
)
def test_assert_arg_error_rejects_wrong_errors(exc, match):
    with pytest.raises((AssertionError, ValueError)):
        with S.assert_arg_error(TypeError, "f", "x", match=match):
            raise_(exc)


def test_assert_arg_error_fails_when_nothing_is_raised():
    with pytest.raises(pytest.fail.Exception):
        with S.assert_arg_error(TypeError, "f", "x"):
            pass


def test_assert_arg_error_on_real_cudalab_errors():
    """The C extension's messages (checked before any device access) fit."""
    with S.assert_arg_error(ValueError, "empty", "shape", match="negative"):
        cudalab.empty((2, -1))
    with S.assert_arg_error(TypeError, "matmul", "precision"):
        cudalab.matmul(np.ones((2, 2)), np.ones((2, 2)), precision=1)


# ---------------------------------------------------------------- skips -----


def test_gpu_flags():
    assert S.HAS_GPU == cudalab.is_available()
    assert S.no_gpu_only.name == "skipif"
    assert S.no_gpu_only.args == (S.HAS_GPU,)


def _fake_module(monkeypatch, name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _fails_without(available, result):
    """A fake probe: returns `result`, or raises as a library does without a GPU."""
    def probe(*args):
        if not available:
            raise RuntimeError("no CUDA-capable device is detected")
        return result
    return probe


def _fake_torch(mp, ok):
    return _fake_module(mp, "torch", cuda=types.SimpleNamespace(is_available=lambda: ok))


def _fake_numba(mp, ok):
    cuda = _fake_module(mp, "numba.cuda", is_available=lambda: ok)
    _fake_module(mp, "numba", cuda=cuda)
    return cuda


def _fake_cupy(mp, ok):
    runtime = types.SimpleNamespace(getDeviceCount=_fails_without(ok, 1))
    return _fake_module(mp, "cupy", cuda=types.SimpleNamespace(runtime=runtime))


def _fake_jax(mp, ok):
    return _fake_module(mp, "jax", devices=_fails_without(ok, ["gpu0"])), ["gpu0"]


# helper -> (install a fake library, the skip message without a GPU)
LIBRARIES = {
    S.torch_cuda: (_fake_torch, "torch without CUDA"),
    S.numba_cuda: (_fake_numba, "sees no GPU"),
    S.cupy_device: (_fake_cupy, "usable device"),
    S.jax_gpus: (_fake_jax, "no GPU backend"),
}


@pytest.mark.parametrize("helper", LIBRARIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("available", [True, False])
def test_library_helpers_return_or_skip(monkeypatch, helper, available):
    install, message = LIBRARIES[helper]
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    expected = install(monkeypatch, available)
    if available:
        assert helper() == expected
    else:
        with pytest.raises(pytest.skip.Exception, match=message):
            helper()
    if helper is S.jax_gpus:
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_missing_library_skips(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails
    with pytest.raises(pytest.skip.Exception):
        S.torch_cuda()


# ---------------------------------------------------- processes and files ---


def test_load_module(tmp_path):
    path = tmp_path / "some_script.py"
    path.write_text("VALUE = 41 + 1\n")
    assert S.load_module(path).VALUE == 42
    assert S.load_module(path, "named").__name__ == "named"


def test_run_in_threads_runs_every_index():
    seen = []
    S.run_in_threads(seen.append, 5)
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_run_in_threads_reports_failures():
    def work(i):
        if i % 2:
            raise KeyError(i)

    with pytest.raises(AssertionError, match="2 of 4 threads failed") as info:
        S.run_in_threads(work, 4)
    assert isinstance(info.value.__cause__, KeyError)


def test_run_cli_help():
    result = S.run_cli("--help", timeout=120)
    assert result.returncode == 0 and "usage" in result.stdout


def test_fake_measurement():
    m = S.fake_measurement("add", median=2e-3, device="Fake GPU")
    assert m.label == "add" and m.median == pytest.approx(2e-3) and m.repeats == 5
    m = S.fake_measurement(times=[1.0, 3.0, 2.0])
    assert m.label == "op" and m.median == 2.0


def test_readme_blocks():
    blocks = S.readme_python_blocks()
    assert blocks and all(isinstance(b, str) for b in blocks)
    assert "gpu_benchmark" in S.readme_plugin_example()
    assert S.REPO_ROOT / "README.md" == S.README
    assert any("GpuMonitor" in b for b in S.doc_python_blocks("measuring"))


# ---- CUDALAB_TEST_SHARD ------------------------------------------------------------------------


shard_of_files, parse_shard, REPO_ROOT = S.shard_of_files, S.parse_shard, S.REPO_ROOT


def test_shards_split_whole_files_evenly_and_the_same_way_each_time():
    counts = {"a.py": 50, "b.py": 40, "c.py": 30, "d.py": 20, "e.py": 10, "f.py": 10}
    shard = shard_of_files(counts, 2)
    assert shard == shard_of_files(dict(reversed(counts.items())), 2)
    totals = [sum(c for f, c in counts.items() if shard[f] == k) for k in (1, 2)]
    assert sorted(totals) == [80, 80]
    assert set(shard_of_files(counts, 1).values()) == {1}
    assert set(shard_of_files(counts, 6).values()) == {1, 2, 3, 4, 5, 6}


def test_parse_shard():
    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "1", "a/b", "1/2/3"):
        with pytest.raises(ValueError, match="CUDALAB_TEST_SHARD"):
            parse_shard(bad)


def test_the_shards_of_the_suite_cover_it_once(tmp_path):
    """Two collections with CUDALAB_TEST_SHARD=1/2 and 2/2 list every test exactly once."""
    import subprocess

    def collect(spec):
        env = {k: v for k, v in os.environ.items() if k != "CUDALAB_TEST_SHARD"}
        if spec:
            env["CUDALAB_TEST_SHARD"] = spec
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                              "-p", "no:cacheprovider", "tests/test_support_cpu.py",
                              "tests/test_streams_cpu.py", "tests/test_sanitize_cpu.py"],
                             cwd=REPO_ROOT, env=env, capture_output=True, text=True).stdout
        return {line for line in out.splitlines() if "::" in line}

    whole, first, second = collect(""), collect("1/2"), collect("2/2")
    assert whole and first and second
    assert first | second == whole and not first & second
