"""Benchmark: square matmul through cudalab (cuBLASLt / cuBLAS) beside torch.mm.

For each of float64, float32 ("highest": true fp32), TF32 (float32 with
precision "high"; torch.backends.cuda.matmul.allow_tf32 = True for torch's
row), float16 and bfloat16: the shared case `cudalab.bench.MatmulCase`, an
n x n x n product (n = 8192, quick: 2048) on random normal data generated on
the device (never zeros: zero operands run faster on tensor cores), each
implementation writing into a preallocated output so that only the GEMM is
timed. torch runs on the very same operands (DLPack views), so both GEMMs see
the same data (a GEMM's power draw, and so its clock, depends on it). Times
come from `cudalab.bench.measure` with the same preset for every
implementation (benchlib.preset: "sustained" warms up until the power-capped
clock has settled, and repeats run back to back so the GPU never idles and
cools between them), one right after the other. TFLOP/s = 2 n^3 / median time.

Module API for the benchmark driver: run(quick: bool) -> list[dict]. Each dict:
{"op": "matmul", "impl": "cudalab" | "torch", "variant": dtype, "shape": (m, n, k),
 "dtype": ..., "precision": "highest" | "high" | None, "median_ms", "iqr_ms",
 "tflops", "flops"} (plus the rest of benchlib.row's keys) and, on cudalab rows
when torch ran, "vs_torch" (TFLOP/s ratio). With
CUDALAB_BENCH_MATMUL_BACKENDS=1 each dtype also gets a "cudalab[lt]" or
"cudalab[cublas]" row: the backend that is not the dtype's default (cuBLASLt
for all but float64), to choose between them on a new GPU. torch is optional
(its rows are skipped without it), a GPU is not. Run as a script to print the
table: python benchmarks/bench_matmul.py [--quick]
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402

TARGET_RATIO = 0.97


def _other_backend(cudalab: Any, prepared: Any) -> tuple[str, Any]:
    """The backend that is not the dtype's default, and the same GEMM through it."""
    dtype = prepared.operands["a"].dtype
    default = cudalab._core._set_matmul_backend(dtype, "lt")
    cudalab._core._set_matmul_backend(dtype, default)
    other = "cublas" if default == "lt" else "lt"

    def through_other() -> None:
        cudalab._core._set_matmul_backend(dtype, other)
        try:
            prepared.fn()
        finally:
            cudalab._core._set_matmul_backend(dtype, default)

    return f"cudalab[{other}]", dataclasses.replace(prepared, fn=through_other)


def _case(cudalab: Any, torch: Any, timer: Any, n: int, dtype: str) -> list[dict]:
    """Rows of one dtype: cudalab (and the other backend, and torch) one after the other."""
    from cudalab.bench import MatmulCase

    case = MatmulCase(dtype, n)
    prepared = case.prepare()
    impls = {"cudalab": prepared}
    if os.environ.get("CUDALAB_BENCH_MATMUL_BACKENDS", "") == "1":
        name, other = _other_backend(cudalab, prepared)
        impls[name] = other
    if torch is not None:
        impls["torch"] = prepared.torch_twin(torch)
    # One after the other, each with the full warm-up, so every one is
    # timed at the clock the GPU sustains under this GEMM.
    rows = {}
    for impl, work in impls.items():
        m = work.measure(timer, description=impl)
        rows[impl] = row(m, (n, n, n), dtype, precision=case.precision)
    if "torch" in rows:
        for impl, r in rows.items():
            if impl != "torch":
                r["vs_torch"] = r["tflops"] / rows["torch"]["tflops"]
    return list(rows.values())


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_matmul")
    import cudalab
    from cudalab.bench import MATMUL_DTYPES, Timer

    torch = torch_cuda()
    timer = Timer(preset(quick))
    n = 2048 if quick else 8192
    results: list[dict] = []
    for dtype in MATMUL_DTYPES:
        results += _case(cudalab, torch, timer, n, dtype)
        cudalab.synchronize()
        cudalab.empty_cache()
        if torch is not None:
            torch.cuda.empty_cache()
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
