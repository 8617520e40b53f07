"""cudalab: hands-on, measured GPU performance lessons from Python.

The core is a C extension (``cudalab._core``) wrapping cudalab's own CUDA
kernels and cuBLAS; this package re-exports its API with names that follow
``torch.cuda`` and NumPy/CuPy habits::

    import numpy as np
    import cudalab as cl

    x = cl.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = x.T.copy()             # transposed view, then a C-contiguous copy
    print(y.get(), cl.memory_allocated())
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

# NumPy's Python package before the extension: _core's init imports NumPy's C API
# (only numpy._core._multiarray_umath) and then ml_dtypes, and with NumPy 2.5.2 and
# ml_dtypes 0.6.0 that order crashed the interpreter in ml_dtypes' init (an H100 test
# machine, `python -c "import cudalab"`); `import numpy, cudalab` never did.
import numpy as _numpy  # noqa: F401

try:
    from . import _core
except ImportError as _error:
    from ._import_hint import import_hint as _import_hint

    _hint = _import_hint(_error)
    if _hint is None:
        raise
    raise ImportError(_hint) from _error
from ._core import (
    MAX_NDIM,
    CublasError,
    CudaError,
    CudalabError,
    DeviceArray,
    DistributedError,
    NcclError,
    NoDeviceError,
    OutOfMemoryError,
    ascontiguousarray,
    asarray,
    copyto,
    asnumpy,
    current_device,
    device_count,
    driver_version,
    empty,
    empty_cache,
    empty_like,
    full,
    full_like,
    get_float32_matmul_precision,
    get_matmul_padding,
    get_per_process_memory_fraction,
    is_available,
    log_softmax,
    max_memory_allocated,
    max_memory_reserved,
    matmul,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    ones,
    ones_like,
    reset_peak_memory_stats,
    runtime_version,
    set_device,
    set_float32_matmul_precision,
    set_matmul_padding,
    set_per_process_memory_fraction,
    softmax,
    synchronize,
    transpose,
    zeros,
    zeros_like,
)
# Element-wise ops and reductions: every function of the C op tables
# (cuda/ops/elementwise_ops.h, reduce_ops.h), re-exported under the names the
# tables give, which _core._ELEMENTWISE_OPS and _core._REDUCTIONS list (a new
# op needs no edit here). `abs`, `pow`, `sum`, `max` and `min` shadow the
# builtins inside this namespace only, as numpy's do. Type checkers find them
# through _core.pyi.
if _TYPE_CHECKING:
    from ._core import *  # noqa: F403
_TABLE_OPS = _core._ELEMENTWISE_OPS + _core._REDUCTIONS
globals().update({_name: getattr(_core, _name) for _name in _TABLE_OPS})
# Pinned host memory and interop.
from ._core import from_dlpack, is_pinned, pinned_empty
# Several GPUs: peer access (copies between devices: DeviceArray.to, copyto).
from ._core import can_access_peer, disable_peer_access, enable_peer_access
from .devices import (
    DeviceProperties,
    device,
    get_device_capability,
    get_device_name,
    get_device_properties,
)
from .memory import memory_summary
from . import random
# Streams, events, CUDA graphs.
from ._core import (CUDAGraph, Event, Stream, current_stream, default_stream,
                    is_current_stream_capturing)
from .streams import graph, stream
# Measurement (issue 5): the timing harness and measured ceilings.
from . import bench
# GPU monitoring through NVML (optional nvidia-ml-py): cudalab.monitor.GpuMonitor.
from . import monitor
# Op profiler (Measurement): cudalab.profiler.profile(), record_function.
from . import profiler

from ._version import __version__

__all__ = [
    "MAX_NDIM",
    "CublasError",
    "CudaError",
    "CudalabError",
    "DeviceArray",
    "DeviceProperties",
    "DistributedError",
    "NcclError",
    "NoDeviceError",
    "OutOfMemoryError",
    "ascontiguousarray",
    "asarray",
    "copyto",
    "asnumpy",
    "current_device",
    "device",
    "device_count",
    "driver_version",
    "empty",
    "empty_cache",
    "empty_like",
    "full",
    "full_like",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_float32_matmul_precision",
    "get_matmul_padding",
    "get_per_process_memory_fraction",
    "is_available",
    "log_softmax",
    "max_memory_allocated",
    "max_memory_reserved",
    "matmul",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "ones",
    "ones_like",
    "random",
    "reset_peak_memory_stats",
    "runtime_version",
    "set_device",
    "set_float32_matmul_precision",
    "set_matmul_padding",
    "set_per_process_memory_fraction",
    "softmax",
    "synchronize",
    "transpose",
    "zeros",
    "zeros_like",
]

__all__ += list(_TABLE_OPS)  # element-wise ops and reductions (the op tables)

__all__ += [  # streams, events, CUDA graphs
    "CUDAGraph",
    "Event",
    "Stream",
    "current_stream",
    "default_stream",
    "graph",
    "is_current_stream_capturing",
    "stream",
]
__all__ += ["from_dlpack", "is_pinned", "pinned_empty"]  # pinned memory, interop
__all__ += ["can_access_peer", "disable_peer_access", "enable_peer_access"]  # several GPUs
__all__ += ["bench", "lessons"]  # measurement, the lessons
__all__ += ["nn"]  # layers, optimizers, loss scaling (loaded lazily)
__all__ += ["models"]  # ResNet-50: architecture, weights, NumPy reference (loaded lazily)
__all__ += ["distributed"]  # NCCL process groups, launcher, data/pipeline parallelism (lazily)
__all__ += ["monitor"]  # GpuMonitor (needs nvidia-ml-py)
__all__ += ["profiler"]  # op profiler


if _TYPE_CHECKING:
    from . import lessons  # noqa: F401  (for type checkers; loaded lazily below)
    from . import nn  # noqa: F401
    from . import models  # noqa: F401
    from . import distributed  # noqa: F401


def __getattr__(name: str):
    # The lessons, nn, models and distributed load on first use, not with every `import cudalab`.
    if name in ("lessons", "nn", "models", "distributed"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
