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
    def copy(self) -> "DeviceArray": ...  # C-contiguous copy
    def astype(self, dtype: _DTypeLike, copy: bool = True) -> "DeviceArray": ...
    @overload
    def reshape(self, shape: _ShapeLike, /) -> "DeviceArray": ...
    @overload
    def reshape(self, *shape: SupportsIndex) -> "DeviceArray": ...
    def __getitem__(self, key: _Index) -> "DeviceArray": ...
    def __len__(self) -> int: ...
    def __array__(self, *args: Any, **kwargs: Any) -> Any: ...  # always raises TypeError

def asarray(obj: Any, dtype: _DTypeLike | None = None) -> DeviceArray: ...
def asnumpy(a: DeviceArray) -> np.ndarray[Any, Any]: ...
def ascontiguousarray(a: DeviceArray) -> DeviceArray: ...
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

# ---- matmul (cuBLASLt / cuBLAS; csrc/blas.c) -------------------------------

def matmul(
    a: DeviceArray,
    b: DeviceArray,
    out: DeviceArray | None = None,
    precision: str | None = None,  # "highest" | "high"; None: the process-wide setting
) -> DeviceArray: ...
def set_float32_matmul_precision(precision: str) -> None: ...  # "highest" | "high"
def get_float32_matmul_precision() -> str: ...  # "highest" (default) | "high" (TF32)

# ---- transpose and device random numbers (ops_transpose.c, ops_random.c) ----

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

# ---- reductions (ops_reduce.c, cuda/reduce.cu) ----------------------------

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

# ---- element-wise ops (ops_elementwise.c, cuda/elementwise.cu) -------------
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
