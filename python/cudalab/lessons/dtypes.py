"""Lesson 2 `dtypes`: what a matmul's dtype buys in speed and costs in accuracy.

The same n x n product in float64, float32, TF32 (float32 storage, tensor-core
math with a 10-bit mantissa), float16 and bfloat16: TFLOP/s, the fraction of
the datasheet peak and of the measured ceiling, and the error against a
float64 NumPy product of the same inputs. Which dtype is fast depends on the
GPU: consumer and inference parts run float64 at 1/32 or 1/64 of float32,
while A100 and H100 have FP64 tensor cores that run it about as fast as (or
faster than) float32. The lesson says which from its own numbers.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

import cudalab
from cudalab import _precision

from .analysis import claim_at_least
from ._measuring import rel_error
from . import _params as P
from .registry import LessonRun, lesson

# fp64 at this fraction of the fp32 rate or more: full-rate fp64 (FP64 tensor
# cores on cc 8.0/9.0, half-rate units on V100); consumer parts sit at 1/32-1/64.
FP64_LIKE_FP32 = 0.5
# Within these bounds of fp32's rate, fp64 is "about as fast"; above, "faster"
# (timing noise is a few percent, DMMA on H100 beats FMA fp32 by ~20%).
FP64_ABOUT_LOW, FP64_ABOUT_HIGH = 0.8, 1.1
# Storage bytes per element, and the key of each dtype in peak_flops.
ITEMSIZE = {"float64": 8, "float32": 4, "tf32": 4, "float16": 2, "bfloat16": 2}
PEAK_KEY = {"tf32": "tfloat32"}
# Largest relative error (max |C - ref| / max |ref|) a correct product of
# random normal inputs stays under: a few units of the dtype's rounding
# (inputs and output rounded; tf32 rounds inputs to 10 mantissa bits).
TOLERANCE = {"float64": 1e-12, "float32": 1e-4, "tf32": 1e-2, "float16": 1e-2,
             "bfloat16": 5e-2}
# The tutorial's T4 figures at 2048 (times include generating the inputs):
# float32 15.63x float64, float16 62.09x float64; and its "16x cliff"
# (312 vs 19.5 TFLOP/s) for float16 tensor cores over float32.
TUTORIAL_FP32_OVER_FP64 = 15.63
TUTORIAL_FP16_OVER_FP64 = 62.09
TUTORIAL_FP16_OVER_FP32 = 16.0
# Those 312 and 19.5 TFLOP/s are an A100's datasheet figures (dense float16
# tensor cores, float32 CUDA cores), not the T4's the tutorial ran on (65 and
# 8.1 TFLOP/s: 8x, not 16x).
QUOTED_FP16_TFLOPS, QUOTED_FP32_TFLOPS = 312.0, 19.5
T4_FP16_TFLOPS, T4_FP32_TFLOPS = 65.0, 8.1


def storage(dtype: str) -> str:
    """storage(dtype) -> str: the array dtype (float32 for tf32)."""
    return _precision.storage(dtype)


def fp64_verdict(ratio: float, capability: tuple[int, int]) -> tuple[bool, str]:
    """fp64_verdict(ratio, capability) -> (full_rate, text)

    What the fp64 / fp32 rate ratio says about the GPU's fp64 units.
    """
    if ratio >= FP64_LIKE_FP32:
        units = ("FP64 tensor cores (DMMA)" if tuple(capability) in ((8, 0), (9, 0))
                 else "full-rate fp64 units")
        speed = ("faster than" if ratio > FP64_ABOUT_HIGH else
                 "about as fast as" if ratio >= FP64_ABOUT_LOW else "at a good fraction of")
        return True, (f"float64 runs {speed} float32 ({ratio:.2f}x its rate): this GPU "
                      f"(cc {capability[0]}.{capability[1]}) has {units}, so float64 costs "
                      f"memory, not speed")
    return False, (f"float64 runs at 1/{1 / ratio:.0f} of the float32 rate: this GPU "
                   f"(cc {capability[0]}.{capability[1]}) has few fp64 units; use float32 "
                   f"unless the precision is needed")


def quoted_peaks_text(peak16: float | None, peak32: float | None, rate16: float,
                      rate32: float) -> str:
    """quoted_peaks_text(peak16, peak32, rate16, rate32) -> str

    The tutorial's 312 / 19.5 TFLOP/s placed beside the T4's datasheet, this
    GPU's datasheet (TFLOP/s, None when unknown) and this run's float16 and
    true-float32 matmul rates.
    """
    sheet = (f"this GPU's datasheet: {peak16:.0f} / {peak32:.1f} ({peak16 / peak32:.0f}x)"
             if peak16 and peak32 else "this GPU's datasheet figures are not known to cudalab")
    return (f"The tutorial's {QUOTED_FP16_TFLOPS:.0f} vs {QUOTED_FP32_TFLOPS} TFLOP/s "
            f"({QUOTED_FP16_TFLOPS / QUOTED_FP32_TFLOPS:.0f}x) are an A100's datasheet figures "
            f"(dense float16 tensor / float32), not the T4's it ran on ({T4_FP16_TFLOPS:.0f} / "
            f"{T4_FP32_TFLOPS}, {T4_FP16_TFLOPS / T4_FP32_TFLOPS:.0f}x); {sheet}; measured "
            f"here: {rate16:.1f} / {rate32:.1f} TFLOP/s ({rate16 / rate32:.1f}x)")


def _set_precision(dtype: str) -> None:
    if storage(dtype) == "float32":
        cudalab.set_float32_matmul_precision(_precision.matmul_precision(dtype))


def _ceiling(r: LessonRun, dtype: str) -> str | None:
    """The measured GEMM ceiling to place `dtype` against; none in quick mode, where
    measuring five 8192^3 ceilings would take most of a minute (the datasheet peak
    column stays)."""
    return None if r.quick else f"matmul_{dtype}"


def _torch_matmul(r: LessonRun, torch: Any, dtype: str, a: Any, b: Any, flops: float) -> Any:
    ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
    tout = torch.empty_like(ta)
    with _precision.TorchTf32(torch, _precision.resolve(dtype).torch_allow_tf32):
        return r.measure(f"torch matmul {dtype}", lambda: torch.mm(ta, tb, out=tout),
                         flops=flops, ceiling=_ceiling(r, dtype))


def _one_dtype(r: LessonRun, dtype: str, a64: Any, b64: Any, ref: np.ndarray, peaks: dict,
               torch: Any) -> list[dict[str, Any]]:
    n, k = a64.shape[0], ref.shape[0]
    flops = 2.0 * n ** 3
    a, b = a64.astype(storage(dtype)), b64.astype(storage(dtype))
    out = cudalab.empty((n, n), dtype=storage(dtype))
    r.check(f"{dtype} stores {ITEMSIZE[dtype]} bytes per element",
            abs(a.nbytes - n * n * ITEMSIZE[dtype]), 0)
    _set_precision(dtype)
    m = r.measure(f"matmul {dtype}", lambda: cudalab.matmul(a, b, out=out), flops=flops,
                  ceiling=_ceiling(r, dtype), metadata={"n": n, "dtype": dtype})
    cudalab.matmul(a, b, out=out)
    err = rel_error(out[:k].astype("float64").get(), ref)
    r.check(f"{dtype} matmul vs NumPy float64 (first {k} rows, max |err| / max |ref|)", err,
            TOLERANCE[dtype])
    peak = peaks.get(PEAK_KEY.get(dtype, dtype))
    rows = [{"impl": "cudalab", "dtype": dtype, "bytes_per_element": ITEMSIZE[dtype],
             "ms": m.median * 1e3, "tflops": m.tflops,
             "pct_peak": None if not peak else 100.0 * m.tflops * 1e12 / peak,
             "pct_ceiling": m.percent_of_ceiling, "rel_err": err}]
    if torch is not None:
        t = _torch_matmul(r, torch, dtype, a, b, flops)
        rows.append({**rows[0], "impl": "torch", "ms": t.median * 1e3, "tflops": t.tflops,
                     "pct_peak": None if not peak else 100.0 * t.tflops * 1e12 / peak,
                     "pct_ceiling": t.percent_of_ceiling, "rel_err": None})
    return rows


def _findings(r: LessonRun, rate: dict[str, float], err: dict[str, float],
              capability: tuple[int, int],
              peaks: Mapping[str, float | None] | None = None) -> None:
    if "float64" in rate and "float32" in rate:
        ratio = rate["float64"] / rate["float32"]
        _, text = fp64_verdict(ratio, capability)
        r.finding(text[0].upper() + text[1:], value=ratio, unit="x",
                  labels=("matmul float64", "matmul float32"))
    best = max(rate, key=rate.get)
    base = rate.get("float32")
    r.finding(f"The fastest dtype here is {best} at {rate[best]:.1f} TFLOP/s"
              + (f", {rate[best] / base:.1f}x true float32" if base else ""),
              value=rate[best], unit="TFLOP/s", labels=(f"matmul {best}",))
    if "tf32" in rate and base:
        r.finding(f"TF32 runs {rate['tf32'] / base:.1f}x true float32 on the same float32 arrays; "
                  f"its error grows from {err['float32']:.1e} to {err['tf32']:.1e} (10-bit "
                  f"mantissa inputs)", value=rate["tf32"] / base, unit="x",
                  labels=("matmul tf32", "matmul float32"))
    if "float16" in err and "bfloat16" in err:
        ratio = err["bfloat16"] / err["float16"]
        r.finding(f"bfloat16's error ({err['bfloat16']:.1e}) is {ratio:.1f}x "
                  f"float16's ({err['float16']:.1e}): 8 mantissa bits against 11, traded for "
                  f"float32's range", value=ratio, unit="x",
                  labels=("matmul bfloat16", "matmul float16"))
    if "float16" in rate and "float32" in rate:
        p16, p32 = (peaks or {}).get("float16"), (peaks or {}).get("float32")
        r.finding(quoted_peaks_text(p16 and p16 / 1e12, p32 and p32 / 1e12, rate["float16"],
                                    rate["float32"]),
                  value=rate["float16"] / rate["float32"], unit="x",
                  labels=("matmul float16", "matmul float32"))


def _claims(r: LessonRun, rate: dict[str, float]) -> None:
    for fast, slow, tutorial, text in (
            ("float32", "float64", TUTORIAL_FP32_OVER_FP64,
             "float32 matmul is ~15.6x faster than float64 (T4, n=2048)"),
            ("float16", "float64", TUTORIAL_FP16_OVER_FP64,
             "float16 matmul is ~62x faster than float64 (T4, n=2048)"),
            ("float16", "float32", TUTORIAL_FP16_OVER_FP32,
             "float16 tensor cores are a ~16x cliff over float32 (312 vs 19.5 TFLOP/s)")):
        if fast in rate and slow in rate:
            x = rate[fast] / rate[slow]
            claim_at_least(r, text, tutorial, x, "x", f"{fast} at {x:.1f}x {slow} here")


def check_params(p: Mapping[str, Any]) -> None:
    """ValueError on a parameter the lesson cannot run with (checked before any GPU work)."""
    P.ints("dtypes", p, "size", "ref_rows")
    P.among("dtypes", p, "dtypes", ITEMSIZE)


@lesson(2, "dtypes", title="Matmul speed and accuracy per dtype",
        seed="Colab notebook lesson 2 (data type optimization, tensor cores)",
        params={"size": 8192, "ref_rows": 64,
                "dtypes": ("float64", "float32", "tf32", "float16", "bfloat16")},
        quick_params={"size": 2048},
        check=check_params)
def run(r: LessonRun) -> None:
    p = r.params
    n = int(p["size"])
    k = min(int(p["ref_rows"]), n)
    a64 = cudalab.random.normal((n, n), dtype="float64", seed=1)  # never zeros
    b64 = cudalab.random.normal((n, n), dtype="float64", seed=2)
    ref = a64[:k].get() @ b64.get()
    props = cudalab.get_device_properties()
    torch = r.torch()
    previous = cudalab.get_float32_matmul_precision()
    rows = []
    try:
        for dtype in p["dtypes"]:
            rows += _one_dtype(r, dtype, a64, b64, ref, props.peak_flops, torch)
    finally:
        cudalab.set_float32_matmul_precision(previous)
    for row in rows:
        r.row(**row)
    ours = [x for x in rows if x["impl"] == "cudalab"]
    _findings(r, {x["dtype"]: x["tflops"] for x in ours}, {x["dtype"]: x["rel_err"] for x in ours},
              props.compute_capability, props.peak_flops)
    _claims(r, {x["dtype"]: x["tflops"] for x in ours})


@run.plot
def plot(result, ax) -> None:
    dtypes = [x["dtype"] for x in result.rows if x["impl"] == "cudalab"]
    impls = [i for i in ("cudalab", "torch") if any(x["impl"] == i for x in result.rows)]
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        rate = {x["dtype"]: x["tflops"] for x in result.rows if x["impl"] == impl}
        ax.bar([i + j * width for i in range(len(dtypes))], [rate.get(d, 0.0) for d in dtypes],
               width=width, label=impl)
    errors = {x["dtype"]: x["rel_err"] for x in result.rows if x["impl"] == "cudalab"}
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(dtypes))])
    ax.set_xticklabels([f"{d}\nerr {errors[d]:.0e}" for d in dtypes], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("matmul TFLOP/s")
    ax.legend(fontsize=8)
