"""Streams and CUDA graphs benchmarks: cudalab beside PyTorch (and CuPy).

* ``graph_100_elementwise``: a graph of 100 small in-place elementwise ops
  (``y += x`` / ``y *= 0.5`` alternating on 1,024 float32) replayed; reported
  per op (median of repeats of one replay, GPU time from CUDA events). Beside
  it the same 100 ops issued eagerly by cudalab, and torch's own CUDA graph of
  the same ops (``torch.cuda.CUDAGraph``). Target: <= 1.5 us per op replayed.
* ``add_inplace_dispatch``: host wall time per in-place add of 1,024 float32
  issued 10,000 times from Python with one synchronize at the end: cudalab
  ``x += y`` vs torch ``x.add_(y)`` vs CuPy ``x += y``. Median and IQR over
  repeats of the whole loop.

``run(quick)`` returns one dict per (op, impl) with median_ms/iqr_ms (ms per
op), ``us_per_op`` and the usual keys; it imports without a GPU, torch or
CuPy (missing ones are skipped).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from timing import median_iqr, times_ms  # noqa: E402

N = 1024
OPS = 100


_quantiles = median_iqr


def _row(op: str, impl: str, per_op_ms: list[float], nbytes_per_op: int,
         **extra: Any) -> dict[str, Any]:
    median, iqr = _quantiles(per_op_ms)
    return {
        "op": op,
        "impl": impl,
        "shape": [N],
        "dtype": "float32",
        "median_ms": median,
        "iqr_ms": iqr,
        "us_per_op": median * 1e3,
        "bytes": nbytes_per_op,
        "gb_per_s": nbytes_per_op / (median / 1e3) / 1e9 if median > 0 else 0.0,
        "repeats": len(per_op_ms),
        **extra,
    }


def _ops_cudalab(x: Any, y: Any) -> None:
    for i in range(OPS):
        if i % 2 == 0:
            y += x
        else:
            y *= 0.5


def _ops_torch(x: Any, y: Any) -> None:
    for i in range(OPS):
        if i % 2 == 0:
            y.add_(x)
        else:
            y.mul_(0.5)


def _gpu_times(cl: Any, fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    """ms per call of fn, cudalab events on the current (legacy) stream."""
    for _ in range(warmup):
        fn()
    cl.synchronize()
    starts = [cl.Event() for _ in range(repeats)]
    ends = [cl.Event() for _ in range(repeats)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    cl.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _bench_graph(cl: Any, torch: Any, np: Any, repeats: int) -> list[dict[str, Any]]:
    rows = []
    nbytes = 3 * N * 4  # ~2 reads + 1 write per op (upper bound)
    rng = np.random.default_rng(0)
    x_h = rng.standard_normal(N, dtype=np.float32)
    x = cl.asarray(x_h)
    y = cl.asarray(x_h)

    # Eager cudalab: 100 launches from Python, GPU time per op.
    t = _gpu_times(cl, lambda: _ops_cudalab(x, y), 3, repeats)
    rows.append(_row("graph_100_elementwise", "cudalab_eager", [v / OPS for v in t], nbytes))

    g = cl.CUDAGraph()
    with cl.graph(g):
        _ops_cudalab(x, y)
    t = _gpu_times(cl, g.replay, 5, repeats)
    rows.append(_row("graph_100_elementwise", "cudalab", [v / OPS for v in t], nbytes,
                     target_us_per_op=1.5))

    if torch is not None:
        tx = torch.from_numpy(x_h).cuda()
        ty = tx.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on a side stream, as torch advises
            _ops_torch(tx, ty)
        torch.cuda.current_stream().wait_stream(s)
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            _ops_torch(tx, ty)

        def torch_times(fn: Callable[[], Any]) -> list[float]:
            return times_ms(fn, 5, repeats)  # torch's CUDA events

        rows.append(_row("graph_100_elementwise", "torch",
                         [v / OPS for v in torch_times(tg.replay)], nbytes))
        rows.append(_row("graph_100_elementwise", "torch_eager",
                         [v / OPS for v in torch_times(lambda: _ops_torch(tx, ty))], nbytes))
    return rows


def _wall_per_op(loop: Callable[[int], Any], sync: Callable[[], Any], iters: int,
                 repeats: int) -> list[float]:
    loop(200)
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loop(iters)
        sync()
        out.append((time.perf_counter() - t0) * 1e3 / iters)
    return out


def _bench_dispatch(cl: Any, torch: Any, cupy: Any, np: Any, iters: int,
                    repeats: int) -> list[dict[str, Any]]:
    rows = []
    nbytes = 3 * N * 4
    x_h = np.random.default_rng(1).standard_normal(N, dtype=np.float32)

    x, y = cl.asarray(x_h), cl.asarray(x_h)

    def cl_loop(n: int) -> None:
        a, b = x, y
        for _ in range(n):
            a += b

    rows.append(_row("add_inplace_dispatch", "cudalab",
                     _wall_per_op(cl_loop, cl.synchronize, iters, repeats), nbytes,
                     iters=iters, timer="host wall"))
    if torch is not None:
        tx, ty = torch.from_numpy(x_h).cuda(), torch.from_numpy(x_h).cuda()

        def torch_loop(n: int) -> None:
            a, b = tx, ty
            for _ in range(n):
                a.add_(b)

        rows.append(_row("add_inplace_dispatch", "torch",
                         _wall_per_op(torch_loop, torch.cuda.synchronize, iters, repeats),
                         nbytes, iters=iters, timer="host wall"))
    if cupy is not None:
        cx, cy = cupy.asarray(x_h), cupy.asarray(x_h)

        def cupy_loop(n: int) -> None:
            a, b = cx, cy
            for _ in range(n):
                a += b

        rows.append(_row("add_inplace_dispatch", "cupy",
                         _wall_per_op(cupy_loop, cupy.cuda.Device().synchronize, iters,
                                      repeats),
                         nbytes, iters=iters, timer="host wall"))
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    import numpy as np

    import cudalab as cl

    if not cl.is_available():
        return []
    try:
        import torch

        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    try:
        import cupy
    except ImportError:
        cupy = None

    repeats = 20 if quick else 50
    rows = _bench_graph(cl, torch, np, repeats)
    rows += _bench_dispatch(cl, torch, cupy, np, 10_000, 5 if quick else 20)
    return rows


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=1))
