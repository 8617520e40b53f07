"""GPU tier: the fused softmax cross-entropy (_core._nn_cross_entropy) and the
activation gradients (relu_grad, gelu_grad) against float64 NumPy references.

Cross-entropy: random odd sizes around the kernels' limits (a warp per row up
to C = 1024 classes, a block per row beyond; vector loads only when every row
is aligned), every logits dtype, int32 and int64 labels, 'mean'/'sum'/'none',
a device-side loss scale, large logits (stability), ignored and out-of-range
labels, strided rows and labels, grad written over the logits, out=, a
non-default stream, CUDA-graph capture and replay, bit-reproducibility, a
finite-difference check of the gradient, PyTorch's F.cross_entropy and its
autograd gradient when torch is installed, and the argument errors that need
an array.

Tolerances (tests/_support.py): the loss is computed in float32 from the
logits' exact values, so it gets float32's; the gradient is rounded to the
logits' dtype and gets that dtype's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import cudalab
from _support import (BF16, F16, F32, F64, FLOAT_DTYPES, FLOAT_IDS, assert_arg_error,
                      assert_bit_equal, assert_close, erf, random_array, tolerance, widen)

pytestmark = pytest.mark.gpu

ce = cudalab._core._nn_cross_entropy
FUNC = "_nn_cross_entropy"
LOGIT_DTYPES = [F32, F16, BF16]
LOGIT_IDS = [d.name for d in LOGIT_DTYPES]
ROWS = [1, 37, 1000]
COLS = [2, 10, 1000, 1025, 32000]


# ---- the reference -------------------------------------------------------------------


def reference(x, labels, reduction="mean", *, scale=1.0, ignore_index=-100):
    """(loss, grad) in float64: loss a float ('mean', 'sum') or (N,) array ('none');
    grad of the (scaled) reduced loss. Out-of-range labels give NaN rows."""
    x = widen(x)
    labels = np.asarray(labels, dtype=np.int64)
    n, c = x.shape
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1, keepdims=True)) + m
    ignored = labels == ignore_index if ignore_index is not None else np.zeros(n, bool)
    bad = ~ignored & ((labels < 0) | (labels >= c))
    safe = np.where(ignored | bad, 0, labels)
    rows = np.arange(n)
    losses = lse[:, 0] - x[rows, safe]
    losses[ignored] = 0.0
    losses[bad] = np.nan
    grad = np.exp(x - lse)
    grad[rows, safe] -= 1.0
    counted = int((~ignored).sum())
    g = 1.0 / counted if reduction == "mean" and counted else 1.0
    if reduction == "mean" and not counted:
        g = np.inf
    grad *= g * scale
    grad[ignored] = 0.0
    grad[bad] = np.nan
    if reduction == "none":
        return losses, grad
    total = losses.sum()
    return (total / counted if counted else np.nan) if reduction == "mean" else total, grad


def make_case(rng, n, c, dtype, *, magnitude=None, label_dtype=np.int64):
    if magnitude is None:
        x = random_array(rng, (n, c), dtype)
    else:
        x = random_array(rng, (n, c), np.float64, low=-magnitude, high=magnitude).astype(dtype)
    labels = rng.integers(0, c, size=n).astype(label_dtype)
    return x, labels


def run(x, labels, reduction="mean", *, with_grad=True, **kw):
    """(loss host array, grad host array or None) from the device."""
    dx, dy = cudalab.asarray(x), cudalab.asarray(labels)
    grad = cudalab.empty(x.shape, x.dtype) if with_grad else None
    loss = ce(dx, dy, grad, reduction, **kw)
    assert loss.dtype == np.float32
    assert loss.shape == ((x.shape[0],) if reduction == "none" else ())
    return loss.get(), (grad.get() if with_grad else None)


def check(loss, grad, x, labels, reduction, dtype, **kw):
    want_loss, want_grad = reference(x, labels, reduction, **kw)
    assert_close(np.asarray(loss, np.float64), np.asarray(want_loss), tol=tolerance(F32))
    if grad is not None:
        assert grad.dtype == dtype
        assert_close(grad, want_grad, dtype)


# ---- against NumPy -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=LOGIT_IDS)
@pytest.mark.parametrize("c", COLS)
@pytest.mark.parametrize("n", ROWS)
def test_matches_numpy(rng, n, c, dtype):
    label_dtype = np.int32 if (n + c) % 2 else np.int64
    x, labels = make_case(rng, n, c, dtype, label_dtype=label_dtype)
    for reduction in ("mean", "sum", "none"):
        loss, grad = run(x, labels, reduction)
        check(loss, grad, x, labels, reduction, dtype)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=LOGIT_IDS)
@pytest.mark.parametrize("c", [10, 1000, 1025, 32000])
def test_forward_only(rng, c, dtype):
    x, labels = make_case(rng, 37, c, dtype)
    for reduction in ("mean", "sum", "none"):
        loss, _ = run(x, labels, reduction, with_grad=False)
        check(loss, None, x, labels, reduction, dtype)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=LOGIT_IDS)
@pytest.mark.parametrize("c", [10, 1025, 32000])
def test_large_logits_are_stable(rng, c, dtype):
    magnitude = 3e4 if dtype == F16 else 1e6  # float16 stops at 65504
    x, labels = make_case(rng, 37, c, dtype, magnitude=magnitude)
    loss, grad = run(x, labels, "sum")
    assert np.isfinite(loss).all() and np.isfinite(grad.astype(np.float64)).all()
    check(loss, grad, x, labels, "sum", dtype)


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=LOGIT_IDS)
@pytest.mark.parametrize("c", [10, 1025])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_scale(rng, c, dtype, reduction):
    x, labels = make_case(rng, 37, c, dtype)
    scale = np.array([1024.0], np.float32)
    loss, grad = run(x, labels, reduction, loss_scale=cudalab.asarray(scale))
    check(loss, grad, x, labels, reduction, dtype, scale=1024.0)  # the loss is not scaled
    # A 0-d scale works too, and is read on the device when the kernel runs.
    s = cudalab.full((), 0.5, np.float32)
    loss, grad = run(x, labels, reduction, loss_scale=s)
    check(loss, grad, x, labels, reduction, dtype, scale=0.5)


def test_gradient_matches_finite_differences(rng):
    """Central differences of the float64 loss against the float32 kernel's gradient."""
    x, labels = make_case(rng, 3, 5, F32)
    for reduction in ("mean", "sum"):
        _, grad = run(x, labels, reduction)
        base = widen(x)
        fd = np.empty_like(base)
        h = 1e-6
        for idx in np.ndindex(base.shape):
            up, down = base.copy(), base.copy()
            up[idx] += h
            down[idx] -= h
            fd[idx] = (reference(up, labels, reduction)[0] -
                       reference(down, labels, reduction)[0]) / (2 * h)
        assert_close(grad, fd, F32)


# ---- labels: ignored, out of range ------------------------------------------------------


@pytest.mark.parametrize("c", [10, 1025])
def test_ignore_index(rng, c):
    x, labels = make_case(rng, 37, c, F32)
    labels[::3] = -100
    for reduction in ("mean", "sum", "none"):
        loss, grad = run(x, labels, reduction)
        check(loss, grad, x, labels, reduction, F32)
        assert (grad[::3] == 0).all()
    labels[::3] = 3  # another ignore_index, inside [0, C)
    loss, grad = run(x, labels, "mean", ignore_index=3)
    check(loss, grad, x, labels, "mean", F32, ignore_index=3)


@pytest.mark.parametrize("c", [10, 1025])
def test_every_row_ignored(rng, c):
    x, labels = make_case(rng, 7, c, F32)
    labels[:] = -100
    loss, grad = run(x, labels, "mean")
    assert np.isnan(loss)  # torch: the mean over no rows is NaN
    assert (grad == 0).all()
    loss, grad = run(x, labels, "sum")
    assert loss == 0 and (grad == 0).all()


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("c", [10, 1025])
def test_out_of_range_labels_give_nan_rows(rng, c, label_dtype):
    x, labels = make_case(rng, 37, c, F32, label_dtype=label_dtype)
    labels[[1, 4, 9]] = [c, -1, np.iinfo(label_dtype).max]
    losses, grad = run(x, labels, "none")
    bad = np.zeros(37, bool)
    bad[[1, 4, 9]] = True
    assert np.isnan(losses[bad]).all() and np.isnan(grad[bad]).all()
    check(losses, grad, x, labels, "none", F32)
    loss, _ = run(x, labels, "mean")
    assert np.isnan(loss)
    # ignore_index=None: -100 is out of range like any other negative label.
    labels[1] = -100
    losses, _ = run(x, labels, "none", ignore_index=None)
    assert np.isnan(losses[1])


def test_zero_rows():
    x = np.ones((0, 5), np.float32)
    labels = np.zeros(0, np.int64)
    loss, grad = run(x, labels, "mean")
    assert np.isnan(loss) and grad.shape == (0, 5)
    assert run(x, labels, "sum")[0] == 0
    assert run(x, labels, "none")[0].shape == (0,)


# ---- layouts, out=, in place --------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=LOGIT_IDS)
@pytest.mark.parametrize("c", [9, 1000, 1031])
def test_strided_rows_and_labels(rng, c, dtype):
    """Rows of a wider array (not 16-byte aligned: the scalar-load path), every other label."""
    wide = random_array(rng, (37, c + 3), dtype)
    all_labels = rng.integers(0, c, size=74).astype(np.int64)
    x = cudalab.asarray(wide)[:, 1:c + 1]
    y = cudalab.asarray(all_labels)[::2]
    grad_buf = cudalab.zeros((37, c + 5), dtype)
    grad = grad_buf[:, 2:c + 2]
    loss = ce(x, y, grad, "sum")
    check(loss.get(), grad.get(), wide[:, 1:c + 1], all_labels[::2], "sum", dtype)
    untouched = grad_buf.get()
    assert (untouched[:, :2] == 0).all() and (untouched[:, c + 2:] == 0).all()
    # Every other row (a row stride of two rows).
    loss = ce(x[::2], y[::2], grad[::2], "mean")
    check(loss.get(), grad.get()[::2], wide[::2, 1:c + 1], all_labels[::4], "mean", dtype)


@pytest.mark.parametrize("c", [10, 1025])
def test_grad_over_logits(rng, c):
    x, labels = make_case(rng, 37, c, F32)
    dx = cudalab.asarray(x)
    loss = ce(dx, cudalab.asarray(labels), dx, "mean")
    check(loss.get(), dx.get(), x, labels, "mean", F32)


def test_out(rng):
    x, labels = make_case(rng, 37, 100, F32)
    dx, dy = cudalab.asarray(x), cudalab.asarray(labels)
    for shape in [(), (1,), (1, 1)]:
        out = cudalab.zeros(shape, np.float32)
        assert ce(dx, dy, out=out) is out
        check(out.get().reshape(()), None, x, labels, "mean", F32)
    buf = cudalab.zeros(74, np.float32)
    out = buf[1::2]
    assert ce(dx, dy, reduction="none", out=out) is out
    check(out.get(), None, x, labels, "none", F32)
    assert (buf.get()[::2] == 0).all()  # strided: only every other element written


def test_bit_reproducible(rng):
    x, labels = make_case(rng, 1000, 1025, F32)
    first = run(x, labels, "mean")
    for _ in range(3):
        again = run(x, labels, "mean")
        assert_bit_equal(again[0], first[0])
        assert_bit_equal(again[1], first[1])


# ---- streams and graphs ---------------------------------------------------------------------


def test_non_default_stream(rng):
    x, labels = make_case(rng, 1000, 1025, F16)
    dx, dy = cudalab.asarray(x), cudalab.asarray(labels)
    s = cudalab.Stream()
    s.wait_stream(cudalab.current_stream())
    with s:
        grad = cudalab.empty(x.shape, x.dtype)
        loss = ce(dx, dy, grad, "mean", cudalab.full((), 8.0, np.float32))
        got_loss, got_grad = loss.get(), grad.get()
    check(got_loss, got_grad, x, labels, "mean", F16, scale=8.0)


@pytest.mark.parametrize("keep", [False, True], ids=["temporaries_freed", "temporaries_kept"])
def test_graph_capture_and_replay(rng, keep):
    # The reduced loss's scratch (rows + 1 floats: the last is the count of
    # rows not ignored) dies inside the capture; the 'none' loss made after
    # it may get its address (see CUDAGraph's keep_temporaries).
    x, labels = make_case(rng, 37, 1025, BF16)
    dx, dy = cudalab.asarray(x), cudalab.asarray(labels)
    grad = cudalab.empty(x.shape, x.dtype)
    scale = cudalab.full((1,), 4.0, np.float32)
    out = cudalab.zeros((), np.float32)
    g = cudalab.CUDAGraph(keep_temporaries=keep)
    with cudalab.graph(g):
        ce(dx, dy, grad, "mean", scale, out)
        losses = ce(dx, dy, reduction="none")
    g.replay()
    check(out.get(), grad.get(), x, labels, "mean", BF16, scale=4.0)
    check(losses.get(), None, x, labels, "none", BF16)
    # New logits, labels and scale in the same buffers: the replay recomputes.
    x2, labels2 = make_case(rng, 37, 1025, BF16)
    cudalab.add(cudalab.asarray(x2), 0, out=dx)  # copies in place (x + 0 is exact)
    cudalab.add(cudalab.asarray(labels2), 0, out=dy)
    scale *= 0.5
    g.replay()
    check(out.get(), grad.get(), x2, labels2, "mean", BF16, scale=2.0)
    check(losses.get(), None, x2, labels2, "none", BF16)
    del losses
    g.reset()


# ---- PyTorch ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LOGIT_DTYPES, ids=LOGIT_IDS)
@pytest.mark.parametrize("c", [10, 1025, 32000])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_torch(rng, c, dtype, reduction):
    torch = pytest.importorskip("torch")
    x, labels = make_case(rng, 37, c, dtype)
    labels[::5] = -100
    t = torch.tensor(widen(x).astype(np.float32), requires_grad=True)
    want = torch.nn.functional.cross_entropy(t, torch.tensor(labels), reduction=reduction)
    want.backward(torch.ones_like(want))
    loss, grad = run(x, labels, reduction)
    assert_close(np.asarray(loss, np.float64), want.detach().double().numpy(), tol=tolerance(F32))
    assert_close(grad, t.grad.double().numpy(), dtype)


# ---- argument errors that need an array -----------------------------------------------------


def test_array_argument_errors(rng):
    x = cudalab.asarray(random_array(rng, (5, 5), F32))
    y = cudalab.asarray(np.arange(5, dtype=np.int64))
    with assert_arg_error(TypeError, FUNC, "logits", "float16, bfloat16 or float32.*float64"):
        ce(x.astype(np.float64), y)
    with assert_arg_error(ValueError, FUNC, "logits", r"shape \(N, C\)"):
        ce(x[0], y)
    with assert_arg_error(ValueError, FUNC, "logits", r"C >= 1"):
        ce(x[:, :0], y)
    with assert_arg_error(ValueError, FUNC, "logits", "row must be contiguous"):
        ce(x.T, y)
    with assert_arg_error(TypeError, FUNC, "labels", "int32 or int64.*float32"):
        ce(x, x[0])
    with assert_arg_error(TypeError, FUNC, "labels", "int32 or int64.*int8"):
        ce(x, y.astype(np.int8))
    with assert_arg_error(ValueError, FUNC, "labels", r"shape \(5,\)"):
        ce(x, y[:4])
    with assert_arg_error(ValueError, FUNC, "labels", r"shape \(5,\)"):
        ce(x, cudalab.zeros((5, 1), np.int64))


def test_grad_errors(rng):
    x = cudalab.asarray(random_array(rng, (5, 6), F32))
    y = cudalab.asarray(np.arange(5, dtype=np.int64))
    with assert_arg_error(TypeError, FUNC, "grad", "float16 but logits have dtype float32"):
        ce(x, y, cudalab.empty((5, 6), np.float16))
    with assert_arg_error(ValueError, FUNC, "grad", r"shape \(6, 5\) but logits"):
        ce(x, y, cudalab.empty((6, 5), np.float32))
    with assert_arg_error(ValueError, FUNC, "grad", "row must be contiguous"):
        ce(x, y, cudalab.empty((6, 5), np.float32).T)
    buf = cudalab.zeros(40, np.float32)
    rows_4_apart = cudalab.asarray(_StridedView(buf, (5, 6), (16, 4)))  # a zero-copy view
    with assert_arg_error(ValueError, FUNC, "grad", "must not overlap"):
        ce(x, y, rows_4_apart)


class _StridedView:
    """Any strides over `owner`'s memory, through the CUDA Array Interface
    (cudalab's indexing cannot make rows that overlap)."""

    def __init__(self, owner, shape, strides):
        self.owner = owner
        cai = dict(owner.__cuda_array_interface__)
        cai.update(shape=shape, strides=strides)
        self.__cuda_array_interface__ = cai


def test_loss_scale_and_out_errors(rng):
    x = cudalab.asarray(random_array(rng, (5, 5), F32))
    y = cudalab.asarray(np.arange(5, dtype=np.int64))
    with assert_arg_error(TypeError, FUNC, "loss_scale", "float32 array of one element.*float16"):
        ce(x, y, loss_scale=cudalab.ones((1,), np.float16))
    with assert_arg_error(ValueError, FUNC, "loss_scale", "one element.*2 elements"):
        ce(x, y, loss_scale=cudalab.zeros(2, np.float32))
    with assert_arg_error(ValueError, FUNC, "out", r"one element.*\(2,\)"):
        ce(x, y, out=cudalab.zeros(2, np.float32))
    with assert_arg_error(TypeError, FUNC, "out", "float64 but the result has dtype float32"):
        ce(x, y, out=cudalab.zeros((), np.float64))
    with assert_arg_error(ValueError, FUNC, "out", r"shape \(\) but the result has shape \(5,\)"):
        ce(x, y, reduction="none", out=cudalab.zeros((), np.float32))
    with assert_arg_error(TypeError, FUNC, "out", "float16 but the result"):
        ce(x, y, reduction="none", out=cudalab.zeros(5, np.float16))


def test_overlap_errors(rng):
    x = cudalab.asarray(random_array(rng, (5, 5), F32))
    y = cudalab.asarray(np.arange(5, dtype=np.int64))
    with assert_arg_error(ValueError, FUNC, "out", "shares memory with 'logits'"):
        ce(x, y, reduction="none", out=x[0])
    buf = cudalab.asarray(random_array(rng, (6, 5), F32))
    with assert_arg_error(ValueError, FUNC, "grad", "shares memory with 'logits'.*grad=logits"):
        ce(buf[:5], y, buf[1:])
    grad = cudalab.empty((5, 5), np.float32)
    with assert_arg_error(ValueError, FUNC, "out", "shares memory with 'grad'"):
        ce(x, y, grad, reduction="none", out=grad[0])
    with assert_arg_error(ValueError, FUNC, "grad", "shares memory with 'loss_scale'"):
        ce(x, y, grad, loss_scale=grad[0, 0])


# ---- relu_grad, gelu_grad ---------------------------------------------------------------------


def gelu_slope(x, approximate):
    """d/dx gelu(x) in float64."""
    x = np.asarray(x, np.float64)
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    return 0.5 * (1 + erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad(rng, dtype, approximate):
    g = random_array(rng, (37, 129), dtype)
    x = random_array(rng, (37, 129), dtype, low=-6, high=6)
    dg, dx = cudalab.asarray(g), cudalab.asarray(x)
    got = cudalab.gelu_grad(dg, dx, approximate=approximate)
    assert_close(got, widen(g) * gelu_slope(widen(x), approximate), dtype)
    # Stepped and transposed views, out= over grad.
    got = cudalab.gelu_grad(dg[::2].T, dx[::2].T, approximate)
    want = (widen(g)[::2] * gelu_slope(widen(x)[::2], approximate)).T
    assert_close(got, want, dtype)
    cudalab.gelu_grad(dg, dx, approximate, out=dg)
    assert_close(dg, widen(g) * gelu_slope(widen(x), approximate), dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
def test_gelu_grad_matches_torch(rng, approximate, dtype):
    torch = pytest.importorskip("torch")
    g = random_array(rng, 1001, dtype)
    x = random_array(rng, 1001, dtype, low=-8, high=8)
    want = torch.ops.aten.gelu_backward(torch.tensor(g), torch.tensor(x),
                                        approximate=approximate).numpy()
    got = cudalab.gelu_grad(cudalab.asarray(g), cudalab.asarray(x), approximate=approximate)
    assert_close(got, widen(want), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [np.dtype(np.int32), np.dtype(np.int8)],
                         ids=FLOAT_IDS + ["int32", "int8"])
def test_relu_grad(rng, dtype):
    g = random_array(rng, (33, 65), dtype)
    x = random_array(rng, (33, 65), dtype)
    x[::7, ::3] = 0  # threshold_backward: 0 at x == 0
    dg, dx = cudalab.asarray(g), cudalab.asarray(x)
    want = np.where(widen(x) > 0, widen(g), 0)
    assert_close(cudalab.relu_grad(dg, dx), want, dtype, tol=0)
    assert_close(cudalab.relu_grad(dg.T[::3], dx.T[::3]), want.T[::3], dtype, tol=0)
    # Broadcasting and a scalar grad: the derivative mask itself.
    assert_close(cudalab.relu_grad(1, dx), np.where(widen(x) > 0, 1, 0), dtype, tol=0)


def test_relu_grad_nan_and_torch(rng):
    x = np.array([np.nan, -1.0, 0.0, -0.0, 2.0, np.inf, -np.inf], np.float32)
    g = np.full(7, 3.0, np.float32)
    got = cudalab.relu_grad(cudalab.asarray(g), cudalab.asarray(x)).get()
    np.testing.assert_array_equal(got, [3.0, 0, 0, 0, 3.0, 3.0, 0])  # NaN is not <= 0
    torch = pytest.importorskip("torch")
    want = torch.ops.aten.threshold_backward(torch.tensor(g), torch.tensor(x), 0).numpy()
    np.testing.assert_array_equal(got, want)
