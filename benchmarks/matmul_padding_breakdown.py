"""Where the time of a padded float16 matmul at 4095^3 goes.

Usage (on a GPU machine with cudalab and PyTorch installed):
    python benchmarks/matmul_padding_breakdown.py

Times, with cudalab.bench.measure ("default" preset): the padded product;
the same product from operands padded beforehand but written straight into
the 4095-wide result (no crop: cuBLAS then writes misaligned rows); the
aligned GEMM alone at M = 4095 and at 4096; torch.mm at 4095. Then it
profiles 20 padded calls with PyTorch's profiler (CUDA activity), which
splits each call into the GEMM kernel and the three pad/crop passes.
"""

from __future__ import annotations

import numpy as np

import cudalab
from cudalab.bench import measure

N = 4095


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    print(cudalab.get_device_properties(0).name, "torch", torch.__version__)
    a = cudalab.random.normal((N, N), dtype="float16", seed=1)
    b = cudalab.random.normal((N, N), dtype="float16", seed=2)
    out = cudalab.empty((N, N), dtype="float16")
    a_padded = cudalab.asarray(np.pad(a.get(), ((0, 0), (0, 1))))  # K -> 4096
    b_padded = cudalab.asarray(np.pad(b.get(), ((0, 1), (0, 1))))  # K, N -> 4096
    square = cudalab.random.normal((N + 1, N + 1), dtype="float16", seed=3)
    ta, tb, tout = (torch.from_dlpack(x) for x in (a, b, out))
    cases = {
        "cudalab, padded (pad='auto')": lambda: cudalab.matmul(a, b, out=out),
        "cudalab, padded operands, uncropped 4095-wide result":
            lambda: cudalab.matmul(a_padded, b_padded[:, :N], out=out, pad=False),
        "cudalab, aligned GEMM alone, M = 4095": lambda: cudalab.matmul(a_padded, b_padded),
        "cudalab, aligned 4096^3": lambda: cudalab.matmul(square, square),
        "torch.mm 4095": lambda: torch.mm(ta, tb, out=tout),
    }
    for name, fn in cases.items():
        m = measure(fn, flops=2 * N**3, label=name)
        print(f"{name:55s} {m.median * 1e3:.4f} ms  {m.tflops:6.1f} TFLOP/s (of 2*4095^3)")
    for _ in range(5):
        cudalab.matmul(a, b, out=out)
    cudalab.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            cudalab.matmul(a, b, out=out)
        cudalab.synchronize()
    print("\nPyTorch profiler, 20 padded calls (CUDA kernels):")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:4]:
        if e.device_time_total > 0:
            print(f"  {e.key[:70]:70s} {e.count:4d} calls  {e.device_time_total / e.count:8.1f} us each")


if __name__ == "__main__":
    main()
