"""GPU tier: matmul (cuBLASLt / cuBLAS) against a float64 NumPy reference.

Random inputs (never zeros), odd shapes (not multiples of 8, K = 1, vectors),
transposed and sliced views (which must reach cuBLAS without a copy: the pool's
allocation counter rises by exactly one, for the output), batched and
broadcast-batched products, 1-D operands, out=, the @ operator, the float32
precision setting, and argument errors that need device arrays.

Error measure: ||out - ref|| / ||ref|| with ref computed in float64 from the
operands' exact values: fp64 < 1e-12, fp32 ("highest") < 1e-5, TF32 ("high")
< 1e-3, fp16/bf16 < 1e-2.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from _support import (BF16, F16, F32, F64, FLOAT_DTYPES, FLOAT_IDS, arg_error, dtype_id,
                      random_array, rel_err, run_in_threads, tolerance)

import cudalab

pytestmark = pytest.mark.gpu

TF32_TOL = 1e-3


def ref_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def check(out, a_host, b_host, dtype, tol=None):
    """`out` (a DeviceArray) equals a_host @ b_host within dtype's tolerance."""
    assert isinstance(out, cudalab.DeviceArray)
    assert out.dtype == np.dtype(dtype)
    assert out.is_contiguous
    ref = ref_matmul(a_host, b_host)
    assert out.shape == ref.shape
    assert np.any(ref), "reference is all zeros: the test data is wrong"
    err = rel_err(out.get(), ref)
    limit = tolerance(dtype) if tol is None else tol
    assert err < limit, f"relative error {err:.3g} >= {limit:g}"
    return err


def allocations() -> int:
    return int(cudalab.memory_stats()["allocation.all.allocated"])


@pytest.fixture
def warm(rng):
    """One product per dtype first, so this thread's handle and workspace exist."""
    for dtype in FLOAT_DTYPES:
        x = cudalab.asarray(random_array(rng, (8, 8), dtype))
        cudalab.matmul(x, x)
    cudalab.synchronize()


# ------------------------------------------------------------ 2-D shapes ----

SHAPES_2D = [
    (64, 64, 64),
    (37, 129, 5),  # M, K, N: none a multiple of 8
    (129, 37, 131),
    (1, 300, 1),  # 1xK @ Kx1
    (300, 1, 7),  # K = 1
    (1, 1, 1),
    (1, 77, 33),
    (33, 77, 1),
    (257, 513, 255),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("mkn", SHAPES_2D, ids=lambda s: "x".join(map(str, s)))
def test_2d_matches_numpy(rng, dtype, mkn):
    m, k, n = mkn
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    out = cudalab.matmul(cudalab.asarray(a), cudalab.asarray(b))
    assert out.shape == (m, n)
    check(out, a, b, dtype)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=dtype_id)
def test_half_types_accumulate_in_float32(rng, dtype):
    """A long K would lose far more than 1e-2 if partial sums were half precision."""
    a, b = random_array(rng, (16, 8192), dtype), random_array(rng, (8192, 24), dtype)
    check(cudalab.matmul(cudalab.asarray(a), cudalab.asarray(b)), a, b, dtype, tol=5e-3)


# ------------------------------------------------------------ precision ----


def test_float32_precision_high_is_tf32(rng, restore_precision):
    n = 512
    a, b = random_array(rng, (n, n), F32), random_array(rng, (n, n), F32)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    ref = ref_matmul(a, b)

    assert cudalab.get_float32_matmul_precision() == "highest"
    highest = cudalab.matmul(da, db).get()
    err_highest = rel_err(highest, ref)
    assert err_highest < 1e-5

    high = cudalab.matmul(da, db, precision="high").get()
    err_high = rel_err(high, ref)
    assert err_high < TF32_TOL
    # TF32 keeps 10 mantissa bits: it provably took effect if the results differ.
    assert not np.array_equal(high, highest)
    assert err_high > err_highest

    # The process-wide setting, and the per-call override of it.
    cudalab.set_float32_matmul_precision("high")
    assert cudalab.get_float32_matmul_precision() == "high"
    via_global = cudalab.matmul(da, db).get()
    assert np.array_equal(via_global, high)
    assert np.array_equal((da @ db).get(), high)
    overridden = cudalab.matmul(da, db, precision="highest").get()
    assert np.array_equal(overridden, highest)
    cudalab.set_float32_matmul_precision("highest")
    assert np.array_equal(cudalab.matmul(da, db).get(), highest)


@pytest.mark.parametrize("dtype", [F64, F16, BF16], ids=dtype_id)
def test_precision_only_affects_float32(rng, dtype):
    a, b = random_array(rng, (65, 33), dtype), random_array(rng, (33, 17), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    hi = cudalab.matmul(da, db, precision="highest").get()
    lo = cudalab.matmul(da, db, precision="high").get()
    assert hi.tobytes() == lo.tobytes()


@pytest.fixture
def backend():
    """Switch a dtype's backend (cuBLASLt / cuBLAS) for one test, then restore it."""
    saved = {}

    def switch(dtype, name):
        previous = cudalab._core._set_matmul_backend(dtype, name)
        saved.setdefault(np.dtype(dtype), previous)

    yield switch
    for dtype, name in saved.items():
        cudalab._core._set_matmul_backend(dtype, name)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("name", ["lt", "cublas"])
def test_both_backends(rng, backend, dtype, name):
    """The path a dtype does not use by default is correct too (it is the
    fallback when cuBLASLt has no algorithm)."""
    backend(dtype, name)
    for m, k, n in [(37, 129, 5), (1, 40, 1), (64, 1, 33)]:
        a, b = random_array(rng, (k, m), dtype), random_array(rng, (k, n), dtype)
        check(cudalab.matmul(cudalab.asarray(a).T, cudalab.asarray(b)), a.T, b, dtype)
    a, b = random_array(rng, (3, 1, 9, 20), dtype), random_array(rng, (4, 20, 6), dtype)
    check(cudalab.matmul(cudalab.asarray(a), cudalab.asarray(b)), a, b, dtype)
    if dtype == F32:
        a, b = random_array(rng, (256, 256), F32), random_array(rng, (256, 256), F32)
        da, db = cudalab.asarray(a), cudalab.asarray(b)
        hi = cudalab.matmul(da, db, precision="highest").get()
        lo = cudalab.matmul(da, db, precision="high").get()
        assert rel_err(hi, ref_matmul(a, b)) < 1e-5
        assert rel_err(lo, ref_matmul(a, b)) < TF32_TOL
        assert not np.array_equal(hi, lo)


# -------------------------------------------- layouts: no copies for views ----


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("ta", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("tb", [False, True], ids=["b", "bT"])
def test_transposed_views_are_not_copied(rng, warm, dtype, ta, tb):
    m, k, n = 37, 129, 45
    a = random_array(rng, (k, m) if ta else (m, k), dtype)
    b = random_array(rng, (n, k) if tb else (k, n), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    va, vb = (da.T if ta else da), (db.T if tb else db)
    ha, hb = (a.T if ta else a), (b.T if tb else b)
    before = allocations()
    out = cudalab.matmul(va, vb)
    assert allocations() - before == 1, "an operand was copied (or the workspace reallocated)"
    check(out, ha, hb, dtype)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_leading_dimension_views_are_not_copied(rng, warm, dtype):
    """Row- and column-major sub-matrices (one unit stride, the other a larger
    leading dimension, unaligned start) go to cuBLAS as they are."""
    big_a = random_array(rng, (61, 150), dtype)  # row-major sources
    big_b = random_array(rng, (140, 53), dtype)
    big_at = random_array(rng, (150, 61), dtype)  # .T of these: column-major sources
    big_bt = random_array(rng, (53, 140), dtype)
    da, db, dat, dbt = (cudalab.asarray(x) for x in (big_a, big_b, big_at, big_bt))
    cases = [
        # row-major, ld 150 @ row-major, ld 53
        (da[3:40, 1:130], db[1:130, 2:47], big_a[3:40, 1:130], big_b[1:130, 2:47]),
        # column-major, ld 61 @ row-major
        (dat.T[3:40, 5:128], db[1:124, 2:47], big_at.T[3:40, 5:128], big_b[1:124, 2:47]),
        # row-major @ column-major, ld 140
        (da[2:50, 3:33], dbt.T[1:31, 5:40], big_a[2:50, 3:33], big_bt.T[1:31, 5:40]),
    ]
    for va, vb, ha, hb in cases:
        before = allocations()
        out = cudalab.matmul(va, vb)
        assert allocations() - before == 1
        check(out, ha, hb, dtype)


@pytest.mark.parametrize("dtype", [F64, F32, F16], ids=dtype_id)
def test_general_strided_views_are_made_contiguous(rng, dtype):
    """Both strides > 1 (steps in both axes) cannot go to cuBLAS: copied first."""
    big_a = random_array(rng, (80, 90), dtype)
    big_b = random_array(rng, (100, 70), dtype)
    da, db = cudalab.asarray(big_a), cudalab.asarray(big_b)
    va, ha = da[::2, ::3], big_a[::2, ::3]  # (40, 30)
    vb, hb = db[1:91:3, ::2], big_b[1:91:3, ::2]  # (30, 35)
    check(cudalab.matmul(va, vb), ha, hb, dtype)
    check(cudalab.matmul(vb.T, va.T), hb.T, ha.T, dtype)


# ---------------------------------------------------------------- batched ----


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((7, 37, 20), (7, 20, 9)),
        ((7, 37, 20), (20, 9)),  # broadcast b
        ((37, 20), (5, 20, 9)),  # broadcast a
        ((1, 37, 20), (5, 20, 9)),  # extent-1 batch axis
        ((2, 3, 5, 4), (3, 4, 6)),
        ((3, 1, 4, 5), (2, 5, 6)),  # (3, 2) batch: no single stride, looped
        ((20, 1, 4, 5), (1, 20, 5, 3)),  # 400 batches: materialized
        ((0, 4, 5), (5, 3)),  # empty batch
    ],
    ids=lambda s: "x".join(map(str, s)),
)
def test_batched_and_broadcast(rng, dtype, sa, sb):
    a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
    out = cudalab.matmul(cudalab.asarray(a), cudalab.asarray(b))
    ref_shape = np.matmul(np.ones(sa), np.ones(sb)).shape
    assert out.shape == ref_shape
    if out.size:
        check(out, a, b, dtype)


@pytest.mark.parametrize("dtype", [F32, F16], ids=dtype_id)
def test_batched_transposed_views_are_not_copied(rng, warm, dtype):
    a = random_array(rng, (6, 21, 37), dtype)  # used as (6, 37, 21)
    b = random_array(rng, (6, 13, 21), dtype)  # used as (6, 21, 13)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    va, vb = da.transpose(0, 2, 1), db.transpose(0, 2, 1)
    ha, hb = a.transpose(0, 2, 1), b.transpose(0, 2, 1)
    before = allocations()
    out = cudalab.matmul(va, vb)
    assert allocations() - before == 1
    check(out, ha, hb, dtype)
    # A broadcast (stride-0) batch operand is not copied either.
    c = random_array(rng, (37, 21), dtype)
    dc = cudalab.asarray(c)
    before = allocations()
    out = cudalab.matmul(dc, vb)
    assert allocations() - before == 1
    check(out, c, hb, dtype)


def test_batch_of_views_with_gaps(rng):
    """A batch slice with a step keeps one constant batch stride."""
    a = random_array(rng, (10, 9, 12), F32)
    b = random_array(rng, (11, 12, 7), F32)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    check(cudalab.matmul(da[::3], db[1::3]), a[::3], b[1::3], F32)


# ----------------------------------------------------------- 1-D operands ----


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=dtype_id)
def test_vector_operands_follow_numpy(rng, dtype):
    m, k, n = 19, 33, 23
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    v, w = random_array(rng, (k,), dtype), random_array(rng, (k,), dtype)
    da, db, dv, dw = (cudalab.asarray(x) for x in (a, b, v, w))
    check(cudalab.matmul(dv, db), v, b, dtype)  # (n,)
    check(cudalab.matmul(da, dv), a, v, dtype)  # (m,)
    out = cudalab.matmul(dv, dw)  # 0-d
    assert out.shape == ()
    check(out, v, w, dtype)
    batched = random_array(rng, (4, m, k), dtype)
    check(cudalab.matmul(cudalab.asarray(batched), dv), batched, v, dtype)  # (4, m)
    # Strided vector views (step 2) need no copy either.
    big = random_array(rng, (2 * k,), dtype)
    dbig = cudalab.asarray(big)
    check(cudalab.matmul(dbig[::2], db), big[::2], b, dtype)
    check(cudalab.matmul(da, dbig[1::2]), a, big[1::2], dtype)


# ------------------------------------------------------------- degenerate ----


def test_empty_and_k0(rng):
    a = cudalab.asarray(random_array(rng, (0, 5), F32))
    b = cudalab.asarray(random_array(rng, (5, 3), F32))
    assert cudalab.matmul(a, b).shape == (0, 3)
    a = cudalab.asarray(np.empty((4, 0), dtype=np.float32))
    b = cudalab.asarray(np.empty((0, 3), dtype=np.float32))
    out = cudalab.matmul(a, b)
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(out.get(), np.zeros((4, 3), dtype=np.float32))
    # K = 0 into a pre-filled out: it must be overwritten with zeros.
    filled = cudalab.full((4, 3), 7.0, dtype=np.float32)
    cudalab.matmul(a, b, out=filled)
    np.testing.assert_array_equal(filled.get(), np.zeros((4, 3), dtype=np.float32))


# -------------------------------------------------------------------- out= ----


@pytest.mark.parametrize("dtype", [F32, BF16], ids=dtype_id)
def test_out_argument(rng, dtype):
    a, b = random_array(rng, (3, 37, 20), dtype), random_array(rng, (20, 9), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    out = cudalab.empty((3, 37, 9), dtype=dtype)
    before = allocations()
    got = cudalab.matmul(da, db, out=out)
    assert got is out
    assert allocations() == before
    check(out, a, b, dtype)


def test_out_overlapping_an_operand(rng):
    a, b = random_array(rng, (33, 33), F32), random_array(rng, (33, 33), F32)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    got = cudalab.matmul(da, db, out=da)
    assert got is da
    check(da, a, b, F32)
    db2 = cudalab.asarray(b)
    dc = cudalab.asarray(a)
    cudalab.matmul(dc, db2, out=db2)
    check(db2, a, b, F32)


def test_out_errors(rng):
    da = cudalab.asarray(random_array(rng, (5, 4), F32))
    db = cudalab.asarray(random_array(rng, (4, 3), F32))
    with pytest.raises(ValueError) as info:
        cudalab.matmul(da, db, out=cudalab.empty((3, 5), dtype=np.float32))
    assert str(info.value) == (
        "matmul() argument 'out': has shape (3, 5) but the result has shape (5, 3)"
    )
    with pytest.raises(ValueError, match=arg_error("matmul", "out") + r".*shape"):
        cudalab.matmul(da, db, out=cudalab.empty((1, 5, 3), dtype=np.float32))
    with pytest.raises(TypeError) as info:
        cudalab.matmul(da, db, out=cudalab.empty((5, 3), dtype=np.float64))
    assert str(info.value) == (
        "matmul() argument 'out': has dtype float64 but the result has dtype float32"
    )
    with pytest.raises(ValueError) as info:
        cudalab.matmul(da, db, out=cudalab.empty((3, 5), dtype=np.float32).T)
    assert str(info.value) == "matmul() argument 'out': must be C-contiguous"
    with pytest.raises(TypeError) as info:
        cudalab.matmul(da, db, out=np.empty((5, 3), dtype=np.float32))
    assert str(info.value) == (
        "matmul() argument 'out': expected a cudalab.DeviceArray or None, got numpy.ndarray "
        "(copy host data to the device with cudalab.asarray())"
    )
    # Shape before dtype: the first thing wrong with out= is reported.
    with pytest.raises(ValueError, match=arg_error("matmul", "out") + r".*shape"):
        cudalab.matmul(da, db, out=cudalab.empty((3, 5), dtype=np.float64))


# ------------------------------------------------------------ the operator ----


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_matmul_operator(rng, dtype):
    a, b = random_array(rng, (2, 17, 31), dtype), random_array(rng, (31, 11), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    out = da @ db
    check(out, a, b, dtype)
    assert out.get().tobytes() == cudalab.matmul(da, db).get().tobytes()
    x = da
    x @= db  # falls back to x = x @ db
    check(x, a, b, dtype)


def test_matmul_operator_with_numpy_is_type_error(rng):
    da = cudalab.asarray(random_array(rng, (3, 3), F32))
    with pytest.raises(TypeError):
        da @ np.ones((3, 3), dtype=np.float32)  # noqa: B018
    with pytest.raises(TypeError):
        np.ones((3, 3), dtype=np.float32) @ da  # noqa: B018


# ------------------------------------------------------ errors with arrays ----


def test_argument_errors(rng):
    f32 = cudalab.asarray(random_array(rng, (4, 5), F32))
    f32b = cudalab.asarray(random_array(rng, (5, 3), F32))
    f16 = cudalab.asarray(random_array(rng, (5, 3), F16))
    i32 = cudalab.asarray(np.arange(1, 21, dtype=np.int32).reshape(4, 5))
    boo = cudalab.asarray(np.ones((5, 3), dtype=np.bool_))
    with pytest.raises(TypeError, match=arg_error("matmul", "b") + r".*float16.*float32"):
        cudalab.matmul(f32, f16)
    with pytest.raises(TypeError, match=arg_error("matmul", "b")):
        f32 @ f16  # noqa: B018
    with pytest.raises(TypeError, match=arg_error("matmul", "a") + r".*int32"):
        cudalab.matmul(i32, f32b)
    with pytest.raises(TypeError, match=arg_error("matmul", "b") + r".*bool"):
        cudalab.matmul(f32, boo)
    with pytest.raises(TypeError) as info:
        cudalab.matmul(f32, np.ones((5, 3), dtype=np.float32))
    assert str(info.value) == (
        "matmul() argument 'b': expected a cudalab.DeviceArray, got numpy.ndarray "
        "(copy host data to the device with cudalab.asarray())"
    )
    with pytest.raises(ValueError, match=arg_error("matmul", "b") + r".*contracted"):
        cudalab.matmul(f32, f32)
    with pytest.raises(ValueError, match=arg_error("matmul", "b") + r".*broadcast"):
        cudalab.matmul(cudalab.asarray(random_array(rng, (2, 4, 5), F32)),
                       cudalab.asarray(random_array(rng, (3, 5, 3), F32)))
    scalar = cudalab.asarray(np.float32(2.0))
    with pytest.raises(ValueError, match=arg_error("matmul", "a")):
        cudalab.matmul(scalar, f32b)
    with pytest.raises(ValueError, match=arg_error("matmul", "b")):
        cudalab.matmul(f32, scalar)
    with pytest.raises(ValueError, match=arg_error("matmul", "precision")):
        cudalab.matmul(f32, f32b, precision="medium")


# ------------------------------------------------- profiler, CUDA graphs ----


@pytest.mark.parametrize(
    "sa,sb",
    [((3, 1, 37, 20), (4, 20, 9)), ((20,), (5, 20, 9)), ((37, 20), (20,))],
    ids=["broadcast", "vector_a", "vector_b"],
)
def test_profiler_record(rng, sa, sb):
    """FLOPs 2 M N K per matrix product; bytes: a, b and the result once each."""
    from cudalab.profiler import profile

    a, b = random_array(rng, sa, BF16), random_array(rng, sb, BF16)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    cudalab.matmul(da, db)  # warm-up: handle and plan
    with profile() as prof:
        out = cudalab.matmul(da, db)
    (e,) = [e for e in prof.events() if e.kind == "op"]
    m = sa[-2] if len(sa) > 1 else 1
    k = sa[-1]
    n = sb[-1] if len(sb) > 1 else 1
    batch = int(np.prod(out.shape)) // (m * n)
    assert e.name == "matmul" and e.dtype == "bfloat16"
    assert e.flops == 2 * m * n * k * batch
    assert e.bytes == da.nbytes + db.nbytes + out.nbytes
    assert e.input_shapes == (sa, sb) and e.output_shape == out.shape
    check(out, a, b, BF16)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_captured_in_a_cuda_graph(rng, warm, dtype):
    """After a warm-up, matmuls (cuBLASLt or cuBLAS; a looped batch and a
    transposed view) capture into a CUDA graph and replay on new values."""
    a, b = random_array(rng, (3, 1, 37, 20), dtype), random_array(rng, (2, 20, 9), dtype)
    a_t = random_array(rng, (20, 37), dtype)  # used as a_t.T
    da, db, dat = cudalab.asarray(a), cudalab.asarray(b), cudalab.asarray(a_t)
    cudalab.matmul(da, db), cudalab.matmul(dat.T, db)  # warm-up: plans
    cudalab.synchronize()
    g = cudalab.CUDAGraph()
    with cudalab.graph(g):
        y1 = cudalab.matmul(da, db)  # (3, 2) batch, no one stride: 3 calls
        y2 = cudalab.matmul(dat.T, db)
    g.replay()
    check(y1, a, b, dtype)
    check(y2, a_t.T, b, dtype)
    # New operand values in place; the replay reads them.
    da += cudalab.asarray(random_array(rng, a.shape, dtype))
    db += cudalab.asarray(random_array(rng, b.shape, dtype))
    dat += cudalab.asarray(random_array(rng, a_t.shape, dtype))
    a2, b2, a_t2 = da.get(), db.get(), dat.get()
    g.replay()
    check(y1, a2, b2, dtype)
    check(y2, a_t2.T, b2, dtype)


# --------------------------------------------------------------- handles ----


def test_workspace_is_allocated_once_per_thread(rng, warm):
    """Later products allocate only their outputs (the workspace is kept)."""
    da = cudalab.asarray(random_array(rng, (64, 48), F32))
    db = cudalab.asarray(random_array(rng, (48, 40), F32))
    before = allocations()
    outs = [cudalab.matmul(da, db) for _ in range(5)]
    assert allocations() - before == 5
    del outs
    gc.collect()


def test_matmul_from_another_thread(rng):
    """A new thread gets its own handles and workspace; both threads stay correct."""
    a, b = random_array(rng, (70, 50), F32), random_array(rng, (50, 30), F32)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    results = []
    run_in_threads(lambda i: results.append(cudalab.matmul(da, db).get()), 3)
    assert len(results) == 3
    for r in results:
        assert rel_err(r, ref_matmul(a, b)) < tolerance(F32)
    # The ended threads' handles are released by the next call, which still works.
    check(cudalab.matmul(da, db), a, b, F32)
    cudalab.synchronize()


# -------------------------------------------------------------- hypothesis ----


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 70),
    k=st.integers(1, 70),
    n=st.integers(1, 70),
    batch=st.sampled_from([(), (1,), (3,), (2, 3)]),
    ta=st.booleans(),
    tb=st.booleans(),
    step=st.sampled_from([1, 2]),
    dtype=st.sampled_from([F32, F16, F64]),
    pad=st.sampled_from(["auto", True, False]),
    seed=st.integers(0, 2**32 - 1),
)
def test_hypothesis_shapes_and_layouts(m, k, n, batch, ta, tb, step, dtype, pad, seed):
    rng = np.random.default_rng(seed)
    nb = len(batch)
    # a: (batch, m, k), stored transposed when ta; every other column when step == 2.
    a_store = random_array(rng, batch + ((k, m * step) if ta else (m, k * step)), dtype)
    b_store = random_array(rng, batch + ((n, k) if tb else (k, n)), dtype)
    da, db = cudalab.asarray(a_store), cudalab.asarray(b_store)
    idx = (slice(None),) * (nb + 1) + (slice(None, None, step),)
    va, ha = da[idx], a_store[idx]
    vb, hb = db, b_store
    perm = tuple(range(nb)) + (nb + 1, nb)
    if ta:
        va, ha = va.transpose(*perm), ha.transpose(perm)
    if tb:
        vb, hb = vb.transpose(*perm), hb.transpose(perm)
    check(cudalab.matmul(va, vb, pad=pad), ha, hb, dtype)


# -------------------------------------------------------------- padding ----
# Tensor-core products whose K or N is not a multiple of 16 bytes run on
# zero-padded copies. The padded path allocates its temporaries through the
# pool, so the allocation count shows whether it ran: one for the result,
# plus one per padded operand and one for a padded result (N padded).

HALF = [F16, BF16]


def count_allocations(fn) -> int:
    before = allocations()
    fn()
    cudalab.synchronize()
    return allocations() - before


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize(
    "mkn,padded_allocs",
    [
        ((37, 29, 13), 4),  # K and N misaligned: a, b and the result padded
        ((37, 29, 16), 3),  # K only: a and b padded, the GEMM writes the result
        ((40, 32, 13), 3),  # N only: a used as it is; b and the result padded
        ((40, 32, 16), 1),  # aligned: unchanged
        ((3, 8, 5), 3),  # a (3 x 8) is aligned already
    ],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_padding_runs_only_when_misaligned(rng, warm, dtype, mkn, padded_allocs):
    m, k, n = mkn
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    outs = {}
    for pad in (True, False):
        outs[pad] = cudalab.matmul(da, db, pad=pad)  # plans made
    assert count_allocations(lambda: cudalab.matmul(da, db, pad=True)) == padded_allocs
    assert count_allocations(lambda: cudalab.matmul(da, db, pad=False)) == 1
    # "auto" leaves products this small alone.
    assert count_allocations(lambda: cudalab.matmul(da, db, pad="auto")) == 1
    for out in outs.values():
        check(out, a, b, dtype)
    assert rel_err(outs[True], outs[False].get().astype(np.float64)) < 1e-2


@pytest.mark.parametrize("dtype", [F32, F64], ids=dtype_id)
def test_padding_leaves_non_tensor_core_dtypes_alone(rng, warm, restore_precision, dtype):
    a, b = random_array(rng, (37, 29), dtype), random_array(rng, (29, 13), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    cudalab.matmul(da, db, pad=True)
    assert count_allocations(lambda: check(cudalab.matmul(da, db, pad=True), a, b, dtype)) == 1
    if dtype == F32:
        # TF32 is a tensor-core product: padded (K 29 -> 32, N 13 -> 16).
        cudalab.matmul(da, db, pad=True, precision="high")
        n = count_allocations(
            lambda: check(cudalab.matmul(da, db, pad=True, precision="high"), a, b, F32,
                          tol=TF32_TOL))
        assert n == 4


def test_padding_leaves_vectors_alone(rng, warm):
    a, b = random_array(rng, (29,), F16), random_array(rng, (29, 13), F16)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    cudalab.matmul(da, db, pad=True)
    assert count_allocations(lambda: check(cudalab.matmul(da, db, pad=True), a, b, F16)) == 1
    assert count_allocations(lambda: check(cudalab.matmul(db.T, da, pad=True), b.T, a, F16)) == 1


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("pad", ["auto", True, False])
def test_padding_odd_large_matches_float64(rng, dtype, pad):
    """1023 x 1025 @ 1025 x 1027 (M, K, N): all odd; fp32 accumulation keeps
    the error at the level of the inputs' rounding."""
    m, k, n = 1023, 1025, 1027
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    out = cudalab.matmul(cudalab.asarray(a), cudalab.asarray(b), pad=pad)
    check(out, a, b, dtype, tol=5e-3)


def test_auto_pads_large_misaligned_products(rng, warm, restore_padding):
    """Above the documented size (M, N, K >= 256, M N K >= 2**30) "auto" pads;
    set_matmul_padding changes what `pad=None` and the @ operator do."""
    m, k, n = 1031, 1029, 1027
    a, b = random_array(rng, (m, k), F16), random_array(rng, (k, n), F16)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    cudalab.matmul(da, db, pad=True)
    cudalab.matmul(da, db, pad=False)
    assert count_allocations(lambda: check(cudalab.matmul(da, db), a, b, F16)) == 4
    cudalab.set_matmul_padding(False)
    assert count_allocations(lambda: check(da @ db, a, b, F16)) == 1
    cudalab.set_matmul_padding(True)
    assert count_allocations(lambda: check(da @ db, a, b, F16)) == 4
    assert count_allocations(lambda: check(cudalab.matmul(da, db, pad=False), a, b, F16)) == 1


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 37, 29), (3, 29, 13)),
        ((3, 37, 29), (29, 13)),  # b broadcast: padded once, at its own shape
        ((1, 37, 29), (4, 29, 13)),
        ((2, 1, 37, 29), (3, 29, 13)),
    ],
    ids=["batched", "b_broadcast", "a_broadcast", "two_axes"],
)
def test_padding_batched(rng, dtype, sa, sb):
    a, b = random_array(rng, sa, dtype), random_array(rng, sb, dtype)
    check(cudalab.matmul(cudalab.asarray(a), cudalab.asarray(b), pad=True), a, b, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_padding_transposed_and_strided_views(rng, dtype, ta, tb):
    """Column-major views are made contiguous, then padded; row-major views
    with a leading dimension are padded straight from their rows; batched
    and single matrices of them."""
    m, k, n = 37, 29, 13
    a_store = random_array(rng, (2, k, m) if ta else (2, m, k + 5), dtype)
    b_store = random_array(rng, (2, n, k) if tb else (2, k, n + 3), dtype)
    da, db = cudalab.asarray(a_store), cudalab.asarray(b_store)
    if ta:
        va, ha = da.transpose(0, 2, 1), a_store.transpose(0, 2, 1)
    else:
        va, ha = da[:, :, :k], a_store[:, :, :k]
    if tb:
        vb, hb = db.transpose(0, 2, 1), b_store.transpose(0, 2, 1)
    else:
        vb, hb = db[:, :, :n], b_store[:, :, :n]
    check(cudalab.matmul(va, vb, pad=True), ha, hb, dtype)
    check(cudalab.matmul(va[1], vb[0], pad=True), ha[1], hb[0], dtype)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_padding_general_strided_operand(rng, dtype):
    a_store = random_array(rng, (37, 58), dtype)
    b = random_array(rng, (29, 13), dtype)
    va, ha = cudalab.asarray(a_store)[:, ::2], a_store[:, ::2]
    check(cudalab.matmul(va, cudalab.asarray(b), pad=True), ha, b, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
def test_padding_with_out(rng, warm, dtype):
    a, b = random_array(rng, (2, 37, 29), dtype), random_array(rng, (29, 13), dtype)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    out = cudalab.empty((2, 37, 13), dtype=dtype)
    assert cudalab.matmul(da, db, out=out, pad=True) is out
    check(out, a, b, dtype)
    # the padded temporaries only: a, b and the padded result
    assert count_allocations(lambda: cudalab.matmul(da, db, out=out, pad=True)) == 3
    check(out, a, b, dtype)


def test_padding_with_out_overlapping_an_operand(rng):
    a, b = random_array(rng, (33, 33), F16), random_array(rng, (33, 33), F16)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    assert cudalab.matmul(da, db, out=da, pad=True) is da
    check(da, a, b, F16)
    dc = cudalab.asarray(a)
    cudalab.matmul(dc, db, out=db, pad=True)
    check(db, a, b, F16)


def test_padding_profiler_reports_logical_flops(rng):
    from cudalab.profiler import profile

    a, b = random_array(rng, (3, 37, 29), F16), random_array(rng, (29, 13), F16)
    da, db = cudalab.asarray(a), cudalab.asarray(b)
    cudalab.matmul(da, db, pad=True)
    with profile() as prof:
        out = cudalab.matmul(da, db, pad=True)
    (e,) = [e for e in prof.events() if e.kind == "op"]
    assert e.name == "matmul" and e.dtype == "float16"
    assert e.flops == 2 * 37 * 13 * 29 * 3
    assert e.bytes == da.nbytes + db.nbytes + out.nbytes
    assert e.output_shape == (3, 37, 13)
    check(out, a, b, F16)
