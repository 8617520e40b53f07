"""cudalab.distributed: several GPUs and several nodes on NCCL.

NCCL (the library the field uses for collectives) is bound in C and loaded
at run time, so a build and an import work without it; ``is_available()``
says whether it can be loaded. A script becomes one process per GPU::

    python -m cudalab.distributed.run --nproc-per-node 2 train.py   # or torchrun

    import cudalab, cudalab.distributed as dist
    dist.init()                                  # rank, GPU, NCCL from the launcher
    x = cudalab.ones(1024)
    dist.all_reduce(x)                           # x == world_size everywhere
    dist.destroy()

* processes: ``init`` / ``init_process_group``, ``destroy``, ``get_rank``,
  ``get_world_size``, ``get_local_rank``, ``LaunchEnv`` (torchrun, Slurm and
  MPI variables); the launcher is ``python -m cudalab.distributed.run``
  (``cudalab.distributed.run.launch`` from Python);
* collectives on DeviceArrays: ``all_reduce``, ``broadcast``, ``reduce``,
  ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``send`` / ``recv``,
  ``barrier``; ``async_op=True`` returns a ``Work``;
* placement: ``can_access_peer``, ``enable_peer_access``,
  ``disable_peer_access`` (and ``DeviceArray.to(device)``);
* parallelism: ``DataParallel`` (one process, several GPUs),
  ``DistributedDataParallel``, ``Pipeline`` (GPipe).
"""

from .._core import (
    DistributedError,
    NcclError,
    can_access_peer,
    disable_peer_access,
    enable_peer_access,
)
from .env import LaunchEnv
from .group import (
    ProcessGroup,
    ReduceOp,
    Work,
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    destroy,
    destroy_process_group,
    get_group,
    get_local_rank,
    get_local_world_size,
    get_rank,
    get_world_size,
    init,
    init_process_group,
    is_initialized,
    recv,
    reduce,
    reduce_scatter,
    send,
)
from .library import is_available, nccl_library, nccl_version
from .data_parallel import DataParallel
from .ddp import DistributedDataParallel
from .pipeline import Pipeline

__all__ = [
    "DataParallel",
    "DistributedDataParallel",
    "DistributedError",
    "LaunchEnv",
    "NcclError",
    "Pipeline",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "can_access_peer",
    "destroy",
    "destroy_process_group",
    "disable_peer_access",
    "enable_peer_access",
    "get_group",
    "get_local_rank",
    "get_local_world_size",
    "get_rank",
    "get_world_size",
    "init",
    "init_process_group",
    "is_available",
    "is_initialized",
    "nccl_library",
    "nccl_version",
    "recv",
    "reduce",
    "reduce_scatter",
    "send",
]
