"""Benchmarks of transpose (every teaching version), ascontiguousarray(a.T) and
device random numbers, each beside PyTorch in the same run.

``run(quick)`` returns a list of dicts (one per op and implementation) with
``"op", "impl", "shape", "dtype", "median_ms", "iqr_ms", "gb_per_s", "bytes"``,
"% of the copy ceiling" and the rest of benchlib.row's keys.

* transpose of an N x N float32 matrix (N = 16384, quick: 4096): bytes = read +
  written = 2 * N * N * 4. cudalab rows: ``transpose`` (the default, v5 best)
  and ``transpose_<method>`` for each teaching version; torch row:
  ``x.t().contiguous()`` under op ``transpose``.
* ``ascontiguousarray_T``: cudalab.ascontiguousarray(x.T) (copy.cu routes it to
  the best tiled kernel) and torch's x.t().contiguous() again (the same
  measurement as its ``transpose`` row).
* ``copy``: a plain device-to-device copy of the same matrix (cudalab x.copy(),
  torch y.copy_(x)), beside the transposes.
* ``random_normal`` / ``random_uniform``: 256M float32 values (quick: 32M),
  bytes = written; torch.randn / torch.rand beside.

Times come from `cudalab.bench.measure` with the same preset for both
libraries (benchlib.preset), each cudalab case right before its
torch twin; "% ceiling" is against the measured device-to-device copy
(`cudalab.bench.ceiling("copy")`). torch is optional (its rows are skipped
without it), a GPU is not.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402

METHODS = ["naive", "coalesced_write", "tiled", "tiled_padded", "best"]


def _timer(p):
    from cudalab.bench import measure

    def timed(fn, op: str, impl: str, nbytes: int):
        return measure(fn, bytes=nbytes, ceiling="copy", label=op, description=impl, preset=p)

    return timed


def _transposes(cudalab, torch, p, n: int) -> list[dict]:
    """Every transpose version, ascontiguousarray(x.T) and a copy of an n x n matrix."""
    timed = _timer(p)
    shape = (n, n)
    nbytes = 2 * n * n * 4
    rows: list[dict] = []
    x = cudalab.random.uniform(shape, -1.0, 1.0, seed=0)  # generated on the device
    t = out = None
    if torch is not None:
        t = torch.rand(shape, device="cuda", dtype=torch.float32)
        out = torch.empty_like(t)

    for method in METHODS:
        op = "transpose" if method == "best" else f"transpose_{method}"
        m = timed(lambda: cudalab.transpose(x, method=method), op, "cudalab", nbytes)
        rows.append(row(m, shape, "float32"))
    torch_transpose = None
    if t is not None:
        torch_transpose = timed(lambda: t.t().contiguous(), "transpose", "torch", nbytes)
        rows.append(row(torch_transpose, shape, "float32"))
    m = timed(lambda: cudalab.ascontiguousarray(x.T), "ascontiguousarray_T", "cudalab", nbytes)
    rows.append(row(m, shape, "float32"))
    if torch_transpose is not None:  # the same torch op as its transpose row
        same = dataclasses.replace(torch_transpose, label="ascontiguousarray_T")
        rows.append(row(same, shape, "float32"))
    m = timed(lambda: x.copy(), "copy", "cudalab", nbytes)
    rows.append(row(m, shape, "float32"))
    if t is not None:
        m = timed(lambda: out.copy_(t), "copy", "torch", nbytes)
        rows.append(row(m, shape, "float32"))
    return rows


def _random(cudalab, torch, p, count: int) -> list[dict]:
    """normal and uniform float32 values on the device; bytes = written."""
    timed = _timer(p)
    rbytes = count * 4
    g = None
    if torch is not None:
        g = torch.Generator(device="cuda")
        g.manual_seed(1)
    rows = []
    for op, ours, theirs in [
        ("random_normal", lambda: cudalab.random.normal(count, seed=1),
         lambda: torch.randn(count, device="cuda", generator=g)),
        ("random_uniform", lambda: cudalab.random.uniform(count, seed=1),
         lambda: torch.rand(count, device="cuda", generator=g)),
    ]:
        rows.append(row(timed(ours, op, "cudalab", rbytes), (count,), "float32"))
        if torch is not None:
            rows.append(row(timed(theirs, op, "torch", rbytes), (count,), "float32"))
    return rows


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_transpose")
    import cudalab

    torch = torch_cuda()
    p = preset(quick)
    rows = _transposes(cudalab, torch, p, 4096 if quick else 16384)
    cudalab.synchronize()
    cudalab.empty_cache()
    if torch is not None:
        torch.cuda.empty_cache()
    rows += _random(cudalab, torch, p, (32 if quick else 256) * 2**20)
    return rows


if __name__ == "__main__":
    sys.exit(main(run))
