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
from . import conv_routes as CR
from .arch import Conv, conv_output_size
from .plan import PRECISION_CODES, ROUTE_IM2COL, ROUTE_IMPLICIT, conv_steps, implicit_channels

__all__ = ["conv2d", "conv_gemm", "conv_routes", "global_avg_pool", "im2col",
           "implicit_gemm_available", "max_pool2d"]

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


def _window_output(func: str, h: int, w: int, kh: int, kw: int, stride: int,
                   padding: int) -> tuple[int, int]:
    """(OH, OW) of a kh x kw window over an h x w image; ValueError where it does not fit."""
    oh, ow = conv_output_size(h, kh, stride, padding), conv_output_size(w, kw, stride, padding)
    if oh < 1 or ow < 1:
        raise ValueError(f"{func}(): a {kh}x{kw} window with padding {padding} does not fit "
                         f"a {h}x{w} image")
    return oh, ow


def _matmul_precision(func: str, precision: Optional[str]) -> str:
    """`precision` checked against the float32 GEMM precisions; None: the process default."""
    if precision is None:
        precision = _core.get_float32_matmul_precision()
    if precision not in PRECISION_CODES:
        raise ValueError(f"{func}() argument 'precision': expected one of "
                         f"{', '.join(map(repr, PRECISION_CODES))}, got {precision!r}")
    return precision


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
    oh, ow = _window_output(func, h, w, kh, kw, stride, padding)
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
    precision = _matmul_precision(func, precision)
    out = _out(out, func, (m, cout), str(a.dtype), a)
    if m and k and cout:
        slots = (a, w, out) if bias is None else (a, w, out, bias)
        bias_ref = (-1, 0) if bias is None else (3, 0)
        _run((("gemm", 0, 0, 1, 0, *bias_ref, 2, 0, str(a.dtype), str(a.dtype),
               PRECISION_CODES[precision], m, k, cout, int(relu),
               int(accumulate)),), slots, func)
    return out


CONV_ROUTES = ("auto", ROUTE_IMPLICIT, ROUTE_IM2COL)


def implicit_gemm_available(dtype: str = "float16", precision: str = CR.TF32) -> bool:
    """implicit_gemm_available(dtype='float16', precision='high') -> bool

    Whether :func:`conv2d` can take the implicit-GEMM route for `dtype` on the
    current device: this build has the kernels (SM80+ in its architecture
    list), the GPU is SM80 or newer, and float32 runs at 'high' (TF32).
    """
    return CR.implicit_available(dtype, precision)


def conv_routes(x_shape: tuple, w_shape: tuple, stride: int = 1, padding: int = 0,
                dtype: str = "float16", precision: str = CR.TF32) -> dict:
    """conv_routes(x_shape, w_shape, stride=1, padding=0, dtype='float16', precision='high') -> dict

    Time every route of one convolution now (im2col + GEMM, and each
    implicit-GEMM tile this build has): ``{label: milliseconds}``, what
    ``route="auto"`` measures once and keeps. Synchronizes.
    """
    n, h, w, cin = x_shape
    cout, kh, kw, _ = w_shape
    return dict(CR.measure(CR.ConvShape(n, h, w, cin, cout, kh, kw, stride, padding, dtype,
                                        precision)).times_ms)


def conv2d(x: _core.DeviceArray, w: _core.DeviceArray, bias: Optional[_core.DeviceArray] = None,
           *, stride: int = 1, padding: int = 0, relu: bool = False, route: str = "auto",
           precision: Optional[str] = None,
           out: Optional[_core.DeviceArray] = None) -> _core.DeviceArray:
    """conv2d(x, w, bias=None, *, stride=1, padding=0, relu=False, route='auto', precision=None, out=None)

    ``out = relu?(conv(x, w) + bias)`` for NHWC `x` and KRSC `w`, as
    torch's ``conv2d`` (cross-correlation, square stride, symmetric zero
    padding) on channels-last tensors, bias and ReLU fused.

    Parameters
    ----------
    x : DeviceArray
        (N, H, W, C), C-contiguous, float16, bfloat16 or float32.
    w : DeviceArray
        (cout, kh, kw, C), x's dtype: torch's (cout, C, kh, kw) weight
        transposed to (0, 2, 3, 1).
    bias : DeviceArray, optional
        (cout,), x's dtype.
    stride, padding : int
    relu : bool
    route : {'auto', 'implicit', 'im2col'}
        'implicit': one implicit-GEMM kernel (tensor cores; SM80+, float32
        only as TF32) that reads the windows in its own loads; 'im2col': the
        im2col matrix into a scratch buffer, then one cuBLASLt GEMM; 'auto':
        the faster for this shape, measured once per process
        (:mod:`cudalab.models.conv_routes`). A 1x1 stride-1 convolution is
        one GEMM on x itself whatever the route.
    precision : {'fp32', 'tf32', 'highest', 'high'}, optional
        float32 only: true fp32 (im2col route only) or TF32. Default:
        get_float32_matmul_precision().
    out : DeviceArray, optional
        (N, OH, OW, cout), x's dtype.

    Returns
    -------
    DeviceArray
        `out`, or a new (N, OH, OW, cout) array.
    """
    func = "conv2d"
    dtypes = ("float16", "bfloat16", "float32")
    x = _array(x, func, "x", 4, dtypes)
    w = _array(w, func, "w", 4, dtypes)
    dtype = str(x.dtype)
    n, h, wd, c = x.shape
    cout, kh, kw, wc = w.shape
    if wc != c or str(w.dtype) != dtype or min(cout, kh, kw) < 1:
        raise ValueError(f"{func}(): w must be (cout, kh, kw, {c}) {dtype}, got {w.dtype} "
                         f"{w.shape}")
    if bias is not None:
        bias = _array(bias, func, "bias", 1, dtypes)
        if bias.shape != (cout,) or str(bias.dtype) != dtype:
            raise ValueError(f"{func}(): bias must be ({cout},) {dtype}, got {bias.dtype} "
                             f"{bias.shape}")
    stride, padding = check_int(stride, func, "stride", 1), check_int(padding, func, "padding", 0)
    if not isinstance(relu, bool):
        raise TypeError(f"{func}() argument 'relu': expected a bool, got {type(relu).__name__}")
    if route not in CONV_ROUTES:
        raise ValueError(f"{func}() argument 'route': expected one of "
                         f"{', '.join(map(repr, CONV_ROUTES))}, got {route!r}")
    precision = _matmul_precision(func, precision)
    oh, ow = _window_output(func, h, wd, kh, kw, stride, padding)
    if c == 0:
        raise ValueError(f"{func}(): x has no channels")
    layer = Conv(func, "bn", "x", "y", c, cout, kh, kw, stride, padding, relu)
    chosen, tile = _conv_route(layer, x.shape, dtype, precision, route)
    out = _out(out, func, (n, oh, ow, cout), dtype, x)
    if not out.size:
        return out
    cin = implicit_channels(c, dtype) if chosen == ROUTE_IMPLICIT else c
    if cin != c:
        # The implicit GEMM reads whole vectors: the weight widened like x (zeros).
        padded = _core.empty((cout, kh, kw, cin), dtype=dtype)
        _run((("pad_channels", 0, 0, dtype, 1, 0, dtype, cout * kh * kw, c, cin),),
             (w, padded), func)
        w = padded
    scratch_elems = (n * oh * ow * layer.k if chosen == ROUTE_IM2COL else
                     n * h * wd * cin if cin != c else 0)
    # Slots: x, w, out, then the bias and the scratch only where used. A program is cached
    # by its slots' sizes and alignments, so a slot that only changes address (a small
    # scratch from the pool) must not be one: it would recompile the program on a new key.
    slots = [x, w, out]
    bias_ref = None
    if bias is not None:
        bias_ref = (len(slots), 0)
        slots.append(bias)
    scratch_ref = (len(slots), 0)
    if scratch_elems:
        slots.append(_core.empty((scratch_elems * x.itemsize,), dtype="uint8"))
    steps = conv_steps(layer, x.shape, chosen, tile, dtype, precision, x=(0, 0), w=(1, 0),
                       bias=bias_ref, out=(2, 0), scratch=scratch_ref,
                       k=layer.k)  # the weight as given: (cout, kh*kw*C), K unpadded
    _run(tuple(steps), tuple(slots), func)
    return out


def _conv_route(layer: Conv, shape: tuple, dtype: str, precision: str,
                route: str) -> tuple[Optional[str], int]:
    """(route, tile) for conv2d: None for a plain GEMM (1x1, stride 1)."""
    if layer.is_1x1 and layer.stride == 1:
        return None, -1
    if route == ROUTE_IM2COL:
        return ROUTE_IM2COL, -1
    if route == ROUTE_IMPLICIT:
        if not CR.implicit_available(dtype, precision):
            raise _core.CudalabError(
                f"conv2d(): route='implicit' needs an SM80+ GPU, a build with the "
                f"implicit-GEMM kernels, and for float32 precision 'high' (TF32); "
                f"got {dtype} at precision {precision!r}")
        return ROUTE_IMPLICIT, -1
    n, h, w, c = shape
    return CR.choose(CR.ConvShape(n, h, w, c, layer.cout, layer.kh, layer.kw, layer.stride,
                                  layer.padding, dtype, precision, relu=layer.relu))
