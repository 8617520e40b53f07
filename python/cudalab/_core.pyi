"""Type stubs for cudalab._core, the C extension (CPython C API + NumPy C API)."""

from typing import Any, Iterator, SupportsIndex, Union, overload

import numpy as np
import numpy.typing as npt

_ShapeLike = Union[SupportsIndex, tuple[SupportsIndex, ...], list[SupportsIndex]]
_DTypeLike = npt.DTypeLike
_Index = Union[SupportsIndex, slice, "EllipsisType", None, tuple[Any, ...]]

# ---- errors ---------------------------------------------------------------

class CudalabError(RuntimeError):
    """Base class of every error cudalab raises for a CUDA-side failure."""

class CudaError(CudalabError):
    code: int  # the cudaError_t value
    name: str  # e.g. "cudaErrorInvalidValue"
    expression: str  # the C call that failed
    file: str
    line: int

class CublasError(CudalabError):
    code: int  # the cublasStatus_t value
    name: str  # e.g. "CUBLAS_STATUS_NOT_SUPPORTED"
    expression: str
    file: str
    line: int

class OutOfMemoryError(CudalabError, MemoryError):
    device: int
    requested: int  # bytes asked for
    allocated: int  # bytes held by live arrays on the device (pool's used memory)
    reserved: int  # bytes the pool holds from the driver
    free: int  # free device memory as the driver reports it
    total: int  # total device memory
    limit: int  # per-process limit in bytes (set_per_process_memory_fraction), total when unset

class NoDeviceError(CudalabError):
    """No CUDA device or driver: raised by every call that needs a GPU."""

# ---- devices --------------------------------------------------------------

def is_available() -> bool: ...
def device_count() -> int: ...
def current_device() -> int: ...
def set_device(device: int) -> None: ...
def synchronize(device: int | None = None) -> None: ...
def runtime_version() -> int: ...  # e.g. 13000 for CUDA 13.0
def driver_version() -> int: ...  # 0 when no driver is installed
# For Python wrappers: check `device` (None: the current one) with errors naming `caller`.
def _parse_device(device: int | None, caller: str, check_only: bool = False) -> int | None: ...
def _exchange_device(device: int, caller: str) -> int: ...  # make current, return the previous
def _device_properties(device: int) -> dict[str, Any]:
    """Raw properties; cudalab.get_device_properties wraps them.

    Keys: name (str), major, minor, total_memory (bytes), multi_processor_count,
    l2_cache_size (bytes), clock_rate_khz (SM peak clock), memory_clock_rate_khz,
    memory_bus_width (bits), max_threads_per_block, max_threads_per_multi_processor,
    shared_memory_per_block, shared_memory_per_block_optin,
    shared_memory_per_multiprocessor, regs_per_multiprocessor, warp_size,
    pci_bus_id (str, "0000:00:00.0" form), uuid (str), ecc_enabled (bool),
    integrated (bool), async_engine_count, concurrent_kernels (bool).
    """

# ---- arrays ---------------------------------------------------------------

class DeviceArray:
    """An n-dimensional array in GPU memory (rank <= 8), strides in bytes."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def is_contiguous(self) -> bool: ...  # C order
    @property
    def is_f_contiguous(self) -> bool: ...
    @property
    def base(self) -> "DeviceArray | None": ...  # the owner of a view, None for an owner
    @property
    def T(self) -> "DeviceArray": ...  # reversed axes, a view
    def transpose(self, *axes: int) -> "DeviceArray": ...  # a view
    def get(self) -> np.ndarray[Any, Any]: ...  # copy to a new NumPy array (same layout when dense)
    def record_stream(self, stream: Stream) -> None: ...  # stream-safe free (streams)

    def get(self, out: np.ndarray[Any, Any] | None = None, non_blocking: bool = False) -> np.ndarray[Any, Any]: ...  # copy to the host (same layout when dense)
    def __dlpack__(self, stream: int | None = None, max_version: tuple[int, int] | None = None, dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def copy(self) -> "DeviceArray": ...  # C-contiguous copy
    def astype(self, dtype: _DTypeLike, copy: bool = True) -> "DeviceArray": ...
    @overload
    def reshape(self, shape: _ShapeLike, /) -> "DeviceArray": ...
    @overload
    def reshape(self, *shape: SupportsIndex) -> "DeviceArray": ...
    def __getitem__(self, key: _Index) -> "DeviceArray": ...
    def __len__(self) -> int: ...
    def __array__(self, *args: Any, **kwargs: Any) -> Any: ...  # always raises TypeError

def asarray(obj: Any, dtype: _DTypeLike | None = None, non_blocking: bool = False) -> DeviceArray: ...
def asnumpy(a: DeviceArray) -> np.ndarray[Any, Any]: ...
def ascontiguousarray(a: DeviceArray) -> DeviceArray: ...
def copyto(dst: DeviceArray, src: DeviceArray) -> None: ...  # np.copyto, 'same_kind'
def empty(shape: _ShapeLike, dtype: _DTypeLike = ...) -> DeviceArray: ...
def zeros(shape: _ShapeLike, dtype: _DTypeLike = ...) -> DeviceArray: ...
def ones(shape: _ShapeLike, dtype: _DTypeLike = ...) -> DeviceArray: ...
def full(shape: _ShapeLike, fill_value: Any, dtype: _DTypeLike | None = None) -> DeviceArray: ...
def empty_like(a: DeviceArray, dtype: _DTypeLike | None = None) -> DeviceArray: ...
def zeros_like(a: DeviceArray, dtype: _DTypeLike | None = None) -> DeviceArray: ...
def ones_like(a: DeviceArray, dtype: _DTypeLike | None = None) -> DeviceArray: ...
def full_like(a: DeviceArray, fill_value: Any, dtype: _DTypeLike | None = None) -> DeviceArray: ...

# ---- memory (stream-ordered pool, one per device) -------------------------

def memory_allocated(device: int | None = None) -> int: ...
def memory_reserved(device: int | None = None) -> int: ...
def max_memory_allocated(device: int | None = None) -> int: ...
def max_memory_reserved(device: int | None = None) -> int: ...
def reset_peak_memory_stats(device: int | None = None) -> None: ...
def empty_cache() -> None: ...
def set_per_process_memory_fraction(fraction: float, device: int | None = None) -> None: ...
def get_per_process_memory_fraction(device: int | None = None) -> float: ...
def mem_get_info(device: int | None = None) -> tuple[int, int]: ...  # (free, total)
def memory_stats(device: int | None = None) -> dict[str, int | float]: ...

# ---- matmul (cuBLASLt / cuBLAS; csrc/ops/matmul.c, matmul_plan.c) ----------------

def matmul(
    a: DeviceArray,
    b: DeviceArray,
    out: DeviceArray | None = None,
    precision: str | None = None,  # "highest" | "high"; None: the process-wide setting
    pad: str | bool | None = None,  # "auto" | True | False; None: the process-wide setting
) -> DeviceArray: ...
def set_float32_matmul_precision(precision: str) -> None: ...  # "highest" | "high"
def get_float32_matmul_precision() -> str: ...  # "highest" (default) | "high" (TF32)
def set_matmul_padding(mode: str | bool) -> None: ...  # "auto" | True | False
def get_matmul_padding() -> str | bool: ...  # "auto" (default) | True | False
def _set_matmul_backend(dtype: _DTypeLike, backend: str) -> str: ...  # "lt" | "cublas"; the previous

# ---- nn Linear on cuBLASLt with fused epilogues (csrc/ops/linear.c) ---------------

def _nn_linear(
    x: DeviceArray,  # (..., in)
    weight: DeviceArray,  # (out, in)
    bias: DeviceArray | None = None,  # (out,), x's dtype
    activation: str | None = None,  # None | "relu" | "gelu" (tanh form)
    out: DeviceArray | None = None,  # (..., out)
    aux: DeviceArray | None = None,  # gelu: pre-activation (..., out); relu: uint8 bit mask
    precision: str | None = None,  # "highest" | "high" (float32)
) -> DeviceArray: ...
def _nn_linear_backward_input(
    grad_y: DeviceArray,  # (..., out)
    weight: DeviceArray,  # (out, in)
    out: DeviceArray | None = None,  # (..., in)
    aux: DeviceArray | None = None,  # the previous layer's aux
    activation: str | None = None,  # the previous layer's activation
    bias_grad: DeviceArray | None = None,  # (in,), the previous layer's bias gradient
    precision: str | None = None,
) -> DeviceArray: ...
def _nn_linear_backward_weight(
    grad_y: DeviceArray,  # (..., out)
    x: DeviceArray,  # (..., in)
    out: DeviceArray | None = None,  # (out, in)
    bias_grad: DeviceArray | None = None,  # (out,), overwritten
    accumulate: bool = False,  # out += grad_y.T @ x
    precision: str | None = None,
) -> DeviceArray: ...

# ---- transpose and device random numbers (csrc/ops/transpose.c, random.c) ----

from typing import Literal, Sequence

_TransposeMethod = Literal["naive", "coalesced_write", "tiled", "tiled_padded", "best"]

def transpose(a: DeviceArray, method: _TransposeMethod = "best") -> DeviceArray: ...  # new C-contiguous a.T
def _random_normal(
    shape: _ShapeLike, mean: float = 0.0, std: float = 1.0, dtype: _DTypeLike | None = None,
    seed: int = 0, offset: int = 0,
) -> DeviceArray: ...
def _random_uniform(
    shape: _ShapeLike, low: float = 0.0, high: float = 1.0, dtype: _DTypeLike | None = None,
    seed: int = 0, offset: int = 0,
) -> DeviceArray: ...
def _random_integers(
    shape: _ShapeLike, low: int, high: int | None = None, dtype: _DTypeLike | None = None,
    seed: int = 0, offset: int = 0,
) -> DeviceArray: ...
def _philox4x32_10(
    counter: Sequence[int], key: Sequence[int]
) -> tuple[int, int, int, int]: ...  # one block on the device (known-answer tests)

# ---- reductions, softmax (csrc/ops/reduce.c, cuda/ops/reduce.cu, softmax.cu) -------

_Axis = Union[SupportsIndex, tuple[SupportsIndex], None]

def sum(
    a: DeviceArray,
    axis: _Axis = None,
    keepdims: bool = False,
    dtype: _DTypeLike | None = None,
    out: DeviceArray | None = None,
) -> DeviceArray: ...
def mean(
    a: DeviceArray,
    axis: _Axis = None,
    keepdims: bool = False,
    dtype: _DTypeLike | None = None,
    out: DeviceArray | None = None,
) -> DeviceArray: ...
def max(a: DeviceArray, axis: _Axis = None, keepdims: bool = False, out: DeviceArray | None = None) -> DeviceArray: ...
def min(a: DeviceArray, axis: _Axis = None, keepdims: bool = False, out: DeviceArray | None = None) -> DeviceArray: ...
def argmax(a: DeviceArray, axis: _Axis = None, keepdims: bool = False, out: DeviceArray | None = None) -> DeviceArray: ...
def softmax(a: DeviceArray, axis: SupportsIndex = -1, out: DeviceArray | None = None) -> DeviceArray: ...
def log_softmax(a: DeviceArray, axis: SupportsIndex = -1, out: DeviceArray | None = None) -> DeviceArray: ...

# ---- element-wise ops (the table cuda/ops/elementwise_ops.h; csrc/ops/elementwise.c) -----
# Operands: DeviceArray or real scalars (Python scalars are weak, NEP 50);
# NumPy broadcasting; result dtype as NumPy 2; `out` may alias an input.

_Operand = Union[DeviceArray, bool, int, float, np.generic]
_Scalar = Union[bool, int, float, np.generic]

def add(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def sub(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def mul(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def div(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def maximum(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def minimum(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def axpy(
    alpha: _Scalar, x: _Operand, y: _Operand, out: DeviceArray | None = None
) -> DeviceArray: ...  # alpha * x + y, fused
def neg(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def abs(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def exp(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def log(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def sqrt(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def tanh(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def sigmoid(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def relu(a: DeviceArray, out: DeviceArray | None = None) -> DeviceArray: ...
def gelu(
    a: DeviceArray, approximate: str = "none", out: DeviceArray | None = None
) -> DeviceArray: ...  # approximate: "none" (erf) or "tanh"
def pow(a: _Operand, b: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def clamp(
    a: DeviceArray,
    lo: _Operand | None = None,
    hi: _Operand | None = None,
    out: DeviceArray | None = None,
) -> DeviceArray: ...  # at least one of lo, hi
def where(
    cond: DeviceArray, a: _Operand, b: _Operand, out: DeviceArray | None = None
) -> DeviceArray: ...  # a where cond, else b
def relu_grad(grad: _Operand, x: _Operand, out: DeviceArray | None = None) -> DeviceArray: ...
def gelu_grad(
    grad: _Operand, x: _Operand, approximate: str = "none", out: DeviceArray | None = None
) -> DeviceArray: ...  # grad * d/dx gelu(x)
def _elementwise_functions() -> tuple[str, ...]: ...
def _elementwise_result_type(func: str, *operands: object) -> np.dtype: ...

# ---- nn losses (csrc/ops/loss.c, cuda/ops/cross_entropy.cu) ------------------------------

def _nn_cross_entropy(
    logits: DeviceArray,
    labels: DeviceArray,
    grad: DeviceArray | None = None,
    reduction: str = "mean",
    loss_scale: DeviceArray | None = None,
    out: DeviceArray | None = None,
    ignore_index: int | None = -100,
) -> DeviceArray: ...  # 0-d float32 ('mean', 'sum') or (N,) float32 ('none')

# ---- streams, events, CUDA graphs (csrc/runtime/stream.c, graph.c) ------------------------

class Stream:
    def __new__(cls, priority: int = 0, device: int | None = None) -> Stream: ...
    @property
    def device(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def cuda_stream(self) -> int: ...  # 0: the legacy default stream
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def wait_event(self, event: Event) -> None: ...
    def wait_stream(self, stream: Stream) -> None: ...
    def record_event(self, event: Event | None = None) -> Event: ...
    def __enter__(self) -> Stream: ...
    def __exit__(self, *exc: object) -> bool: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Event:
    def __new__(cls, enable_timing: bool = True, blocking: bool = False) -> Event: ...
    @property
    def device(self) -> int: ...
    @property
    def cuda_event(self) -> int: ...
    def record(self, stream: Stream | None = None) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Event) -> float: ...  # milliseconds

class CUDAGraph:
    def __new__(cls) -> CUDAGraph: ...
    @property
    def capturing(self) -> bool: ...
    @property
    def captured(self) -> bool: ...
    def capture_begin(self, stream: Stream) -> None: ...
    def capture_end(self) -> None: ...
    def _abort_capture(self) -> None: ...
    def replay(self) -> None: ...
    def reset(self) -> None: ...

def is_current_stream_capturing() -> bool: ...
def current_stream(device: int | None = None) -> Stream: ...
def default_stream(device: int | None = None) -> Stream: ...


# ---- pinned host memory and interop (csrc/runtime/memory.c, csrc/array/interop.c) ------------------
# asarray(obj, dtype=None, non_blocking=False) also takes foreign device arrays
# (DLPack producers on CUDA first, then __cuda_array_interface__) without a copy;
# DeviceArray gains get(out=None, non_blocking=False), __cuda_array_interface__,
# __dlpack__(stream=None, max_version=None, dl_device=None, copy=None) and
# __dlpack_device__() -> (2, device).

def pinned_empty(shape: int | tuple[int, ...], dtype: _DTypeLike = ...) -> np.ndarray: ...
def is_pinned(a: np.ndarray) -> bool: ...
def from_dlpack(obj: object) -> DeviceArray: ...


# ---- profiler (csrc/prof/profiler.c); cudalab.profiler is the public face ---------------

def _profiler_enable() -> None: ...  # RuntimeError when a profile already records
def _profiler_disable() -> dict[str, Any]:
    """Stop recording: {"events": [dict with ProfilerEvent's fields, ...],
    "start_ns": int, "end_ns": int, "origins": {device: (host_ns, uncertainty_ns)}}."""
def _profiler_is_enabled() -> bool: ...
def _profiler_range_begin(name: str) -> tuple[int, int, bool] | None: ...  # token or None
def _profiler_range_end(token: tuple[int, int, bool] | None) -> None: ...
def _nvtx_set_enabled(enabled: bool) -> bool: ...  # returns the previous setting
def _nvtx_is_enabled() -> bool: ...


# ---- nn: fused multi-tensor scaler and optimizer kernels (csrc/ops/optim.c) ------------
# In place, on the current stream, no host synchronization; lists are lists or
# tuples of C-contiguous DeviceArrays; every device scalar is a 1-element array.

_Arrays = Union[list[DeviceArray], tuple[DeviceArray, ...]]

def _nn_unscale_(grads: _Arrays, inv_scale: DeviceArray, found_inf: DeviceArray) -> None: ...
def _nn_update_scale_(
    scale: DeviceArray, growth_tracker: DeviceArray, found_inf: DeviceArray,
    growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000,
) -> None: ...
def _nn_sgd_(
    params: _Arrays, grads: _Arrays, momentum_buffers: _Arrays | None, lr: float | DeviceArray,
    momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
    nesterov: bool = False, found_inf: DeviceArray | None = None,
    grad_scale: DeviceArray | None = None, first_step: bool = False,
) -> None: ...
def _nn_adamw_(
    params: _Arrays, grads: _Arrays, exp_avgs: _Arrays, exp_avg_sqs: _Arrays, step: DeviceArray,
    lr: float | DeviceArray, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
    weight_decay: float = 0.01, found_inf: DeviceArray | None = None,
    grad_scale: DeviceArray | None = None,
) -> None: ...

# ---- models: a network forward as one compiled program (csrc/ops/convnet.c) ----------------
# steps: tuples ("im2col" | "max_pool" | "avg_pool" | "gemm", ...) over slot indices and byte
# offsets (format at the top of convnet.c; cudalab.models.plan writes them).
def _convnet_compile(steps: tuple[tuple[Any, ...], ...], slots: tuple[DeviceArray, ...], name: str) -> Any: ...  # a program capsule
def _convnet_run(program: Any, slots: tuple[DeviceArray, ...]) -> None: ...
