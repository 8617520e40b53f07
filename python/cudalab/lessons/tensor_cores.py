"""Lesson 6 `tensor_cores`: matrix sizes that keep the tensor cores fed.

Tensor-core GEMM kernels load their tiles 16 bytes at a time, so cuBLAS
picks them only when every matrix's rows start on a 16-byte boundary: the
contiguous extents K (of A) and N (of B and C) must be multiples of 8 half
elements or 4 float32 (TF32) elements. One element more or less and it
falls back to kernels that load element by element: the same GEMM, a
fraction of the rate. The lesson sweeps sizes around powers of two (n-1, n,
n+1, the next multiple of 8) in float16, bfloat16 and TF32, with matmul's
padding off (the plain cuBLAS call, as torch.mm makes it) and on (the
operands copied into zero-padded buffers with K and N rounded up, the
aligned GEMM, the valid part copied back), beside torch.mm where PyTorch
is installed.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

import numpy as np

import cudalab
from .. import _precision
from ..bench import MatmulCase
from .registry import LessonRun, lesson

# A misaligned size counts as a cliff when the aligned sizes run this many
# times faster (timing noise and the small size differences stay well below).
CLIFF_SEEN = 1.5
# Padding "removes" the cliff when misaligned sizes reach this fraction of
# the aligned rate: the copies cost O(n^2) against the GEMM's O(n^3).
PADDING_RECOVERS = 0.7
# The tutorial: misaligned sizes fall back to CUDA cores, "a 16x penalty".
TUTORIAL_PENALTY = 16.0
# The claim holds when the cliff measured here is within 2x of that figure.
CLAIM_PENALTY_HOLDS = TUTORIAL_PENALTY / 2
# The tutorial's mechanism: misaligned sizes "fall back to CUDA cores". True
# float32 (cuBLAS COMPUTE_32F, no TF32: matmul precision "highest") runs on
# the CUDA cores only; a misaligned tensor-core dtype faster than that rate
# (or the datasheet fp32 peak) cannot be running on CUDA cores.
SIMT_LABEL = "matmul float32 highest (CUDA cores) n={}"
# The tutorial's T4 figure: float16 2048^3 torch.mm at 18.70 TFLOP/s.
TUTORIAL_T4_TFLOPS_2048 = 18.70
# The result vs float64 NumPy on a block of rows of the smallest size.
CHECK_ROWS = 128
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "tf32": 5e-3}

# Storage dtype, its bytes and matmul's precision for each swept dtype (the
# storage and precision from the one table, cudalab._precision).
STORAGE = {d: _precision.storage(d) for d in ("float16", "bfloat16", "tf32")}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "tf32": 4}
PRECISION = {d: _precision.matmul_precision(d) for d in STORAGE}
ALIGN_BYTES = 16
DTYPES = tuple(STORAGE)


def elements_per_16_bytes(dtype: str) -> int:
    """How many elements of `dtype` (a swept name: tf32 is 4 bytes) fill 16 bytes."""
    return ALIGN_BYTES // ITEMSIZE[dtype]


def is_aligned(size: int, dtype: str) -> bool:
    """Whether an n x n x n product in `dtype` has 16-byte aligned rows."""
    return size % elements_per_16_bytes(dtype) == 0


def check_params(sizes: Any, dtypes: Any) -> None:
    """ValueError unless sizes are ints >= 16 and dtypes are swept names."""
    if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 16
                            for s in sizes):
        raise ValueError(f"tensor_cores: sizes must be ints >= 16, got {sizes!r}")
    bad = [d for d in dtypes if d not in STORAGE]
    if not dtypes or bad:
        raise ValueError(f"tensor_cores: dtypes must be among {DTYPES}, got {dtypes!r}")


def summarize(rates: Mapping[tuple[int, str], float], dtype: str) -> dict[str, float] | None:
    """The cliff and what padding recovers, for one dtype.

    Parameters
    ----------
    rates : mapping
        ``(size, mode) -> TFLOP/s`` with mode ``"off"`` or ``"on"`` (padding).
    dtype : str

    Returns
    -------
    dict or None
        aligned (median TFLOP/s of aligned sizes, padding off), misaligned_off,
        misaligned_on, cliff (aligned / misaligned_off), recovered
        (misaligned_on / aligned), gain (misaligned_on / misaligned_off);
        None without both an aligned and a misaligned size.
    """
    sizes = sorted({s for s, _ in rates})
    aligned = [rates[s, "off"] for s in sizes if is_aligned(s, dtype) and (s, "off") in rates]
    off = [rates[s, "off"] for s in sizes if not is_aligned(s, dtype) and (s, "off") in rates]
    on = [rates[s, "on"] for s in sizes if not is_aligned(s, dtype) and (s, "on") in rates]
    if not aligned or not off or not on:
        return None
    a, mo, mn = statistics.median(aligned), statistics.median(off), statistics.median(on)
    return {"aligned": a, "misaligned_off": mo, "misaligned_on": mn,
            "cliff": a / mo if mo > 0 else float("inf"),
            "recovered": mn / a if a > 0 else 0.0,
            "gain": mn / mo if mo > 0 else float("inf")}


def cliff_text(dtype: str, s: Mapping[str, float]) -> str:
    """The finding on misaligned sizes without padding."""
    if s["cliff"] >= CLIFF_SEEN:
        return (f"{dtype}: misaligned sizes run at {s['misaligned_off']:.1f} TFLOP/s without "
                f"padding vs {s['aligned']:.1f} aligned: a {s['cliff']:.1f}x cliff "
                f"(cuBLAS leaves its 16-byte tensor-core kernels)")
    return (f"{dtype}: no cliff: misaligned sizes run at {s['misaligned_off']:.1f} TFLOP/s "
            f"without padding vs {s['aligned']:.1f} aligned ({s['cliff']:.2f}x)")


def padding_text(dtype: str, s: Mapping[str, float]) -> str:
    """The finding on misaligned sizes with padding."""
    pct = 100 * s["recovered"]
    if s["recovered"] >= PADDING_RECOVERS:
        return (f"{dtype}: padding removes the cliff: misaligned sizes reach "
                f"{s['misaligned_on']:.1f} TFLOP/s, {pct:.0f}% of the aligned rate "
                f"({s['gain']:.1f}x unpadded)")
    return (f"{dtype}: padding recovers only {pct:.0f}% of the aligned rate "
            f"({s['misaligned_on']:.1f} TFLOP/s, {s['gain']:.2f}x unpadded): the copies "
            f"cost too much at these sizes")


def simt_size(sizes: list[int]) -> int:
    """The size to measure the CUDA-core float32 rate at: the largest of `sizes`
    aligned for float32 (its best case), else the largest."""
    aligned = [s for s in sizes if s % elements_per_16_bytes("tf32") == 0]
    return max(aligned or sizes)


def cuda_core_verdict(dtype: str, misaligned: float, simt: float,
                      datasheet: float | None) -> tuple[bool, str]:
    """cuda_core_verdict(dtype, misaligned, simt, datasheet) -> (beyond, text)

    Whether the misaligned rate of `dtype` (TFLOP/s, padding off) exceeds what
    CUDA cores can do: the measured true-float32 rate `simt` and the datasheet
    float32 peak `datasheet` (TFLOP/s, None when unknown), whichever is higher.
    """
    bound = max(simt, datasheet or 0.0)
    sheet = "" if datasheet is None else f", datasheet peak {datasheet:.1f}"
    if misaligned > bound:
        return True, (f"{dtype}: misaligned sizes run at {misaligned:.1f} TFLOP/s unpadded, "
                      f"{misaligned / bound:.1f}x the most the CUDA cores can do (true float32 "
                      f"{simt:.1f} TFLOP/s measured{sheet}): the fallback kernels still run on "
                      f"the tensor cores (with narrower loads), so the tutorial's mechanism is "
                      f"wrong, not only its factor")
    return False, (f"{dtype}: misaligned sizes run at {misaligned:.1f} TFLOP/s unpadded, within "
                   f"what CUDA cores can do (true float32 {simt:.1f} TFLOP/s measured{sheet}): "
                   f"the rate alone cannot tell which units ran them")


def claim_verdict(cliff: float) -> tuple[bool, str]:
    """Whether the tutorial's 16x penalty holds for a measured cliff."""
    held = cliff >= CLAIM_PENALTY_HOLDS
    why = (f"a {cliff:.1f}x cliff here, within 2x of 16x" if held
           else f"a {cliff:.1f}x cliff here: cuBLAS keeps part of its speed on misaligned sizes")
    return held, why


def _label(impl: str, dtype: str, size: int, mode: str | None) -> str:
    if impl == "torch":
        return f"torch.mm {dtype} n={size}"
    return f"matmul {dtype} n={size} pad={mode}"


def _check(r: LessonRun, a: Any, b: Any, dtype: str, size: int) -> None:
    """Both modes' results vs float64 NumPy on the first CHECK_ROWS rows."""
    rows = min(size, CHECK_ROWS)
    ah = a[:rows].get().astype(np.float64)
    bh = b.get().astype(np.float64)
    ref = ah @ bh
    for mode, pad in (("off", False), ("on", True)):
        got = cudalab.matmul(a[:rows], b, precision=PRECISION[dtype], pad=pad)
        err = float(np.linalg.norm(got.get().astype(np.float64) - ref) / np.linalg.norm(ref))
        r.check(f"{dtype} n={size} padding {mode} vs float64 NumPy (relative L2, {rows} rows)",
                err, TOLERANCE[dtype])


def _sweep_dtype(r: LessonRun, dtype: str, sizes: list[int], torch: Any) -> dict:
    """Measure every size with padding off and on (and torch.mm); rows; rates."""
    rates: dict[tuple[int, str], float] = {}
    ceiling = f"matmul_{dtype}"
    for size in sizes:
        a = cudalab.random.normal((size, size), dtype=STORAGE[dtype], seed=size)
        b = cudalab.random.normal((size, size), dtype=STORAGE[dtype], seed=size + 1)
        out = cudalab.empty((size, size), dtype=STORAGE[dtype])
        if size == sizes[0]:
            _check(r, a, b, dtype, size)
        impls = [("cudalab", "off"), ("cudalab", "on")] + ([("torch", None)] if torch else [])
        for impl, mode in impls:
            label = _label(impl, dtype, size, mode)
            if impl == "torch":
                # The bench case's torch.mm twin: same size, dtype and TF32 setting.
                twin = MatmulCase(dtype, size).prepare().torch_twin(torch)
                m = r.add(twin.measure(r.timer, label=label, description="torch",
                                       ceiling=ceiling), label)
            else:
                def fn(pad=mode == "on"):
                    return cudalab.matmul(a, b, out=out, precision=PRECISION[dtype], pad=pad)
                m = r.measure(label, fn, flops=2 * size**3, ceiling=ceiling)
            if impl == "cudalab":
                rates[size, mode] = m.tflops
            pct = m.percent_of_ceiling
            r.row(dtype=dtype, size=size, aligned=is_aligned(size, dtype), impl=impl,
                  pad=mode, ms=m.median * 1e3, tflops=m.tflops,
                  pct_ceiling=None if pct is None else round(pct, 1))
    return rates


def _findings(r: LessonRun, dtype: str, sizes: list[int], rates: dict, torch: Any) -> float | None:
    s = summarize(rates, dtype)
    if s is None:
        return None
    al = [sz for sz in sizes if is_aligned(sz, dtype)]
    mis = [sz for sz in sizes if not is_aligned(sz, dtype)]
    off_labels = tuple(_label("cudalab", dtype, sz, "off") for sz in al + mis)
    on_labels = tuple(_label("cudalab", dtype, sz, "on") for sz in mis)
    best = max((_label("cudalab", dtype, sz, "off") for sz in al),
               key=lambda k: r.measurements[k].tflops)
    pct = r.measurements[best].percent_of_ceiling
    if pct is not None:
        r.finding(f"{dtype}: the best aligned size reaches {pct:.0f}% of this GPU's measured "
                  f"{dtype} matmul ceiling", value=pct, unit="% of ceiling", labels=(best,))
    r.finding(cliff_text(dtype, s), value=s["cliff"], unit="x", labels=off_labels)
    r.finding(padding_text(dtype, s), value=100 * s["recovered"], unit="% of aligned",
              labels=off_labels + on_labels)
    if torch is not None:
        t_labels = tuple(_label("torch", dtype, sz, None) for sz in mis)
        t_mis = statistics.median(r.measurements[k].tflops for k in t_labels)
        ratio = s["misaligned_on"] / t_mis if t_mis > 0 else float("inf")
        r.finding(f"{dtype}: at misaligned sizes padded matmul runs at {ratio:.1f}x torch.mm "
                  f"({s['misaligned_on']:.1f} vs {t_mis:.1f} TFLOP/s)", value=ratio, unit="x",
                  labels=on_labels + t_labels)
    return s["cliff"]


def _cuda_cores(r: LessonRun, sizes: list[int]) -> tuple[float, float | None]:
    """The true-float32 GEMM rate (CUDA cores) at `simt_size`, and the datasheet peak."""
    n = simt_size(sizes)
    a = cudalab.random.normal((n, n), dtype="float32", seed=n + 2)
    b = cudalab.random.normal((n, n), dtype="float32", seed=n + 3)
    out = cudalab.empty((n, n), dtype="float32")
    rows = min(n, CHECK_ROWS)
    got = cudalab.matmul(a[:rows], b, precision="highest").get().astype(np.float64)
    ref = a[:rows].get().astype(np.float64) @ b.get().astype(np.float64)
    r.check(f"float32 highest n={n} vs float64 NumPy (relative L2, {rows} rows)",
            float(np.linalg.norm(got - ref) / np.linalg.norm(ref)), TOLERANCE["tf32"] / 10)
    m = r.measure(SIMT_LABEL.format(n), lambda: cudalab.matmul(a, b, out=out,
                                                                precision="highest"),
                  flops=2 * n**3)
    r.row(dtype="float32 (CUDA cores)", size=n, aligned=True, impl="cudalab", pad="off",
          ms=m.median * 1e3, tflops=m.tflops, pct_ceiling=None)
    peak = cudalab.get_device_properties().peak_flops.get("float32")
    return m.tflops, None if not peak else peak / 1e12


def _mechanism(r: LessonRun, sizes: list[int], dtypes: list[str], rates: dict) -> None:
    """Findings and the claim on what runs misaligned sizes (tensor or CUDA cores)."""
    simt, datasheet = _cuda_cores(r, sizes)
    n = simt_size(sizes)
    verdicts = {}
    for dtype in dtypes:
        s = summarize(rates[dtype], dtype)
        if s is None:
            continue
        beyond, text = cuda_core_verdict(dtype, s["misaligned_off"], simt, datasheet)
        verdicts[dtype] = beyond, text
        mis = tuple(_label("cudalab", dtype, sz, "off") for sz in sizes
                    if not is_aligned(sz, dtype))
        r.finding(text, value=s["misaligned_off"] / max(simt, datasheet or 0.0),
                  unit="x CUDA-core rate", labels=mis + (SIMT_LABEL.format(n),))
    if verdicts:
        dtype = "float16" if "float16" in verdicts else next(iter(verdicts))
        beyond, text = verdicts[dtype]
        r.claim("misaligned dimensions fall back to CUDA cores (the mechanism, whatever the "
                "factor)", tutorial=None, measured=summarize(rates[dtype], dtype)["misaligned_off"],
                unit="TFLOP/s", held=not beyond, why=text)


def _torch_twin(label: str) -> str | None:
    """torch.mm's twin is the same cuBLAS product unpadded (padding is cudalab's own)."""
    prefix = "torch.mm "
    return f"matmul {label[len(prefix):]} pad=off" if label.startswith(prefix) else None


def _check_run_params(p: Mapping[str, Any]) -> None:
    """`check_params` on a run's parameters (checked before any GPU work)."""
    check_params(list(p["sizes"]), list(p["dtypes"]))


@lesson(6, "tensor_cores", title="Tensor cores: dimension alignment and padding",
        seed="Colab notebook lesson 6: tensor core optimization (float16, dimensions "
             "divisible by 8/16)",
        params={"sizes": (4095, 4096, 4097, 4104, 8191), "dtypes": DTYPES},
        quick_params={"sizes": (1023, 1024, 1025, 1032), "dtypes": ("float16", "tf32")},
        torch_twin=_torch_twin,
        check=_check_run_params)
def run(r: LessonRun) -> None:
    sizes, dtypes = list(r.params["sizes"]), list(r.params["dtypes"])
    check_params(sizes, dtypes)
    torch = r.torch()
    cliffs: dict[str, float] = {}
    all_rates = {}
    for dtype in dtypes:
        all_rates[dtype] = rates = _sweep_dtype(r, dtype, sizes, torch)
        cliff = _findings(r, dtype, sizes, rates, torch)
        if cliff is not None:
            cliffs[dtype] = cliff
    _mechanism(r, sizes, dtypes, all_rates)
    if "float16" in cliffs:
        held, why = claim_verdict(cliffs["float16"])
        r.claim("misaligned float16 dimensions fall back to CUDA cores: a 16x penalty",
                tutorial=TUTORIAL_PENALTY, measured=cliffs["float16"], unit="x", held=held,
                why=why)
    f16_aligned = [sz for sz in sizes if "float16" in dtypes and is_aligned(sz, "float16")]
    if f16_aligned:
        best = max(r.measurements[_label("cudalab", "float16", sz, "off")].tflops
                   for sz in f16_aligned)
        r.claim("float16 with aligned dimensions runs a 2048^3 matmul at 18.70 TFLOP/s (T4)",
                tutorial=TUTORIAL_T4_TFLOPS_2048, measured=best, unit="TFLOP/s",
                held=best >= TUTORIAL_T4_TFLOPS_2048,
                why=f"best aligned float16 rate here {best:.1f} TFLOP/s at sizes {f16_aligned}")


@run.plot
def plot(result: Any, ax: Any) -> None:
    styles = {("cudalab", "off"): "--", ("cudalab", "on"): "-", ("torch", None): ":"}
    names = {("cudalab", "off"): "padding off", ("cudalab", "on"): "padding on",
             ("torch", None): "torch.mm"}
    # Sizes side by side, evenly spaced: on a linear n axis 4095..4104 would
    # stack into one column beside 8191.
    sizes = sorted({row["size"] for row in result.rows})
    # The swept dtypes' rows say which sizes are aligned (the float32 row is 4-aligned).
    aligned = {row["size"]: row["aligned"] for row in result.rows if row["dtype"] in DTYPES}
    for i, dtype in enumerate(dict.fromkeys(row["dtype"] for row in result.rows)):
        for key, style in styles.items():
            pts = sorted((row["size"], row["tflops"]) for row in result.rows
                         if row["dtype"] == dtype and (row["impl"], row.get("pad")) == key)
            if pts:
                ax.plot([sizes.index(p[0]) for p in pts], [p[1] for p in pts], style,
                        marker="o", color=f"C{i}", label=f"{dtype} {names[key]}")
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([f"{n}\n{'aligned' if aligned[n] else 'misaligned'}" for n in sizes],
                       fontsize=8)
    ax.set_xlabel("n (n x n x n product)")
    ax.set_ylabel("TFLOP/s")
    # Below the axes: every height of the plot holds data.
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))
