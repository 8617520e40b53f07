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

Activations share equally sized buffers by liveness (:func:`~cudalab.models.
arch.last_reads`): a buffer is reused once the last layer reading it has run.
A block's last convolution writes in place over its shortcut, which the
GEMM reads as C with beta = 1 and which nothing reads afterwards: the
residual add costs no memory and no kernel. A kxk (or strided 1x1)
convolution first writes its im2col matrix into the scratch area, which
every such layer reuses (the steps run in order on one stream).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _precision

from .arch import RESNET50, Conv, GlobalAvgPool, Layer, Linear, MaxPool, last_reads, \
    tensor_shapes

__all__ = ["ALIGN", "ITEMSIZE", "PRECISION_CODES", "SLOT_FC_BIAS", "SLOT_IMAGES", "SLOT_LOGITS", "SLOT_WEIGHTS",
           "SLOT_WORKSPACE", "Plan", "WeightLayout", "gemm_flops", "plan_forward",
           "weight_layout"]

SLOT_WORKSPACE, SLOT_WEIGHTS, SLOT_IMAGES, SLOT_LOGITS, SLOT_FC_BIAS = range(5)

# Byte alignment of every buffer and weight: cuBLASLt's widest vector loads
# want 16 bytes; 256 (the pool's own alignment) keeps every operand at the
# alignment its plan was made for.
ALIGN = 256

# Bytes per element of the model dtypes.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
# A float32 GEMM step's precision code: true fp32 or TF32, by the model's
# precision names or matmul's (both from the one table, cudalab._precision).
PRECISION_CODES = {name: code for code, spec in enumerate(map(_precision.resolve, ("fp32", "tf32")))
                   for name in (spec.name, spec.matmul_precision)}


def _align(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


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
    """

    offsets: dict
    nbytes: int


def weight_layout(layers: tuple[Layer, ...], dtype: str) -> WeightLayout:
    """weight_layout(layers, dtype) -> WeightLayout

    Pack every Conv's and the Linear's GEMM weight and bias, each aligned to
    :data:`ALIGN` bytes, in execution order.
    """
    size = ITEMSIZE[dtype]
    offsets: dict[str, tuple[int, int]] = {}
    at = 0
    for layer in layers:
        if isinstance(layer, Conv):
            w = at
            at += _align(layer.cout * layer.k_padded * size)
            offsets[layer.name] = (w, at)
            at += _align(layer.cout * size)
        elif isinstance(layer, Linear):
            offsets[layer.name] = (at, -1)
            at += _align(layer.cout * layer.cin * size)
    return WeightLayout(offsets, at)


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
    """

    steps: tuple
    workspace_bytes: int
    scratch_bytes: int
    buffers: dict
    flops: int


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


def _needs_im2col(layer: Conv) -> bool:
    return not layer.is_1x1 or layer.stride != 1


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
                 layers: tuple[Layer, ...] = RESNET50) -> Plan:
    """plan_forward(batch, dtype, precision, weights, height=224, width=224) -> Plan

    The steps of one forward: im2col where needed, one GEMM per convolution
    (bias + ReLU epilogue, shortcut through beta = 1), max-pool, global
    average pool, and the fc GEMM into float32 logits.

    Parameters
    ----------
    batch : int
    dtype : {'float32', 'float16', 'bfloat16'}
        Activations and weights.
    precision : {'highest', 'high'}
        float32 GEMMs: fp32 or TF32 (ignored for half dtypes).
    weights : WeightLayout
    """
    size = ITEMSIZE[dtype]
    shapes = tensor_shapes(batch, height, width, layers)
    where, count = _assign_buffers(layers)
    act_bytes = max(_align(_prod(shape) * size) for name, shape in shapes.items()
                    if name not in ("input", "fc"))
    scratch = 0
    for layer in layers:
        if isinstance(layer, Conv) and _needs_im2col(layer):
            n, oh, ow, _ = shapes[layer.dst]
            scratch = max(scratch, _align(n * oh * ow * layer.k_padded * size))
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
            steps += _conv_steps(layer, src, shapes[layer.dst], slot_of, weights, dtype,
                                 precision)
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
                gemm_flops(batch, height, width, layers))


def _conv_steps(layer: Conv, src: tuple, dst: tuple, slot_of: Any, weights: WeightLayout,
                dtype: str, precision: str) -> list[tuple]:
    n, h, w, c = src
    _, oh, ow, _ = dst
    steps = []
    a = slot_of(layer.src)
    k = layer.k_padded
    if _needs_im2col(layer):
        src_dtype = "float32" if layer.src == "input" else dtype
        steps.append(("im2col", *a, src_dtype, SLOT_WORKSPACE, 0, dtype, n, h, w, c, oh, ow,
                      layer.kh, layer.kw, layer.stride, layer.padding, k))
        a = (SLOT_WORKSPACE, 0)
    w_off, b_off = weights.offsets[layer.name]
    steps.append(("gemm", *a, SLOT_WEIGHTS, w_off, SLOT_WEIGHTS, b_off, *slot_of(layer.dst),
                  dtype, dtype, PRECISION_CODES[precision], n * oh * ow, k, layer.cout,
                  int(layer.relu), int(layer.residual is not None)))
    return steps


def _prod(shape: tuple) -> int:
    out = 1
    for v in shape:
        out *= v
    return out
