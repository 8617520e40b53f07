"""cudalab.models.arch: torchvision's ResNet-50 v1.5 written out as a list of layers.

The network is data, not code: :data:`RESNET50` is a tuple of frozen layer
descriptions, in execution order, that the host reference and the C forward
both walk. Every layer reads one named activation (`src`) and writes one
(`dst`); ``"input"`` is the (N, 224, 224, 3) NHWC image batch and
``"fc"`` the (N, 1000) logits.

Names are torchvision's module names, so ``f"{conv.name}.weight"`` and
``f"{conv.bn}.running_var"`` are keys of its ``state_dict``.

The order inside a bottleneck block is conv1, conv2, then (first block of a
stage only) the downsample branch, then conv3: the shortcut exists before
conv3 runs, so conv3's GEMM can add it in its epilogue (C with beta = 1)
before the ReLU. v1.5 means the stride-2 of a stage's first block sits in
its 3x3 conv2, not in conv1 (torchvision's choice, unlike the paper's v1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

__all__ = [
    "Conv",
    "GlobalAvgPool",
    "K_ALIGN",
    "Layer",
    "Linear",
    "MaxPool",
    "NUM_CLASSES",
    "RESNET50",
    "RESNET50_PARAMETERS",
    "conv_output_size",
    "last_reads",
    "parameter_count",
    "resnet50_layers",
    "round_up",
    "state_shapes",
    "tensor_shapes",
]

# Every GEMM dimension is a multiple of this many elements: 16 bytes in fp16 and
# bf16 (and 32 in fp32), the alignment cuBLASLt's tensor-core kernels want.
K_ALIGN = 8
NUM_CLASSES = 1000
# torchvision.models.resnet50(): sum(p.numel() for p in model.parameters()).
RESNET50_PARAMETERS = 25_557_032


def round_up(value: int, multiple: int = K_ALIGN) -> int:
    """The smallest multiple of `multiple` that is >= `value`."""
    return -(-value // multiple) * multiple


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output extent of a convolution or pool along one axis (floor, as torch)."""
    return (size + 2 * padding - kernel) // stride + 1


def _output_hw(height: int, width: int, kh: int, kw: int, stride: int,
               padding: int) -> tuple[int, int]:
    return (conv_output_size(height, kh, stride, padding),
            conv_output_size(width, kw, stride, padding))


@dataclass(frozen=True)
class Conv:
    """One convolution, its BatchNorm folded in, then optionally a residual add and ReLU.

    ``dst = relu?(conv(src) * bn_scale + bn_shift (+ residual))``.

    Attributes
    ----------
    name : str
        torchvision's module name (``"layer2.0.conv2"``, ``"layer2.0.downsample.0"``).
    bn : str
        The BatchNorm that follows it (``"layer2.0.bn2"``, ``"layer2.0.downsample.1"``).
    src, dst : str
        The activations read and written.
    cin, cout, kh, kw, stride, padding : int
        Square stride and symmetric zero padding on both spatial axes.
    relu : bool
        ReLU after the BatchNorm (and after the residual add, if any).
    downsample : bool
        True for a block's shortcut projection (1x1, no ReLU).
    residual : str or None
        The activation added before the ReLU (the block's input or its
        downsample branch), or None.
    """

    name: str
    bn: str
    src: str
    dst: str
    cin: int
    cout: int
    kh: int
    kw: int
    stride: int
    padding: int
    relu: bool
    downsample: bool = False
    residual: Optional[str] = None

    @property
    def k(self) -> int:
        """The GEMM's reduction size, kh * kw * cin (im2col row length)."""
        return self.kh * self.kw * self.cin

    @property
    def k_padded(self) -> int:
        """`k` rounded up to :data:`K_ALIGN` (147 -> 152 for the stem, else unchanged)."""
        return round_up(self.k)

    @property
    def is_1x1(self) -> bool:
        """A 1x1 convolution with no padding: a GEMM on the (strided) activation itself."""
        return self.kh == 1 and self.kw == 1 and self.padding == 0

    @property
    def parameters(self) -> int:
        """Conv weights (no bias) plus its BatchNorm's weight and bias."""
        return self.k * self.cout + 2 * self.cout

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        return _output_hw(height, width, self.kh, self.kw, self.stride, self.padding)


@dataclass(frozen=True)
class MaxPool:
    """Max over kernel x kernel windows; padding counts as -inf (never selected)."""

    name: str
    src: str
    dst: str
    kernel: int = 3
    stride: int = 2
    padding: int = 1

    parameters = 0

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        return _output_hw(height, width, self.kernel, self.kernel, self.stride, self.padding)


@dataclass(frozen=True)
class GlobalAvgPool:
    """Mean over all spatial positions: (N, H, W, C) -> (N, C)."""

    name: str
    src: str
    dst: str

    parameters = 0


@dataclass(frozen=True)
class Linear:
    """``dst = src @ W.T + b`` with torchvision's W of shape (cout, cin)."""

    name: str
    src: str
    dst: str
    cin: int
    cout: int

    @property
    def parameters(self) -> int:
        return self.cin * self.cout + self.cout


Layer = Union[Conv, MaxPool, GlobalAvgPool, Linear]


def _bottleneck(prefix: str, src: str, cin: int, width: int, stride: int,
                project: bool) -> list[Conv]:
    """One bottleneck block: 1x1 reduce, 3x3 (strided), [1x1 shortcut], 1x1 expand + add."""
    cout = 4 * width
    layers = [
        Conv(f"{prefix}.conv1", f"{prefix}.bn1", src, f"{prefix}.conv1",
             cin, width, 1, 1, 1, 0, relu=True),
        Conv(f"{prefix}.conv2", f"{prefix}.bn2", f"{prefix}.conv1", f"{prefix}.conv2",
             width, width, 3, 3, stride, 1, relu=True),
    ]
    shortcut = src
    if project:
        shortcut = f"{prefix}.downsample"
        layers.append(Conv(f"{prefix}.downsample.0", f"{prefix}.downsample.1", src, shortcut,
                           cin, cout, 1, 1, stride, 0, relu=False, downsample=True))
    layers.append(Conv(f"{prefix}.conv3", f"{prefix}.bn3", f"{prefix}.conv2", prefix,
                       width, cout, 1, 1, 1, 0, relu=True, residual=shortcut))
    return layers


def resnet50_layers() -> tuple[Layer, ...]:
    """resnet50_layers() -> tuple of layers

    torchvision's ``resnet50()`` (v1.5, 1000 classes) in execution order:
    the 7x7/2 stem conv, 3x3/2 max-pool, 3 + 4 + 6 + 3 bottleneck blocks
    (widths 64, 128, 256, 512, expansion 4), global average pool, fc.

    Returns
    -------
    tuple of Conv, MaxPool, GlobalAvgPool, Linear
        53 convolutions (4 of them downsample branches) and 3 other layers.
    """
    layers: list[Layer] = [
        Conv("conv1", "bn1", "input", "conv1", 3, 64, 7, 7, 2, 3, relu=True),
        MaxPool("maxpool", "conv1", "maxpool"),
    ]
    src, cin = "maxpool", 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            stride = 2 if stage > 1 and block == 0 else 1
            layers += _bottleneck(prefix, src, cin, width, stride, project=block == 0)
            src, cin = prefix, 4 * width
    layers.append(GlobalAvgPool("avgpool", src, "avgpool"))
    layers.append(Linear("fc", "avgpool", "fc", cin, NUM_CLASSES))
    return tuple(layers)


RESNET50: tuple[Layer, ...] = resnet50_layers()


def parameter_count(layers: tuple[Layer, ...] = RESNET50) -> int:
    """Trainable parameters (torchvision's ``model.parameters()``; running stats excluded)."""
    return sum(layer.parameters for layer in layers)


def state_shapes(layers: tuple[Layer, ...] = RESNET50) -> dict[str, tuple[int, ...]]:
    """torchvision's float ``state_dict`` keys and shapes (``num_batches_tracked`` left out).

    Conv weights are (cout, cin, kh, kw), BatchNorm tensors (cout,), the fc
    weight (cout, cin) and its bias (cout,).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in layers:
        if isinstance(layer, Conv):
            shapes[f"{layer.name}.weight"] = (layer.cout, layer.cin, layer.kh, layer.kw)
            for field in ("weight", "bias", "running_mean", "running_var"):
                shapes[f"{layer.bn}.{field}"] = (layer.cout,)
        elif isinstance(layer, Linear):
            shapes[f"{layer.name}.weight"] = (layer.cout, layer.cin)
            shapes[f"{layer.name}.bias"] = (layer.cout,)
    return shapes


def last_reads(layers: tuple[Layer, ...] = RESNET50) -> dict[str, int]:
    """Activation name -> index in `layers` of the last layer that reads it.

    An activation is dead after that layer, so its buffer can take a later
    layer's output (``"fc"``, the logits, is read by no layer and stays).
    """
    last: dict[str, int] = {}
    for i, layer in enumerate(layers):
        for name in (layer.src, getattr(layer, "residual", None)):
            if name is not None:
                last[name] = i
    return last


def tensor_shapes(batch: int, height: int = 224, width: int = 224,
                  layers: tuple[Layer, ...] = RESNET50) -> dict[str, tuple[int, ...]]:
    """Every activation's shape for a (batch, height, width, 3) input: NHWC, then (N, C).

    The C forward sizes its workspace from this; ``"fc"`` is the logits.
    """
    shapes: dict[str, tuple[int, ...]] = {"input": (batch, height, width, 3)}
    for layer in layers:
        src = shapes[layer.src]
        if isinstance(layer, (Conv, MaxPool)):
            h, w = layer.output_size(src[1], src[2])
            channels = layer.cout if isinstance(layer, Conv) else src[3]
            shapes[layer.dst] = (batch, h, w, channels)
        elif isinstance(layer, GlobalAvgPool):
            shapes[layer.dst] = (batch, src[3])
        else:
            shapes[layer.dst] = (batch, layer.cout)
    return shapes
