"""cudalab.models.conv_routes: each convolution's route, measured once per shape.

A convolution that is not a plain GEMM (kxk, or 1x1 with a stride) runs one
of two ways:

* ``im2col``: write the im2col matrix (every output pixel's window as a row)
  and multiply it by the weights with one cuBLASLt GEMM. Simple and it runs
  on every GPU, but the matrix is kh*kw times the input, written and read
  back: at batch 128 it was 40% of ResNet-50's forward.
* ``implicit``: one implicit-GEMM kernel (CUTLASS's SM80 tensor-core
  convolution, built in for SM80 and newer) that loads each window straight
  from the NHWC input inside the GEMM's own pipeline and never writes the
  matrix. Several tile shapes are built; which is fastest depends on the
  layer's shape.

Which is faster depends on the GPU, the dtype and the shape, so it is
measured, as ``torch.backends.cudnn.benchmark`` does for cuDNN's algorithms:
the first time a shape is planned outside a CUDA graph capture, the im2col
route and every implicit tile are timed on scratch buffers, and the fastest
is kept for the rest of the process. Each candidate is captured REPEATS
times into a CUDA graph and timed by events around replays: what is compared
is the GPU's time, not the host's time to launch (at batch 1 a convolution
takes a few microseconds, less than its launch from Python). That first plan
synchronizes; later ones do not. Inside a capture an unmeasured shape takes
the implicit route's default tile (nothing can be timed there) and stays
unmeasured.

``set_conv_route("implicit" | "im2col" | "auto")`` forces a route (for
lessons, experiments and tests) or restores the measurement;
:func:`decisions` shows what was measured, :func:`forget` drops it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

from .. import _core, _precision
from ..streams import graph as _graph
from .arch import Conv
from .plan import (IMPLICIT_ALIGN, ITEMSIZE, PRECISION_CODES, ROUTE_IM2COL, ROUTE_IMPLICIT,
                   conv_steps, implicit_channels)

__all__ = ["MODES", "ConvShape", "choose", "decisions", "forget", "get_conv_route",
           "implicit_available", "implicit_tiles", "measure", "set_conv_route"]

MODES = ("auto", ROUTE_IMPLICIT, ROUTE_IM2COL)
# The matmul precision of TF32 (the implicit GEMM's only float32 form).
TF32 = _precision.resolve("tf32").matmul_precision
# Runs per captured graph, and timed replays of it after one untimed replay.
REPEATS = 10
REPLAYS = 3

_mode = "auto"
_measured: dict[tuple, "Decision"] = {}


@dataclass(frozen=True)
class ConvShape:
    """One convolution problem: NHWC input (n, h, w, cin), cout kh x kw filters.

    `src_dtype` is what the input holds (float32 images for a half model's stem).
    """

    n: int
    h: int
    w: int
    cin: int
    cout: int
    kh: int
    kw: int
    stride: int
    padding: int
    dtype: str
    precision: str = "highest"
    src_dtype: Optional[str] = None
    relu: bool = True

    def layer(self) -> Conv:
        """The shape as an arch.Conv (for the step builder)."""
        src = "input" if (self.src_dtype or self.dtype) != self.dtype else "x"
        return Conv("conv", "bn", src, "y", self.cin, self.cout, self.kh, self.kw, self.stride,
                    self.padding, self.relu)


@dataclass(frozen=True)
class Decision:
    """A measured choice: the route, the implicit tile (-1 for im2col) and every candidate's ms."""

    route: str
    tile: int
    times_ms: dict


def set_conv_route(mode: str) -> None:
    """set_conv_route(mode) -> None

    "auto" (measure each shape once, the default), "implicit" (always the
    implicit GEMM where it can run, its default tile) or "im2col" (always
    im2col + GEMM). Models plan with the mode in force when a batch shape is
    first compiled: call ``model.release()`` to plan again.
    """
    global _mode
    if mode not in MODES:
        raise ValueError(f"set_conv_route() argument 'mode': expected one of "
                         f"{', '.join(repr(m) for m in MODES)}, got {mode!r}")
    _mode = mode


def get_conv_route() -> str:
    """The current mode (see :func:`set_conv_route`)."""
    return _mode


def decisions() -> dict[tuple, dict[str, Any]]:
    """Every measured shape: ``{key: {"route": str, "tile": str or None, "times_ms": {...}}}``."""
    return {k: {"route": d.route, "tile": _tile_name(k[1], d.tile), "times_ms": dict(d.times_ms)}
            for k, d in _measured.items()}


def forget() -> None:
    """forget() -> None

    Drop every measured decision: each shape is measured again the next time
    it is planned outside a capture. The mode itself is kept.
    """
    _measured.clear()


@lru_cache(maxsize=None)
def implicit_tiles(dtype: str) -> tuple[str, ...]:
    """The implicit-GEMM tile shapes this build has for `dtype` (empty: none)."""
    names, align = _core._conv_implicit_tiles(dtype)
    if names and align != IMPLICIT_ALIGN.get(dtype):
        raise AssertionError(f"implicit GEMM alignment {align} for {dtype}, the planner "
                             f"assumes {IMPLICIT_ALIGN.get(dtype)}")
    return tuple(names)


def implicit_available(dtype: str, precision: str = TF32, device: Optional[int] = None) -> bool:
    """Whether the implicit GEMM can run `dtype` at `precision` on `device` (None: current).

    It needs a build with the kernels, an SM80 or newer GPU, and for float32
    the TF32 precision ('high'): its float32 kernels run on TF32 tensor cores.
    """
    if dtype not in IMPLICIT_ALIGN or not implicit_tiles(dtype):
        return False
    if dtype == "float32" and PRECISION_CODES[precision] == 0:
        return False
    return _compute_major(_core.current_device() if device is None else device) >= 8


@lru_cache(maxsize=None)
def _compute_major(device: int) -> int:
    """The device's compute capability major, asked once per device: ops.conv2d and every
    choose() check it, and cudaGetDeviceProperties is far too slow for a per-call path."""
    return _core._device_properties(device)["major"]


def _tile_name(dtype: str, tile: int) -> Optional[str]:
    if tile < 0:
        return None
    tiles = implicit_tiles(dtype)
    return tiles[tile] if tile < len(tiles) else None


def _key(shape: ConvShape) -> tuple:
    return (_core.current_device(), shape.dtype, shape.precision, shape.src_dtype, shape.n,
            shape.h, shape.w, shape.cin, shape.cout, shape.kh, shape.kw, shape.stride,
            shape.padding, shape.relu)


def choose(shape: ConvShape, residual: bool = False) -> tuple[str, int]:
    """choose(shape, residual=False) -> (route, tile)

    The route for one convolution under the current mode: measured once per
    shape in "auto" (see the module docstring); im2col wherever the implicit
    GEMM cannot run (older GPU, float32 without TF32, a residual add in the
    epilogue together with a bias: its one C operand holds the bias).
    """
    if _mode == ROUTE_IM2COL or residual or not implicit_available(shape.dtype, shape.precision):
        return ROUTE_IM2COL, -1
    if _mode == ROUTE_IMPLICIT:
        return ROUTE_IMPLICIT, -1
    known = _measured.get(_key(shape))
    if known is not None:
        return known.route, known.tile
    if _core.is_current_stream_capturing():
        return ROUTE_IMPLICIT, -1
    decision = measure(shape)
    _measured[_key(shape)] = decision
    return decision.route, decision.tile


def measure(shape: ConvShape, repeats: int = REPEATS) -> Decision:
    """measure(shape, repeats=REPEATS) -> Decision

    Time the im2col route and every implicit tile on scratch buffers of
    `shape` (milliseconds per run, from CUDA-graph replays of `repeats` runs)
    and return the fastest. Synchronizes. Does not record the decision.
    """
    times: dict[str, float] = {}
    best = (float("inf"), ROUTE_IM2COL, -1)
    candidates = [(ROUTE_IM2COL, -1)] + [(ROUTE_IMPLICIT, t)
                                         for t in range(len(implicit_tiles(shape.dtype)))]
    buffers = _Buffers(shape)
    for route, tile in candidates:
        run = buffers.runner(route, tile)
        if run is None:
            continue
        ms = _time_ms(run, repeats)
        label = route if tile < 0 else f"{route} {implicit_tiles(shape.dtype)[tile]}"
        times[label] = ms
        if ms < best[0]:
            best = (ms, route, tile)
    return Decision(best[1], best[2], times)


def _time_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # outside the capture: cuBLASLt's and the kernels' first-use setup
    g = _core.CUDAGraph()
    with _graph(g):
        for _ in range(repeats):
            fn()
    g.replay()
    start, end = _core.Event(), _core.Event()
    start.record()
    for _ in range(REPLAYS):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (REPLAYS * repeats)


class _Buffers:
    """Scratch operands of one shape, shared by every candidate's one-conv program."""

    def __init__(self, shape: ConvShape) -> None:
        self.shape = shape
        layer = shape.layer()
        oh, ow = layer.output_size(shape.h, shape.w)
        size = ITEMSIZE[shape.dtype]
        src_dtype = shape.src_dtype or shape.dtype
        cin = implicit_channels(shape.cin, shape.dtype)
        self.layer = layer
        self.x = _core.zeros((shape.n, shape.h, shape.w, shape.cin), dtype=src_dtype)
        # Room for either weight layout: (cout, K padded) and (cout, kh, kw, cin padded).
        k = max(layer.k_padded, shape.kh * shape.kw * cin)
        self.w = _core.zeros((shape.cout, k), dtype=shape.dtype)
        self.bias = _core.zeros((shape.cout,), dtype=shape.dtype)
        self.out = _core.empty((shape.n, oh, ow, shape.cout), dtype=shape.dtype)
        scratch = max(shape.n * oh * ow * layer.k_padded, shape.n * shape.h * shape.w * cin)
        self.scratch = _core.empty((scratch * size,), dtype="uint8")

    def runner(self, route: str, tile: int) -> Optional[Callable[[], None]]:
        s = self.shape
        slots = (self.x, self.w, self.bias, self.out, self.scratch)
        steps = conv_steps(self.layer, (s.n, s.h, s.w, s.cin), route, tile, s.dtype,
                           s.precision, x=(0, 0), w=(1, 0), bias=(2, 0), out=(3, 0),
                           scratch=(4, 0))
        try:
            program = _core._convnet_compile(tuple(steps), slots, "conv_route")
        except _core.CudalabError:
            return None  # this tile cannot do this shape
        return lambda: _core._convnet_run(program, slots)
