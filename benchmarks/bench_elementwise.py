"""Element-wise benchmarks: cudalab beside PyTorch, measured in one run.

* ``add``: ``cl.add(x, y, out=z)`` vs ``torch.add(x, y, out=z)`` over float32
  arrays of 1 GiB each (quick: 64 MiB); 2 reads + 1 write.
* ``scale_inplace``: ``cl.mul(x, 2.0, out=x)`` vs ``x.mul_(2.0)``; 1 read +
  1 write.
* ``add_inplace_dispatch``: host time per in-place add of 1,024 float32
  values issued 10,000 times from Python (``cl.add(x, y, out=x)`` vs
  ``x.add_(y)``), ending with one synchronize, i.e. the per-call cost of the
  Python -> C -> launch path once the GPU work is negligible.

GPU times come from `cudalab.bench.measure` with the same preset for both
libraries (benchlib.preset), each cudalab case right before its torch twin;
"% ceiling" is against the measured device-to-device copy
(`cudalab.bench.ceiling("copy")`, bytes read + written). The dispatch rows
use the host clock (`cudalab.bench.host_clock`), cudalab and torch
interleaved.
``run(quick)`` returns one dict per (op, impl); torch is optional (its rows
are skipped without it), a GPU is not.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
DISPATCH_N = 1024
DISPATCH_TIMER = "host clock around the calls + one synchronize"


def _bandwidth(cl, torch, p: Any, nbytes: int) -> list[dict[str, Any]]:
    """add and scale_inplace over float32 arrays of `nbytes` each."""
    from cudalab.bench import measure

    n = nbytes // 4
    shape = (n,)
    results: list[dict[str, Any]] = []
    x = cl.full(shape, 1.0, dtype="float32")
    y = cl.full(shape, 0.5, dtype="float32")
    z = cl.empty(shape, dtype="float32")
    if torch is not None:
        tx = torch.full(shape, 1.0, dtype=torch.float32, device="cuda")
        ty = torch.full(shape, 0.5, dtype=torch.float32, device="cuda")
        tz = torch.empty(shape, dtype=torch.float32, device="cuda")

    # ---- add: 2 reads + 1 write ----
    m = measure(lambda: cl.add(x, y, out=z), bytes=3 * nbytes, ceiling="copy",
                label="add", description="cudalab", preset=p)
    results.append(row(m, shape, "float32"))
    if torch is not None:
        m = measure(lambda: torch.add(tx, ty, out=tz), bytes=3 * nbytes, ceiling="copy",
                    label="add", description="torch", preset=p)
        results.append(row(m, shape, "float32"))

    # ---- scale in place: 1 read + 1 write ----
    # Repeated doubling reaches inf after 128 calls; the work is the same.
    m = measure(lambda: cl.mul(x, 2.0, out=x), bytes=2 * nbytes, ceiling="copy",
                label="scale_inplace", description="cudalab", preset=p)
    results.append(row(m, shape, "float32"))
    if torch is not None:
        m = measure(lambda: tx.mul_(2.0), bytes=2 * nbytes, ceiling="copy",
                    label="scale_inplace", description="torch", preset=p)
        results.append(row(m, shape, "float32"))
    return results


def _dispatch(cl, torch, warmup: float, calls: int, repeats: int) -> list[dict[str, Any]]:
    """Host time per in-place add of 1,024 values, cudalab and torch interleaved."""
    from cudalab.bench import host_clock, host_measurement

    small = (DISPATCH_N,)
    a = cl.full(small, 1.0, dtype="float32")
    b = cl.full(small, 0.0, dtype="float32")
    add = cl.add

    def cudalab_loop() -> None:
        for _ in range(calls):
            add(a, b, out=a)
        cl.synchronize()

    cases = {"cudalab": cudalab_loop}
    if torch is not None:
        ta = torch.ones(small, dtype=torch.float32, device="cuda")
        tb = torch.zeros(small, dtype=torch.float32, device="cuda")

        def torch_loop() -> None:
            for _ in range(calls):
                ta.add_(tb)
            torch.cuda.synchronize()

        cases["torch"] = torch_loop
    results = []
    for impl, samples in host_clock(cases, repeats, warmup=warmup).items():
        m = host_measurement(samples, calls=calls, label="add_inplace_dispatch", description=impl,
                             timer=DISPATCH_TIMER, bytes=3 * 4 * DISPATCH_N)
        results.append(row(m, small, "float32", calls_per_round=calls,
                           host_us_per_op=m.median * 1e6))
    return results


def run(quick: bool = False) -> list[dict[str, Any]]:
    require_gpu("bench_elementwise")
    import cudalab as cl

    torch = torch_cuda()
    p = preset(quick)
    results = _bandwidth(cl, torch, p, (64 * MIB) if quick else GIB)
    cl.synchronize()
    cl.empty_cache()
    if torch is not None:
        torch.cuda.empty_cache()
    calls, repeats = (2000, 5) if quick else (10_000, 7)
    results += _dispatch(cl, torch, p.warmup, calls, repeats)
    return results


if __name__ == "__main__":
    sys.exit(main(run))
