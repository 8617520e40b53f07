"""GPU tier: the nn Linear GEMMs on cuBLASLt with fused epilogues.

Every function and epilogue against NumPy float64 (and torch's definitions on
the CPU in float64, when torch is installed): forward with and without bias,
ReLU / GELU (the tanh form), the aux outputs (GELU's pre-activation, ReLU's bit
mask and its documented layout), the input gradient with DRELU / DGELU and
their bias gradients, the weight gradient with BGRADB and accumulation, a
two-layer chain with GELU between the layers, leading batch axes, row-strided
views, out=, a non-default stream and CUDA graph capture. Sizes are odd
(N = 37 rows); the feature counts 72 and 40 are multiples of 8 (16-byte rows
in every dtype), and 73 / 41 check what cuBLASLt does with misaligned ones
(a correct result, or the documented "offers no algorithm" error).

Tolerances: relative L2 error, tests/_support.py's per dtype, and 1e-3 for
float32 under precision 'high' (TF32). The ReLU decisions and masks are
compared only where the float64 pre-activation is clear of zero by more than
the product's rounding (MARGIN), since the device may round the other way
there; the fused bias gradients are also checked against the sum of the
device's own gradient.

The argument checks that need real DeviceArrays (dtypes, shapes, layouts,
aux, overlaps) are here too; those that need none are in the CPU tier.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import (
    BF16,
    F16,
    F32,
    F64,
    assert_arg_error,
    gelu_reference,
    random_array,
    rel_err,
    tolerance,
    widen,
)

import cudalab
from cudalab import _core

pytestmark = pytest.mark.gpu

N, IN, OUT = 37, 72, 40          # aligned features (multiples of 8)
IN_ODD, OUT_ODD = 73, 41         # misaligned features
TF32_TOL = 1e-3
U8 = np.dtype(np.uint8)

# (dtype, precision): float32 in true fp32 and in TF32, the half types.
CASES = [(F32, "highest"), (F32, "high"), (F16, None), (BF16, None)]
CASE_IDS = ["float32", "tf32", "float16", "bfloat16"]

linear = _core._nn_linear
backward_input = _core._nn_linear_backward_input
backward_weight = _core._nn_linear_backward_weight


# ---- references and data -------------------------------------------------------------------


def tol(dtype, precision=None) -> float:
    return TF32_TOL if precision == "high" else tolerance(dtype)


def mask_bytes(features: int) -> int:
    return (features + 127) // 128 * 16


def dgelu_tanh(z):
    """The derivative of GELU's tanh form, in float64."""
    z = np.asarray(z, dtype=np.float64)
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (z + 0.044715 * z**3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * z * z)


def act_ref(z, act):
    if act == "relu":
        return np.maximum(z, 0.0)
    if act == "gelu":
        return gelu_reference(z, "tanh")
    return z


def margin(precision, scale) -> float:
    """|pre-activation| below which the device's sign may differ from float64's."""
    return (0.05 if precision == "high" else 1e-5) * scale


def make(rng, shape, dtype, scale=1.0):
    """(host, device): random values (never zero) of `dtype`, times `scale`."""
    host = (random_array(rng, shape, F64) * scale).astype(dtype)
    return host, cudalab.asarray(host)


def layer(rng, dtype, n_in, n_out, rows=N):
    """x (rows, n_in), weight (n_out, n_in) scaled by 1/sqrt(n_in), bias (n_out,)."""
    return (make(rng, (rows, n_in), dtype), make(rng, (n_out, n_in), dtype, 1 / math.sqrt(n_in)),
            make(rng, (n_out,), dtype))


def unpack_mask(mask, features):
    """The documented ReLU mask layout: bit f % 8 of byte f // 8 of each row."""
    bits = np.unpackbits(mask.get(), axis=-1, bitorder="little")
    return bits[..., :features].astype(bool)


def assert_near(got, want, dtype, precision=None, *, factor=1.0):
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    err = rel_err(widen(got), want)
    bound = factor * tol(dtype, precision)
    assert err < bound, f"relative error {err:.3g} >= {bound:g} ({np.dtype(dtype).name})"


def unsupported_or(call):
    """call() or a skip naming cuBLASLt's refusal (the documented error)."""
    try:
        return call()
    except cudalab.CudalabError as exc:
        if "offers no algorithm" not in str(exc):
            raise
        pytest.skip(f"cuBLASLt refuses: {exc}")


@pytest.fixture
def warm(rng):
    """One product first, so this thread's handle and workspace exist."""
    x = cudalab.asarray(random_array(rng, (8, 8), F32))
    linear(x, x)
    cudalab.synchronize()


# ---- forward -----------------------------------------------------------------------------------


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_forward(rng, dtype, precision, with_bias, act):
    """Epilogues DEFAULT / BIAS, RELU / RELU_BIAS, GELU / GELU_BIAS."""
    (x, dx), (w, dw), (b, db) = layer(rng, dtype, IN, OUT)
    y = linear(dx, dw, db if with_bias else None, activation=act, precision=precision)
    assert y.shape == (N, OUT) and y.is_contiguous
    pre = widen(x) @ widen(w).T + (widen(b) if with_bias else 0.0)
    assert_near(y, act_ref(pre, act), dtype, precision)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_forward_gelu_aux(rng, dtype, precision, with_bias):
    """GELU_AUX(_BIAS): aux receives the pre-activation, y = gelu(aux)."""
    (x, dx), (w, dw), (b, db) = layer(rng, dtype, IN, OUT)
    aux = cudalab.full((N, OUT), 7.0, dtype=dtype)
    y = linear(dx, dw, db if with_bias else None, activation="gelu", aux=aux,
               precision=precision)
    pre = widen(x) @ widen(w).T + (widen(b) if with_bias else 0.0)
    assert_near(aux, pre, dtype, precision)
    assert_near(y, gelu_reference(pre, "tanh"), dtype, precision)
    assert_near(y, gelu_reference(widen(aux), "tanh"), dtype, precision)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_forward_relu_mask(rng, dtype, precision, with_bias):
    """RELU_AUX(_BIAS): the mask is uint8 (N, 16), bit f % 8 of byte f // 8 set
    where the pre-activation at feature f is positive."""
    (x, dx), (w, dw), (b, db) = layer(rng, dtype, IN, OUT)
    mask = cudalab.zeros((N, mask_bytes(OUT)), dtype=U8)
    y = linear(dx, dw, db if with_bias else None, activation="relu", aux=mask,
               precision=precision)
    pre = widen(x) @ widen(w).T + (widen(b) if with_bias else 0.0)
    assert_near(y, np.maximum(pre, 0.0), dtype, precision)
    clear = np.abs(pre) > margin(precision, pre.std())
    np.testing.assert_array_equal(unpack_mask(mask, OUT)[clear], (pre > 0)[clear])


def test_forward_relu_mask_wide(rng):
    """out = 200 features: a mask of 2 x 128 bits = 32 bytes per row."""
    (x, dx), (w, dw), (b, db) = layer(rng, F32, 24, 200)
    mask = cudalab.zeros((N, 32), dtype=U8)
    linear(dx, dw, db, activation="relu", aux=mask)
    pre = widen(x) @ widen(w).T + widen(b)
    clear = np.abs(pre) > margin("highest", pre.std())
    np.testing.assert_array_equal(unpack_mask(mask, 200)[clear], (pre > 0)[clear])


@pytest.mark.parametrize("act", [None, "gelu"])
def test_forward_leading_axes_and_views(rng, act):
    """x (3, 5, in) gives y (3, 5, out); x and out as row views of wider buffers."""
    (x, dx), (w, dw), (b, db) = layer(rng, F32, IN, OUT, rows=15)
    x3 = dx.reshape((3, 5, IN))
    y = linear(x3, dw, db, activation=act)
    ref = act_ref(widen(x) @ widen(w).T + widen(b), act)
    assert y.shape == (3, 5, OUT)
    assert_near(y, ref.reshape(3, 5, OUT), F32)
    root_host, root = make(rng, (15, IN + 8), F32)
    out_root = cudalab.zeros((15, OUT + 8), dtype=F32)
    got = linear(root[:, :IN], dw, db, activation=act, out=out_root[:, :OUT])
    want = act_ref(widen(root_host[:, :IN]) @ widen(w).T + widen(b), act)
    assert_near(got, want, F32)
    host = out_root.get()
    np.testing.assert_array_equal(host[:, OUT:], 0)  # beyond the view: untouched


def test_forward_out_is_returned(rng):
    (x, dx), (w, dw), (b, db) = layer(rng, BF16, IN, OUT)
    out = cudalab.empty((N, OUT), dtype=BF16)
    assert linear(dx, dw, db, out=out) is out
    assert_near(out, widen(x) @ widen(w).T + widen(b), BF16)


def test_plans_keep_their_epilogues_apart(rng, warm):
    """The same operands through alternating epilogues: each cached plan
    (keyed by its epilogue too) gives its own result."""
    (x, dx), (w, dw), (b, db) = layer(rng, F32, IN, OUT)
    pre = widen(x) @ widen(w).T + widen(b)
    for _ in range(2):
        for act in (None, "relu", "gelu"):
            assert_near(linear(dx, dw, db, activation=act), act_ref(pre, act), F32)
        assert_near(linear(dx, dw), pre - widen(b), F32)


def test_precision_follows_the_process_setting(rng, restore_precision):
    (x, dx), (w, dw), _ = layer(rng, F32, IN, OUT)
    highest = linear(dx, dw).get()
    cudalab.set_float32_matmul_precision("high")
    assert np.array_equal(linear(dx, dw).get(), linear(dx, dw, precision="high").get())
    assert np.array_equal(linear(dx, dw, precision="highest").get(), highest)


# ---- backward: input gradient ----------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_backward_input_plain(rng, dtype, precision):
    (w, dw) = make(rng, (OUT, IN), dtype, 1 / math.sqrt(OUT))
    (g, dg) = make(rng, (N, OUT), dtype)
    gx = backward_input(dg, dw, precision=precision)
    assert gx.shape == (N, IN)
    assert_near(gx, widen(g) @ widen(w), dtype, precision)


@pytest.mark.parametrize("with_bias_grad", [True, False], ids=["bgrad", "nobgrad"])
@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_backward_input_dgelu(rng, dtype, precision, with_bias_grad):
    """DGELU(_BGRAD): (g @ W) * gelu'(aux), and its sum over rows."""
    (w, dw) = make(rng, (OUT, IN), dtype, 1 / math.sqrt(OUT))
    (g, dg) = make(rng, (N, OUT), dtype)
    (pre, aux) = make(rng, (N, IN), dtype)
    bias_grad = cudalab.full((IN,), 3.0, dtype=dtype) if with_bias_grad else None
    gx = backward_input(dg, dw, aux=aux, activation="gelu", bias_grad=bias_grad,
                        precision=precision)
    want = (widen(g) @ widen(w)) * dgelu_tanh(widen(pre))
    assert_near(gx, want, dtype, precision)
    if with_bias_grad:
        assert_near(bias_grad, want.sum(axis=0), dtype, precision)
        assert_near(bias_grad, widen(gx).sum(axis=0), dtype, precision)


@pytest.mark.parametrize("with_bias_grad", [True, False], ids=["bgrad", "nobgrad"])
@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_backward_input_drelu(rng, dtype, precision, with_bias_grad):
    """DRELU(_BGRAD) with the mask a previous layer's RELU_AUX_BIAS wrote."""
    (x0, dx0), (w0, dw0), (b0, db0) = layer(rng, dtype, 24, IN)
    mask = cudalab.zeros((N, mask_bytes(IN)), dtype=U8)
    linear(dx0, dw0, db0, activation="relu", aux=mask, precision=precision)
    pre = widen(x0) @ widen(w0).T + widen(b0)
    (w, dw) = make(rng, (OUT, IN), dtype, 1 / math.sqrt(OUT))
    (g, dg) = make(rng, (N, OUT), dtype)
    bias_grad = cudalab.full((IN,), 3.0, dtype=dtype) if with_bias_grad else None
    gx = backward_input(dg, dw, aux=mask, activation="relu", bias_grad=bias_grad,
                        precision=precision)
    want = (widen(g) @ widen(w)) * (pre > 0)
    clear = np.abs(pre) > margin(precision, pre.std())
    got = widen(gx)
    assert rel_err(got[clear], want[clear]) < tol(dtype, precision)
    if with_bias_grad:
        assert_near(bias_grad, got.sum(axis=0), dtype, precision)


# ---- backward: weight gradient -----------------------------------------------------------------


@pytest.mark.parametrize("with_bias_grad", [True, False], ids=["bgrad", "nobgrad"])
@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_backward_weight(rng, dtype, precision, with_bias_grad):
    """grad_w = g.T @ x; BGRADB: bias_grad = g summed over rows."""
    (g, dg) = make(rng, (N, OUT), dtype)
    (x, dx) = make(rng, (N, IN), dtype)
    bias_grad = cudalab.full((OUT,), 3.0, dtype=dtype) if with_bias_grad else None
    gw = backward_weight(dg, dx, bias_grad=bias_grad, precision=precision)
    assert gw.shape == (OUT, IN)
    assert_near(gw, widen(g).T @ widen(x), dtype, precision)
    if with_bias_grad:
        assert_near(bias_grad, widen(g).sum(axis=0), dtype, precision)


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_backward_weight_accumulate(rng, dtype, precision):
    """accumulate=True adds into out (beta = 1): two micro-batches sum up."""
    (g1, dg1), (x1, dx1) = make(rng, (N, OUT), dtype), make(rng, (N, IN), dtype)
    (g2, dg2), (x2, dx2) = make(rng, (19, OUT), dtype), make(rng, (19, IN), dtype)
    (start, out) = make(rng, (OUT, IN), dtype)
    assert backward_weight(dg1, dx1, out=out, accumulate=True, precision=precision) is out
    backward_weight(dg2, dx2, out=out, accumulate=True, precision=precision)
    want = widen(start) + widen(g1).T @ widen(x1) + widen(g2).T @ widen(x2)
    assert_near(out, want, dtype, precision, factor=2.0)  # two roundings of the sum
    # accumulate=False overwrites.
    backward_weight(dg2, dx2, out=out, precision=precision)
    assert_near(out, widen(g2).T @ widen(x2), dtype, precision)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_backward_weight_float32_out_from_half(rng, dtype):
    """Half operands, float32 out and bias_grad: the float32 accumulator written
    as is (more accurate than the half result), and accumulate adds in float32."""
    (g, dg) = make(rng, (N, OUT), dtype)
    (x, dx) = make(rng, (N, IN), dtype)
    out = cudalab.full((OUT, IN), 5.0, dtype=F32)
    bias_grad = cudalab.full((OUT,), 3.0, dtype=F32)
    assert backward_weight(dg, dx, out=out, bias_grad=bias_grad) is out
    want = widen(g).T @ widen(x)
    assert rel_err(widen(out), want) < 1e-5  # float32 accuracy, not half's
    assert rel_err(widen(bias_grad), widen(g).sum(axis=0)) < 1e-5
    backward_weight(dg, dx, out=out, accumulate=True)
    assert rel_err(widen(out), 2 * want) < 1e-5
    with pytest.raises(TypeError, match="bias_grad.*float32 like out"):
        backward_weight(dg, dx, out=out, bias_grad=cudalab.full((OUT,), 3.0, dtype=dtype))


def test_backward_leading_axes(rng):
    """grad_y and x of shape (3, 5, ...) are 15 rows."""
    (g, dg) = make(rng, (15, OUT), F32)
    (x, dx) = make(rng, (15, IN), F32)
    (w, dw) = make(rng, (OUT, IN), F32)
    gw = backward_weight(dg.reshape((3, 5, OUT)), dx.reshape((3, 5, IN)))
    assert_near(gw, widen(g).T @ widen(x), F32)
    gx = backward_input(dg.reshape((3, 5, OUT)), dw)
    assert gx.shape == (3, 5, IN)
    assert_near(gx, (widen(g) @ widen(w)).reshape(3, 5, IN), F32)


# ---- two layers, GELU between them: the fused chain against the chain rule ---------------


def two_layer_reference(x, w1, b1, w2, b2, g):
    x, w1, b1, w2, b2, g = (widen(a) for a in (x, w1, b1, w2, b2, g))
    pre = x @ w1.T + b1
    h = gelu_reference(pre, "tanh")
    gpre = (g @ w2) * dgelu_tanh(pre)
    return {"pre": pre, "h": h, "y": h @ w2.T + b2, "dw2": g.T @ h, "db2": g.sum(axis=0),
            "gpre": gpre, "db1": gpre.sum(axis=0), "dw1": gpre.T @ x, "gx": gpre @ w1}


def two_layer_device(dx, dw1, db1, dw2, db2, dg, dtype, precision):
    aux1 = cudalab.empty((dx.shape[0], dw1.shape[0]), dtype=dtype)
    db1_grad = cudalab.empty((dw1.shape[0],), dtype=dtype)
    db2_grad = cudalab.empty((dw2.shape[0],), dtype=dtype)
    h = linear(dx, dw1, db1, activation="gelu", aux=aux1, precision=precision)
    y = linear(h, dw2, db2, precision=precision)
    dw2_grad = backward_weight(dg, h, bias_grad=db2_grad, precision=precision)
    gpre = backward_input(dg, dw2, aux=aux1, activation="gelu", bias_grad=db1_grad,
                          precision=precision)
    dw1_grad = backward_weight(gpre, dx, precision=precision)
    gx = backward_input(gpre, dw1, precision=precision)
    return {"pre": aux1, "h": h, "y": y, "dw2": dw2_grad, "db2": db2_grad, "gpre": gpre,
            "db1": db1_grad, "dw1": dw1_grad, "gx": gx}


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_two_layer_gelu_chain(rng, dtype, precision):
    """Forward with GELU_AUX_BIAS, then BGRADB, DGELU_BGRAD, plain input grad:
    every intermediate and gradient equals NumPy's chain rule."""
    (x, dx), (w1, dw1), (b1, db1) = layer(rng, dtype, IN, 56)
    (w2, dw2), (b2, db2) = make(rng, (OUT, 56), dtype, 1 / math.sqrt(56)), make(rng, (OUT,), dtype)
    (g, dg) = make(rng, (N, OUT), dtype)
    ref = two_layer_reference(x, w1, b1, w2, b2, g)
    got = two_layer_device(dx, dw1, db1, dw2, db2, dg, dtype, precision)
    # Half-precision intermediates (h, gpre) are rounded before the next product.
    factor = 1.0 if dtype == F32 and precision == "highest" else 3.0
    for name, want in ref.items():
        assert_near(got[name], want, dtype, precision, factor=factor)


def test_against_torch(rng):
    """The same two layers through torch.nn.functional (float64, CPU): linear,
    gelu(approximate='tanh') and autograd's gradients."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    (x, dx), (w1, dw1), (b1, db1) = layer(rng, F32, IN, 56)
    (w2, dw2), (b2, db2) = make(rng, (OUT, 56), F32, 1 / math.sqrt(56)), make(rng, (OUT,), F32)
    (g, dg) = make(rng, (N, OUT), F32)
    t = {k: torch.tensor(widen(v), requires_grad=True)
         for k, v in dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2).items()}
    h = F.gelu(F.linear(t["x"], t["w1"], t["b1"]), approximate="tanh")
    y = F.linear(h, t["w2"], t["b2"])
    y.backward(torch.tensor(widen(g)))
    got = two_layer_device(dx, dw1, db1, dw2, db2, dg, F32, "highest")
    assert_near(got["y"], y.detach().numpy(), F32)
    assert_near(got["h"], h.detach().numpy(), F32)
    for name, key in (("dw1", "w1"), ("db1", "b1"), ("dw2", "w2"), ("db2", "b2"), ("gx", "x")):
        assert_near(got[name], t[key].grad.numpy(), F32)


# ---- streams and graphs ------------------------------------------------------------------------


def test_non_default_stream(rng, warm):
    (x, dx), (w, dw), (b, db) = layer(rng, F16, IN, OUT)
    aux = cudalab.empty((N, OUT), dtype=F16)
    s = cudalab.Stream()
    with s:
        y = linear(dx, dw, db, activation="gelu", aux=aux)
        gw = backward_weight(y, dx)
    s.synchronize()
    pre = widen(x) @ widen(w).T + widen(b)
    assert_near(y, gelu_reference(pre, "tanh"), F16)
    assert_near(gw, widen(y).T @ widen(x), F16)


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_captured_in_a_cuda_graph(rng, warm, dtype, precision):
    """A fused forward and backward (GELU_AUX_BIAS, DGELU_BGRAD, BGRADB with
    accumulation) captures after a warm-up and replays on new values."""
    (x, dx), (w, dw), (b, db) = layer(rng, dtype, IN, OUT)
    (g, dg) = make(rng, (N, OUT), dtype)
    (w2, dw2) = make(rng, (OUT, OUT), dtype, 1 / math.sqrt(OUT))
    aux, y = cudalab.empty((N, OUT), dtype=dtype), cudalab.empty((N, OUT), dtype=dtype)
    gpre, bg = cudalab.empty((N, OUT), dtype=dtype), cudalab.empty((OUT,), dtype=dtype)
    gw = cudalab.empty((OUT, IN), dtype=dtype)

    def step():
        linear(dx, dw, db, activation="gelu", aux=aux, out=y, precision=precision)
        backward_input(dg, dw2, aux=aux, activation="gelu", bias_grad=bg, out=gpre,
                       precision=precision)
        backward_weight(gpre, dx, out=gw, precision=precision)

    def check():
        pre = widen(dx.get()) @ widen(dw.get()).T + widen(db.get())
        want_gpre = (widen(dg.get()) @ widen(w2)) * dgelu_tanh(widen(aux.get()))
        assert_near(y, gelu_reference(pre, "tanh"), dtype, precision)
        assert_near(gpre, want_gpre, dtype, precision)
        assert_near(bg, want_gpre.sum(axis=0), dtype, precision)
        assert_near(gw, widen(gpre.get()).T @ widen(dx.get()), dtype, precision)

    step()  # warm-up: plans
    cudalab.synchronize()
    graph = cudalab.CUDAGraph()
    with cudalab.graph(graph):
        step()
    graph.replay()
    cudalab.synchronize()
    check()
    dx += cudalab.asarray(random_array(rng, x.shape, dtype))
    dg += cudalab.asarray(random_array(rng, g.shape, dtype))
    graph.replay()
    cudalab.synchronize()
    check()


# ---- misaligned feature counts -------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_misaligned_features(rng, dtype, precision):
    """in = 73, out = 41: each fused product is right, or refused with the
    documented error (reported as a skip naming the combination)."""
    (x, dx), (w, dw), (b, db) = layer(rng, dtype, IN_ODD, OUT_ODD)
    pre = widen(x) @ widen(w).T + widen(b)
    y = unsupported_or(lambda: linear(dx, dw, db, activation="gelu", precision=precision))
    assert_near(y, gelu_reference(pre, "tanh"), dtype, precision)
    # A GELU aux of 41 features: rows 48 elements apart.
    aux_root = cudalab.zeros((N, 48), dtype=dtype)
    unsupported_or(lambda: linear(dx, dw, db, activation="gelu", aux=aux_root[:, :OUT_ODD],
                                  precision=precision))
    assert_near(aux_root[:, :OUT_ODD], pre, dtype, precision)
    mask = cudalab.zeros((N, mask_bytes(OUT_ODD)), dtype=U8)
    unsupported_or(lambda: linear(dx, dw, db, activation="relu", aux=mask, precision=precision))
    clear = np.abs(pre) > margin(precision, pre.std())
    np.testing.assert_array_equal(unpack_mask(mask, OUT_ODD)[clear], (pre > 0)[clear])
    (gy, dgy) = make(rng, (N, OUT_ODD), dtype)
    bg = cudalab.empty((OUT_ODD,), dtype=dtype)
    gw = unsupported_or(lambda: backward_weight(dgy, dx, bias_grad=bg, precision=precision))
    assert_near(gw, widen(gy).T @ widen(x), dtype, precision)
    assert_near(bg, widen(gy).sum(axis=0), dtype, precision)


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_misaligned_dgelu(rng, dtype, precision):
    """DGELU_BGRAD with in = 41 features (aux rows 48 apart)."""
    (w, dw) = make(rng, (OUT, OUT_ODD), dtype, 1 / math.sqrt(OUT))
    (g, dg) = make(rng, (N, OUT), dtype)
    aux_host = random_array(rng, (N, 48), dtype)
    aux = cudalab.asarray(aux_host)[:, :OUT_ODD]
    bg = cudalab.empty((OUT_ODD,), dtype=dtype)
    gx = unsupported_or(lambda: backward_input(dg, dw, aux=aux, activation="gelu", bias_grad=bg,
                                               precision=precision))
    want = (widen(g) @ widen(w)) * dgelu_tanh(widen(aux_host[:, :OUT_ODD]))
    assert_near(gx, want, dtype, precision)
    assert_near(bg, want.sum(axis=0), dtype, precision)


# ---- argument checks that need device arrays -------------------------------------------------


@pytest.fixture
def arrays(rng):
    """float32 x (N, IN), weight (OUT, IN), bias (OUT,), grad_y (N, OUT)."""
    return {
        "x": cudalab.asarray(random_array(rng, (N, IN), F32)),
        "w": cudalab.asarray(random_array(rng, (OUT, IN), F32)),
        "b": cudalab.asarray(random_array(rng, (OUT,), F32)),
        "g": cudalab.asarray(random_array(rng, (N, OUT), F32)),
    }


@pytest.mark.parametrize("dtype", [F64, np.dtype(np.int32), U8], ids=lambda d: d.name)
def test_unsupported_dtype(rng, dtype):
    a = cudalab.asarray(random_array(rng, (N, IN), dtype))
    with assert_arg_error(TypeError, "_nn_linear", "x",
                          match=f"unsupported dtype {dtype.name} \\(expected float32, float16 "
                          "or bfloat16\\)"):
        linear(a, a)
    with assert_arg_error(TypeError, "_nn_linear_backward_weight", "grad_y",
                          match="unsupported dtype"):
        backward_weight(a, a)


def test_mixed_dtypes(arrays):
    w16 = arrays["w"].astype(F16)
    with assert_arg_error(TypeError, "_nn_linear", "weight",
                          match="dtype float16 differs from 'x''s dtype float32"):
        linear(arrays["x"], w16)
    with assert_arg_error(TypeError, "_nn_linear", "bias", match="dtype bfloat16 differs"):
        linear(arrays["x"], arrays["w"], arrays["b"].astype(BF16))
    with assert_arg_error(TypeError, "_nn_linear", "out", match="has dtype float16"):
        linear(arrays["x"], arrays["w"], out=cudalab.empty((N, OUT), dtype=F16))


def test_dimensions(arrays):
    with assert_arg_error(ValueError, "_nn_linear", "x",
                          match="expected at least 2 dimensions, got 1"):
        linear(arrays["b"], arrays["w"])
    with assert_arg_error(ValueError, "_nn_linear", "weight",
                          match="expected a 2-D array, got 3-D"):
        linear(arrays["x"], arrays["w"].reshape((2, 20, IN)))
    with assert_arg_error(ValueError, "_nn_linear", "weight",
                          match=f"has {IN - 1} input features but 'x' has {IN}"):
        linear(arrays["x"], arrays["w"][:, 1:])
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "weight",
                          match=f"has {OUT - 1} output features but 'grad_y' has {OUT}"):
        backward_input(arrays["g"], arrays["w"][1:])
    with assert_arg_error(ValueError, "_nn_linear_backward_weight", "x",
                          match=f"has {N - 1} rows but 'grad_y' has {N}"):
        backward_weight(arrays["g"], arrays["x"][1:])
    with assert_arg_error(ValueError, "_nn_linear", "x", match=r"is empty \(shape \(0, 72\)\)"):
        linear(arrays["x"][:0], arrays["w"])


def test_layouts(arrays):
    with assert_arg_error(ValueError, "_nn_linear", "x", match="needs unit stride along its last"):
        linear(arrays["x"][:, ::2], arrays["w"][:, ::2])
    with assert_arg_error(ValueError, "_nn_linear", "weight", match="needs unit stride"):
        linear(arrays["x"][:, :OUT], arrays["w"][:, :OUT].T)
    # Leading axes that do not flatten into evenly spaced rows.
    x3 = arrays["x"][:36].reshape((6, 6, IN))[:, :5]
    with assert_arg_error(ValueError, "_nn_linear", "x", match="evenly spaced rows"):
        linear(x3, arrays["w"])
    out = cudalab.empty((N, 2 * OUT), dtype=F32)[:, ::2]
    with assert_arg_error(ValueError, "_nn_linear", "out", match="needs unit stride"):
        linear(arrays["x"], arrays["w"], out=out)


def test_bias_checks(arrays):
    with assert_arg_error(ValueError, "_nn_linear", "bias",
                          match=rf"expected shape \({OUT},\), got \({OUT - 1},\)"):
        linear(arrays["x"], arrays["w"], arrays["b"][1:])
    with assert_arg_error(ValueError, "_nn_linear", "bias", match="must be contiguous"):
        linear(arrays["x"], arrays["w"], cudalab.empty((2 * OUT,), dtype=F32)[::2])
    with assert_arg_error(TypeError, "_nn_linear", "bias",
                          match="expected a cudalab.DeviceArray or None"):
        linear(arrays["x"], arrays["w"], np.ones(OUT, np.float32))


def test_out_checks(arrays):
    with assert_arg_error(ValueError, "_nn_linear", "out",
                          match=r"has shape \(37, 41\) but the result has shape \(37, 40\)"):
        linear(arrays["x"], arrays["w"], out=cudalab.empty((N, OUT + 1), dtype=F32))
    with assert_arg_error(ValueError, "_nn_linear", "out", match="overlaps 'x'"):
        linear(arrays["x"], arrays["w"][:, :IN], out=arrays["x"][:, :OUT])
    with assert_arg_error(ValueError, "_nn_linear_backward_weight", "out",
                          match=r"has shape .* but the result has shape \(40, 72\)"):
        backward_weight(arrays["g"], arrays["x"], out=cudalab.empty((IN, OUT), dtype=F32))


def test_aux_checks(arrays):
    x, w = arrays["x"], arrays["w"]
    with assert_arg_error(ValueError, "_nn_linear", "aux", match="needs activation='relu' or"):
        linear(x, w, aux=cudalab.empty((N, OUT), dtype=F32))
    with assert_arg_error(TypeError, "_nn_linear", "aux",
                          match="expected dtype uint8 \\(the ReLU bit mask\\), got float32"):
        linear(x, w, activation="relu", aux=cudalab.empty((N, OUT), dtype=F32))
    with assert_arg_error(TypeError, "_nn_linear", "aux", match="expected dtype float32"):
        linear(x, w, activation="gelu", aux=cudalab.empty((N, 16), dtype=U8))
    with assert_arg_error(ValueError, "_nn_linear", "aux",
                          match=r"expected shape \(37, 16\), got \(37, 5\)"):
        linear(x, w, activation="relu", aux=cudalab.empty((N, 5), dtype=U8))
    with assert_arg_error(ValueError, "_nn_linear", "aux",
                          match=r"expected shape \(37, 40\), got \(40, 37\)"):
        linear(x, w, activation="gelu", aux=cudalab.empty((OUT, N), dtype=F32))
    # GELU aux rows must lie a multiple of 8 elements apart.
    w41 = cudalab.empty((OUT_ODD, IN), dtype=F32)
    with assert_arg_error(ValueError, "_nn_linear", "aux", match="multiple of 8 elements apart"):
        linear(x, w41, activation="gelu", aux=cudalab.empty((N, OUT_ODD), dtype=F32))
    aux = cudalab.empty((N, OUT), dtype=F32)
    with assert_arg_error(ValueError, "_nn_linear", "out", match="overlaps 'aux'"):
        linear(x, w, activation="gelu", aux=aux, out=aux)
    with assert_arg_error(ValueError, "_nn_linear", "aux", match="overlaps 'x'"):
        linear(x, w[:, :IN], activation="gelu", aux=x[:, :OUT])


def test_backward_input_requirements(arrays):
    g, w = arrays["g"], arrays["w"]
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "aux",
                          match="is required with an activation"):
        backward_input(g, w, activation="gelu")
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "aux",
                          match="needs activation="):
        backward_input(g, w, aux=cudalab.empty((N, IN), dtype=F32))
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "bias_grad",
                          match="needs an activation: cuBLASLt fuses"):
        backward_input(g, w, bias_grad=cudalab.empty((IN,), dtype=F32))
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "bias_grad",
                          match=rf"expected shape \({IN},\)"):
        backward_input(g, w, aux=cudalab.empty((N, IN), dtype=F32), activation="gelu",
                       bias_grad=cudalab.empty((OUT,), dtype=F32))
    out = cudalab.empty((N, IN), dtype=F32)
    with assert_arg_error(ValueError, "_nn_linear_backward_input", "out",
                          match="overlaps 'bias_grad'"):
        backward_input(g, w, aux=cudalab.empty((N, IN), dtype=F32), activation="gelu",
                       out=out, bias_grad=out[0])


def test_backward_weight_requirements(arrays):
    g, x = arrays["g"], arrays["x"]
    with assert_arg_error(ValueError, "_nn_linear_backward_weight", "accumulate",
                          match="needs out="):
        backward_weight(g, x, accumulate=True)
    with assert_arg_error(ValueError, "_nn_linear_backward_weight", "bias_grad",
                          match="cannot be accumulated"):
        backward_weight(g, x, out=cudalab.empty((OUT, IN), dtype=F32), accumulate=True,
                        bias_grad=cudalab.empty((OUT,), dtype=F32))
    with assert_arg_error(ValueError, "_nn_linear_backward_weight", "bias_grad",
                          match=rf"expected shape \({OUT},\), got \({IN},\)"):
        backward_weight(g, x, bias_grad=cudalab.empty((IN,), dtype=F32))
    with assert_arg_error(ValueError, "_nn_linear_backward_weight", "bias_grad",
                          match="overlaps 'grad_y'"):
        backward_weight(g, x, bias_grad=g[0])


def test_profiler_record(rng, warm):
    from cudalab.profiler import profile

    (x, dx), (w, dw), (b, db) = layer(rng, F16, IN, OUT)
    linear(dx, dw, db)  # warm-up: plan
    with profile() as prof:
        y = linear(dx, dw, db, activation="relu")
    (e,) = [e for e in prof.events() if e.kind == "op"]
    assert e.name == "linear" and e.dtype == "float16"
    assert e.flops == 2 * N * IN * OUT
    assert e.bytes == dx.nbytes + dw.nbytes + y.nbytes + db.nbytes
    assert e.output_shape == (N, OUT)
