"""CPU tier: import, exceptions, version queries and argument validation.

Everything here must pass on a machine without a GPU AND on a GPU machine.
Argument errors are checked before any device access, so they raise the same
TypeError/ValueError either way. Message convention:
``"<func>() argument '<param>': ..."``.

The last section (NoDeviceError) only runs where no GPU is available.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np
import pytest
from _support import arg_error, driver_library_loadable, no_gpu_only

import cudalab

core = cudalab._core


# ---------------------------------------------------------------- import ----


def test_import_and_core_extension():
    """cudalab and its C extension import; the core is a real extension module."""
    mod = importlib.import_module("cudalab._core")
    assert mod is core
    assert Path(mod.__file__).suffix in {".so", ".pyd"}


def _pyi_public_names() -> list[str]:
    pyi = Path(cudalab.__file__).parent / "_core.pyi"
    if not pyi.exists():
        pytest.skip("_core.pyi is not installed next to the package")
    tree = ast.parse(pyi.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
    return sorted({n for n in names if not n.startswith("_")})


def test_every_stub_name_is_reexported():
    """Every public function/class in _core.pyi exists in _core and is cudalab.X."""
    names = _pyi_public_names()
    assert names, "no names found in _core.pyi"
    missing_core = [n for n in names if not hasattr(core, n)]
    assert not missing_core, f"missing from cudalab._core: {missing_core}"
    not_same = [n for n in names if getattr(cudalab, n, None) is not getattr(core, n)]
    assert not not_same, f"not re-exported as cudalab.X: {not_same}"


def test_device_properties_raw_function_exists():
    """The raw property query the Python wrapper builds on is in the core."""
    assert callable(core._device_properties)


@pytest.mark.parametrize(
    "attr",
    [
        "shape", "strides", "dtype", "ndim", "size", "itemsize", "nbytes", "device",
        "data_ptr", "is_contiguous", "is_f_contiguous", "base", "T", "transpose",
        "get", "copy", "astype", "reshape", "__getitem__", "__len__", "__array__",
    ],
)
def test_devicearray_has_documented_attribute(attr):
    """DeviceArray exposes every attribute the stub documents."""
    assert hasattr(cudalab.DeviceArray, attr)


def test_devicearray_cannot_be_instantiated_directly():
    """DeviceArray has no public constructor: use asarray/empty/... instead."""
    with pytest.raises(TypeError):
        cudalab.DeviceArray()
    with pytest.raises(TypeError):
        cudalab.DeviceArray(np.ones(3))


# ------------------------------------------------------------ exceptions ----


def test_exception_hierarchy():
    """The hierarchy is exactly the one in DESIGN.md."""
    E = cudalab
    assert issubclass(E.CudalabError, RuntimeError)
    for cls in (E.CudaError, E.CublasError, E.NoDeviceError, E.OutOfMemoryError):
        assert issubclass(cls, E.CudalabError), cls
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(E.OutOfMemoryError, MemoryError)
    # siblings, not each other's subclasses; only OOM is a MemoryError
    siblings = (E.CudaError, E.CublasError, E.NoDeviceError, E.OutOfMemoryError)
    for a in siblings:
        for b in siblings:
            if a is not b:
                assert not issubclass(a, b), (a, b)
    for cls in (E.CudalabError, E.CudaError, E.CublasError, E.NoDeviceError):
        assert not issubclass(cls, MemoryError), cls


def test_exceptions_are_catchable_as_their_bases():
    """Raising each error is caught through its documented bases."""
    with pytest.raises(RuntimeError):
        raise cudalab.NoDeviceError("no CUDA device")
    with pytest.raises(MemoryError):
        raise cudalab.OutOfMemoryError("Tried to allocate")
    with pytest.raises(cudalab.CudalabError):
        raise cudalab.OutOfMemoryError("Tried to allocate")


# -------------------------------------------------------------- versions ----


def test_is_available_and_device_count_agree():
    """is_available() is a bool, device_count() an int >= 0, and they agree."""
    avail = cudalab.is_available()
    count = cudalab.device_count()
    assert type(avail) is bool
    assert type(count) is int
    assert count >= 0
    assert avail == (count > 0)


def test_runtime_version():
    """runtime_version() is the CUDA runtime as an int, at least 12.0."""
    v = cudalab.runtime_version()
    assert type(v) is int
    assert v >= 12000


def test_driver_version():
    """driver_version() is an int; 0 when no driver is installed; > 0 with a GPU."""
    v = cudalab.driver_version()
    assert type(v) is int
    assert v >= 0
    if cudalab.is_available():
        assert v > 0
    if not driver_library_loadable():
        assert v == 0


# ------------------------------------------------- argument errors: shape ---

CREATORS = {
    "empty": lambda shape, **kw: cudalab.empty(shape, **kw),
    "zeros": lambda shape, **kw: cudalab.zeros(shape, **kw),
    "ones": lambda shape, **kw: cudalab.ones(shape, **kw),
    "full": lambda shape, **kw: cudalab.full(shape, 1.0, **kw),
}


@pytest.mark.parametrize("func", sorted(CREATORS))
@pytest.mark.parametrize("shape", [-1, (2, -3), (-1,), (3, 4, -2)], ids=repr)
def test_negative_shape_is_value_error(func, shape):
    """A negative dimension raises ValueError naming 'shape'."""
    with pytest.raises(ValueError, match=arg_error(func, "shape")):
        CREATORS[func](shape)


@pytest.mark.parametrize("func", sorted(CREATORS))
@pytest.mark.parametrize("shape", [2.5, "a", (2, None), (2, 1.5), None], ids=repr)
def test_non_integer_shape_is_type_error(func, shape):
    """A shape that is not an int or a sequence of ints raises TypeError naming 'shape'."""
    with pytest.raises(TypeError, match=arg_error(func, "shape")):
        CREATORS[func](shape)


@pytest.mark.parametrize("func", sorted(CREATORS))
def test_rank_above_eight_is_value_error(func):
    """Rank 9 exceeds the maximum rank 8: ValueError naming 'shape'."""
    with pytest.raises(ValueError, match=arg_error(func, "shape")):
        CREATORS[func]((1,) * 9)


# ------------------------------------------------- argument errors: dtype ---

# non-native byte order for this host (">" on little-endian machines)
_NON_NATIVE = ">" if np.dtype("<f4").isnative else "<"
BAD_DTYPES = [
    np.complex64, "complex64", np.complex128, object, "U3", "S4", "M8[s]",
    _NON_NATIVE + "f4", _NON_NATIVE + "i8",
]


@pytest.mark.parametrize("func", sorted(CREATORS))
@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
def test_unsupported_dtype_is_type_error(func, dtype):
    """complex, object, str, datetime and non-native byte order are refused."""
    with pytest.raises(TypeError, match=arg_error(func, "dtype")):
        CREATORS[func](3, dtype=dtype)


# -------------------------------------------------- argument errors: full ---


@pytest.mark.parametrize("fill_value", ["x", None, [1.0], object()], ids=repr)
def test_full_bad_fill_value_is_type_error(fill_value):
    """full() refuses a fill_value that is not a real number or bool."""
    with pytest.raises(TypeError, match=arg_error("full", "fill_value")):
        cudalab.full(3, fill_value)


def test_full_bad_fill_value_with_dtype_is_type_error():
    """The fill_value check also applies with an explicit dtype."""
    with pytest.raises(TypeError, match=arg_error("full", "fill_value")):
        cudalab.full((2, 2), "x", dtype=np.float32)


# ----------------------------------------------- argument errors: asarray ---


@pytest.mark.parametrize(
    "obj",
    [
        np.ones(3, dtype=np.complex128),
        np.ones((2, 2), dtype=np.complex64),
        np.array(["a", "bc"], dtype=object),
        np.array(["a", "bc"]),
        np.ones(3, dtype=_NON_NATIVE + "f4"),
    ],
    ids=["complex128", "complex64", "object-strings", "unicode", "non-native"],
)
def test_asarray_unsupported_source_is_type_error(obj):
    """asarray refuses sources whose dtype cudalab does not support."""
    with pytest.raises(TypeError, match=arg_error("asarray", "obj")):
        cudalab.asarray(obj)


def test_asarray_rank_nine_is_value_error():
    """A 9-d source exceeds the maximum rank: ValueError naming 'obj'."""
    with pytest.raises(ValueError, match=arg_error("asarray", "obj")):
        cudalab.asarray(np.ones((1,) * 9, dtype=np.float32))


@pytest.mark.parametrize("dtype", ["complex64", object, "U3"], ids=str)
def test_asarray_bad_dtype_is_type_error(dtype):
    """asarray(np.ones(3), dtype=<unsupported>) names 'dtype'."""
    with pytest.raises(TypeError, match=arg_error("asarray", "dtype")):
        cudalab.asarray(np.ones(3), dtype=dtype)


# ------------------------------------- argument errors: functions taking a ---

A_FUNCS = {
    "empty_like": lambda a: cudalab.empty_like(a),
    "zeros_like": lambda a: cudalab.zeros_like(a),
    "ones_like": lambda a: cudalab.ones_like(a),
    "full_like": lambda a: cudalab.full_like(a, 1.0),
    "asnumpy": lambda a: cudalab.asnumpy(a),
    "ascontiguousarray": lambda a: cudalab.ascontiguousarray(a),
}


@pytest.mark.parametrize("func", sorted(A_FUNCS))
@pytest.mark.parametrize("a", [np.ones(3), [1.0, 2.0], 3.0, None], ids=["ndarray", "list", "float", "None"])
def test_functions_taking_a_devicearray_refuse_others(func, a):
    """Functions that take a DeviceArray refuse NumPy arrays and other objects."""
    with pytest.raises(TypeError, match=arg_error(func, "a")):
        A_FUNCS[func](a)


# --------------------------------------- argument errors: device / memory ---


@pytest.mark.parametrize("device", ["a", 1.0, [0]], ids=repr)
def test_set_device_non_int_is_type_error(device):
    """set_device needs an int device index."""
    with pytest.raises(TypeError, match=arg_error("set_device", "device")):
        cudalab.set_device(device)


def test_set_device_negative_is_value_error():
    """set_device(-1) is out of range."""
    with pytest.raises(ValueError, match=arg_error("set_device", "device")):
        cudalab.set_device(-1)


DEVICE_ARG_FUNCS = [
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "mem_get_info",
    "memory_stats",
    "get_per_process_memory_fraction",
    "synchronize",
]


@pytest.mark.parametrize("func", DEVICE_ARG_FUNCS)
def test_device_keyword_non_int_is_type_error(func):
    """device="x" raises TypeError naming the function and 'device'."""
    with pytest.raises(TypeError, match=arg_error(func, "device")):
        getattr(cudalab, func)(device="x")


@pytest.mark.parametrize("func", DEVICE_ARG_FUNCS)
def test_device_keyword_negative_is_value_error(func):
    """device=-1 raises ValueError naming the function and 'device'."""
    with pytest.raises(ValueError, match=arg_error(func, "device")):
        getattr(cudalab, func)(device=-1)


@pytest.mark.parametrize("fraction", [1.5, 0, 0.0, -0.1, float("nan"), float("inf")], ids=repr)
def test_memory_fraction_out_of_range_is_value_error(fraction):
    """The fraction must lie in (0, 1]."""
    with pytest.raises(ValueError, match=arg_error("set_per_process_memory_fraction", "fraction")):
        cudalab.set_per_process_memory_fraction(fraction)


@pytest.mark.parametrize("fraction", ["a", None, [0.5]], ids=repr)
def test_memory_fraction_non_number_is_type_error(fraction):
    """The fraction must be a real number."""
    with pytest.raises(TypeError, match=arg_error("set_per_process_memory_fraction", "fraction")):
        cudalab.set_per_process_memory_fraction(fraction)


def test_memory_fraction_bad_device_is_checked():
    """set_per_process_memory_fraction also validates its device argument."""
    with pytest.raises(ValueError, match=arg_error("set_per_process_memory_fraction", "device")):
        cudalab.set_per_process_memory_fraction(0.5, device=-1)
    with pytest.raises(TypeError, match=arg_error("set_per_process_memory_fraction", "device")):
        cudalab.set_per_process_memory_fraction(0.5, device="x")


# --------------------------------------------------- without a GPU only -----

NEEDS_GPU = {
    "empty(3)": lambda: cudalab.empty(3),
    "zeros(3)": lambda: cudalab.zeros(3),
    "ones(3)": lambda: cudalab.ones(3),
    "full(3, 1.0)": lambda: cudalab.full(3, 1.0),
    "asarray(np.ones(3))": lambda: cudalab.asarray(np.ones(3)),
    "asarray([1, 2])": lambda: cudalab.asarray([1, 2]),
    "set_device(0)": lambda: cudalab.set_device(0),
    "synchronize()": lambda: cudalab.synchronize(),
    "memory_allocated()": lambda: cudalab.memory_allocated(),
    "memory_reserved()": lambda: cudalab.memory_reserved(),
    "max_memory_allocated()": lambda: cudalab.max_memory_allocated(),
    "max_memory_reserved()": lambda: cudalab.max_memory_reserved(),
    "reset_peak_memory_stats()": lambda: cudalab.reset_peak_memory_stats(),
    "empty_cache()": lambda: cudalab.empty_cache(),
    "set_per_process_memory_fraction(0.5)": lambda: cudalab.set_per_process_memory_fraction(0.5),
    "mem_get_info()": lambda: cudalab.mem_get_info(),
    "memory_stats()": lambda: cudalab.memory_stats(),
    "_device_properties(0)": lambda: core._device_properties(0),
    "current_device()": lambda: cudalab.current_device(),
}


@no_gpu_only
@pytest.mark.parametrize("call", sorted(NEEDS_GPU))
def test_without_gpu_calls_raise_no_device_error(call):
    """Without a GPU every call that needs one raises NoDeviceError saying so."""
    with pytest.raises(cudalab.NoDeviceError, match="no CUDA device"):
        NEEDS_GPU[call]()


@no_gpu_only
def test_without_gpu_queries_do_not_raise():
    """Without a GPU the availability and version queries still answer."""
    assert cudalab.is_available() is False
    assert cudalab.device_count() == 0
    assert cudalab.runtime_version() >= 12000
    assert isinstance(cudalab.driver_version(), int)


@no_gpu_only
def test_without_gpu_argument_errors_win_over_no_device():
    """Argument validation happens before the device check, even without a GPU."""
    with pytest.raises(ValueError, match=arg_error("empty", "shape")):
        cudalab.empty(-1)
    with pytest.raises(TypeError, match=arg_error("zeros", "dtype")):
        cudalab.zeros(3, dtype=np.complex64)
    # and a valid call then reports the missing device
    with pytest.raises(cudalab.NoDeviceError, match="no CUDA device"):
        cudalab.empty(3, dtype=np.float32)
