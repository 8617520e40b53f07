"""Half-precision matmul at misaligned sizes: cudalab's padding vs none vs torch.mm.

Usage (on a GPU machine with cudalab and PyTorch installed):
    python benchmarks/matmul_padding.py

For float16 and bfloat16 at n = 4095, 4096, 8191, 8192 (n x n x n) it times
cudalab.matmul with the default padding ('auto'), with pad=False, and
torch.mm on the same operands (shared through DLPack), each with
cudalab.bench.measure's "sustained" preset, and prints TFLOP/s, the speed-up
over torch.mm and the relative error against a float64 product.
"""

from __future__ import annotations

import cudalab
from cudalab.bench import measure


def main() -> None:
    import torch

    print(cudalab.get_device_properties(0).name, "torch", torch.__version__)
    for dtype in ("float16", "bfloat16"):
        for n in (4095, 4096, 8191, 8192):
            a = cudalab.random.normal((n, n), dtype=dtype, seed=1)
            b = cudalab.random.normal((n, n), dtype=dtype, seed=2)
            out = cudalab.empty((n, n), dtype=dtype)
            ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
            tout = torch.empty_like(ta)
            flops = 2 * n**3
            ours = measure(lambda: cudalab.matmul(a, b, out=out), flops=flops,
                           label=f"cudalab {n}", preset="sustained")
            nopad = measure(lambda: cudalab.matmul(a, b, out=out, pad=False), flops=flops,
                            label=f"cudalab pad=False {n}", preset="sustained")
            theirs = measure(lambda: torch.mm(ta, tb, out=tout), flops=flops,
                             label=f"torch.mm {n}", preset="sustained")
            ref = torch.mm(ta.double(), tb.double())
            got = torch.from_dlpack(cudalab.matmul(a, b)).double()
            err = float((got - ref).norm() / ref.norm())
            print(f"{dtype} {n}: cudalab {ours.tflops:.1f}  pad=False {nopad.tflops:.1f}  "
                  f"torch.mm {theirs.tflops:.1f} TFLOP/s;  x torch {theirs.median / ours.median:.2f};"
                  f"  rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
