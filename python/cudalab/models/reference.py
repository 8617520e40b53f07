"""cudalab.models.reference: ResNet-50's forward in NumPy, NHWC, convolution as GEMM.

The host twin of the C forward and its correctness reference: the same
folded weights (:class:`~cudalab.models.params.FoldedParams`), the same
layouts and the same order of operations, written with NumPy only.

* :func:`im2col` gathers every output pixel's window into one row, K ordered
  (kh, kw, cin) with zero columns up to the padded K (the GPU im2col kernel
  writes exactly these bytes);
* :func:`conv2d` is ``im2col @ W + b`` (a 1x1 conv skips im2col; stride 2
  reads every other pixel), then the residual add and ReLU;
* :func:`max_pool` and :func:`global_avg_pool`; :func:`forward` runs the
  layer list.

Values stay in the chosen dtype (float32 or float64) from input to logits.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .._check import arg_error, check_bool, check_int
from .arch import Conv, GlobalAvgPool, Linear, MaxPool, last_reads
from .params import FoldedParams, GemmWeights

__all__ = ["conv2d", "forward", "global_avg_pool", "im2col", "max_pool"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_nhwc(x: Any, func: str, param: str = "x") -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise arg_error(TypeError, func, param, f"expected a NumPy array, got {type(x).__name__}")
    if x.ndim != 4:
        raise arg_error(ValueError, func, param, f"expected (N, H, W, C), got shape {x.shape}")
    if x.dtype not in _DTYPES:
        raise arg_error(TypeError, func, param, f"expected float32 or float64, got {x.dtype}")
    return x


def _windows(x: np.ndarray, kh: int, kw: int, stride: int, pad_value: float,
             padding: int) -> np.ndarray:
    """A read-only (N, Ho, Wo, kh, kw, C) view of every window of padded `x` (no copy of windows)."""
    if padding:
        x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)),
                   constant_values=pad_value)
    n, h, w, c = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    sn, sh, sw, sc = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (n, ho, wo, kh, kw, c), (sn, sh * stride, sw * stride, sh, sw, sc), writeable=False)


def im2col(x: np.ndarray, kh: int, kw: int, stride: int = 1, padding: int = 0,
           k_padded: Optional[int] = None) -> np.ndarray:
    """im2col(x, kh, kw, stride=1, padding=0, k_padded=None) -> ndarray

    Every output pixel's receptive field as one row, for a convolution as a GEMM.

    ``cols[n, y, x, (i * kw + j) * C + c] = xpad[n, y * stride + i, x * stride + j, c]``
    where ``xpad`` is `x` with `padding` zeros on each spatial side; columns
    ``kh * kw * C`` to ``k_padded - 1`` are zero. Reshaped to
    (N * Ho * Wo, k_padded) (free: it is C-contiguous) it is the GEMM's A
    operand for :func:`~cudalab.models.params.conv_weight_matrix`'s B.

    Parameters
    ----------
    x : ndarray
        (N, H, W, C) float32 or float64.
    kh, kw : int
        Kernel height and width, >= 1.
    stride : int, optional
        >= 1, both axes.
    padding : int, optional
        >= 0, zeros on every spatial side.
    k_padded : int, optional
        Row length, >= kh * kw * C (default: exactly that).

    Returns
    -------
    ndarray
        (N, Ho, Wo, k_padded), `x`'s dtype, C-contiguous, with
        Ho = (H + 2 * padding - kh) // stride + 1 (likewise Wo).
    """
    x = _check_nhwc(x, "im2col")
    kh, kw = check_int(kh, "im2col", "kh"), check_int(kw, "im2col", "kw")
    stride = check_int(stride, "im2col", "stride")
    padding = check_int(padding, "im2col", "padding", minimum=0)
    n, h, w, c = x.shape
    if h + 2 * padding < kh or w + 2 * padding < kw:
        raise arg_error(ValueError, "im2col", "x",
                        f"padded image {h + 2 * padding}x{w + 2 * padding} is smaller than "
                        f"the {kh}x{kw} kernel")
    k = kh * kw * c
    k_padded = k if k_padded is None else check_int(k_padded, "im2col", "k_padded", minimum=k)
    windows = _windows(x, kh, kw, stride, 0.0, padding)
    ho, wo = windows.shape[1:3]
    cols = np.empty((n, ho, wo, k_padded), dtype=x.dtype)
    cols[..., k:] = 0
    # The first k columns as (kh, kw, C) axes: a view, so the copy below is the only pass.
    cols[..., :k].reshape(n, ho, wo, kh, kw, c)[...] = windows
    return cols


def _gemm_rows(x: np.ndarray, conv: Conv) -> np.ndarray:
    """The GEMM's A operand (M, K padded) for `conv` on NHWC `x`."""
    if conv.is_1x1 and conv.k == conv.k_padded:
        if conv.stride > 1:  # the strided gather a 1x1/2 conv does instead of im2col
            x = x[:, ::conv.stride, ::conv.stride, :]
        return np.ascontiguousarray(x).reshape(-1, conv.cin)
    cols = im2col(x, conv.kh, conv.kw, conv.stride, conv.padding, conv.k_padded)
    return cols.reshape(-1, conv.k_padded)


def conv2d(x: np.ndarray, gemm: GemmWeights, residual: Optional[np.ndarray] = None) -> np.ndarray:
    """conv2d(x, gemm, residual=None) -> ndarray

    One folded convolution: ``relu?(im2col(x) @ W + b (+ residual))``, NHWC.

    Parameters
    ----------
    x : ndarray
        (N, H, W, cin) float32 or float64.
    gemm : GemmWeights
        A :class:`~cudalab.models.arch.Conv` layer's folded weights; the
        computation runs in `x`'s dtype.
    residual : ndarray, optional
        (N, Ho, Wo, cout), added before the ReLU.

    Returns
    -------
    ndarray
        (N, Ho, Wo, cout), `x`'s dtype.
    """
    x = _check_nhwc(x, "conv2d")
    conv = gemm.layer
    if not isinstance(conv, Conv):
        raise arg_error(TypeError, "conv2d", "gemm",
                        f"expected a convolution's GemmWeights, got {type(conv).__name__}")
    if x.shape[3] != conv.cin:
        raise arg_error(ValueError, "conv2d", "x",
                        f"{conv.name} expects {conv.cin} channels, got {x.shape[3]}")
    n = x.shape[0]
    ho, wo = conv.output_size(x.shape[1], x.shape[2])
    out = _gemm_rows(x, conv) @ gemm.weight.astype(x.dtype, copy=False)
    out += gemm.bias.astype(x.dtype, copy=False)
    out = out.reshape(n, ho, wo, conv.cout)
    if residual is not None:
        out += residual
    if conv.relu:
        np.maximum(out, 0, out=out)
    return out


def max_pool(x: np.ndarray, kernel: int = 3, stride: int = 2, padding: int = 1) -> np.ndarray:
    """max_pool(x, kernel=3, stride=2, padding=1) -> ndarray

    Max over kernel x kernel windows of NHWC `x`; padding is -inf (never the maximum).

    Parameters
    ----------
    x : ndarray
        (N, H, W, C) float32 or float64.
    kernel, stride : int, optional
    padding : int, optional
        At most kernel // 2, as torch requires.

    Returns
    -------
    ndarray
        (N, Ho, Wo, C).
    """
    x = _check_nhwc(x, "max_pool")
    kernel = check_int(kernel, "max_pool", "kernel")
    stride = check_int(stride, "max_pool", "stride")
    padding = check_int(padding, "max_pool", "padding", minimum=0)
    if padding > kernel // 2:
        raise arg_error(ValueError, "max_pool", "padding",
                        f"must be <= kernel // 2 = {kernel // 2}, got {padding}")
    windows = _windows(x, kernel, kernel, stride, -np.inf, padding)
    # One pass per window offset (kernel * kernel of them), never per pixel.
    out = windows[:, :, :, 0, 0, :].copy()
    for i in range(kernel):
        for j in range(kernel):
            np.maximum(out, windows[:, :, :, i, j, :], out=out)
    return out


def global_avg_pool(x: np.ndarray) -> np.ndarray:
    """global_avg_pool(x) -> ndarray

    The mean over all spatial positions: (N, H, W, C) -> (N, C), `x`'s dtype.
    """
    x = _check_nhwc(x, "global_avg_pool")
    return x.mean(axis=(1, 2), dtype=x.dtype)


def forward(params: FoldedParams, x: Any, dtype: Any = np.float32,
            keep: bool = False) -> Any:
    """forward(params, x, dtype=float32, keep=False) -> logits or (logits, activations)

    ResNet-50's forward on the host: every layer of ``params.layers`` in order.

    Parameters
    ----------
    params : FoldedParams
    x : ndarray
        (N, H, W, 3) NHWC images, already normalised (see
        :func:`~cudalab.models.imagenet.preprocess`); any H, W >= 32 work
        (the network is convolutional up to the global pool).
    dtype : {float32, float64}, optional
        The dtype of every value computed.
    keep : bool, optional
        Also return every named activation (for layer-by-layer checks).

    Returns
    -------
    logits : ndarray
        (N, 1000) in `dtype`.
    activations : dict of str to ndarray
        Only with ``keep=True``: ``"input"``, each layer's `dst`.
    """
    if not isinstance(params, FoldedParams):
        raise arg_error(TypeError, "forward", "params",
                        f"expected FoldedParams (models.fold), got {type(params).__name__}")
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise arg_error(TypeError, "forward", "dtype", f"expected float32 or float64, got {dtype}")
    if not isinstance(x, np.ndarray) or x.ndim != 4 or x.shape[3] != 3:
        shape = getattr(x, "shape", None)
        raise arg_error(ValueError if shape is not None else TypeError, "forward", "x",
                        f"expected a (N, H, W, 3) NumPy array, got "
                        f"{shape if shape is not None else type(x).__name__}")
    if min(x.shape[1:3]) < 32:
        raise arg_error(ValueError, "forward", "x",
                        f"images must be at least 32x32, got {x.shape[1]}x{x.shape[2]}")
    if x.dtype.kind != "f":
        raise arg_error(TypeError, "forward", "x",
                        f"expected normalised float images, got {x.dtype} "
                        "(uint8 images go through models.preprocess first)")
    keep = check_bool(keep, "forward", "keep")
    acts = {"input": np.ascontiguousarray(x, dtype=dtype)}
    last_use = last_reads(params.layers)
    for i, layer in enumerate(params.layers):
        acts[layer.dst] = _run_layer(params, layer, acts)
        if not keep:  # drop activations no later layer reads: batch 32 fits in memory
            for name in [n for n in acts if last_use.get(n, -1) <= i and n != "fc"]:
                del acts[name]
    logits = acts["fc"]
    return (logits, acts) if keep else logits


def _run_layer(params: FoldedParams, layer: Any, acts: dict[str, np.ndarray]) -> np.ndarray:
    src = acts[layer.src]
    if isinstance(layer, Conv):
        residual = None if layer.residual is None else acts[layer.residual]
        return conv2d(src, params[layer.name], residual)
    if isinstance(layer, MaxPool):
        return max_pool(src, layer.kernel, layer.stride, layer.padding)
    if isinstance(layer, GlobalAvgPool):
        return global_avg_pool(src)
    if isinstance(layer, Linear):
        gemm = params[layer.name]
        return src @ gemm.weight.astype(src.dtype, copy=False) + gemm.bias.astype(src.dtype)
    raise TypeError(f"unknown layer {layer!r}")

