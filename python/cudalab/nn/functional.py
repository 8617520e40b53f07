"""cudalab.nn.functional: the nn primitives as public functions.

The Linear GEMMs run on cuBLASLt with fused epilogues (bias, ReLU, GELU,
their derivatives and the bias gradients); the softmax cross-entropy computes
its loss and gradient in one kernel. No autograd: each backward is explicit.
Everything is asynchronous on the current stream and capturable in a CUDA
graph (no host synchronization).

PyTorch's layout: a weight is (out_features, in_features) and
``y = x @ weight.T + bias``. GELU is the tanh form (torch's
``gelu(approximate='tanh')``), as cuBLASLt computes it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .. import _core
from .._core import gelu_grad, relu_grad
from .._check import check_int
from ._util import check_activation
from .precision import Precision

__all__ = [
    "cross_entropy",
    "empty_aux",
    "gelu_grad",
    "linear",
    "linear_backward_input",
    "linear_backward_weight",
    "relu_grad",
    "relu_mask_bytes",
]

_ARG_ERRORS = (TypeError, ValueError, OverflowError)


def _renamed(exc: Exception, private: str, public: str) -> Exception:
    """`exc` with the private entry point's name replaced by the public one."""
    message = str(exc)
    if type(exc) in _ARG_ERRORS and message.startswith(private + "()"):
        return type(exc)(public + message[len(private):])
    return exc


def _matmul_precision(precision: Any) -> Optional[str]:
    return precision.matmul_precision if isinstance(precision, Precision) else precision


def relu_mask_bytes(features: int) -> int:
    """relu_mask_bytes(features) -> int

    Bytes per row of the ReLU aux bit mask: ``ceil(features / 128) * 16``.

    Parameters
    ----------
    features : int
        The layer's output features (>= 1).

    Returns
    -------
    int
    """
    return _relu_mask_bytes(check_int(features, "relu_mask_bytes", "features"))


def _relu_mask_bytes(features: int) -> int:
    """relu_mask_bytes without the argument check (for the layers' hot path)."""
    return (features + 127) // 128 * 16


def _gelu_aux_row(features: int) -> int:
    """Elements per row of a GELU aux buffer: `features` rounded up to a multiple of 8
    (cuBLASLt's aux leading dimension)."""
    return (features + 7) // 8 * 8


def empty_aux(shape: Sequence[int], activation: str, dtype: Any = np.float32) -> _core.DeviceArray:
    """empty_aux(shape, activation, dtype=float32) -> DeviceArray

    An uninitialized aux array for :func:`linear` of result shape `shape`.

    For 'gelu' it is a view ``buf[..., :features]`` of a buffer whose rows
    are padded to a multiple of 8 elements (cuBLASLt's aux leading
    dimension); for 'relu' a C-contiguous uint8 bit mask of shape
    ``(..., relu_mask_bytes(features))``.

    Parameters
    ----------
    shape : sequence of int
        The linear result's shape ``(..., features)``.
    activation : {'relu', 'gelu'}
    dtype : dtype-like, optional
        The result's dtype (used for 'gelu').

    Returns
    -------
    DeviceArray
    """
    act = check_activation(activation, "empty_aux")
    if act is None:
        raise ValueError("empty_aux() argument 'activation': expected 'relu' or 'gelu', got None")
    shape = tuple(check_int(s, "empty_aux", "shape") for s in shape)
    if not shape:
        raise ValueError("empty_aux() argument 'shape': expected at least one axis")
    lead, features = shape[:-1], shape[-1]
    if act == "relu":
        return _core.empty((*lead, _relu_mask_bytes(features)), dtype=np.uint8)
    buf = _core.empty((*lead, _gelu_aux_row(features)), dtype=dtype)
    return buf[(Ellipsis, slice(0, features))]


def linear(x, weight, bias=None, activation=None, *, out=None, aux=None, precision=None):
    """linear(x, weight, bias=None, activation=None, *, out=None, aux=None, precision=None)

    ``y = act(x @ weight.T + bias)`` in one cuBLASLt GEMM with a fused epilogue.

    Parameters
    ----------
    x : DeviceArray
        (..., in_features): unit stride along the last axis, evenly spaced
        rows. float32, float16 or bfloat16.
    weight : DeviceArray
        (out_features, in_features), x's dtype.
    bias : DeviceArray, optional
        (out_features,), contiguous, x's dtype.
    activation : {None, 'relu', 'gelu'}, optional
        GELU is the tanh form.
    out : DeviceArray, optional
        (..., out_features), x's dtype; written and returned.
    aux : DeviceArray, optional
        With an activation: receives what the backward needs (GELU: the
        pre-activation, of y's shape and dtype, rows a multiple of 8
        elements apart; ReLU: a uint8 bit mask, ``relu_mask_bytes`` bytes a
        row). :func:`empty_aux` makes one.
    precision : {'highest', 'high'} or Precision, optional
        For float32: true fp32 or TF32. None: the process-wide setting.

    Returns
    -------
    DeviceArray
        `out`, or a new (..., out_features) array.

    Raises
    ------
    TypeError, ValueError
        A bad argument (before any GPU work).
    CudalabError
        cuBLASLt has no algorithm for this epilogue, dtype and size.
    """
    try:
        return _core._nn_linear(x, weight, bias, activation, out, aux, _matmul_precision(precision))
    except _ARG_ERRORS as exc:
        raise _renamed(exc, "_nn_linear", "linear") from None


def linear_backward_input(grad_y, weight, *, out=None, aux=None, activation=None,
                          bias_grad=None, precision=None):
    """linear_backward_input(grad_y, weight, *, out=None, aux=None, activation=None, bias_grad=None, precision=None)

    ``grad_x = grad_y @ weight``, times the previous layer's activation
    derivative when `activation` is given.

    For layers ``h = act(x @ W1.T + b1)`` (aux = its aux) and
    ``y = h @ W2.T + b2``, ``linear_backward_input(grad_y, W2, aux=aux,
    activation=act, bias_grad=db1)`` returns the gradient of layer 1's
    pre-activation and writes ``db1`` (its sum over rows) in the same GEMM.

    Parameters
    ----------
    grad_y : DeviceArray
        (..., out_features).
    weight : DeviceArray
        (out_features, in_features), grad_y's dtype.
    out : DeviceArray, optional
        (..., in_features); written and returned.
    aux : DeviceArray, optional
        The previous layer's aux (required with an activation).
    activation : {None, 'relu', 'gelu'}, optional
        The previous layer's activation.
    bias_grad : DeviceArray, optional
        (in_features,), grad_y's dtype: the previous layer's bias gradient,
        overwritten. Needs an activation.
    precision : {'highest', 'high'} or Precision, optional

    Returns
    -------
    DeviceArray
        `out`, or a new (..., in_features) array.

    Raises
    ------
    TypeError, ValueError
        A bad argument (before any GPU work).
    CudalabError
        cuBLASLt has no algorithm for this epilogue, dtype and size.
    """
    try:
        return _core._nn_linear_backward_input(grad_y, weight, out, aux, activation, bias_grad,
                                               _matmul_precision(precision))
    except _ARG_ERRORS as exc:
        raise _renamed(exc, "_nn_linear_backward_input", "linear_backward_input") from None


def linear_backward_weight(grad_y, x, *, out=None, bias_grad=None, accumulate=False,
                           precision=None):
    """linear_backward_weight(grad_y, x, *, out=None, bias_grad=None, accumulate=False, precision=None)

    ``grad_w = grad_y.T @ x`` (added into `out` when accumulating), and the
    bias gradient ``grad_y.sum(rows)`` fused into the same GEMM.

    Parameters
    ----------
    grad_y : DeviceArray
        (..., out_features): the gradient of this layer's pre-activation.
    x : DeviceArray
        (..., in_features), as many rows, grad_y's dtype: the layer's input.
    out : DeviceArray, optional
        (out_features, in_features), grad_y's dtype; written and returned.
    bias_grad : DeviceArray, optional
        (out_features,), grad_y's dtype; overwritten (never accumulated).
    accumulate : bool, optional
        ``out += grad_y.T @ x``; needs `out`, refuses `bias_grad` (cuBLASLt's
        bias-gradient epilogue overwrites its vector).
    precision : {'highest', 'high'} or Precision, optional

    Returns
    -------
    DeviceArray
        `out`, or a new (out_features, in_features) array.

    Raises
    ------
    TypeError, ValueError
        A bad argument (before any GPU work).
    CudalabError
        cuBLASLt has no algorithm for this epilogue, dtype and size.
    """
    try:
        return _core._nn_linear_backward_weight(grad_y, x, out, bias_grad, accumulate,
                                                _matmul_precision(precision))
    except _ARG_ERRORS as exc:
        raise _renamed(exc, "_nn_linear_backward_weight", "linear_backward_weight") from None


def cross_entropy(logits, labels, *, grad=None, reduction="mean", loss_scale=None, out=None,
                  ignore_index=-100):
    """cross_entropy(logits, labels, *, grad=None, reduction='mean', loss_scale=None, out=None, ignore_index=-100)

    Softmax cross-entropy of class logits and, optionally, its gradient, in
    one kernel (torch.nn.functional.cross_entropy without label smoothing or
    class weights), computed in float32.

    Parameters
    ----------
    logits : DeviceArray
        (N, C), float32, float16 or bfloat16; rows contiguous.
    labels : DeviceArray
        (N,), int32 or int64 class indices.
    grad : DeviceArray, optional
        (N, C) of logits' dtype (may be `logits` itself): receives the
        gradient of the reduced loss times `loss_scale`.
    reduction : {'mean', 'sum', 'none'}, optional
    loss_scale : DeviceArray, optional
        One float32 element (a GradScaler's ``scale``): scales the gradient,
        not the loss returned.
    out : DeviceArray, optional
        float32: one element for 'mean' / 'sum', (N,) for 'none'.
    ignore_index : int or None, optional
        Rows with this label count for nothing (torch's default -100).

    Returns
    -------
    DeviceArray
        `out`, or a new float32 array (0-d, or (N,) for 'none').

    Raises
    ------
    TypeError, ValueError
        A bad argument (before any GPU work).

    Notes
    -----
    A label outside [0, C) gives a NaN loss and gradient (found on the device,
    never read back), so a loss scaler skips that step.
    """
    try:
        return _core._nn_cross_entropy(logits, labels, grad, reduction, loss_scale, out,
                                       ignore_index)
    except _ARG_ERRORS as exc:
        raise _renamed(exc, "_nn_cross_entropy", "cross_entropy") from None
