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
"""

from __future__ import annotations

from typing import Any

import numpy as np

import cudalab

from ..bench import ceiling
from ._measuring import ratio, rel_error
from .registry import LessonRun, lesson

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


def check_params(p: Any) -> tuple[int, str]:
    batch = p["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 256:
        raise ValueError(f"lesson 'conv_as_gemm': batch must be an int in 1..256, got {batch!r}")
    if p["dtype"] not in DTYPES:
        raise ValueError(f"lesson 'conv_as_gemm': dtype must be one of {', '.join(DTYPES)}, "
                         f"got {p['dtype']!r}")
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


@lesson(20, "conv_as_gemm", title="Convolution as GEMM: im2col's cost and fused epilogues",
        seed="ResNet-50 in NHWC as GEMMs (the inference lesson's network); guides' kernel "
             "fusion sections (fewer memory passes)",
        params={"batch": 32, "dtype": "float16"},
        quick_params={"batch": 8},
        check=check_params)
def run(r: LessonRun) -> None:
    from .. import models

    batch, dtype = check_params(r.params)
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


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = result.rows
    labels = [f"{x['layer']}\n{x['path']}" for x in rows]
    y = np.arange(len(rows))
    ax.barh(y, [x["ms"] for x in rows])
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median time (ms)")
