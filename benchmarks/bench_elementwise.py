"""Element-wise benchmarks: cudalab beside PyTorch, measured in one run.

* ``add``: ``cl.add(x, y, out=z)`` vs ``torch.add(x, y, out=z)`` over float32
  arrays of 1 GiB each (quick: 64 MiB); 2 reads + 1 write.
* ``scale_inplace``: ``cl.mul(x, 2.0, out=x)`` vs ``x.mul_(2.0)``; 1 read +
  1 write.
* ``copy`` (torch only): ``z.copy_(x)``, the device-to-device copy bandwidth
  the other two are judged against (bytes read + written).
* ``add_inplace_dispatch``: host wall time per in-place add of 1,024 float32
  values issued 10,000 times from Python (``cl.add(x, y, out=x)`` vs
  ``x.add_(y)``), ending with one synchronize, i.e. the per-call cost of the
  Python -> C -> launch path once the GPU work is negligible.

GPU times come from ``torch.cuda.Event`` pairs around each repeat: cudalab
launches on CUDA's legacy default stream, which is PyTorch's default stream
too, so the events order with them. Warm-up first, then >= 20 repeats;
median and inter-quartile range reported. ``run(quick)`` returns one dict per
(op, impl); it imports without a GPU (and without torch, which is optional).
"""

from __future__ import annotations

import time
from typing import Any, Callable
from timing import median_iqr, times_ms  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


_quantiles = median_iqr


def _time_gpu(torch: Any, fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    """Milliseconds per call of `fn`, one event pair per repeat."""
    return times_ms(fn, warmup, repeats)


def _row(op: str, impl: str, shape: tuple[int, ...], times_ms: list[float], nbytes: int,
         **extra: Any) -> dict[str, Any]:
    median, iqr = _quantiles(times_ms)
    row = {
        "op": op,
        "impl": impl,
        "shape": list(shape),
        "dtype": "float32",
        "median_ms": median,
        "iqr_ms": iqr,
        "gb_per_s": nbytes / (median * 1e-3) / 1e9 if median > 0 else float("nan"),
        "bytes": nbytes,
        "repeats": len(times_ms),
    }
    row.update(extra)
    return row


def _dispatch_rounds(sync: Callable[[], None], fn: Callable[[], Any], calls: int,
                     rounds: int) -> list[float]:
    """Host milliseconds per call, one value per round of `calls` calls."""
    for _ in range(1000):  # warm-up: caches, lazy loading, the pool
        fn()
    sync()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3 / calls)
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    import cudalab as cl

    try:
        import torch
    except ImportError:  # timing needs torch.cuda.Event
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise RuntimeError("bench_elementwise needs PyTorch with CUDA for its event timer")

    nbytes = (64 * MIB) if quick else GIB
    n = nbytes // 4
    shape = (n,)
    warmup, repeats = (3, 20) if quick else (3, 30)
    results: list[dict[str, Any]] = []

    # ---- cudalab ----
    x = cl.full(shape, 1.0, dtype="float32")
    y = cl.full(shape, 0.5, dtype="float32")
    z = cl.empty(shape, dtype="float32")
    t = _time_gpu(torch, lambda: cl.add(x, y, out=z), warmup, repeats)
    results.append(_row("add", "cudalab", shape, t, 3 * nbytes))
    # Repeated doubling reaches inf after 128 repeats; the work is the same.
    t = _time_gpu(torch, lambda: cl.mul(x, 2.0, out=x), warmup, repeats)
    results.append(_row("scale_inplace", "cudalab", shape, t, 2 * nbytes))
    del x, y, z
    cl.synchronize()
    cl.empty_cache()

    # ---- torch ----
    tx = torch.full(shape, 1.0, dtype=torch.float32, device="cuda")
    ty = torch.full(shape, 0.5, dtype=torch.float32, device="cuda")
    tz = torch.empty(shape, dtype=torch.float32, device="cuda")
    t = _time_gpu(torch, lambda: torch.add(tx, ty, out=tz), warmup, repeats)
    results.append(_row("add", "torch", shape, t, 3 * nbytes))
    t = _time_gpu(torch, lambda: tx.mul_(2.0), warmup, repeats)
    results.append(_row("scale_inplace", "torch", shape, t, 2 * nbytes))
    t = _time_gpu(torch, lambda: tz.copy_(tx), warmup, repeats)
    results.append(_row("copy", "torch", shape, t, 2 * nbytes))
    del tx, ty, tz
    torch.cuda.empty_cache()

    # ---- dispatch cost: in-place add of 1,024 values from Python ----
    calls, rounds = (2000, 5) if quick else (10000, 7)
    small = (1024,)
    a = cl.full(small, 1.0, dtype="float32")
    b = cl.full(small, 0.0, dtype="float32")
    add = cl.add
    t = _dispatch_rounds(torch.cuda.synchronize, lambda: add(a, b, out=a), calls, rounds)
    results.append(_row("add_inplace_dispatch", "cudalab", small, t, 3 * 4096,
                        calls_per_round=calls, host_us_per_op=_quantiles(t)[0] * 1e3,
                        timer="host wall clock, synchronize at the end"))
    ta = torch.ones(small, dtype=torch.float32, device="cuda")
    tb = torch.zeros(small, dtype=torch.float32, device="cuda")
    t = _dispatch_rounds(torch.cuda.synchronize, lambda: ta.add_(tb), calls, rounds)
    results.append(_row("add_inplace_dispatch", "torch", small, t, 3 * 4096,
                        calls_per_round=calls, host_us_per_op=_quantiles(t)[0] * 1e3,
                        timer="host wall clock, synchronize at the end"))
    return results


if __name__ == "__main__":
    import json
    import sys

    rows = run(quick="--quick" in sys.argv)
    for r in rows:
        extra = f"  {r['host_us_per_op']:.2f} us/op" if "host_us_per_op" in r else ""
        print(f"{r['op']:22s} {r['impl']:8s} {r['median_ms']:9.4f} ms  iqr {r['iqr_ms']:.4f}  "
              f"{r['gb_per_s']:8.1f} GB/s{extra}")
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
