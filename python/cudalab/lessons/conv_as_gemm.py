"""Lesson 20 `conv_as_gemm`: a convolution as a GEMM, what im2col costs, what fusion saves.

In NHWC a convolution is one GEMM, ``out (M, cout) = cols (M, K) @ W.T``,
with one row of ``cols`` per output pixel holding its kh x kw x cin window
(im2col). Two layers of ResNet-50's second stage show both sides of it:

* a 3x3 conv (layer2.1.conv2): im2col writes every input pixel nine times
  before the GEMM reads it back; the lesson times im2col and the GEMM
  apart and together, and puts im2col's share of the time beside its share
  of the bytes moved;
* a 1x1 conv (layer2.1.conv3, residual add): its cols are the activation
  itself, so it runs as a direct GEMM; the lesson times an im2col that would
  only copy it to show what skipping it saves.

Then fusion: the layer's BatchNorm (unfolded: scale and shift), ReLU and
residual add as separate element-wise kernels after a bare GEMM, against
one GEMM with BatchNorm folded into its weights and bias and the add and
ReLU in its epilogue (beta = 1 on the output that holds the shortcut).

Last, the third form, per layer: every distinct conv shape of ResNet-50
(derived from :mod:`cudalab.models.arch`, 23 at batch 128) as im2col +
GEMM (``ops.conv2d(route="im2col")``), as one implicit GEMM that reads the
windows in its own loads and never writes columns (``route="implicit"``),
and as torch's cuDNN conv (channels_last, cudnn.benchmark on, same weights)
and torch.compile of it where torch is installed: time, the bytes each form
moves at least, TFLOP/s and the share of the measured GEMM peak. Every form
computes ``relu(conv(x, w) + b)``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

import cudalab

from ..bench import ceiling
from ..models import arch
from ._measuring import ratio, rel_error
from .registry import LessonCheckError, LessonRun, lesson

LAYERS = ("layer2.1.conv2", "layer2.1.conv3")
DTYPES = ("float32", "float16", "bfloat16")
# Outputs vs float64 NumPy of the same (rounded) inputs, relative to the largest
# |value|: float32 GEMMs at full precision; half precision stores 11 / 8 bits.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
# im2col only moves values: its output equals NumPy's bit for bit.
TOL_IM2COL = 0.0
# Fusion "pays" when the separate kernels take at least this many times as long.
FUSION_PAYS = 1.2
# im2col is "a large share" of a 3x3 conv from this fraction of its time on.
IM2COL_LARGE = 0.25
SEED = 20

# ---- the per-layer table (the third form) ----
# The full run's batch: the "every distinct ResNet-50 conv shape at batch 128".
TABLE_BATCH = 128
# The forms of one conv, as the table's rows name them.
IM2COL_FORM = "im2col + gemm"
IMPLICIT_FORM = "implicit gemm"
CUDNN_FORM = "torch cudnn"
COMPILE_FORM = "torch compile"
# Which of the table's shapes torch.compile gets: none (quick mode: its first compile alone
# takes seconds), the shapes whose im2col writes columns (11 of 23: the full run stays near
# 90 s with a compile of ~1-2 s per shape), or all of them.
COMPILE_CHOICES = ("none", "columns", "all")
# Two forms' outputs against each other: each is within TOLERANCE of the float64 truth.
TOL_FORMS = {dtype: 2 * tol for dtype, tol in TOLERANCE.items()}
# Implicit GEMM "pays" from this geometric-mean speedup over im2col + GEMM on the shapes
# whose im2col writes columns (where it saves a write and a read of them).
IMPLICIT_PAYS = 1.1
# A form "loses" to another below this ratio; run-to-run noise stays inside it.
LOSES_BELOW = 0.95
# Layers named in the sentences that list where a form loses.
NAMED_AT_MOST = 4


# ---- the numbers' meaning (pure functions, tested on the CPU) ------------------------------


def im2col_bytes(m: int, k: int, in_elems: int, itemsize: int) -> int:
    """Bytes im2col moves: the input read once, (M, K) columns written."""
    return (in_elems + m * k) * itemsize


def gemm_bytes(m: int, k: int, cout: int, itemsize: int) -> int:
    """Bytes a GEMM moves at least: A (M, K) and W (cout, K) read, (M, cout) written."""
    return (m * k + cout * k + m * cout) * itemsize


def im2col_text(layer: str, im2col_s: float, gemm_s: float, byte_share: float) -> tuple[float, str]:
    """(im2col's share of im2col + GEMM time, one sentence)."""
    total = im2col_s + gemm_s
    share = im2col_s / total if total > 0 else 0.0
    text = (f"{layer}: im2col {im2col_s * 1e3:.3f} ms + GEMM {gemm_s * 1e3:.3f} ms: im2col is "
            f"{share:.0%} of the time and {byte_share:.0%} of the bytes moved")
    if share >= IM2COL_LARGE:
        return share, text + ": materialising the windows is a real cost (implicit GEMM " \
                             "would read them in the GEMM's own loads)"
    return share, text + ": the GEMM's math dominates, the copy is a small tax"


def fusion_text(layer: str, separate_s: float, fused_s: float, kernels: int) -> tuple[float, str]:
    """(separate / fused time, one sentence)."""
    gain = ratio(separate_s, fused_s)
    text = (f"{layer}: GEMM + {kernels} element-wise kernels {separate_s * 1e3:.3f} ms vs one "
            f"GEMM with a fused epilogue {fused_s * 1e3:.3f} ms ({gain:.2f}x)")
    if gain >= FUSION_PAYS:
        return gain, text + ": each separate kernel reads and writes the whole output again"
    return gain, text + ": at this size the extra passes are cheap next to the GEMM"


# ---- the per-layer table's shapes and byte models (pure) ------------------------------------


@dataclasses.dataclass(frozen=True)
class ConvShape:
    """One distinct conv shape of ResNet-50 at a batch size (NHWC input, KRSC weight).

    `layer` is the first layer (in execution order) with this shape, `count` how many
    of the network's convolutions share it.
    """

    layer: str
    count: int
    n: int
    h: int
    w: int
    cin: int
    cout: int
    kh: int
    kw: int
    stride: int
    padding: int

    @property
    def oh(self) -> int:
        return arch.conv_output_size(self.h, self.kh, self.stride, self.padding)

    @property
    def ow(self) -> int:
        return arch.conv_output_size(self.w, self.kw, self.stride, self.padding)

    @property
    def m(self) -> int:
        """Output pixels: the GEMM's rows."""
        return self.n * self.oh * self.ow

    @property
    def k(self) -> int:
        """The GEMM's reduction, kh * kw * cin."""
        return self.kh * self.kw * self.cin

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.cout

    @property
    def columns(self) -> bool:
        """Whether the im2col form writes columns (a 1x1 stride-1 conv's are its input)."""
        return writes_columns(self.kh, self.kw, self.stride, self.padding)

    @property
    def text(self) -> str:
        return (f"{self.h}x{self.w}x{self.cin} -> {self.oh}x{self.ow}x{self.cout}, "
                f"{self.kh}x{self.kw}/{self.stride}")


def writes_columns(kh: int, kw: int, stride: int, padding: int) -> bool:
    """Whether im2col + GEMM materialises columns: every conv but a 1x1, stride-1, unpadded
    one, whose NHWC activation already is the GEMM's A (the network's rule, models.plan)."""
    return not (kh == 1 and kw == 1 and stride == 1 and padding == 0)


def table_shapes(batch: int, layers: Any = "all") -> list[ConvShape]:
    """Every distinct (cin, cout, kh, kw, stride, padding, h, w) of ResNet-50's convolutions
    at `batch`, in the order the network first runs each, named by its first layer; with
    `layers` (conv names) only the shapes of those layers, named by them."""
    shapes = arch.tensor_shapes(batch)
    found: dict[tuple, list[str]] = {}
    for c in arch.RESNET50:
        if isinstance(c, arch.Conv):
            _, h, w, _ = shapes[c.src]
            found.setdefault((c.cin, c.cout, c.kh, c.kw, c.stride, c.padding, h, w),
                             []).append(c.name)
    out = []
    for (cin, cout, kh, kw, stride, padding, h, w), names in found.items():
        named = names if layers == "all" else [name for name in names if name in layers]
        if named:
            out.append(ConvShape(named[0], len(names), batch, h, w, cin, cout, kh, kw, stride,
                                 padding))
    return out


def conv_names() -> tuple[str, ...]:
    """ResNet-50's convolutions, by torchvision's module names."""
    return tuple(c.name for c in arch.RESNET50 if isinstance(c, arch.Conv))


def implicit_bytes(s: ConvShape, itemsize: int) -> int:
    """Bytes an implicit GEMM moves at least: the input read once, the weights, the output
    written (the bias is negligible)."""
    return (s.n * s.h * s.w * s.cin + s.cout * s.k + s.m * s.cout) * itemsize


def im2col_form_bytes(s: ConvShape, itemsize: int) -> int:
    """Bytes im2col + GEMM moves at least: im2col's read of the input and write of the
    (M, K padded) columns, then the GEMM's read of them, of the weights and its write."""
    if not s.columns:
        return gemm_bytes(s.m, s.cin, s.cout, itemsize)
    k = arch.round_up(s.k)
    return im2col_bytes(s.m, k, s.n * s.h * s.w * s.cin, itemsize) + \
        gemm_bytes(s.m, k, s.cout, itemsize)


def reference_shape(shapes: Sequence[ConvShape]) -> ConvShape:
    """The shape checked against float64 NumPy: the cheapest with a spatial kernel (padding
    and window offsets to get right), else the cheapest."""
    spatial = [s for s in shapes if s.kh > 1] or list(shapes)
    return min(spatial, key=lambda s: s.flops)


def compiles(s: ConvShape, choice: str) -> bool:
    """Whether torch.compile gets shape `s` under the `torch_compile` parameter `choice`."""
    return choice == "all" or (choice == "columns" and s.columns)


def implicit_may_refuse(cin: int) -> bool:
    """Whether route="implicit" may refuse a conv of `cin` channels: tensor-core loads read
    the channels in 16-byte vectors, so only a cin that is not a multiple of arch.K_ALIGN
    (the 3-channel stem) may be refused; any other refusal is an error of the lesson's."""
    return cin % arch.K_ALIGN != 0


# ---- the per-layer table's findings (pure) ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LayerTiming:
    """One table shape's median times (seconds; None: that form did not run) and bytes."""

    layer: str
    columns: bool
    im2col_s: float
    implicit_s: Optional[float]
    im2col_bytes: int
    implicit_bytes: int
    cudnn_s: Optional[float] = None
    compile_s: Optional[float] = None


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive `values` (nan when there are none)."""
    values = [v for v in values if v > 0 and math.isfinite(v)]
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _shapes(count: int, kind: str = "") -> str:
    """'1 shape', '3 1x1 stride-1 shapes'."""
    return f"{count} {kind}shape" + ("" if count == 1 else "s")


def _listed(pairs: Sequence[tuple[str, float]]) -> str:
    """'a (0.80x), b (0.90x)' for the first NAMED_AT_MOST, slowest first, and how many more."""
    pairs = sorted(pairs, key=lambda p: p[1])
    text = ", ".join(f"{layer} ({x:.2f}x)" for layer, x in pairs[:NAMED_AT_MOST])
    if len(pairs) > NAMED_AT_MOST:
        text += f" and {len(pairs) - NAMED_AT_MOST} more"
    return text


def implicit_text(timings: Sequence[LayerTiming], batch: int) -> tuple[float, str]:
    """(geometric-mean speedup of implicit GEMM over im2col + GEMM, one sentence)."""
    pairs = [(t.layer, t.im2col_s / t.implicit_s) for t in timings
             if t.implicit_s and t.im2col_s > 0]
    if not pairs:
        return float("nan"), "implicit GEMM did not run on any shape"
    g = geomean([x for _, x in pairs])
    best = max(pairs, key=lambda p: p[1])
    faster = sum(x >= 1 / LOSES_BELOW for _, x in pairs)
    slower = [p for p in pairs if p[1] < LOSES_BELOW]
    text = (f"implicit GEMM vs im2col + GEMM on {_shapes(len(pairs))} of ResNet-50's "
            f"convolutions at batch {batch}: {g:.2f}x geometric mean, faster on {faster}, best "
            f"{best[1]:.2f}x on {best[0]}")
    if slower:
        return g, text + f"; slower on {len(slower)}: {_listed(slower)}"
    return g, text + f"; never more than {1 - LOSES_BELOW:.0%} slower"


def columns_text(timings: Sequence[LayerTiming]) -> tuple[float, float, str]:
    """(speedup where im2col writes columns, share of bytes implicit GEMM saves there, one
    sentence setting them beside the 1x1 stride-1 shapes, whose bytes are the same)."""
    ran = [t for t in timings if t.implicit_s]
    cols = [t for t in ran if t.columns]
    flat = [t for t in ran if not t.columns]
    g_cols = geomean([t.im2col_s / t.implicit_s for t in cols])
    saved = (1 - sum(t.implicit_bytes for t in cols) / sum(t.im2col_bytes for t in cols)
             if cols else 0.0)
    parts = []
    if cols:
        parts.append(f"where im2col writes columns ({_shapes(len(cols))}) implicit GEMM moves "
                     f"{saved:.0%} fewer bytes and runs {g_cols:.2f}x (geometric mean)")
    if flat:
        g_flat = geomean([t.im2col_s / t.implicit_s for t in flat])
        parts.append(f"on the {_shapes(len(flat), '1x1 stride-1 ')}, whose columns are the "
                     f"input itself, both move the same bytes and implicit GEMM runs "
                     f"{g_flat:.2f}x: there the difference is the two kernels' own, not memory "
                     f"traffic")
    text = "; ".join(parts) if parts else "implicit GEMM did not run on any shape"
    return g_cols, saved, text[0].upper() + text[1:]


def torch_text(timings: Sequence[LayerTiming]) -> tuple[float, str]:
    """(geometric mean of cuDNN's time over cudalab's best form, one sentence)."""
    pairs = []
    for t in timings:
        ours = min(x for x in (t.im2col_s, t.implicit_s) if x)
        if t.cudnn_s and ours > 0:
            pairs.append((t.layer, t.cudnn_s / ours))
    if not pairs:
        return float("nan"), "torch's cuDNN did not run"
    g = geomean([x for _, x in pairs])
    slower = [p for p in pairs if p[1] < LOSES_BELOW]
    text = (f"cudalab's faster form vs torch's cuDNN (channels_last, cudnn.benchmark on) "
            f"over {_shapes(len(pairs))}: {g:.2f}x geometric mean (above 1: cudalab faster), "
            f"at parity or faster on {len(pairs) - len(slower)}")
    if slower:
        text += f"; cuDNN faster on {_listed(slower)}"
    return g, text


def compile_text(timings: Sequence[LayerTiming], setup_s: Sequence[float]) -> tuple[float, str]:
    """(geometric mean of eager cuDNN's time over torch.compile's, one sentence)."""
    ratios = [t.cudnn_s / t.compile_s for t in timings if t.cudnn_s and t.compile_s]
    if not ratios:
        return float("nan"), "torch.compile did not run"
    g = geomean(ratios)
    setup = f", after {statistics.median(setup_s):.1f} s of compiling per shape (median)" \
        if setup_s else ""
    return g, (f"torch.compile of the single conv + bias + ReLU vs eager cuDNN over "
               f"{_shapes(len(ratios))}: {g:.2f}x geometric mean{setup}: a lone conv leaves "
               f"it nothing to fuse but the ReLU, the conv itself stays cuDNN's")


def peak_text(form: str, percents: Sequence[tuple[str, float]], ceiling_name: str) -> str:
    """One sentence: the median share of the measured GEMM peak a form reaches, and its range."""
    pcts = [(layer, p) for layer, p in percents if p is not None]
    if not pcts:
        return f"{form}: no share of {ceiling_name} measured"
    lo, hi = min(pcts, key=lambda p: p[1]), max(pcts, key=lambda p: p[1])
    return (f"{form} reaches a median {statistics.median(p for _, p in pcts):.0f}% of the "
            f"measured GEMM peak ({ceiling_name}), from {lo[1]:.0f}% on {lo[0]} to "
            f"{hi[1]:.0f}% on {hi[0]}")


def torch_twin(label: str) -> Optional[str]:
    """The cudalab measurement a table's torch label pairs with: the implicit GEMM of the
    same shape (`versus` pairs the rest by its naming rules)."""
    for form in (CUDNN_FORM, COMPILE_FORM):
        if label.endswith(" " + form):
            return label[:-len(form)] + IMPLICIT_FORM
    return None


def table_params(p: Any) -> tuple[int, Any, str]:
    """(table_batch, table_layers, torch_compile), checked; ValueError naming the parameter."""
    batch = p["table_batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 256:
        raise ValueError(f"lesson 'conv_as_gemm': table_batch must be an int in 1..256, got "
                         f"{batch!r}")
    layers = p["table_layers"]
    if layers != "all":
        if isinstance(layers, str) or not isinstance(layers, (tuple, list)) or not layers:
            raise ValueError(f"lesson 'conv_as_gemm': table_layers must be 'all' or a "
                             f"non-empty tuple of ResNet-50 conv names, got {layers!r}")
        known = conv_names()
        for name in layers:
            if name not in known:
                raise ValueError(f"lesson 'conv_as_gemm': table_layers: no conv {name!r} in "
                                 f"ResNet-50 (names as torchvision's: 'conv1', "
                                 f"'layer2.1.conv2', 'layer3.0.downsample.0', ...)")
        layers = tuple(layers)
    choice = p["torch_compile"]
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"lesson 'conv_as_gemm': torch_compile must be one of "
                         f"{', '.join(map(repr, COMPILE_CHOICES))}, got {choice!r}")
    return batch, layers, choice


def check_params(p: Any) -> tuple[int, str]:
    """(batch, dtype) of the two-layer part; every parameter checked (the table's too)."""
    batch = p["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 256:
        raise ValueError(f"lesson 'conv_as_gemm': batch must be an int in 1..256, got {batch!r}")
    if p["dtype"] not in DTYPES:
        raise ValueError(f"lesson 'conv_as_gemm': dtype must be one of {', '.join(DTYPES)}, "
                         f"got {p['dtype']!r}")
    table_params(p)
    return batch, p["dtype"]


# ---- measuring ------------------------------------------------------------------------------


def _upload(values: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
    """(device array in `dtype`, its values read back as float32: what the GPU really holds)."""
    dev = cudalab.asarray(np.ascontiguousarray(values, dtype=np.float32), dtype=dtype)
    return dev, dev.astype("float32").get()


class _Layer:
    """One conv layer's operands on the device, and their rounded values on the host."""

    def __init__(self, name: str, batch: int, dtype: str, state: dict, folded: Any) -> None:
        from ..models import arch, params

        self.conv = c = next(x for x in arch.RESNET50 if getattr(x, "name", None) == name)
        shapes = arch.tensor_shapes(batch)
        rng = np.random.default_rng(SEED)
        self.out_shape = shapes[c.dst]
        self.m = int(np.prod(self.out_shape[:3]))
        s, bn = state, c.bn
        scale = s[f"{bn}.weight"] / np.sqrt(s[f"{bn}.running_var"] + params.BN_EPS)
        shift = s[f"{bn}.bias"] - s[f"{bn}.running_mean"] * scale
        raw = params.conv_weight_matrix(s[f"{name}.weight"], c.k_padded)  # (K, cout)
        host = {"x": rng.standard_normal(shapes[c.src]), "w_folded": folded[name].weight.T,
                "bias": folded[name].bias, "w_raw": raw.T, "scale": scale, "shift": shift}
        if c.residual:
            host["res"] = rng.standard_normal((self.m, c.cout))
        self.dev, self.host = {}, {}
        for key, value in host.items():
            self.dev[key], self.host[key] = _upload(value, dtype)
        self.x, self.res = self.dev["x"], self.dev.get("res")
        self.itemsize = self.x.itemsize

    def cols_host(self) -> np.ndarray:
        from ..models import reference

        c = self.conv
        return reference.im2col(self.host["x"], c.kh, c.kw, c.stride, c.padding,
                                c.k_padded).reshape(self.m, c.k_padded)

    def reference(self) -> np.ndarray:
        """float64 relu(cols @ W_folded.T + b (+ residual)) from the device's rounded operands."""
        h = self.host
        out = self.cols_host().astype(np.float64) @ h["w_folded"].astype(np.float64).T
        out += h["bias"]
        if "res" in h:
            out += h["res"]
        return np.maximum(out, 0) if self.conv.relu else out


def _im2col_rows(r: LessonRun, L: _Layer, dtype: str) -> dict[str, float]:
    from ..models import ops

    c = L.conv
    itemsize = L.itemsize
    # (N * Ho * Wo, K padded): one row per output pixel, the GEMM's A operand.
    cols = ops.im2col(L.x, c.kh, c.kw, c.stride, c.padding, k_padded=c.k_padded)
    r.check(f"{c.name}: im2col vs NumPy", rel_error(cols.astype("float32").get(), L.cols_host()),
            TOL_IM2COL)
    nb = im2col_bytes(L.m, c.k_padded, L.x.size, itemsize)
    out = cudalab.empty((L.m, c.cout), dtype=dtype)
    w, b = L.dev["w_folded"], L.dev["bias"]

    def im2col() -> None:
        ops.im2col(L.x, c.kh, c.kw, c.stride, c.padding, k_padded=c.k_padded, out=cols)

    def gemm() -> None:
        ops.conv_gemm(cols, w, b, relu=c.relu, out=out)

    def both() -> None:
        im2col()
        gemm()

    flops = 2.0 * L.m * c.k * c.cout
    gb = gemm_bytes(L.m, c.k_padded, c.cout, itemsize)
    t_cols = r.measure(f"{c.name} im2col", im2col, bytes=nb, ceiling="copy")
    t_gemm = r.measure(f"{c.name} gemm", gemm, flops=flops, ceiling=f"matmul_{dtype}")
    t_both = r.measure(f"{c.name} im2col + gemm", both, flops=flops, ceiling=f"matmul_{dtype}")
    times = {"im2col": t_cols.median, "gemm": t_gemm.median, "both": t_both.median,
             "byte_share": nb / (nb + gb)}
    for path, m in (("im2col", t_cols), ("gemm only", t_gemm), ("im2col + gemm", t_both)):
        r.row(layer=c.name, kernel=f"{c.kh}x{c.kw}", path=path, ms=m.median * 1e3,
              gbps=m.gbps, tflops=m.tflops, pct_ceiling=m.percent_of_ceiling,
              ceiling=m.ceiling_name)
    return times


def _fusion_rows(r: LessonRun, L: _Layer, dtype: str) -> dict[str, float]:
    """Separate BN (scale, shift), residual add and ReLU kernels vs one fused GEMM."""
    from ..models import ops

    c = L.conv
    d = L.dev
    a = (L.x.reshape(L.m, c.cin) if c.is_1x1 and c.stride == 1 else
         ops.im2col(L.x, c.kh, c.kw, c.stride, c.padding, k_padded=c.k_padded).reshape(
             L.m, c.k_padded))
    out = cudalab.empty((L.m, c.cout), dtype=dtype)

    def separate() -> None:
        ops.conv_gemm(a, d["w_raw"], out=out)
        cudalab.mul(out, d["scale"], out=out)
        cudalab.add(out, d["shift"], out=out)
        if L.res is not None:
            cudalab.add(out, L.res, out=out)
        if c.relu:
            cudalab.relu(out, out=out)

    fused_out = cudalab.empty((L.m, c.cout), dtype=dtype)
    if L.res is not None:
        cudalab.copyto(fused_out, L.res)

    def fused() -> None:
        ops.conv_gemm(a, d["w_folded"], d["bias"], relu=c.relu, out=fused_out,
                      accumulate=L.res is not None)

    ref = L.reference()
    separate()
    fused()
    tol = TOLERANCE[dtype]
    r.check(f"{c.name}: GEMM + separate BN/add/ReLU kernels vs NumPy float64",
            rel_error(out.astype("float32").get(), ref), tol)
    r.check(f"{c.name}: fused GEMM epilogue vs NumPy float64",
            rel_error(fused_out.astype("float32").get(), ref), tol)
    kernels = 2 + (L.res is not None) + c.relu
    flops = 2.0 * L.m * c.k * c.cout
    # Timed repeats of the fused GEMM keep adding into `fused_out` (as the forward's
    # in-place shortcut does once): the values change, the work does not.
    m_sep = r.measure(f"{c.name} separate epilogue", separate, flops=flops,
                      ceiling=f"matmul_{dtype}")
    m_fused = r.measure(f"{c.name} fused epilogue", fused, flops=flops,
                        ceiling=f"matmul_{dtype}")
    for path, m in ((f"gemm + {kernels} kernels", m_sep), ("fused epilogue", m_fused)):
        r.row(layer=c.name, kernel=f"{c.kh}x{c.kw}", path=path, ms=m.median * 1e3,
              gbps=m.gbps, tflops=m.tflops, pct_ceiling=m.percent_of_ceiling,
              ceiling=m.ceiling_name)
    return {"separate": m_sep.median, "fused": m_fused.median, "kernels": kernels}


# ---- the per-layer table: im2col + GEMM, implicit GEMM, torch --------------------------------


def device_error(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| of two device arrays, reduced on the device (a batch-128
    activation is too large to copy back per check); inf when the shapes differ."""
    if tuple(got.shape) != tuple(ref.shape):
        return float("inf")
    g, f = got.astype("float32"), ref.astype("float32")
    diff = float(cudalab.max(cudalab.abs(cudalab.sub(g, f))).get())
    scale = float(cudalab.max(cudalab.abs(f)).get())
    return diff / scale if scale > 0 else diff


class _TableShape:
    """One table shape's operands on the device: x NHWC, w KRSC (cout, kh, kw, cin), b."""

    def __init__(self, s: ConvShape, dtype: str, seed: int) -> None:
        self.s = s
        # Weights scaled as He initialisation would, so outputs stay O(1) in half precision.
        self.x = cudalab.random.normal((s.n, s.h, s.w, s.cin), dtype=dtype, seed=seed)
        self.w = cudalab.random.normal((s.cout, s.kh, s.kw, s.cin), 0.0,
                                       math.sqrt(2.0 / s.k), dtype=dtype, seed=seed + 1)
        self.b = cudalab.random.normal((s.cout,), 0.0, 0.5, dtype=dtype, seed=seed + 2)
        self.itemsize = self.x.itemsize
        self.outs = {form: cudalab.empty((s.n, s.oh, s.ow, s.cout), dtype=dtype)
                     for form in (IM2COL_FORM, IMPLICIT_FORM)}

    def call(self, form: str, dtype: str) -> Callable[[], Any]:
        """``ops.conv2d`` of this shape by `form`'s route into its own output."""
        from ..models import ops

        s = self.s
        route = "implicit" if form == IMPLICIT_FORM else "im2col"
        # float32 runs true fp32 (the matmul_float32 ceiling); half precision takes no setting.
        extra = {"precision": "highest"} if dtype == "float32" else {}
        out = self.outs[form]

        def conv() -> Any:
            return ops.conv2d(self.x, self.w, self.b, stride=s.stride, padding=s.padding,
                              relu=True, route=route, out=out, **extra)
        return conv

    def reference_error(self, got: Any) -> float:
        """`got`'s first image against float64 NumPy of the device's rounded operands."""
        from ..models import reference

        s = self.s
        x0 = self.x[:1].astype("float32").get().astype(np.float64)
        w = self.w.astype("float32").get().astype(np.float64).reshape(s.cout, s.k)
        b = self.b.astype("float32").get().astype(np.float64)
        cols = reference.im2col(x0, s.kh, s.kw, s.stride, s.padding).reshape(-1, s.k)
        want = np.maximum(cols @ w.T + b, 0).reshape(1, s.oh, s.ow, s.cout)
        return rel_error(got[:1].astype("float32").get(), want)


def _table_row(r: LessonRun, s: ConvShape, form: str, m: Any, nbytes: Optional[int],
               im2col_s: float, setup_s: Optional[float] = None) -> None:
    r.row(layer=s.layer, kernel=f"{s.kh}x{s.kw}", path=form, batch=s.n, shape=s.text,
          n_layers=s.count, ms=m.median * 1e3, mb=None if nbytes is None else nbytes / 1e6,
          gbps=m.gbps, tflops=m.tflops, pct_ceiling=m.percent_of_ceiling,
          ceiling=m.ceiling_name, vs_im2col=ratio(im2col_s, m.median), setup_s=setup_s)


def _label(s: ConvShape, form: str) -> str:
    return f"{s.layer} b{s.n} {form}"


def _ours(r: LessonRun, t: _TableShape, dtype: str, implicit: bool,
          notes: list[str]) -> dict[str, Any]:
    """im2col + GEMM and implicit GEMM of one shape: checked, timed, their rows written."""
    s, tol = t.s, TOL_FORMS[dtype]
    peak = f"matmul_{dtype}"
    got: dict[str, Any] = {}
    forms = [IM2COL_FORM] + ([IMPLICIT_FORM] if implicit else [])
    for form in forms:
        fn = t.call(form, dtype)
        try:
            fn()
        except ValueError as exc:
            if form != IMPLICIT_FORM or not implicit_may_refuse(s.cin):
                raise
            notes.append(f"{s.layer} ({s.text}): route='implicit' refused its {s.cin} "
                         f"channels, so it has no implicit row: {str(exc).splitlines()[0]}")
            continue
        nbytes = (im2col_form_bytes if form == IM2COL_FORM else implicit_bytes)(s, t.itemsize)
        got[form] = (r.measure(_label(s, form), fn, flops=s.flops, bytes=nbytes, ceiling=peak),
                     nbytes)
    if IMPLICIT_FORM in got:
        r.check(f"{s.layer} b{s.n}: implicit GEMM vs im2col + GEMM",
                device_error(t.outs[IMPLICIT_FORM], t.outs[IM2COL_FORM]), tol)
    im2col_s = got[IM2COL_FORM][0].median
    for form, (m, nbytes) in got.items():
        _table_row(r, s, form, m, nbytes, im2col_s)
    return {form: m for form, (m, _) in got.items()}


def _theirs(r: LessonRun, torch: Any, t: _TableShape, dtype: str, compile_it: bool,
            im2col_s: float, notes: list[str]) -> tuple[dict[str, Any], Optional[float], bool]:
    """torch's cuDNN conv (and torch.compile of it) on the same device buffers, channels_last:
    ({form: Measurement}, seconds torch.compile took to make its first call or None,
    whether torch.compile failed)."""
    from ..models.torch_twin import TorchPrecision
    from .compilers import compiling, failure_text

    s, tol = t.s, TOL_FORMS[dtype]
    F = torch.nn.functional
    # The NHWC / KRSC buffers seen as NCHW / OIHW with channels_last strides: no copy.
    tx = torch.from_dlpack(t.x).permute(0, 3, 1, 2)
    tw = torch.from_dlpack(t.w).permute(0, 3, 1, 2)
    tb = torch.from_dlpack(t.b)

    def layer(x: Any, w: Any, b: Any) -> Any:
        return torch.relu(F.conv2d(x, w, b, stride=s.stride, padding=s.padding))

    def error(y: Any) -> float:
        return device_error(cudalab.from_dlpack(y.permute(0, 2, 3, 1).contiguous()),
                            t.outs[IM2COL_FORM])

    out: dict[str, Any] = {}
    with TorchPrecision(torch, dtype), torch.no_grad():
        r.check(f"{s.layer} b{s.n}: torch cuDNN vs im2col + GEMM", error(layer(tx, tw, tb)),
                tol)
        m = out[CUDNN_FORM] = r.measure(_label(s, CUDNN_FORM), layer, tx, tw, tb,
                                        flops=s.flops, ceiling=f"matmul_{dtype}")
        _table_row(r, s, CUDNN_FORM, m, None, im2col_s)
        if not compile_it:
            return out, None, False
        with compiling(torch):
            try:
                compiled = torch.compile(layer, dynamic=False)
                start = time.perf_counter()
                y = compiled(tx, tw, tb)
                torch.cuda.synchronize()
                setup_s = time.perf_counter() - start
            except LessonCheckError:
                raise
            except Exception as exc:  # no inductor or no compiler here: say so, go on
                notes.append(failure_text(f"torch.compile of {s.layer}", exc))
                return out, None, True
            r.check(f"{s.layer} b{s.n}: torch.compile vs im2col + GEMM", error(y), tol)
            m = out[COMPILE_FORM] = r.measure(_label(s, COMPILE_FORM), compiled, tx, tw, tb,
                                              flops=s.flops, ceiling=f"matmul_{dtype}")
            _table_row(r, s, COMPILE_FORM, m, None, im2col_s, setup_s)
    return out, setup_s, False


def _table(r: LessonRun, dtype: str, batch: int, layers: Any, choice: str) -> None:
    """The per-layer table and its findings and claim."""
    from ..models import ops

    if getattr(ops, "conv2d", None) is None:
        r.finding("this build of cudalab has no models.ops.conv2d: the per-layer table of "
                  "im2col + GEMM vs implicit GEMM needs it")
        return
    # float32 runs true fp32 here, which the implicit GEMM (TF32 only) does not do.
    implicit = ops.implicit_gemm_available(dtype, "highest")
    torch = r.torch()
    shapes = table_shapes(batch, layers)
    checked = reference_shape(shapes)
    timings: list[LayerTiming] = []
    labels: dict[str, list[str]] = {}
    notes: list[str] = []
    setups: list[float] = []
    percents: dict[str, list[tuple[str, float]]] = {IM2COL_FORM: [], IMPLICIT_FORM: []}
    for i, s in enumerate(shapes):
        t = _TableShape(s, dtype, SEED + 10 * i)
        ms = _ours(r, t, dtype, implicit, notes)
        if s == checked:
            for form in ms:
                r.check(f"{s.layer} b{s.n}, first image: {form} vs NumPy float64",
                        t.reference_error(t.outs[form]), TOLERANCE[dtype])
        theirs: dict[str, Any] = {}
        if torch is not None:
            theirs, setup_s, failed = _theirs(r, torch, t, dtype, compiles(s, choice),
                                              ms[IM2COL_FORM].median, notes)
            if failed:
                choice = "none"  # one failure says why; the next shapes would fail alike
            if setup_s is not None:
                setups.append(setup_s)
        for form, m in ms.items():
            percents[form].append((s.layer, m.percent_of_ceiling))
        for form, m in (*ms.items(), *theirs.items()):
            labels.setdefault(form, []).append(m.label)
        imp = ms.get(IMPLICIT_FORM)
        timings.append(LayerTiming(
            s.layer, s.columns, ms[IM2COL_FORM].median, imp.median if imp else None,
            im2col_form_bytes(s, t.itemsize), implicit_bytes(s, t.itemsize),
            theirs[CUDNN_FORM].median if CUDNN_FORM in theirs else None,
            theirs[COMPILE_FORM].median if COMPILE_FORM in theirs else None))
    _table_findings(r, timings, batch, dtype, implicit, torch is not None, labels, percents,
                    setups, notes)


def _table_findings(r: LessonRun, timings: list[LayerTiming], batch: int, dtype: str,
                    implicit: bool, with_torch: bool, labels: dict[str, list[str]],
                    percents: dict[str, list[tuple[str, float]]], setups: list[float],
                    notes: list[str]) -> None:
    peak = f"matmul_{dtype}"

    def of(*forms: str) -> tuple[str, ...]:
        return tuple(x for form in forms for x in labels.get(form, ()))
    if not implicit:
        r.finding("implicit GEMM is not available here (a GPU below sm80, or a build without "
                  "its kernels): the table has im2col + GEMM and torch only")
    elif any(t.implicit_s for t in timings):
        g, text = implicit_text(timings, batch)
        both = of(IM2COL_FORM, IMPLICIT_FORM)
        r.finding(text, value=g, unit="x", labels=both)
        g_cols, saved, text = columns_text(timings)
        r.finding(text, value=saved, unit="fraction", labels=both)
        r.finding(peak_text("implicit GEMM", percents[IMPLICIT_FORM], peak),
                  labels=of(IMPLICIT_FORM))
        cols = [t for t in timings if t.columns and t.implicit_s]
        if cols:
            r.claim("fusing im2col into the GEMM's own loads (implicit GEMM) saves memory "
                    "passes and time", tutorial=None, measured=g_cols, unit="x",
                    held=g_cols >= IMPLICIT_PAYS,
                    why=f"geometric mean over the {_shapes(len(cols))} whose im2col writes "
                        f"columns, {saved:.0%} fewer bytes; holds from {IMPLICIT_PAYS:g}x")
    r.finding(peak_text("im2col + GEMM", percents[IM2COL_FORM], peak), labels=of(IM2COL_FORM))
    if with_torch:
        g, text = torch_text(timings)
        r.finding(text, value=g, unit="x", labels=of(IM2COL_FORM, IMPLICIT_FORM, CUDNN_FORM))
        if any(t.compile_s for t in timings):
            g, text = compile_text(timings, setups)
            r.finding(text, value=g, unit="x", labels=of(CUDNN_FORM, COMPILE_FORM))
    else:
        r.finding("torch is not installed (or sees no GPU): the table has no cuDNN or "
                  "torch.compile rows")
    for note in notes:
        r.finding(note)


@lesson(20, "conv_as_gemm", title="Convolution as GEMM: im2col's cost and fused epilogues",
        seed="ResNet-50 in NHWC as GEMMs (the inference lesson's network); guides' kernel "
             "fusion sections (fewer memory passes)",
        params={"batch": 32, "dtype": "float16", "table_batch": TABLE_BATCH, "table_layers": "all",
                "torch_compile": "columns"},
        quick_params={"batch": 8, "table_batch": 8, "table_layers": LAYERS,
                      "torch_compile": "none"},
        torch_twin=torch_twin,
        check=check_params)
def run(r: LessonRun) -> None:
    from .. import models

    batch, dtype = check_params(r.params)
    table_batch, table_layers, choice = table_params(r.params)
    state = models.init_weights(seed=SEED, random_stats=True)
    folded = models.fold(state)
    ceiling("copy")
    ceiling(f"matmul_{dtype}")
    conv3x3 = _Layer(LAYERS[0], batch, dtype, state, folded)
    conv1x1 = _Layer(LAYERS[1], batch, dtype, state, folded)
    t3 = _im2col_rows(r, conv3x3, dtype)
    t1 = _im2col_rows(r, conv1x1, dtype)
    share, text = im2col_text(LAYERS[0], t3["im2col"], t3["gemm"], t3["byte_share"])
    r.finding(text, value=share, unit="fraction",
              labels=(f"{LAYERS[0]} im2col", f"{LAYERS[0]} gemm"))
    skip = ratio(t1["both"], t1["gemm"])
    r.finding(f"{LAYERS[1]} (1x1): the direct GEMM on the activation takes "
              f"{t1['gemm'] * 1e3:.3f} ms, with a needless im2col copy first "
              f"{t1['both'] * 1e3:.3f} ms ({skip:.2f}x): a 1x1 conv's cols are its input",
              value=skip, unit="x", labels=(f"{LAYERS[1]} im2col + gemm", f"{LAYERS[1]} gemm"))
    gains = []
    for L in (conv3x3, conv1x1):
        f = _fusion_rows(r, L, dtype)
        gain, text = fusion_text(L.conv.name, f["separate"], f["fused"], f["kernels"])
        gains.append(gain)
        r.finding(text, value=gain, unit="x", labels=(f"{L.conv.name} separate epilogue",
                                                      f"{L.conv.name} fused epilogue"))
    best = max(gains)
    r.claim("fusing element-wise work into the GEMM saves memory passes and time",
            tutorial=None, measured=best, unit="x", held=best >= FUSION_PAYS,
            why=f"best layer {best:.2f}x; holds from {FUSION_PAYS:g}x")
    _table(r, dtype, table_batch, table_layers, choice)


@run.plot
def plot(result: Any, ax: Any) -> None:
    table = [x for x in result.rows if x.get("batch") is not None]
    if table:
        _plot_table(table, ax)
        return
    rows = result.rows
    labels = [f"{x['layer']}\n{x['path']}" for x in rows]
    y = np.arange(len(rows))
    ax.barh(y, [x["ms"] for x in rows])
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median time (ms)")


def _plot_table(rows: list[dict[str, Any]], ax: Any) -> None:
    """Per table shape, each form's speed over im2col + GEMM's (bars to the right: faster)."""
    layers = list(dict.fromkeys(x["layer"] for x in rows))
    forms = [f for f in (IMPLICIT_FORM, CUDNN_FORM, COMPILE_FORM)
             if any(x["path"] == f for x in rows)]
    y = np.arange(len(layers))
    height = 0.8 / max(len(forms), 1)
    for j, form in enumerate(forms):
        speed = {x["layer"]: x["vs_im2col"] for x in rows if x["path"] == form}
        ax.barh(y + j * height, [speed.get(layer, 0.0) for layer in layers], height=height,
                label=form)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(y + 0.4 - height / 2, layers, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speed over im2col + GEMM (x)")
    ax.legend(fontsize=7)
