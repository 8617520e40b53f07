"""cudalab.nn.reference: an MLP's training step in float64 NumPy, to check the GPU against.

What :class:`~cudalab.nn.MLP`, :func:`~cudalab.nn.functional.cross_entropy`
and :class:`~cudalab.nn.AdamW` compute, written plainly on the host:
PyTorch's layout (``z = h @ W.T + b``), the tanh GELU (or ReLU) after every
layer but the last, the mean softmax cross-entropy and its gradient, the
backward pass layer by layer, and one AdamW update. Tests and lessons feed it
the weights the device holds and compare. Values are float64; a `dtype`
rounds the stored values (layer inputs, pre-activations, gradients) the way
a run in that dtype stores them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = [
    "ACTIVATIONS",
    "adamw_step",
    "backward",
    "cross_entropy",
    "forward",
    "gelu_tanh",
    "gelu_tanh_grad",
    "loss_and_grads",
    "mlp_params",
]

_K = math.sqrt(2.0 / math.pi)
_C = 0.044715

Params = Sequence[tuple[np.ndarray, np.ndarray]]


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    """gelu_tanh(z) -> ndarray

    torch's ``gelu(z, approximate='tanh')``, which cuBLASLt's GELU epilogue computes.

    Parameters
    ----------
    z : ndarray
    """
    return 0.5 * z * (1.0 + np.tanh(_K * (z + _C * z**3)))


def gelu_tanh_grad(z: np.ndarray) -> np.ndarray:
    """gelu_tanh_grad(z) -> ndarray

    The derivative of :func:`gelu_tanh` at `z`.

    Parameters
    ----------
    z : ndarray
    """
    t = np.tanh(_K * (z + _C * z**3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _K * (1.0 + 3.0 * _C * z * z)


# activation name -> (function, derivative), as MLP(activation=...) names them.
ACTIVATIONS: dict[str, tuple[Callable[[np.ndarray], np.ndarray],
                             Callable[[np.ndarray], np.ndarray]]] = {
    "gelu": (gelu_tanh, gelu_tanh_grad),
    "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0) * 1.0),
}


def _rounder(dtype: Any) -> Callable[[np.ndarray], np.ndarray]:
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return lambda a: np.asarray(a, dtype=np.float64)
    return lambda a: np.asarray(a).astype(dtype).astype(np.float64)


def forward(params: Params, x: np.ndarray, activation: Optional[str] = "gelu",
            dtype: Any = np.float64) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """forward(params, x, activation='gelu', dtype=float64) -> (hs, zs)

    The MLP's forward pass.

    Parameters
    ----------
    params : sequence of (W, b)
        Per layer: W (out, in), b (out,).
    x : ndarray
        (N, in) inputs.
    activation : {'gelu', 'relu', None}, optional
        After every layer but the last.
    dtype : dtype-like, optional
        Every stored value is rounded to it (float64: no rounding).

    Returns
    -------
    hs : list of ndarray
        The input of every layer, then the logits (``hs[-1]``).
    zs : list of ndarray
        Every layer's pre-activation.
    """
    rnd = _rounder(dtype)
    act = None if activation is None else ACTIVATIONS[activation][0]
    hs, zs = [rnd(x)], []
    last = len(params) - 1
    for i, (w, b) in enumerate(params):
        z = hs[-1] @ rnd(w).T + rnd(b)
        zs.append(rnd(z))
        hs.append(rnd(act(z)) if i < last and act is not None else rnd(z))
    return hs, zs


def backward(params: Params, hs: Sequence[np.ndarray], zs: Sequence[np.ndarray],
             grad_logits: np.ndarray, activation: Optional[str] = "gelu",
             dtype: Any = np.float64) -> list[tuple[np.ndarray, np.ndarray]]:
    """backward(params, hs, zs, grad_logits, activation='gelu', dtype=float64) -> grads

    Every layer's weight and bias gradients from the logits' gradient.

    Parameters
    ----------
    params : sequence of (W, b)
    hs, zs : sequences of ndarray
        What :func:`forward` returned.
    grad_logits : ndarray
        (N, classes).
    activation : {'gelu', 'relu', None}, optional
    dtype : dtype-like, optional
        Each pre-activation gradient is rounded to it.

    Returns
    -------
    list of (dW, db)
        Per layer, in layer order.
    """
    rnd = _rounder(dtype)
    grads: list[Any] = [None] * len(params)
    g = np.asarray(grad_logits, dtype=np.float64)
    for i in range(len(params) - 1, -1, -1):
        grads[i] = (g.T @ hs[i], g.sum(axis=0))
        if i > 0:
            g = g @ rnd(params[i][0])
            if activation is not None:
                g = g * ACTIVATIONS[activation][1](zs[i - 1])
            g = rnd(g)
    return grads


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """cross_entropy(logits, labels) -> (loss, grad)

    The mean softmax cross-entropy and its gradient with respect to the logits.

    Parameters
    ----------
    logits : ndarray
        (N, C).
    labels : ndarray
        (N,) class indices in [0, C).

    Returns
    -------
    loss : float
    grad : ndarray
        (N, C): ``(softmax(logits) - onehot(labels)) / N``.
    """
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    rows = np.arange(len(z))
    labels = np.asarray(labels)
    grad = np.exp(logp)
    grad[rows, labels] -= 1.0
    return float(-logp[rows, labels].mean()), grad / len(z)


def loss_and_grads(params: Params, x: np.ndarray, labels: np.ndarray,
                   activation: Optional[str] = "gelu"
                   ) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
    """loss_and_grads(params, x, labels, activation='gelu') -> (loss, grads)

    Forward, mean cross-entropy and backward in float64: one training step's loss
    and every layer's (dW, db).

    Parameters
    ----------
    params : sequence of (W, b)
    x : ndarray
        (N, in).
    labels : ndarray
        (N,) class indices.
    activation : {'gelu', 'relu', None}, optional
    """
    hs, zs = forward(params, x, activation)
    loss, g = cross_entropy(hs[-1], labels)
    return loss, backward(params, hs, zs, g, activation)


def adamw_step(param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray,
               exp_avg_sq: np.ndarray, step: int, lr: float, betas: tuple[float, float],
               eps: float, weight_decay: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay) -> (param, exp_avg, exp_avg_sq)

    torch.optim.AdamW's update number `step` (from 1), decoupled weight decay first.

    Parameters
    ----------
    param, grad, exp_avg, exp_avg_sq : ndarray
        One parameter, its gradient and its two moments before the step.
    step : int
        The step being taken, counted from 1 (bias corrections).
    lr, eps, weight_decay : float
    betas : (float, float)

    Returns
    -------
    tuple of ndarray
        The new parameter and moments (new arrays).
    """
    beta1, beta2 = betas
    g = np.asarray(grad, dtype=np.float64)
    p = np.asarray(param, dtype=np.float64) * (1.0 - lr * weight_decay)
    m = beta1 * np.asarray(exp_avg, dtype=np.float64) + (1.0 - beta1) * g
    v = beta2 * np.asarray(exp_avg_sq, dtype=np.float64) + (1.0 - beta2) * g * g
    p = p - lr / (1.0 - beta1**step) * m / (np.sqrt(v / (1.0 - beta2**step)) + eps)
    return p, m, v


def mlp_params(model: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """mlp_params(model) -> list of (W, b)

    An MLP's current master weights read back from the device as float64
    (a layer without a bias gets zeros). Reading synchronizes.

    Parameters
    ----------
    model : MLP
    """
    out = []
    for layer in model.layers:
        w = np.asarray(layer.weight.value.get(), dtype=np.float64)
        b = (np.zeros(w.shape[0]) if layer.bias is None
             else np.asarray(layer.bias.value.get(), dtype=np.float64))
        out.append((w, b))
    return out
