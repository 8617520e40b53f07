"""Benchmark: square matmul through cudalab (cuBLASLt / cuBLAS) beside torch.mm.

For each of float64, float32 ("highest": true fp32), TF32 (float32 with
precision "high"; torch.backends.cuda.matmul.allow_tf32 = True for torch's
row), float16 and bfloat16: an n x n x n product (n = 8192, quick: 2048) on
random normal data (never zeros: zero operands run faster on tensor cores),
each implementation writing into a preallocated output so that only the GEMM
is timed. Timing: torch.cuda.Event pairs around every repeat, on the legacy
default stream that both libraries use, after warm-up; median and IQR of
>= 20 repeats. TFLOP/s = 2 n^3 / median time.

Module API for the benchmark driver: run(quick: bool) -> list[dict]. Each dict:
{"op": "matmul", "impl": "cudalab" | "torch", "shape": (m, n, k), "dtype": ...,
 "precision": "highest" | "high" | None, "median_ms", "iqr_ms", "tflops", "flops"}
and, on cudalab rows when torch ran, "vs_torch" (TFLOP/s ratio). With
CUDALAB_BENCH_MATMUL_BACKENDS=1 each dtype also gets a "cudalab[lt]" or
"cudalab[cublas]" row: the backend that is not the dtype's default (cuBLASLt
for all but float64), to choose between them on a new GPU. Run as a script
to print the table: python benchmarks/bench_matmul.py [--quick]
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
from timing import times_ms  # noqa: E402

# (label, numpy dtype name, float32 precision or None)
CASES = [
    ("float64", "float64", None),
    ("float32", "float32", "highest"),
    ("tf32", "float32", "high"),
    ("float16", "float16", None),
    ("bfloat16", "bfloat16", None),
]
TARGET_RATIO = 0.97


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _time(torch, fn, warmup: int, repeats: int) -> np.ndarray:
    """Per-repeat times in ms (CUDA events; the host clock without torch)."""
    return np.array(times_ms(fn, warmup, repeats), dtype=np.float64)


def _row(impl, n, label, precision, times_ms) -> dict:
    flops = 2 * n * n * n
    median = float(np.median(times_ms))
    q1, q3 = np.percentile(times_ms, [25, 75])
    return {
        "op": "matmul",
        "impl": impl,
        "shape": (n, n, n),
        "dtype": label,
        "precision": precision,
        "median_ms": median,
        "iqr_ms": float(q3 - q1),
        "tflops": flops / (median * 1e-3) / 1e12,
        "flops": flops,
        "repeats": int(times_ms.size),
    }


def _host_operand(rng, n, dtype):
    # float32 normals are generated fast; the cast gives every dtype its values.
    return rng.standard_normal(size=(n, n), dtype=np.float32).astype(dtype)


def run(quick: bool = False) -> list[dict]:
    import cudalab

    try:
        import torch

        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None

    n = 2048 if quick else 8192
    repeats = 20 if quick else 25
    warmup = 5 if quick else 3
    rng = np.random.default_rng(0)
    results: list[dict] = []
    tf32_saved = torch.backends.cuda.matmul.allow_tf32 if torch is not None else None
    torch_dtypes = {}
    if torch is not None:
        torch_dtypes = {
            "float64": torch.float64,
            "float32": torch.float32,
            "float16": torch.float16,
            "bfloat16": torch.bfloat16,
        }
    try:
        for label, dtype_name, precision in CASES:
            dtype = _np_dtype(dtype_name)
            a_host = _host_operand(rng, n, dtype)
            b_host = _host_operand(rng, n, dtype)
            a = cudalab.asarray(a_host)
            b = cudalab.asarray(b_host)
            c = cudalab.empty((n, n), dtype=dtype)

            def ours_fn():
                cudalab.matmul(a, b, out=c, precision=precision)

            impls = {"cudalab": ours_fn}
            if os.environ.get("CUDALAB_BENCH_MATMUL_BACKENDS", "") == "1":
                # The other backend too (cuBLASLt vs cublasGemmStridedBatchedEx).
                default = cudalab._core._set_matmul_backend(dtype, "lt")
                cudalab._core._set_matmul_backend(dtype, default)
                other = "cublas" if default == "lt" else "lt"

                def other_fn(other=other, default=default):
                    cudalab._core._set_matmul_backend(dtype, other)
                    try:
                        ours_fn()
                    finally:
                        cudalab._core._set_matmul_backend(dtype, default)

                impls[f"cudalab[{other}]"] = other_fn
            if torch is not None:
                # The same values as ours (data changes a GEMM's power draw and
                # so its clock), copied bit for bit through a same-size int view.
                tdt = torch_dtypes[dtype_name]
                ints = {2: np.int16, 4: np.int32, 8: np.int64}[dtype.itemsize]
                ta = torch.from_numpy(a_host.view(ints)).cuda().view(tdt)
                tb = torch.from_numpy(b_host.view(ints)).cuda().view(tdt)
                tc = torch.empty(n, n, device="cuda", dtype=tdt)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.backends.cuda.matmul.allow_tf32 = precision == "high"
                impls["torch"] = lambda: torch.mm(ta, tb, out=tc)
            del a_host, b_host

            # Interleave the implementations in rounds so clock and thermal
            # drift over the run hit every one of them alike.
            times = {name: [] for name in impls}
            rounds = 5
            for _ in range(rounds):
                for name, fn in impls.items():
                    times[name].append(_time(torch, fn, warmup, max(1, repeats // rounds)))
            rows = {name: _row(name, n, label, precision, np.concatenate(t))
                    for name, t in times.items()}
            if "torch" in rows:
                for name, row in rows.items():
                    if name != "torch":
                        row["vs_torch"] = row["tflops"] / rows["torch"]["tflops"]
            results += list(rows.values())
            del a, b, c
            if torch is not None:
                del ta, tb, tc
                torch.cuda.empty_cache()
    finally:
        if torch is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.backends.cuda.matmul.allow_tf32 = tf32_saved
    return results


def table(rows: list[dict]) -> str:
    lines = [
        f"{'dtype':<9} {'impl':<16} {'shape':<16} {'median ms':>10} {'IQR ms':>8} "
        f"{'TFLOP/s':>8} {'vs torch':>9}"
    ]
    for r in rows:
        ratio = r.get("vs_torch")
        mark = "" if ratio is None else f"{ratio:8.3f}" + (" " if ratio >= TARGET_RATIO else "!")
        lines.append(
            f"{r['dtype']:<9} {r['impl']:<16} {'x'.join(map(str, r['shape'])):<16} "
            f"{r['median_ms']:>10.3f} {r['iqr_ms']:>8.3f} {r['tflops']:>8.1f} {mark:>9}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(run(quick="--quick" in sys.argv[1:])))
