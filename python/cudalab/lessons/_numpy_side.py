"""The CPU side of lesson `cpu_vs_gpu`'s training step and convolution, in float32 NumPy.

The same work as the GPU does, written the way a NumPy user would run it on
the host, in the GPU's dtype (float32) so that the comparison is of hardware,
not of precision:

* `train_step`: one SGD step of :class:`cudalab.nn.MLP` (PyTorch's layout,
  tanh GELU after every layer but the last, mean softmax cross-entropy), its
  forward, loss, backward and update. :mod:`cudalab.nn.reference` does the
  same step in float64 to check against; this one stays in float32 and
  updates the weights in place, as a training loop does.
* `conv3x3`: one NHWC convolution with its folded BatchNorm bias and ReLU as
  im2col (:func:`cudalab.models.reference.im2col`) then one matmul, the
  layout cudalab's GPU convolution uses.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..models import reference as model_reference
from ..nn import reference

F32 = np.float32


def train_step(params: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray,
               labels: np.ndarray, lr: float,
               activation: str = "gelu") -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
    """One SGD step in float32: (the loss before the step, every layer's (dW, db)).

    `params` are float32 (W (out, in), b (out,)) pairs, updated in place
    (``W -= lr * dW``) after the whole backward. The loss and its gradient are
    taken in float64 (a (batch, classes) array: a negligible cost), the GEMMs
    and the activations in float32.
    """
    act, grad_act = reference.ACTIVATIONS[activation]
    last = len(params) - 1
    hs, zs = [np.asarray(x, dtype=F32)], []
    for i, (w, b) in enumerate(params):
        z = hs[-1] @ w.T
        z += b
        zs.append(z)
        hs.append(act(z).astype(F32, copy=False) if i < last else z)
    loss, g64 = reference.cross_entropy(hs[-1], labels)
    g = g64.astype(F32)
    grads: list[Any] = [None] * len(params)
    for i in range(last, -1, -1):
        grads[i] = (g.T @ hs[i], g.sum(axis=0))
        if i > 0:
            g = (g @ params[i][0]) * grad_act(zs[i - 1]).astype(F32, copy=False)
    for (w, b), (dw, db) in zip(params, grads):
        w -= F32(lr) * dw
        b -= F32(lr) * db
    return loss, grads


def conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray, kh: int, kw: int, stride: int,
            padding: int, relu: bool) -> np.ndarray:
    """relu?(im2col(x) @ w.T + b): (N * Ho * Wo, cout), x's dtype.

    `x` is NHWC (N, H, W, cin); `w` is (cout, K) with K = kh * kw * cin ordered
    (ky, kx, c), as cudalab's conv_gemm takes it; `b` is (cout,).
    """
    k = w.shape[1]
    cols = model_reference.im2col(x, kh, kw, stride, padding, k).reshape(-1, k)
    out = cols @ w.T
    out += b
    if relu:
        np.maximum(out, 0, out=out)
    return out
