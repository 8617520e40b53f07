"""Benchmark: square matmul through cudalab (cuBLASLt / cuBLAS) beside torch.mm.

For each of float64, float32 ("highest": true fp32), TF32 (float32 with
precision "high"; torch.backends.cuda.matmul.allow_tf32 = True for torch's
row), float16 and bfloat16: an n x n x n product (n = 8192, quick: 2048) on
random normal data (never zeros: zero operands run faster on tensor cores),
each implementation writing into a preallocated output so that only the GEMM
is timed. Times come from `cudalab.bench.measure` with the same settings for
every implementation (benchlib.measure_settings: a 0.25 s warm-up, so the
power-capped clock has settled before timing starts, and repeats back to back
so the GPU never idles and cools between them), one right after the other on
the same operand values (a GEMM's power draw, and so its clock, depends on its
data). TFLOP/s = 2 n^3 / median time.

Module API for the benchmark driver: run(quick: bool) -> list[dict]. Each dict:
{"op": "matmul", "impl": "cudalab" | "torch", "shape": (m, n, k), "dtype": ...,
 "precision": "highest" | "high" | None, "median_ms", "iqr_ms", "tflops", "flops"}
(plus the rest of benchlib.row's keys) and, on cudalab rows when torch ran,
"vs_torch" (TFLOP/s ratio). With
CUDALAB_BENCH_MATMUL_BACKENDS=1 each dtype also gets a "cudalab[lt]" or
"cudalab[cublas]" row: the backend that is not the dtype's default (cuBLASLt
for all but float64), to choose between them on a new GPU. torch is optional
(its rows are skipped without it), a GPU is not. Run as a script to print the
table: python benchmarks/bench_matmul.py [--quick]
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, measure_settings, require_gpu, row, torch_cuda  # noqa: E402

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


def _host_operand(rng, n, dtype):
    # float32 normals are generated fast; the cast gives every dtype its values.
    return rng.standard_normal(size=(n, n), dtype=np.float32).astype(dtype)


def _torch_dtypes(torch) -> dict:
    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}


def _case(cudalab, torch, settings: dict, rng, n: int, label: str, dtype_name: str,
          precision: str | None) -> list[dict]:
    """Rows of one dtype: cudalab (and the other backend, and torch) one after the other."""
    from cudalab.bench import measure

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

        def other_fn():
            cudalab._core._set_matmul_backend(dtype, other)
            try:
                ours_fn()
            finally:
                cudalab._core._set_matmul_backend(dtype, default)

        impls[f"cudalab[{other}]"] = other_fn
    if torch is not None:
        # The same values as ours (data changes a GEMM's power draw and
        # so its clock), copied bit for bit through a same-size int view.
        tdt = _torch_dtypes(torch)[dtype_name]
        ints = {2: np.int16, 4: np.int32, 8: np.int64}[dtype.itemsize]
        ta = torch.from_numpy(a_host.view(ints)).cuda().view(tdt)
        tb = torch.from_numpy(b_host.view(ints)).cuda().view(tdt)
        tc = torch.empty(n, n, device="cuda", dtype=tdt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cuda.matmul.allow_tf32 = precision == "high"
        impls["torch"] = lambda: torch.mm(ta, tb, out=tc)
    del a_host, b_host

    # One after the other, each with the full warm-up, so every one is
    # timed at the clock the GPU sustains under this GEMM.
    rows = {}
    for impl, fn in impls.items():
        m = measure(fn, flops=2 * n * n * n, ceiling=None, label="matmul", sub_label=label,
                    description=impl, metadata={"precision": precision}, **settings)
        rows[impl] = row(m, (n, n, n), label, precision=precision)
    if "torch" in rows:
        for impl, r in rows.items():
            if impl != "torch":
                r["vs_torch"] = r["tflops"] / rows["torch"]["tflops"]
    return list(rows.values())


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_matmul")
    import cudalab

    torch = torch_cuda()
    settings = measure_settings(quick)
    n = 2048 if quick else 8192
    rng = np.random.default_rng(0)
    results: list[dict] = []
    tf32_saved = torch.backends.cuda.matmul.allow_tf32 if torch is not None else None
    try:
        for label, dtype_name, precision in CASES:
            results += _case(cudalab, torch, settings, rng, n, label, dtype_name, precision)
            cudalab.synchronize()
            cudalab.empty_cache()
            if torch is not None:
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
            + (f"  ({r['warning']})" if r.get("warning") else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(run, table))
