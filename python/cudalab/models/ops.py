"""cudalab.models.ops: the convolution-as-GEMM pieces of the ResNet forward, one at a time.

The network runs these as steps of one compiled program
(:mod:`~cudalab.models.plan`); here each is a function on DeviceArrays, for
the conv_as_gemm lesson and for tests. Each call runs a one-step program,
compiled on the first call with the same shapes, dtypes and alignments and
then cached, so a repeated call costs what the step costs. Everything is
asynchronous on the current stream.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional


from .. import _core
from .._check import check_int
from .arch import conv_output_size
from .plan import PRECISION_CODES

__all__ = ["conv_gemm", "global_avg_pool", "im2col", "max_pool2d"]

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_CACHE_SIZE = 64
_programs: "OrderedDict[tuple, Any]" = OrderedDict()


def _alignment(a: _core.DeviceArray) -> int:
    ptr = a.data_ptr
    return 256 if ptr % 256 == 0 else ptr & -ptr


def _run(steps: tuple, slots: tuple, name: str) -> None:
    """Run a one-step program, compiling it on first use for this layout."""
    key = (steps, tuple((s.device, s.nbytes, _alignment(s)) for s in slots))
    program = _programs.get(key)
    if program is None:
        program = _core._convnet_compile(steps, slots, name)
        _programs[key] = program
        if len(_programs) > _CACHE_SIZE:
            _programs.popitem(last=False)
    else:
        _programs.move_to_end(key)
    _core._convnet_run(program, slots)


def _array(x: Any, func: str, param: str, ndim: int,
           dtypes: tuple = _FLOAT_DTYPES) -> _core.DeviceArray:
    if not isinstance(x, _core.DeviceArray):
        raise TypeError(f"{func}() argument '{param}': expected a DeviceArray, got "
                        f"{type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{func}() argument '{param}': expected {ndim} dimensions, got "
                         f"shape {x.shape}")
    if str(x.dtype) not in dtypes:
        raise TypeError(f"{func}() argument '{param}': expected one of {', '.join(dtypes)}, "
                        f"got {x.dtype}")
    if not x.is_contiguous:
        raise ValueError(f"{func}() argument '{param}': must be C-contiguous")
    return x


def _out(out: Any, func: str, shape: tuple, dtype: str, like: _core.DeviceArray) -> Any:
    if out is None:
        return _core.empty(shape, dtype=dtype)
    out = _array(out, func, "out", len(shape))
    if out.shape != shape or str(out.dtype) != dtype or out.device != like.device:
        raise ValueError(f"{func}() argument 'out': expected {dtype} {shape} on device "
                         f"{like.device}, got {out.dtype} {out.shape} on device {out.device}")
    return out


def im2col(x: _core.DeviceArray, kh: int, kw: int, stride: int = 1, padding: int = 0,
           k_padded: Optional[int] = None, dtype: Optional[str] = None,
           out: Optional[_core.DeviceArray] = None) -> _core.DeviceArray:
    """im2col(x, kh, kw, stride=1, padding=0, k_padded=None, dtype=None, out=None) -> DeviceArray

    The GEMM operand of a kh x kw convolution of NHWC `x`.

    Parameters
    ----------
    x : DeviceArray
        (N, H, W, C), C-contiguous, a float dtype.
    kh, kw, stride, padding : int
        The window, its square stride and symmetric zero padding.
    k_padded : int, optional
        Row length, >= kh * kw * C; the columns past kh * kw * C are zero
        (default: no padding).
    dtype : str, optional
        Of the result: x's dtype (default), or any float dtype when x is
        float32 (cast on store, as the network's stem does).
    out : DeviceArray, optional

    Returns
    -------
    DeviceArray
        (N * OH * OW, k_padded): row (n, oh, ow) holds the window under that
        output pixel, ordered (ky, kx, c), zeros where it covers padding.
    """
    func = "im2col"
    x = _array(x, func, "x", 4)
    kh, kw = check_int(kh, func, "kh", 1), check_int(kw, func, "kw", 1)
    stride, padding = check_int(stride, func, "stride", 1), check_int(padding, func, "padding", 0)
    n, h, w, c = x.shape
    k = kh * kw * c
    k_padded = k if k_padded is None else check_int(k_padded, func, "k_padded", max(k, 1))
    dtype = str(x.dtype) if dtype is None else dtype
    if dtype not in _FLOAT_DTYPES or (dtype != str(x.dtype) and str(x.dtype) != "float32"):
        raise TypeError(f"{func}() argument 'dtype': {x.dtype} input gives {x.dtype} only "
                        f"(float32 input may cast to any float dtype), got {dtype}")
    oh, ow = conv_output_size(h, kh, stride, padding), conv_output_size(w, kw, stride, padding)
    if oh < 1 or ow < 1:
        raise ValueError(f"{func}(): a {kh}x{kw} window with padding {padding} does not fit "
                         f"a {h}x{w} image")
    out = _out(out, func, (n * oh * ow, k_padded), dtype, x)
    if out.size:
        _run((("im2col", 0, 0, str(x.dtype), 1, 0, dtype, n, h, w, c, oh, ow, kh, kw, stride,
               padding, k_padded),), (x, out), func)
    return out


def max_pool2d(x: _core.DeviceArray, kernel: int = 3, stride: int = 2, padding: int = 1,
               out: Optional[_core.DeviceArray] = None) -> _core.DeviceArray:
    """max_pool2d(x, kernel=3, stride=2, padding=1, out=None) -> DeviceArray

    Max over kernel x kernel windows of NHWC `x` (padding never wins), as
    torch's ``max_pool2d``; (N, OH, OW, C) in x's dtype. A NaN anywhere in a
    window makes that output NaN, as in torch and ``np.max``.
    """
    func = "max_pool2d"
    x = _array(x, func, "x", 4)
    kernel, stride = check_int(kernel, func, "kernel", 1), check_int(stride, func, "stride", 1)
    padding = check_int(padding, func, "padding", 0)
    if 2 * padding > kernel:
        raise ValueError(f"{func}(): padding must be at most half the kernel, got "
                         f"padding {padding} for kernel {kernel}")
    n, h, w, c = x.shape
    oh = conv_output_size(h, kernel, stride, padding)
    ow = conv_output_size(w, kernel, stride, padding)
    if oh < 1 or ow < 1:
        raise ValueError(f"{func}(): a {kernel}x{kernel} window does not fit a {h}x{w} image")
    out = _out(out, func, (n, oh, ow, c), str(x.dtype), x)
    if out.size:
        _run((("max_pool", 0, 0, 1, 0, str(x.dtype), n, h, w, c, oh, ow, kernel, stride,
               padding),), (x, out), func)
    return out


def global_avg_pool(x: _core.DeviceArray,
                    out: Optional[_core.DeviceArray] = None) -> _core.DeviceArray:
    """global_avg_pool(x, out=None) -> DeviceArray

    The mean over all pixels of NHWC `x`: (N, H, W, C) -> (N, C), summed in
    float32 (float64 for float64).
    """
    func = "global_avg_pool"
    x = _array(x, func, "x", 4)
    n, h, w, c = x.shape
    if h * w == 0:
        raise ValueError(f"{func}(): x has no pixels (shape {x.shape})")
    out = _out(out, func, (n, c), str(x.dtype), x)
    if out.size:
        _run((("avg_pool", 0, 0, 1, 0, str(x.dtype), n, h * w, c),), (x, out), func)
    return out


def conv_gemm(a: _core.DeviceArray, w: _core.DeviceArray,
              bias: Optional[_core.DeviceArray] = None, relu: bool = False,
              out: Optional[_core.DeviceArray] = None, accumulate: bool = False,
              precision: Optional[str] = None) -> _core.DeviceArray:
    """conv_gemm(a, w, bias=None, relu=False, out=None, accumulate=False, precision=None)

    ``out = relu?(a @ w.T + bias (+ out))``: a convolution's GEMM with its
    folded BatchNorm bias, ReLU and residual add in cuBLASLt's epilogue.

    Parameters
    ----------
    a : DeviceArray
        (M, K): im2col rows, or an NHWC activation viewed as (N*H*W, C).
    w : DeviceArray
        (cout, K), a's dtype (float32, float16 or bfloat16).
    bias : DeviceArray, optional
        (cout,), a's dtype.
    relu : bool, optional
    out : DeviceArray, optional
        (M, cout), a's dtype; required when accumulating.
    accumulate : bool, optional
        Add out's contents (beta = 1): a residual block's shortcut, added
        before the ReLU.
    precision : {'fp32', 'tf32', 'highest', 'high'}, optional
        float32 only: true fp32 ('fp32' or 'highest') or TF32 ('tf32' or
        'high'). Default: get_float32_matmul_precision().

    Returns
    -------
    DeviceArray
        `out`, or a new (M, cout) array.
    """
    func = "conv_gemm"
    dtypes = ("float16", "bfloat16", "float32")
    a = _array(a, func, "a", 2, dtypes)
    w = _array(w, func, "w", 2, dtypes)
    m, k = a.shape
    cout = w.shape[0]
    if k == 0:
        raise ValueError(f"{func}(): a has no columns (K = 0)")
    if w.shape[1] != k or str(w.dtype) != str(a.dtype):
        raise ValueError(f"{func}(): w must be ({{cout}}, {k}) {a.dtype}, got {w.dtype} "
                         f"{w.shape}")
    if bias is not None:
        bias = _array(bias, func, "bias", 1, dtypes)
        if bias.shape != (cout,) or str(bias.dtype) != str(a.dtype):
            raise ValueError(f"{func}(): bias must be ({cout},) {a.dtype}, got {bias.dtype} "
                             f"{bias.shape}")
    if not isinstance(relu, bool) or not isinstance(accumulate, bool):
        raise TypeError(f"{func}(): relu and accumulate must be bools")
    if accumulate and out is None:
        raise ValueError(f"{func}(): accumulate=True adds to out, which must be given")
    if precision is None:
        precision = _core.get_float32_matmul_precision()
    if precision not in PRECISION_CODES:
        raise ValueError(f"{func}() argument 'precision': expected one of "
                         f"{', '.join(map(repr, PRECISION_CODES))}, got {precision!r}")
    out = _out(out, func, (m, cout), str(a.dtype), a)
    if m and k and cout:
        slots = (a, w, out) if bias is None else (a, w, out, bias)
        bias_ref = (-1, 0) if bias is None else (3, 0)
        _run((("gemm", 0, 0, 1, 0, *bias_ref, 2, 0, str(a.dtype), str(a.dtype),
               PRECISION_CODES[precision], m, k, cout, int(relu),
               int(accumulate)),), slots, func)
    return out
