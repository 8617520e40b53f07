"""Lesson 16 `roofline`: this GPU's measured roofline, and where common kernels sit on it.

A kernel's speed is capped by two roofs: the bytes it moves times the
memory bandwidth, and the device's arithmetic peak. Which one binds depends
on its arithmetic intensity (FLOPs per byte moved): below the ridge point
(peak / bandwidth) a kernel is memory-bound, above it compute-bound. A third
regime sits under both: a kernel so short that its launch cost, not its
work, sets its time (overhead-bound). The roofs here are measured, not taken
from a datasheet: the device copy bandwidth (``ceiling("copy")``) and the
GEMM peak per dtype (``ceiling("matmul_<dtype>")``). Each kernel is timed
with its FLOPs and minimum bytes, placed by intensity and labelled by named
thresholds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np

import cudalab
from cudalab import _precision
from cudalab.bench import MatmulCase, ceiling

from ._measuring import rel_error
from . import _params as P
from .registry import LessonRun, lesson

# A kernel whose GPU time is within this many empty-kernel launch times is
# overhead-bound: its size hardly changes its time.
OVERHEAD_LAUNCHES = 3.0
# Achieved FLOP/s at least this percentage of the dtype's measured GEMM peak:
# compute-bound.
COMPUTE_BOUND_PCT = 50.0
# Achieved bytes/s at least this percentage of the measured copy bandwidth:
# memory-bound.
MEMORY_BOUND_PCT = 50.0
REGIMES = ("overhead-bound", "memory-bound", "compute-bound")
# FLOPs counted per softmax element: max, subtract, exp, sum, scale.
SOFTMAX_FLOPS_PER_ELEMENT = 5
# Tolerances of the small-input checks (relative to the largest reference value).
MATMUL_TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "tf32": 5e-3, "float16": 1e-2,
                    "bfloat16": 2e-2}
ELEMENTWISE_TOLERANCE = 1e-5


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
    if not (peak_flops > 0 and bandwidth > 0):
        raise ValueError("ridge_point(): expected peak_flops > 0 and bandwidth > 0")
    return peak_flops / bandwidth


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roof at `intensity`: ``min(peak_flops, intensity * bandwidth)`` FLOP/s."""
    return min(peak_flops, intensity * bandwidth)


@dataclasses.dataclass(frozen=True)
class Placement:
    """A kernel on the roofline.

    Attributes
    ----------
    intensity : float
        FLOPs per byte moved.
    flops_per_s, bytes_per_s : float
        Achieved rates.
    roof : float
        The attainable FLOP/s at this intensity.
    pct_of_roof, pct_of_peak, pct_of_bandwidth : float
        Achieved over the roof, the compute peak and the copy bandwidth (%).
    regime : str
        One of `REGIMES`.
    why : str
        The threshold that decided it.
    """

    intensity: float
    flops_per_s: float
    bytes_per_s: float
    roof: float
    pct_of_roof: float
    pct_of_peak: float
    pct_of_bandwidth: float
    regime: str
    why: str


def classify(seconds: float, flops: float, nbytes: float, peak_flops: float, bandwidth: float,
             launch_seconds: float) -> Placement:
    """Place a kernel that took `seconds` for `flops` and `nbytes` on the roofline.

    Rules, in order: within `OVERHEAD_LAUNCHES` launch times -> overhead-bound;
    at least `COMPUTE_BOUND_PCT` of the peak -> compute-bound; at least
    `MEMORY_BOUND_PCT` of the bandwidth -> memory-bound; otherwise the side
    of the ridge point its intensity falls on.
    """
    if not (seconds > 0 and flops > 0 and nbytes > 0 and launch_seconds > 0):
        raise ValueError("classify(): expected seconds, flops, nbytes and launch_seconds > 0")
    ridge = ridge_point(peak_flops, bandwidth)
    intensity = flops / nbytes
    fps, bps = flops / seconds, nbytes / seconds
    roof = attainable(intensity, peak_flops, bandwidth)
    pct_peak, pct_bw = 100.0 * fps / peak_flops, 100.0 * bps / bandwidth
    launches = seconds / launch_seconds
    if launches <= OVERHEAD_LAUNCHES:
        regime, why = "overhead-bound", f"{launches:.1f} launch times (<= {OVERHEAD_LAUNCHES:g})"
    elif pct_peak >= COMPUTE_BOUND_PCT:
        regime, why = "compute-bound", f"{pct_peak:.0f}% of peak (>= {COMPUTE_BOUND_PCT:g}%)"
    elif pct_bw >= MEMORY_BOUND_PCT:
        regime, why = "memory-bound", f"{pct_bw:.0f}% of copy bandwidth (>= {MEMORY_BOUND_PCT:g}%)"
    elif intensity < ridge:
        regime, why = "memory-bound", f"intensity {intensity:.3g} below the ridge {ridge:.3g}"
    else:
        regime, why = "compute-bound", f"intensity {intensity:.3g} above the ridge {ridge:.3g}"
    return Placement(intensity, fps, bps, roof, 100.0 * fps / roof, pct_peak, pct_bw, regime, why)


# ---- the kernels -------------------------------------------------------------------------


@dataclasses.dataclass
class Kernel:
    """One kernel to place: what to call, its work, and its PyTorch twin."""

    name: str
    dtype: str  # the compute dtype whose peak applies ("tf32" for TF32 matmul)
    shape: str
    fn: Callable[[], Any]
    flops: float
    nbytes: float
    torch_fn: Callable[[], Any] | None = None


def _matmul_kernel(name: str, dtype: str, n: int, seed: int, torch: Any) -> Kernel:
    # Storage and matmul's precision from the one table.
    spec = _precision.resolve(dtype)
    storage, precision = spec.storage, spec.matmul_precision
    a = cudalab.random.normal((n, n), dtype=storage, seed=seed)
    b = cudalab.random.normal((n, n), dtype=storage, seed=seed + 1)
    out = cudalab.empty((n, n), dtype=storage)
    itemsize = {"float64": 8, "float32": 4}.get(storage, 2)
    # The bench case's torch.mm twin: same size, dtype and TF32 setting (its own operands).
    twin = None if torch is None else MatmulCase(dtype, n).prepare().torch_twin(torch).fn
    return Kernel(name, dtype, f"{n}x{n}x{n}",
                  lambda: cudalab.matmul(a, b, out=out, precision=precision),
                  2.0 * n ** 3, 3.0 * n * n * itemsize, twin)


def _vector_kernels(p: dict, torch: Any) -> list[Kernel]:
    """add (tiny and large), sum and softmax in float32."""
    n, rows, cols = p["elements"], *p["softmax_shape"]
    a = cudalab.random.normal(n, seed=11)
    b = cudalab.random.normal(n, seed=12)
    c = cudalab.empty(n)
    tiny = [cudalab.random.normal(p["tiny_elements"], seed=13 + i) for i in range(3)]
    x = cudalab.random.normal((rows, cols), seed=16)
    y = cudalab.empty((rows, cols))
    t = rows * cols
    kernels = [
        Kernel("add tiny", "float32", f"{p['tiny_elements']}",
               lambda: cudalab.add(tiny[0], tiny[1], out=tiny[2]),
               float(p["tiny_elements"]), 12.0 * p["tiny_elements"]),
        Kernel("add", "float32", f"{n}", lambda: cudalab.add(a, b, out=c), float(n), 12.0 * n),
        Kernel("sum", "float32", f"{n}", lambda: cudalab.sum(a), float(n), 4.0 * n),
        # Minimum traffic: read x once, write y once.
        Kernel("softmax", "float32", f"{rows}x{cols}", lambda: cudalab.softmax(x, out=y),
               float(SOFTMAX_FLOPS_PER_ELEMENT * t), 8.0 * t),
    ]
    if torch is not None:
        ta, tb, tc = (torch.from_dlpack(v) for v in (a, b, c))
        tt = [torch.from_dlpack(v) for v in tiny]
        tx = torch.from_dlpack(x)
        twins = [lambda: torch.add(tt[0], tt[1], out=tt[2]), lambda: torch.add(ta, tb, out=tc),
                 lambda: torch.sum(ta), lambda: torch.softmax(tx, dim=-1)]
        for k, twin in zip(kernels, twins):
            k.torch_fn = twin
    return kernels


# ---- the checks on small inputs ------------------------------------------------------------


def _check_small(r: LessonRun, dtypes: tuple[str, ...]) -> None:
    rng = np.random.default_rng(r.params["seed"])
    ha = rng.standard_normal(1001, dtype=np.float32)
    hb = rng.standard_normal(1001, dtype=np.float32)
    got = cudalab.add(cudalab.asarray(ha), cudalab.asarray(hb)).get()
    r.check("add (1001 float32) vs NumPy, exact", rel_error(got, ha + hb), 0.0)
    hs = rng.uniform(0.5, 1.5, 100_003).astype(np.float32)
    got = cudalab.sum(cudalab.asarray(hs)).get()
    r.check("sum (100003 float32) vs float64 NumPy",
            rel_error(got, hs.astype(np.float64).sum()), ELEMENTWISE_TOLERANCE)
    hx = rng.standard_normal((37, 1500)).astype(np.float32)
    got = cudalab.softmax(cudalab.asarray(hx)).get()
    w = np.exp(hx.astype(np.float64) - hx.max(axis=1, keepdims=True))
    r.check("softmax (37x1500 float32) vs float64 NumPy",
            rel_error(got, w / w.sum(1, keepdims=True)), ELEMENTWISE_TOLERANCE)
    for dtype in dtypes:
        a = cudalab.random.normal((67, 129), dtype=_precision.storage(dtype), seed=21)
        b = cudalab.random.normal((129, 45), dtype=_precision.storage(dtype), seed=22)
        got = cudalab.matmul(a, b, precision=_precision.matmul_precision(dtype)).get()
        want = a.get().astype(np.float64) @ b.get().astype(np.float64)
        r.check(f"matmul {dtype} (67x129 @ 129x45) vs float64 NumPy", rel_error(got, want),
                MATMUL_TOLERANCE[dtype])


# ---- the lesson -------------------------------------------------------------------------------


def _place(r: LessonRun, k: Kernel, copy_bw: float, launch_s: float) -> tuple[Any, Placement]:
    matmul = k.name.startswith("matmul")
    ceiling_name = f"matmul_{k.dtype}" if matmul else "copy"
    m = r.measure(k.name, k.fn, flops=k.flops, bytes=k.nbytes, ceiling=ceiling_name,
                  description=k.shape)
    peak = ceiling(f"matmul_{k.dtype}").value
    placed = classify(m.median, k.flops, k.nbytes, peak, copy_bw, launch_s)
    torch_ms = None
    if k.torch_fn is not None:
        t = r.measure(f"torch {k.name}", k.torch_fn, flops=k.flops, bytes=k.nbytes,
                      ceiling=ceiling_name, description=k.shape)
        torch_ms = t.median * 1e3
    r.row(kernel=k.name, dtype=k.dtype, shape=k.shape, ms=m.median * 1e3, gflop=k.flops / 1e9,
          mb=k.nbytes / 1e6, intensity=placed.intensity, tflops=placed.flops_per_s / 1e12,
          gbps=placed.bytes_per_s / 1e9, pct_of_copy=placed.pct_of_bandwidth,
          pct_of_peak=placed.pct_of_peak, roof_tflops=placed.roof / 1e12,
          pct_of_roof=placed.pct_of_roof, regime=placed.regime, why=placed.why,
          peak_tflops=peak / 1e12, copy_gbps=copy_bw / 1e9, torch_ms=torch_ms)
    return m, placed


def _claims(r: LessonRun, placed: dict[str, Placement], big_matmul: str) -> None:
    add, tiny, mm = placed["add"], placed["add tiny"], placed[big_matmul]
    r.claim("Element-wise ops are memory-bound: low FLOP/s, high bandwidth", tutorial=None,
            measured=add.pct_of_bandwidth, unit="% of copy", held=add.regime == "memory-bound",
            why=f"add: {add.regime} ({add.why})")
    r.claim("A large matmul is compute-bound", tutorial=None, measured=mm.pct_of_peak,
            unit="% of peak", held=mm.regime == "compute-bound",
            why=f"{big_matmul}: {mm.regime} ({mm.why})")
    r.claim("A tiny op is overhead-bound: its time does not follow its size", tutorial=None,
            measured=tiny.pct_of_roof, unit="% of roof", held=tiny.regime == "overhead-bound",
            why=f"add tiny: {tiny.regime} ({tiny.why})")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.among("roofline", p, "dtypes", MATMUL_TOLERANCE)
    P.ints("roofline", p, "elements", "tiny_elements", "small_n", "large_n")
    P.int_lists("roofline", p, "softmax_shape")
    if len(p["softmax_shape"]) != 2:
        raise ValueError(f"lesson 'roofline': softmax_shape must be (rows, cols), "
                         f"got {p['softmax_shape']!r}")
    P.seed("roofline", p)


@lesson(16, "roofline", title="The measured roofline: memory, compute and overhead regimes",
        seed="Colab notebook summary: the three performance regimes and arithmetic intensity "
             "(FLOPs / bytes accessed)",
        params={"dtypes": ("float64", "float32", "tf32", "float16", "bfloat16"),
                "elements": 1 << 26, "tiny_elements": 4096, "softmax_shape": (8192, 8192),
                "small_n": 256, "large_n": 8192, "seed": 0},
        quick_params={"dtypes": ("float32", "float16"), "elements": 1 << 24,
                      "softmax_shape": (4096, 4096), "large_n": 4096},
        check=check_params)
def run(r: LessonRun) -> None:
    p = dict(r.params)
    dtypes = tuple(p["dtypes"])
    if "float32" not in dtypes:  # element-wise kernels are placed against the fp32 peak
        dtypes = ("float32", *dtypes)
    torch = r.torch()
    _check_small(r, dtypes)
    copy_bw, launch_s = ceiling("copy").value, ceiling("launch").value
    kernels = _vector_kernels(p, torch)
    for i, dtype in enumerate(dtypes):
        for size, n in (("small", p["small_n"]), ("large", p["large_n"])):
            kernels.append(_matmul_kernel(f"matmul {size} {dtype}", dtype, n, 100 + 2 * i, torch))
    placed = {}
    for k in kernels:
        m, placed[k.name] = _place(r, k, copy_bw, launch_s)
        x = placed[k.name]
        r.finding(f"{k.name} ({k.shape}): {x.intensity:.3g} FLOP/B, "
                  f"{x.flops_per_s / 1e12:.3g} TFLOP/s, {x.bytes_per_s / 1e9:.0f} GB/s, "
                  f"{x.pct_of_roof:.0f}% of its roof: {x.regime} ({x.why})",
                  value=x.pct_of_roof, unit="% of roof", labels=(m.label,))
    for dtype in dtypes:
        peak = ceiling(f"matmul_{dtype}").value
        ridge = ridge_point(peak, copy_bw)
        r.finding(f"{dtype}: ridge point {ridge:.0f} FLOP/B (GEMM peak {peak / 1e12:.1f} "
                  f"TFLOP/s over copy {copy_bw / 1e9:.0f} GB/s); below it a kernel cannot "
                  f"reach the peak", value=ridge, unit="FLOP/B",
                  labels=(f"matmul large {dtype}",))
    for dtype in dtypes:
        small, large = placed[f"matmul small {dtype}"], placed[f"matmul large {dtype}"]
        gain = large.flops_per_s / small.flops_per_s
        r.finding(f"{dtype}: the {p['large_n']}^3 matmul runs at {gain:.0f}x the FLOP/s of the "
                  f"{p['small_n']}^3 one (intensity {small.intensity:.0f} -> "
                  f"{large.intensity:.0f} FLOP/B; {small.regime} -> {large.regime})",
                  value=gain, unit="x",
                  labels=(f"matmul small {dtype}", f"matmul large {dtype}"))
    big = "matmul large float16" if "float16" in dtypes else f"matmul large {dtypes[-1]}"
    _claims(r, placed, big)


# Short names for the plot: the float32 and tf32 matmuls at 256^3 become "256 f32/tf32".
SHORT_DTYPES = {"float64": "f64", "float32": "f32", "tf32": "tf32", "float16": "f16",
                "bfloat16": "bf16"}


def _spot_name(group: list) -> str:
    first = group[0]
    if not first["kernel"].startswith("matmul"):
        return first["kernel"]
    dtypes = "/".join(SHORT_DTYPES.get(row["dtype"], row["dtype"]) for row in group)
    return f"{str(first['shape']).split('x')[0]} {dtypes}"


@run.plot
def plot(result: Any, ax: Any) -> None:
    rows = result.rows
    if not rows:
        return
    copy_gbps = rows[0]["copy_gbps"]
    lo = min(row["intensity"] for row in rows) / 4
    hi = max(row["intensity"] for row in rows) * 4
    xs = np.logspace(math.log10(lo), math.log10(hi), 200)
    peaks = {}
    for row in rows:
        peaks.setdefault(row["dtype"], row["peak_tflops"])
    colors = {}
    for dtype, peak in peaks.items():
        roof = np.minimum(peak, xs * copy_gbps / 1e3)
        (line,) = ax.plot(xs, roof, linewidth=1, label=f"{dtype} roof ({peak:.0f} TFLOP/s)")
        colors[dtype] = line.get_color()
    markers = {"overhead-bound": "x", "memory-bound": "o", "compute-bound": "^"}
    for regime, marker in markers.items():
        pts = [row for row in rows if row["regime"] == regime]
        ax.scatter([row["intensity"] for row in pts], [row["tflops"] for row in pts],
                   marker=marker, c=[colors[row["dtype"]] for row in pts], label=regime)
    # One label per spot: matmuls of one size and intensity (float32 and tf32,
    # float16 and bfloat16) share it, listing their dtypes.
    spots: dict[tuple, list] = {}
    for row in rows:
        key = ((row["shape"], row["intensity"]) if row["kernel"].startswith("matmul")
               else (row["kernel"],))
        spots.setdefault(key, []).append(row)
    for group in spots.values():
        top = max(group, key=lambda row: row["tflops"])
        ax.annotate(_spot_name(group), (top["intensity"], top["tflops"]), fontsize=6,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte); matmuls named by n (n^3) and dtype")
    ax.set_ylabel("achieved (TFLOP/s)")
    ax.legend(fontsize=6)
