"""Host <-> device transfer bandwidth: pageable vs pinned, cudalab beside PyTorch.

The shared case `cudalab.bench.TransferCase` for a 256 MiB float32 buffer
(64 MiB in quick mode), pinned then pageable, each direction:

* h2d: ``cudalab.asarray(host, non_blocking=True)`` from pinned memory
  (``cudalab.pinned_empty``; pageable memory is copied synchronously) vs
  ``tensor.to('cuda', non_blocking=True)`` from ``pin_memory=True`` (and from
  pageable memory).
* d2h: ``a.get(out=host, non_blocking=True)`` vs ``host.copy_(t, non_blocking=True)``.

Times come from `cudalab.bench.measure` with the same preset for both
libraries (benchlib.preset), each cudalab case right before its torch twin,
on the legacy default stream that both use. Pageable copies are synchronous,
so they are measured unheld: a spin kernel cannot queue anything ahead of a
call that waits for the GPU, it would only add a wait. GB/s counts the bytes
moved once (bytes = buffer size); "% ceiling" is against the measured pinned
transfer in the same direction (`cudalab.bench.ceiling("h2d")` / ``("d2h")``,
256 MiB). "host_us" is the host time per call: a few microseconds for pinned
non_blocking copies, the whole copy for pageable ones. torch is optional (its
rows are skipped without it), a GPU is not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import main, preset, require_gpu, row, torch_cuda  # noqa: E402


def run(quick: bool = False) -> list[dict]:
    require_gpu("bench_transfer")
    import cudalab
    from cudalab.bench import Timer, TransferCase
    from cudalab.bench.cases import HOST_MEMORIES, TRANSFER_DIRECTIONS

    torch = torch_cuda()
    timer = Timer(preset(quick))
    nbytes = (64 if quick else 256) << 20
    rows: list[dict] = []
    for memory in HOST_MEMORIES:
        for direction in TRANSFER_DIRECTIONS:
            case = TransferCase(direction, memory, nbytes)
            prepared = case.prepare()
            impls = {"cudalab": prepared}
            if torch is not None:
                impls["torch"] = prepared.torch_twin(torch)
            for impl, work in impls.items():
                m = work.measure(timer, description=impl, ceiling=case.ceiling)
                rows.append(row(m, (nbytes // 4,), "float32", memory=memory))
            cudalab.synchronize()
            if direction == "d2h":  # every copy wrote the device's values into the host buffer
                assert np.all(prepared.operands["host"] == prepared.operands["device"].get())
    return rows


if __name__ == "__main__":
    sys.exit(main(run))
