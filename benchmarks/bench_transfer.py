"""Host <-> device transfer bandwidth: pageable vs pinned, cudalab beside PyTorch.

For a 256 MiB float32 buffer (64 MiB in quick mode):

* h2d: ``cudalab.asarray(host, non_blocking=True)`` (pinned source from
  ``cudalab.pinned_empty``; a pageable source falls back to a synchronous
  copy) vs ``tensor.to('cuda', non_blocking=True)`` from ``pin_memory=True``
  (and from pageable memory).
* d2h: ``a.get(out=host, non_blocking=True)`` vs ``host.copy_(t, non_blocking=True)``.

Timed with torch.cuda.Event on the legacy default stream, which both libraries
use, so each event pair brackets exactly the copies issued between them.
GB/s counts the bytes moved once (bytes = buffer size). Imports without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import row, time_cuda  # noqa: E402

import cudalab  # noqa: E402


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def run(quick: bool = False) -> list[dict]:
    torch = _torch()
    if torch is None or not cudalab.is_available():
        return []  # events come from torch; nothing to time without both
    reps = 20 if quick else 40
    nbytes = (64 if quick else 256) << 20
    n = nbytes // 4
    shape = (n,)
    rows: list[dict] = []
    values = np.random.default_rng(0).standard_normal(n).astype(np.float32) + 2.0

    # ---- cudalab ----------------------------------------------------------
    pinned = cudalab.pinned_empty(shape, np.float32)
    pinned[:] = values
    pageable = values.copy()
    dev = cudalab.asarray(values)
    for kind, host in (("pinned", pinned), ("pageable", pageable)):
        t = time_cuda(lambda h=host: cudalab.asarray(h, non_blocking=True), repeats=reps)
        rows.append(row("h2d", "cudalab", shape, "float32", t, bytes=nbytes, memory=kind))
        t = time_cuda(lambda h=host: dev.get(out=h, non_blocking=True), repeats=reps)
        rows.append(row("d2h", "cudalab", shape, "float32", t, bytes=nbytes, memory=kind))
    cudalab.synchronize()
    assert np.array_equal(pinned, values) and np.array_equal(pageable, values)
    del dev

    # ---- torch, same sizes, its own buffers -------------------------------
    tp = torch.empty(shape, dtype=torch.float32, pin_memory=True)
    tp.copy_(torch.from_numpy(values))
    tpage = torch.from_numpy(values.copy())
    tdev = tp.to("cuda")
    for kind, host in (("pinned", tp), ("pageable", tpage)):
        t = time_cuda(lambda h=host: h.to("cuda", non_blocking=True), repeats=reps)
        rows.append(row("h2d", "torch", shape, "float32", t, bytes=nbytes, memory=kind))
        t = time_cuda(lambda h=host: h.copy_(tdev, non_blocking=True), repeats=reps)
        rows.append(row("d2h", "torch", shape, "float32", t, bytes=nbytes, memory=kind))
    torch.cuda.synchronize()
    del tdev
    torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":  # pragma: no cover
    for r in run(quick="--quick" in sys.argv):
        print(f"{r['op']:4s} {r['impl']:8s} {r['memory']:9s} {r['median_ms']:8.3f} ms "
              f"{r['gb_per_s']:7.2f} GB/s")
