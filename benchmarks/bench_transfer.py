"""Host <-> device transfer bandwidth: pageable vs pinned, cudalab beside PyTorch.

For a 256 MiB float32 buffer (64 MiB in quick mode):

* h2d: ``cudalab.asarray(host, non_blocking=True)`` (pinned source from
  ``cudalab.pinned_empty``; a pageable source falls back to a synchronous
  copy) vs ``tensor.to('cuda', non_blocking=True)`` from ``pin_memory=True``
  (and from pageable memory).
* d2h: ``a.get(out=host, non_blocking=True)`` vs ``host.copy_(t, non_blocking=True)``.

Times come from `cudalab.bench.measure` with the same settings for both
libraries (benchlib.measure_settings), each cudalab case right before its
torch twin, on the legacy default stream that both use. Pageable copies are
synchronous, so they are measured with ``hold=False``: a spin kernel cannot
queue anything ahead of a call that waits for the GPU, it would only add a
wait. GB/s counts the bytes moved once (bytes = buffer size); "% ceiling" is
against the measured pinned transfer in the same direction
(`cudalab.bench.ceiling("h2d")` / ``("d2h")``, 256 MiB). "host_us" is the
host time per call: a few microseconds for pinned non_blocking copies, the
whole copy for pageable ones. torch is optional (its rows are skipped without
it), a GPU is not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, measure_settings, require_gpu, row, torch_cuda  # noqa: E402


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_transfer")
    import cudalab
    from cudalab.bench import measure

    torch = torch_cuda()
    settings = measure_settings(quick)
    nbytes = (64 if quick else 256) << 20
    n = nbytes // 4
    shape = (n,)
    rows: list[dict] = []
    values = np.random.default_rng(0).standard_normal(n).astype(np.float32) + 2.0

    pinned = cudalab.pinned_empty(shape, np.float32)
    pinned[:] = values
    pageable = values.copy()
    dev = cudalab.asarray(values)
    hosts = {"pinned": pinned, "pageable": pageable}
    tdev = None
    if torch is not None:
        tp = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        tp.copy_(torch.from_numpy(values))
        tpage = torch.from_numpy(values.copy())
        tdev = tp.to("cuda")
        torch_hosts = {"pinned": tp, "pageable": tpage}

    def timed(fn, op: str, impl: str, memory: str):
        return measure(fn, bytes=nbytes, ceiling=op, hold=memory == "pinned", label=op,
                       sub_label=memory, description=impl, **settings)

    for memory, host in hosts.items():
        m = timed(lambda: cudalab.asarray(host, non_blocking=True), "h2d", "cudalab", memory)
        rows.append(row(m, shape, "float32", memory=memory))
        if tdev is not None:
            th = torch_hosts[memory]
            m = timed(lambda: th.to("cuda", non_blocking=True), "h2d", "torch", memory)
            rows.append(row(m, shape, "float32", memory=memory))
        m = timed(lambda: dev.get(out=host, non_blocking=True), "d2h", "cudalab", memory)
        rows.append(row(m, shape, "float32", memory=memory))
        if tdev is not None:
            th = torch_hosts[memory]
            m = timed(lambda: th.copy_(tdev, non_blocking=True), "d2h", "torch", memory)
            rows.append(row(m, shape, "float32", memory=memory))
    cudalab.synchronize()
    if torch is not None:
        torch.cuda.synchronize()
    # Every d2h copy wrote the same values back into the host buffers.
    assert np.array_equal(pinned, values) and np.array_equal(pageable, values)
    return rows


if __name__ == "__main__":
    sys.exit(main(run))
