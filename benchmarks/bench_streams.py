"""Streams and CUDA graphs benchmarks: cudalab beside PyTorch (and CuPy).

* ``graph_100_elementwise``: a graph of 100 small in-place elementwise ops
  (``y += x`` / ``y *= 0.5`` alternating on 1,024 float32) replayed; reported
  per op. Beside it the same 100 ops issued eagerly by cudalab, and torch's
  own CUDA graph of the same ops (``torch.cuda.CUDAGraph``) and its eager
  loop. Target: <= 1.5 us per op replayed. GPU times from
  `cudalab.bench.measure` (CUDA events on the legacy default stream, where
  both libraries launch and replay). The eager rows are measured with
  ``hold=False``: the point of the comparison is what the GPU sees when
  Python issues the ops one by one, launch gaps included (with the hold,
  the spin kernel would queue them up and hide exactly that). The graph rows
  use measure()'s default, which does not hold calls this long anyway.
* ``add_inplace_dispatch``: host time per in-place add of 1,024 float32
  issued 10,000 times from Python with one synchronize at the end: cudalab
  ``x += y`` vs torch ``x.add_(y)`` vs CuPy ``x += y``, interleaved in rounds
  (`cudalab.bench.host_clock`). This is a host-side figure, so it is timed with the
  host clock: everything from the first call until the GPU has finished,
  per op. Each row also carries, from one `measure()` of a single add,
  ``gpu_us_per_op`` (the GPU time of one add when adds run back to back) and
  ``enqueue_us_per_op`` (measure()'s host enqueue time per call).

``run(quick)`` returns one dict per (op, impl) with median_ms/iqr_ms (ms per
op), ``us_per_op`` and the usual keys; torch and CuPy are optional (their
rows are skipped without them), a GPU is not.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402

N = 1024
OPS = 100
ITERS = 10_000
NBYTES_PER_OP = 3 * N * 4  # ~2 reads + 1 write per op (upper bound)
DISPATCH_TIMER = "host clock around the calls + one synchronize"


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


def _bench_graph(cl: Any, torch: Any, np: Any, p: Any) -> list[dict[str, Any]]:
    from cudalab.bench import measure

    rows = []
    rng = np.random.default_rng(0)
    x_h = rng.standard_normal(N, dtype=np.float32)
    x = cl.asarray(x_h)
    y = cl.asarray(x_h)

    def timed(fn, impl: str, hold: bool) -> Any:
        return measure(fn, bytes=OPS * NBYTES_PER_OP, hold=hold,
                       label="graph_100_elementwise", description=impl, preset=p)

    def per_op(m: Any, **extra: Any) -> dict[str, Any]:
        r = row(m, [N], "float32", ops_per_call=OPS, **extra)
        r["us_per_op"] = r["median_ms"] * 1e3
        return r

    # Eager cudalab: 100 launches from Python, as the GPU sees them.
    rows.append(per_op(timed(lambda: _ops_cudalab(x, y), "cudalab_eager", hold=False)))
    g = cl.CUDAGraph()
    with cl.graph(g):
        _ops_cudalab(x, y)
    rows.append(per_op(timed(g.replay, "cudalab", hold=True), target_us_per_op=1.5))

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
        rows.append(per_op(timed(tg.replay, "torch", hold=True)))
        rows.append(per_op(timed(lambda: _ops_torch(tx, ty), "torch_eager", hold=False)))
    return rows


def _bench_dispatch(cl: Any, torch: Any, cupy: Any, np: Any, repeats: int,
                    p: Any) -> list[dict[str, Any]]:
    from cudalab.bench import host_clock, host_measurement, measure

    x_h = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
    loops, singles = {}, {}

    x, y = cl.asarray(x_h), cl.asarray(x_h)

    def cl_add() -> None:
        nonlocal x
        x += y

    def cl_loop() -> None:
        a, b = x, y
        for _ in range(ITERS):
            a += b
        cl.synchronize()

    loops["cudalab"], singles["cudalab"] = cl_loop, cl_add
    if torch is not None:
        tx, ty = torch.from_numpy(x_h).cuda(), torch.from_numpy(x_h).cuda()

        def torch_loop() -> None:
            a, b = tx, ty
            for _ in range(ITERS):
                a.add_(b)
            torch.cuda.synchronize()

        loops["torch"], singles["torch"] = torch_loop, lambda: tx.add_(ty)
    if cupy is not None:
        cx, cy = cupy.asarray(x_h), cupy.asarray(x_h)
        sync = cupy.cuda.Device().synchronize

        def cupy_loop() -> None:
            a, b = cx, cy
            for _ in range(ITERS):
                a += b
            sync()

        def cupy_add() -> None:
            nonlocal cx
            cx += cy

        loops["cupy"], singles["cupy"] = cupy_loop, cupy_add

    rows = []
    times = host_clock(loops, repeats, warmup=p.warmup)
    for impl, samples in times.items():
        m = host_measurement(samples, calls=ITERS, label="add_inplace_dispatch", description=impl,
                             timer=DISPATCH_TIMER, bytes=NBYTES_PER_OP)
        # One add under measure(): its GPU time back to back, and the host
        # enqueue time per call that measure() records (a cross-check).
        single = measure(singles[impl], bytes=NBYTES_PER_OP, ceiling=None,
                         label="add_inplace", description=impl, preset=p)
        rows.append(row(m, [N], "float32", us_per_op=m.median * 1e6, iters=ITERS,
                        gpu_us_per_op=single.median * 1e6,
                        enqueue_us_per_op=single.host_time * 1e6,
                        gpu_measurement_held=single.held))
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    require_gpu("bench_streams")
    import numpy as np

    import cudalab as cl

    torch = torch_cuda()
    try:
        import cupy
    except ImportError:
        cupy = None

    p = preset(quick)
    rows = _bench_graph(cl, torch, np, p)
    rows += _bench_dispatch(cl, torch, cupy, np, 5 if quick else 20, p)
    return rows


if __name__ == "__main__":
    sys.exit(main(run))
