"""Benchmark: reductions (cudalab.sum) beside torch.sum on the same shapes.

``run(quick)`` returns one dict per (op, impl):

* ``sum_all``   -- sum over every element of a 1 GiB float32 vector (quick: 64 MiB)
* ``sum_axis0`` -- sum over axis 0 of a (16384, 16384) float32 matrix (quick: 4096^2),
  the strided-axis kernel (threads over columns)
* ``sum_axis1`` -- sum over axis 1 of the same matrix, the contiguous-row kernel

GB/s counts the bytes read plus the bytes written (the result is tiny next to
the input, so this is essentially the 1 GiB read); "% ceiling" is against the
measured device-to-device copy (`cudalab.bench.ceiling("copy")`, bytes read +
written). Times come from `cudalab.bench.measure` with the same preset for
both libraries (benchlib.preset), each cudalab case right before its
torch twin. Arrays are filled with a non-zero constant on the device (values
don't change the timing of a sum). torch is optional (its rows are skipped
without it), a GPU is not.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402

VALUE = 1.0009765625  # exactly representable, never zero


def _sum_all(cudalab, torch, p: Any, n: int) -> list[dict]:
    from cudalab.bench import measure

    nbytes = n * 4 + 4
    x = cudalab.full((n,), VALUE, dtype=np.float32)
    rows = [row(measure(lambda: cudalab.sum(x), bytes=nbytes, ceiling="copy",
                        label="sum_all", description="cudalab", preset=p), (n,), "float32")]
    if torch is not None:
        t = torch.full((n,), VALUE, dtype=torch.float32, device="cuda")
        rows.append(row(measure(lambda: torch.sum(t), bytes=nbytes, ceiling="copy",
                                label="sum_all", description="torch", preset=p),
                        (n,), "float32"))
    return rows


def _sum_axis(cudalab, torch, p: Any, side: int) -> list[dict]:
    from cudalab.bench import measure

    nbytes = side * side * 4 + side * 4
    mat = cudalab.full((side, side), VALUE, dtype=np.float32)
    tmat = None
    if torch is not None:
        tmat = torch.full((side, side), VALUE, dtype=torch.float32, device="cuda")
    rows = []
    for axis in (0, 1):
        m = measure(lambda: cudalab.sum(mat, axis=axis), bytes=nbytes, ceiling="copy",
                    label=f"sum_axis{axis}", description="cudalab", preset=p)
        rows.append(row(m, (side, side), "float32"))
        if tmat is not None:
            m = measure(lambda: torch.sum(tmat, dim=axis), bytes=nbytes, ceiling="copy",
                        label=f"sum_axis{axis}", description="torch", preset=p)
            rows.append(row(m, (side, side), "float32"))
    return rows


def _release(cudalab, torch) -> None:
    cudalab.synchronize()
    cudalab.empty_cache()
    if torch is not None:
        torch.cuda.empty_cache()


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_reduce")
    import cudalab

    torch = torch_cuda()
    p = preset(quick)
    rows = _sum_all(cudalab, torch, p, (64 << 20) // 4 if quick else (1 << 30) // 4)
    _release(cudalab, torch)
    rows += _sum_axis(cudalab, torch, p, 4096 if quick else 16384)
    _release(cudalab, torch)
    return rows


if __name__ == "__main__":
    sys.exit(main(run))
