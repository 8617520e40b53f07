"""cudalab.models.params: ResNet-50's weights as GEMM operands, BatchNorm folded in.

In NHWC a convolution is one GEMM, ``out (M, cout) = cols (M, K) @ W (K, cout) + b``,
with M = N * Ho * Wo output pixels and one im2col row per pixel
(:func:`cudalab.models.reference.im2col`; a 1x1 convolution's rows are the
activation itself). This module builds each ``W`` and ``b`` on the host:

* **K ordering** ``(kh, kw, cin)``, cin fastest: row ``(i * kw + j) * cin + c``
  of ``W`` holds torchvision's ``weight[:, c, i, j]``, the same order in
  which an NHWC im2col row lists the window (pixel (i, j), then its
  channels). A 1x1 conv's K is just cin, so its activation needs no im2col.
* **Padding**: K is rounded up to a multiple of 8 elements
  (:data:`~cudalab.models.arch.K_ALIGN`) with zero rows; only the stem
  needs it: K = 7 * 7 * 3 = 147 -> 152, and its im2col rows carry 5 zero
  columns to match. 152 rather than 160: 8 elements is the 16-byte alignment
  cuBLASLt's tensor-core kernels need for fp16 / bf16 leading dimensions (and
  more than the 4 tf32 / fp32 need); padding further adds im2col traffic and
  FLOPs (+8.8% instead of +3.4%) for no alignment gain, since the GEMM's own
  K tiling handles a partial last tile. Every cout (64 ... 2048, and the 1000
  classes) is already a multiple of 8. M needs no alignment: in row-major
  NHWC GEMMs the leading dimensions are K and cout, never M.
* **BatchNorm folded** (eval mode, running statistics): with
  ``s = gamma / sqrt(running_var + eps)``, ``W' = W * s`` per output channel
  and ``b = beta - running_mean * s``, computed in float64 and stored as
  float32 (float64 on request, for a float64 reference). The fc layer keeps its own bias and is stored as ``W.T``
  (2048, 1000).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from .._check import arg_error, check_real
from .arch import RESNET50, Conv, Linear, round_up
from .weights import check_state

__all__ = ["BN_EPS", "FoldedParams", "GemmWeights", "conv_weight_matrix", "fold",
           "fold_batchnorm"]

# torch.nn.BatchNorm2d's default eps, which torchvision's ResNet uses.
BN_EPS = 1e-5


def conv_weight_matrix(weight: np.ndarray, k_padded: int | None = None) -> np.ndarray:
    """conv_weight_matrix(weight, k_padded=None) -> ndarray

    A torch conv weight as the GEMM's B operand: (cout, cin, kh, kw) ->
    (K, cout), K ordered (kh, kw, cin), then zero rows up to `k_padded`.

    Parameters
    ----------
    weight : ndarray
        (cout, cin, kh, kw).
    k_padded : int, optional
        Rows of the result, >= kh * kw * cin (default: no padding).

    Returns
    -------
    ndarray
        (k_padded, cout), C-contiguous, `weight`'s dtype.
    """
    weight = np.asarray(weight)
    if weight.ndim != 4:
        raise arg_error(ValueError, "conv_weight_matrix", "weight",
                        f"expected (cout, cin, kh, kw), got shape {weight.shape}")
    cout, cin, kh, kw = weight.shape
    k = kh * kw * cin
    k_padded = k if k_padded is None else k_padded
    if k_padded < k:
        raise arg_error(ValueError, "conv_weight_matrix", "k_padded",
                        f"must be >= kh * kw * cin = {k}, got {k_padded}")
    out = np.zeros((k_padded, cout), dtype=weight.dtype)
    out[:k] = weight.transpose(2, 3, 1, 0).reshape(k, cout)
    return out


def fold_batchnorm(weight: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                   mean: np.ndarray, var: np.ndarray,
                   eps: float = BN_EPS) -> tuple[np.ndarray, np.ndarray]:
    """fold_batchnorm(weight, gamma, beta, mean, var, eps=1e-5) -> (weight, bias)

    ``bn(conv(x, weight))`` in eval mode as ``conv(x, weight') + bias``, in float64.

    Parameters
    ----------
    weight : ndarray
        (cout, ...) conv weight, output channel first.
    gamma, beta, mean, var : ndarray
        (cout,) BatchNorm weight, bias, running mean and running variance.
    eps : float, optional

    Returns
    -------
    weight : ndarray
        float64, `weight`'s shape, each output channel scaled.
    bias : ndarray
        float64, (cout,).
    """
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    w = np.asarray(weight, np.float64)
    folded = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    return folded, np.asarray(beta, np.float64) - np.asarray(mean, np.float64) * scale


@dataclass(frozen=True, eq=False)
class GemmWeights:
    """One layer's GEMM operands: ``out = cols @ weight + bias``.

    Attributes
    ----------
    layer : Conv or Linear
    weight : ndarray
        (K padded, cout), C-contiguous; zero rows past the real K.
    bias : ndarray
        (cout,), the weight's dtype (float32, or float64 for a float64 reference).
    """

    layer: Union[Conv, Linear]
    weight: np.ndarray
    bias: np.ndarray


class FoldedParams:
    """FoldedParams(state, eps=1e-5, dtype=float32)

    ResNet-50's weights ready for NHWC GEMMs: every conv with its BatchNorm
    folded in, K ordered (kh, kw, cin) and padded to a multiple of 8, and the
    fc as (2048, 1000). Build it with :func:`fold`.

    Attributes
    ----------
    layers : tuple of layers
        :data:`~cudalab.models.arch.RESNET50`.
    state : dict of str to ndarray
        The unfolded float32 weights it was made from (torchvision's names and layouts).
    eps : float
    dtype : numpy.dtype
        Of every GEMM weight and bias: float32 (what the GPU reads) or float64.
    gemms : dict of str to GemmWeights
        By layer name (``"conv1"``, ``"layer3.4.conv2"``, ``"fc"``), in execution order.
    """

    def __init__(self, state: Any, eps: float = BN_EPS, dtype: Any = np.float32) -> None:
        self.eps = check_real(eps, "fold", "eps")
        if self.eps <= 0:
            raise arg_error(ValueError, "fold", "eps", f"must be > 0, got {self.eps}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise arg_error(TypeError, "fold", "dtype",
                            f"expected float32 or float64, got {self.dtype}")
        self.state = check_state(state, "fold")
        self.layers = RESNET50
        self.gemms: dict[str, GemmWeights] = {}
        for layer in self.layers:
            if isinstance(layer, (Conv, Linear)):
                self.gemms[layer.name] = self._gemm(layer)

    def _gemm(self, layer: Union[Conv, Linear]) -> GemmWeights:
        s = self.state
        if isinstance(layer, Linear):
            w = s[f"{layer.name}.weight"].T
            b = s[f"{layer.name}.bias"]
        else:
            bn = layer.bn
            w, b = fold_batchnorm(s[f"{layer.name}.weight"], s[f"{bn}.weight"], s[f"{bn}.bias"],
                                  s[f"{bn}.running_mean"], s[f"{bn}.running_var"], self.eps)
            w = conv_weight_matrix(w, layer.k_padded)
        if w.shape[1] != round_up(w.shape[1]):  # holds for every ResNet-50 layer
            raise AssertionError(f"{layer.name}: cout {w.shape[1]} is not a multiple of 8")
        return GemmWeights(layer, np.ascontiguousarray(w, self.dtype),
                           np.ascontiguousarray(b, self.dtype))

    def __getitem__(self, name: str) -> GemmWeights:
        return self.gemms[name]

    @property
    def nbytes(self) -> int:
        """Bytes of all GEMM weights and biases (padding included)."""
        return sum(g.weight.nbytes + g.bias.nbytes for g in self.gemms.values())

    def __repr__(self) -> str:
        return (f"FoldedParams({len(self.gemms)} GEMMs, {self.nbytes / 2**20:.1f} MiB "
                f"{self.dtype.name})")


def fold(state: Any, eps: float = BN_EPS, dtype: Any = np.float32) -> FoldedParams:
    """fold(state, eps=1e-5, dtype=float32) -> FoldedParams

    ResNet-50's weights as GEMM operands with BatchNorm folded in (see the module docstring).

    Parameters
    ----------
    state : mapping of str to array-like
        torchvision's state_dict names and layouts, as :func:`load_weights`,
        :func:`from_torchvision` and :func:`init_weights` return.
    eps : float, optional
        BatchNorm's eps (torchvision: 1e-5).
    dtype : {float32, float64}, optional
        Of the folded weights and biases. float32 is what the GPU model reads;
        float64 (folded from the same float32 state without rounding) makes
        :func:`~cudalab.models.reference.forward` in float64 a float64
        reference of the unfolded network.

    Returns
    -------
    FoldedParams
    """
    return FoldedParams(state, eps, dtype)
