"""GPU tier: every cudalab.nn backward against float64 finite differences.

The analytic gradients come from the GPU (float32, precision "fp32": full
float32 GEMMs); the finite differences are central differences of the same
function evaluated in float64 NumPy at the GPU's parameter values. Two views
of each gradient are checked:

* single coordinates (a few per tensor, chosen at random): the difference
  must be small next to the tensor's largest gradient;
* a random direction through every coordinate at once: the directional
  derivative must match within float32 accuracy of the dot product, bounded
  by |g| |v| (Cauchy-Schwarz), so cancellation in the sum cannot hide behind
  a relative tolerance.

Layers: Linear with no activation, ReLU and GELU (with and without bias), its
input gradient plain and with the previous layer's activation derivative
fused; the softmax cross-entropy; the whole MLP (the fused backward chain) on
odd sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import F32, random_array

import cudalab
import cudalab.nn as nn
from cudalab.nn import functional as F

pytestmark = pytest.mark.gpu

H = 1e-6              # float64 central-difference step: truncation and rounding both < 1e-9
COORDS = 6            # single coordinates checked per tensor
COORD_TOL = 2e-4      # |analytic - numeric| / max |analytic| of the tensor
DIRECTION_TOL = 1e-5  # |analytic . v - numeric| / (|analytic| |v|)
ROWS = 19             # odd batch, no tile fits it exactly


def _gelu(z):
    return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))


ACT64 = {None: lambda z: z, "relu": lambda z: np.maximum(z, 0.0), "gelu": _gelu}


def host(a):
    return a.get().astype(np.float64)


def check_gradient(name, loss64, value, grad, rng):
    """`grad` (float64 host array) against central differences of `loss64` at `value`."""
    scale = np.abs(grad).max()
    assert scale > 0, f"{name}: zero gradient (unwritten output?)"
    for idx in rng.choice(value.size, size=min(COORDS, value.size), replace=False):
        step = np.zeros(value.size)
        step[idx] = H
        step = step.reshape(value.shape)
        numeric = (loss64(value + step) - loss64(value - step)) / (2 * H)
        err = abs(grad.flat[idx] - numeric) / scale
        assert err < COORD_TOL, f"{name}[{idx}]: analytic {grad.flat[idx]}, numeric {numeric}"
    v = rng.standard_normal(value.shape)
    numeric = (loss64(value + H * v) - loss64(value - H * v)) / (2 * H)
    err = abs(np.vdot(grad, v) - numeric) / (np.linalg.norm(grad) * np.linalg.norm(v))
    assert err < DIRECTION_TOL, f"{name}: directional derivative off by {err:.2e}"


# ---- Linear ---------------------------------------------------------------------------


def linear_case(rng, activation, bias, in_f=45, out_f=29):
    """A Linear layer run forward on a random (ROWS, in_f) input, and a loss
    sum(G * y) with a random G: its gradient with respect to y is G."""
    layer = nn.Linear(in_f, out_f, bias=bias, activation=activation, seed=int(rng.integers(1 << 30)))
    x = random_array(rng, (ROWS, in_f), F32)
    g_out = random_array(rng, (ROWS, out_f), F32)
    layer.forward(cudalab.asarray(x), "fp32")
    w = host(layer.weight.value)
    b = host(layer.bias.value) if bias else np.zeros(out_f)
    G = g_out.astype(np.float64)

    def loss64(x_, w_, b_):
        return float((G * ACT64[activation](x_ @ w_.T + b_)).sum())
    return layer, x.astype(np.float64), w, b, G, g_out, loss64


def pre_activation_grad(layer, g_out, z):
    """dL/d(pre-activation) from dL/dy through the activation derivative ops.

    GELU reads the pre-activation the forward kept (aux); ReLU's aux is
    cuBLASLt's bit mask, so relu_grad gets the pre-activation `z` instead.
    """
    g = cudalab.asarray(g_out)
    if layer.activation == "relu":
        return cudalab.relu_grad(g, cudalab.asarray(z.astype(np.float32)))
    if layer.activation == "gelu":
        return cudalab.gelu_grad(g, layer.aux, approximate="tanh")
    return g


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_linear_backward_against_finite_differences(rng, activation, bias):
    layer, x, w, b, _, g_out, loss64 = linear_case(rng, activation, bias)
    z = x @ w.T + b
    # ReLU's kink: every pre-activation must lie farther from 0 than a step moves it.
    if activation == "relu" and np.abs(z).min() < 10 * H * (1 + np.abs(x).sum(axis=1).max()):
        pytest.skip("a pre-activation lies within a finite-difference step of ReLU's kink")
    gx = layer.backward(pre_activation_grad(layer, g_out, z))
    check_gradient("weight", lambda v: loss64(x, v, b), w, host(layer.weight.grad), rng)
    if bias:
        check_gradient("bias", lambda v: loss64(x, w, v), b, host(layer.bias.grad), rng)
    check_gradient("input", lambda v: loss64(v, w, b), x, host(gx), rng)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_fused_input_gradient_against_finite_differences(rng, activation):
    """Two layers: the second's input-gradient GEMM applies the first's
    activation derivative in its epilogue, returning d loss / d (first
    pre-activation)."""
    first = nn.Linear(37, 24, activation=activation, seed=3)
    second = nn.Linear(24, 13, seed=4)
    x = random_array(rng, (ROWS, 37), F32)
    g_out = random_array(rng, (ROWS, 13), F32)
    second.forward(first.forward(cudalab.asarray(x), "fp32"), "fp32")
    w1, b1 = host(first.weight.value), host(first.bias.value)
    w2, b2 = host(second.weight.value), host(second.bias.value)
    G = g_out.astype(np.float64)
    z1 = x.astype(np.float64) @ w1.T + b1
    if activation == "relu" and np.abs(z1).min() < 1e-3:
        pytest.skip("a pre-activation lies near ReLU's kink")

    def loss64(z):  # as a function of the first layer's pre-activation
        return float((G * (ACT64[activation](z) @ w2.T + b2)).sum())

    dz1 = second.backward(cudalab.asarray(g_out), activation=activation, aux=first.aux)
    check_gradient("pre-activation", loss64, z1, host(dz1), rng)


# ---- cross-entropy ----------------------------------------------------------------------


@pytest.mark.parametrize("classes", [7, 1500], ids=["warp_rows", "block_rows"])
def test_cross_entropy_gradient_against_finite_differences(rng, classes):
    logits = random_array(rng, (ROWS, classes), F32) * 3
    labels = rng.integers(0, classes, ROWS)

    def loss64(z):
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(ROWS), labels].mean())

    grad = cudalab.empty((ROWS, classes), dtype=F32)
    loss = F.cross_entropy(cudalab.asarray(logits), cudalab.asarray(labels), grad=grad)
    z = logits.astype(np.float64)
    assert abs(float(loss.get()) - loss64(z)) < 1e-5 * max(1.0, loss64(z))
    check_gradient("logits", loss64, z, host(grad), rng)


# ---- the whole MLP ---------------------------------------------------------------------


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_mlp_backward_against_finite_differences(rng, activation):
    sizes = (33, 45, 29, 11)
    model = nn.MLP(sizes, activation, seed=7)
    x = random_array(rng, (ROWS, sizes[0]), F32)
    labels = rng.integers(0, sizes[-1], ROWS)
    logits = model.forward(cudalab.asarray(x), "fp32")
    F.cross_entropy(logits, cudalab.asarray(labels), grad=logits)  # the gradient in place
    model.backward(logits)
    params = [(host(l.weight.value), host(l.bias.value)) for l in model.layers]
    x64 = x.astype(np.float64)

    def loss64(ps):
        h = x64
        for i, (w, b) in enumerate(ps):
            h = h @ w.T + b
            if i < len(ps) - 1:
                h = ACT64[activation](h)
        h = h - h.max(axis=1, keepdims=True)
        logp = h - np.log(np.exp(h).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(ROWS), labels].mean())

    for i, layer in enumerate(model.layers):
        for j, (pname, p) in enumerate((("weight", layer.weight), ("bias", layer.bias))):
            def loss_of(v, i=i, j=j):
                ps = [list(t) for t in params]
                ps[i][j] = v
                return loss64(ps)
            check_gradient(f"layer {i} {pname}", loss_of, params[i][j], host(p.grad), rng)
