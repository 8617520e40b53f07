"""cudalab.models.plan: ResNet-50's forward as a list of C steps, and its workspace.

The GPU forward is one call into C (``_core._convnet_run``) that walks a
tuple of steps compiled once per input shape. This module writes those
steps from :data:`~cudalab.models.arch.RESNET50`; it is pure Python, so the
plan can be checked without a GPU.

Memory. Every step addresses memory through five slots, bound per call:

====  ==========  =====================================================
slot  name        contents
====  ==========  =====================================================
0     workspace   im2col scratch, then the activation buffers
1     weights     every GEMM weight (cout, K padded) and bias, in the
                  model's dtype
2     images      the float32 (N, H, W, 3) NHWC input
3     logits      the float32 (N, 1000) output
4     fc_bias     the fc bias in float32 (the logits' dtype)
====  ==========  =====================================================

Convolutions. A 1x1 stride-1 convolution is a GEMM on the activation
itself. Any other takes one of two routes, chosen per layer by
:mod:`~cudalab.models.conv_routes` (measured once per shape) and passed in
as ``routes``: ``im2col`` (the im2col matrix written into the scratch, then
one GEMM) or ``implicit`` (one implicit-GEMM kernel that reads the windows
in its own loads; the stem's images are first widened to 8 channels, 4 in
float32, in the scratch, cast on the way, so its loads are 16-byte vectors).

Activations share equally sized buffers by liveness (:func:`~cudalab.models.
arch.last_reads`): a buffer is reused once the last layer reading it has run.
A block's last convolution writes in place over its shortcut, which the
GEMM reads as C with beta = 1 and which nothing reads afterwards: the
residual add costs no memory and no kernel. An im2col convolution first
writes its im2col matrix into the scratch area, which every such layer
reuses (the steps run in order on one stream).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .. import _precision

from .arch import RESNET50, Conv, GlobalAvgPool, Layer, Linear, MaxPool, last_reads, \
    round_up, tensor_shapes

__all__ = ["ALIGN", "FIXED_CHANNELS", "IMPLICIT_ALIGN", "ITEMSIZE", "PRECISION_CODES", "ROUTE_IM2COL", "ROUTE_IMPLICIT", "SLOT_FC_BIAS", "SLOT_IMAGES", "SLOT_LOGITS", "SLOT_WEIGHTS",
           "SLOT_WORKSPACE", "Plan", "WeightLayout", "conv_steps", "gemm_flops",
           "implicit_channels", "needs_route", "plan_forward", "weight_layout"]

SLOT_WORKSPACE, SLOT_WEIGHTS, SLOT_IMAGES, SLOT_LOGITS, SLOT_FC_BIAS = range(5)

# Byte alignment of every buffer and weight: cuBLASLt's widest vector loads
# want 16 bytes; 256 (the pool's own alignment) keeps every operand at the
# alignment its plan was made for.
ALIGN = 256

# The implicit-GEMM kernels' vector width in elements (16 bytes): a
# convolution's input and output channels must be multiples of it
# (``_core._conv_implicit_tiles(dtype)[1]`` says the same; a test checks).
IMPLICIT_ALIGN = {"float32": 4, "float16": 8, "bfloat16": 8}
# Exactly this many input channels also works, through a kernel of its own (kFixedChannels):
# the RGB images widened by one zero channel (CL_CONV_FIXED_CHANNELS in the C core).
FIXED_CHANNELS = 4
ROUTE_IM2COL, ROUTE_IMPLICIT = "im2col", "implicit"

# Bytes per element of the model dtypes.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# A float32 GEMM step's precision code: true fp32 or TF32, by the model's
# precision names or matmul's (both from the one table, cudalab._precision).
PRECISION_CODES = {name: code for code, spec in enumerate(map(_precision.resolve, ("fp32", "tf32")))
                   for name in (spec.name, spec.matmul_precision)}


def _align(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def needs_route(layer: Conv) -> bool:
    """Whether a convolution chooses a route: all but the 1x1 stride-1 ones (plain GEMMs)."""
    return not layer.is_1x1 or layer.stride != 1


def implicit_channels(cin: int, dtype: str) -> int:
    """Input channels the implicit GEMM reads: up to 4 widened to exactly 4 (the stem's
    kernel, one tap per 4 channels), more rounded up to whole 16-byte vectors."""
    return FIXED_CHANNELS if cin <= FIXED_CHANNELS else round_up(cin, IMPLICIT_ALIGN[dtype])


@dataclass(frozen=True)
class WeightLayout:
    """Where each GEMM's weight (cout, K padded) and bias (cout,) lie in the weights slot.

    Attributes
    ----------
    offsets : dict of str to (int, int)
        Layer name -> (weight, bias) byte offsets; the fc's bias offset is
        -1 (its float32 bias has a slot of its own).
    nbytes : int
        Size of the weights slot.
    implicit : dict of str to int
        Layer name -> byte offset of a second copy of the weight as the
        implicit GEMM reads it, (cout, kh, kw, cin padded), for the layers
        whose input channels are not whole vectors (the stem: 3 -> 8). The
        other layers' GEMM weight (cout, kh * kw * cin) is that layout already.
    """

    offsets: dict
    nbytes: int
    implicit: dict = field(default_factory=dict)


def weight_layout(layers: tuple[Layer, ...], dtype: str) -> WeightLayout:
    """weight_layout(layers, dtype) -> WeightLayout

    Pack every Conv's and the Linear's GEMM weight and bias, each aligned to
    :data:`ALIGN` bytes, in execution order.
    """
    size = ITEMSIZE[dtype]
    offsets: dict[str, tuple[int, int]] = {}
    implicit: dict[str, int] = {}
    at = 0
    for layer in layers:
        if isinstance(layer, Conv):
            w = at
            at += _align(layer.cout * layer.k_padded * size)
            offsets[layer.name] = (w, at)
            at += _align(layer.cout * size)
            cin = implicit_channels(layer.cin, dtype)
            if needs_route(layer) and cin != layer.cin:
                implicit[layer.name] = at
                at += _align(layer.cout * layer.kh * layer.kw * cin * size)
        elif isinstance(layer, Linear):
            offsets[layer.name] = (at, -1)
            at += _align(layer.cout * layer.cin * size)
    return WeightLayout(offsets, at, implicit)


@dataclass(frozen=True)
class Plan:
    """The compiled-forward description for one input shape.

    Attributes
    ----------
    steps : tuple of tuples
        ``_core._convnet_compile``'s step format.
    workspace_bytes : int
        Size of the workspace slot.
    scratch_bytes : int
        Of which the im2col scratch at its start.
    buffers : dict of str to int
        Activation name -> workspace byte offset (the input and logits are
        in their own slots and not listed).
    flops : int
        Useful GEMM FLOPs (2 M N K with K unpadded).
    routes : dict of str to (str, int)
        Every convolution that takes a route: layer name -> (``"im2col"``, -1)
        or (``"implicit"``, tile index).
    """

    steps: tuple
    workspace_bytes: int
    scratch_bytes: int
    buffers: dict
    flops: int
    routes: dict = field(default_factory=dict)


def gemm_flops(batch: int, height: int = 224, width: int = 224,
               layers: tuple[Layer, ...] = RESNET50) -> int:
    """Useful FLOPs of every convolution and the fc for a batch: sum of 2 M cout K (K unpadded)."""
    shapes = tensor_shapes(batch, height, width, layers)
    total = 0
    for layer in layers:
        if isinstance(layer, Conv):
            n, oh, ow, _ = shapes[layer.dst]
            total += 2 * n * oh * ow * layer.cout * layer.k
        elif isinstance(layer, Linear):
            total += 2 * batch * layer.cout * layer.cin
    return total


class _Buffers:
    """Equal buffers handed out by liveness: take() the next free one, release() it later."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.count = 0

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.count += 1
        return self.count - 1

    def release(self, index: int) -> None:
        self.free.append(index)


def _assign_buffers(layers: tuple[Layer, ...]) -> tuple[dict[str, int], int]:
    """Activation -> buffer index, and the number of buffers (input and logits excluded)."""
    last = last_reads(layers)
    buffers = _Buffers()
    where: dict[str, int] = {}
    for i, layer in enumerate(layers):
        residual = getattr(layer, "residual", None)
        if isinstance(layer, Linear):
            dst = None
        elif residual is not None:
            if last[residual] != i:
                raise AssertionError(f"{layer.name}: its shortcut {residual} is read later")
            dst = where[residual]  # in place: the GEMM adds C = shortcut, then writes D there
        else:
            dst = buffers.take()
        for name in {layer.src, residual} - {None, "input"}:
            if last[name] == i and where[name] != dst:
                buffers.release(where[name])
        if dst is not None:
            where[layer.dst] = dst
    return where, buffers.count


def plan_forward(batch: int, dtype: str, precision: str, weights: WeightLayout,
                 height: int = 224, width: int = 224,
                 layers: tuple[Layer, ...] = RESNET50,
                 routes: Optional[Mapping[str, tuple[str, int]]] = None) -> Plan:
    """plan_forward(batch, dtype, precision, weights, height=224, width=224, layers=RESNET50, routes=None) -> Plan

    The steps of one forward: per convolution one GEMM (bias + ReLU
    epilogue, shortcut through beta = 1) after an im2col where needed, or one
    implicit-GEMM kernel; max-pool, global average pool, and the fc GEMM into
    float32 logits.

    Parameters
    ----------
    batch : int
    dtype : {'float32', 'float16', 'bfloat16'}
        Activations and weights.
    precision : {'highest', 'high'}
        float32 GEMMs: fp32 or TF32 (ignored for half dtypes).
    weights : WeightLayout
    routes : mapping of str to (str, int), optional
        Layer name -> (route, tile) for the convolutions that take a route
        (:func:`needs_route`); a layer not named takes im2col. A layer with a
        residual add, or float32 at ``"highest"``, cannot take ``"implicit"``.
    """
    size = ITEMSIZE[dtype]
    chosen = {layer.name: _route_of(layer, routes, dtype, precision)
              for layer in layers if isinstance(layer, Conv) and needs_route(layer)}
    stray = set(routes or ()) - set(chosen)
    if stray:
        raise ValueError(f"plan_forward(): routes name layers that take no route (plain "
                         f"GEMMs or not convolutions): {', '.join(sorted(stray))}")
    shapes = tensor_shapes(batch, height, width, layers)
    where, count = _assign_buffers(layers)
    act_bytes = max(_align(_prod(shape) * size) for name, shape in shapes.items()
                    if name not in ("input", "fc"))
    scratch = 0
    for layer in layers:
        if isinstance(layer, Conv) and layer.name in chosen:
            scratch = max(scratch, _scratch_bytes(layer, shapes, dtype, chosen[layer.name][0]))
    offsets = {name: scratch + index * act_bytes for name, index in where.items()}

    def slot_of(name: str) -> tuple[int, int]:
        if name == "input":
            return SLOT_IMAGES, 0
        if name == "fc":
            return SLOT_LOGITS, 0
        return SLOT_WORKSPACE, offsets[name]

    steps: list[tuple[Any, ...]] = []
    for layer in layers:
        src = shapes[layer.src]
        if isinstance(layer, Conv):
            w_off, b_off = weights.offsets[layer.name]
            route, tile = chosen.get(layer.name, (None, -1))
            if route == ROUTE_IMPLICIT:
                w_off = weights.implicit.get(layer.name, w_off)
            steps += conv_steps(layer, src, route, tile, dtype, precision,
                                x=slot_of(layer.src), w=(SLOT_WEIGHTS, w_off),
                                bias=(SLOT_WEIGHTS, b_off), out=slot_of(layer.dst),
                                scratch=(SLOT_WORKSPACE, 0))
        elif isinstance(layer, MaxPool):
            n, h, w, c = src
            _, oh, ow, _ = shapes[layer.dst]
            steps.append(("max_pool", *slot_of(layer.src), *slot_of(layer.dst), dtype,
                          n, h, w, c, oh, ow, layer.kernel, layer.stride, layer.padding))
        elif isinstance(layer, GlobalAvgPool):
            n, h, w, c = src
            steps.append(("avg_pool", *slot_of(layer.src), *slot_of(layer.dst), dtype,
                          n, h * w, c))
        else:
            w_off, _ = weights.offsets[layer.name]
            steps.append(("gemm", *slot_of(layer.src), SLOT_WEIGHTS, w_off, SLOT_FC_BIAS, 0,
                          *slot_of(layer.dst), dtype, "float32", PRECISION_CODES[precision],
                          batch, layer.cin, layer.cout, 0, 0))
    return Plan(tuple(steps), scratch + count * act_bytes, scratch, offsets,
                gemm_flops(batch, height, width, layers), chosen)


def _route_of(layer: Conv, routes: Optional[Mapping[str, tuple[str, int]]], dtype: str,
              precision: str) -> tuple[str, int]:
    route, tile = (routes or {}).get(layer.name, (ROUTE_IM2COL, -1))
    if route not in (ROUTE_IM2COL, ROUTE_IMPLICIT):
        raise ValueError(f"plan_forward(): {layer.name}: unknown route {route!r}")
    if route == ROUTE_IMPLICIT and (layer.residual is not None or (
            dtype == "float32" and PRECISION_CODES[precision] == 0)):
        raise ValueError(f"plan_forward(): {layer.name} cannot take the implicit route "
                         "(a residual add, or float32 without TF32)")
    return route, (int(tile) if route == ROUTE_IMPLICIT else -1)


def _scratch_bytes(layer: Conv, shapes: Mapping[str, tuple], dtype: str, route: str) -> int:
    """The scratch a convolution's route writes: the im2col matrix, or the widened images."""
    n, h, w, c = shapes[layer.src]
    _, oh, ow, _ = shapes[layer.dst]
    size = ITEMSIZE[dtype]
    if route == ROUTE_IM2COL:
        return _align(n * oh * ow * layer.k_padded * size)
    cin = implicit_channels(c, dtype)
    return _align(n * h * w * cin * size) if cin != c or layer.src == "input" else 0


def conv_steps(layer: Conv, src_shape: tuple, route: Optional[str], tile: int, dtype: str,
               precision: str, *, x: tuple, w: tuple, bias: Optional[tuple], out: tuple,
               scratch: tuple, k: Optional[int] = None) -> list[tuple]:
    """conv_steps(layer, src_shape, route, tile, dtype, precision, *, x, w, bias, out, scratch, k=None) -> list

    The steps of one convolution with BatchNorm folded (bias, ReLU, residual
    add as `layer` says), operands given as (slot, byte offset):

    * route None (a 1x1 stride-1 layer): one GEMM on `x` itself;
    * ``"im2col"``: the im2col matrix into `scratch`, then one GEMM;
    * ``"implicit"``: one implicit-GEMM kernel of tile shape `tile`; when the
      input's channels are not whole vectors, or it is the float32 images,
      they are first widened (and cast) into `scratch`, and `w` must be the
      weight in that padded (cout, kh, kw, cin padded) layout.

    `w` holds (cout, K padded) for the GEMM routes; the GEMM's C is `out`
    (beta = 1) when the layer has a residual: `out` must hold the shortcut.
    `bias` None: no bias. `k`: the GEMM routes' K, the im2col row length
    (default ``layer.k_padded``; ``layer.k`` multiplies an unpadded weight).
    """
    epilogue, bias = (0, (-1, 0)) if bias is None else (1, bias)
    n, h, wd, c = src_shape
    oh, ow = layer.output_size(h, wd)
    src_dtype = "float32" if layer.src == "input" else dtype
    steps: list[tuple] = []
    if route == ROUTE_IMPLICIT:
        cin = implicit_channels(c, dtype)
        if cin != c or src_dtype != dtype:
            steps.append(("pad_channels", *x, src_dtype, *scratch, dtype, n * h * wd, c, cin))
            x = scratch
        steps.append(("conv", *x, *w, *bias, *out, dtype, n, h, wd, cin, oh, ow, layer.kh,
                      layer.kw, layer.stride, layer.padding, layer.cout, epilogue, int(layer.relu),
                      tile))
        return steps
    k = layer.k_padded if k is None else k
    if route == ROUTE_IM2COL:
        steps.append(("im2col", *x, src_dtype, *scratch, dtype, n, h, wd, c, oh, ow,
                      layer.kh, layer.kw, layer.stride, layer.padding, k))
        x = scratch
    steps.append(("gemm", *x, *w, *bias, *out, dtype, dtype, PRECISION_CODES[precision],
                  n * oh * ow, k, layer.cout, int(layer.relu), int(layer.residual is not None)))
    return steps


def _prod(shape: tuple) -> int:
    out = 1
    for v in shape:
        out *= v
    return out
