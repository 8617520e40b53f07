"""A NumPy stand-in for the slice of cudalab that test_properties_gpu.py uses.

tests/test_properties_cpu.py swaps it in for ``cudalab`` inside that module
and runs the property tests on the CPU, with the very cases the GPU run draws:
a strategy that builds an impossible case, a reference or an out= check that
is wrong, fails there and not first on the GPU. It tests the tests, not
cudalab: the semantics here are cudalab's documented ones, built from the same
rules (_properties), and results are rounded once from float64.

"Device memory" is NumPy memory that asarray copies into; views are NumPy
views, so offsets, steps, transposes and aliasing behave as on the device.
Negative slice steps raise ValueError unless DEVICE_NEGATIVE_STEPS, as
DeviceArray indexing does today.
"""

from __future__ import annotations

import numpy as np

import _properties as P
from _support import is_float


class DeviceArray:
    """A NumPy view standing in for a DeviceArray."""

    def __init__(self, a: np.ndarray):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    is_contiguous = property(lambda self: self._a.flags.c_contiguous)
    T = property(lambda self: DeviceArray(self._a.T))

    def __array__(self, dtype=None, copy=None):
        # _support.to_host sees no cudalab.DeviceArray here and asks for this.
        return np.array(self._a, dtype=dtype)

    def __getitem__(self, key):
        items = key if isinstance(key, tuple) else (key,)
        if not P.DEVICE_NEGATIVE_STEPS and any(
                isinstance(k, slice) and k.step is not None and k.step < 0 for k in items):
            raise ValueError("DeviceArray indexing: negative slice steps are not supported")
        # A trailing Ellipsis keeps an all-integer index a 0-d view, as on the device.
        return DeviceArray(self._a[items if Ellipsis in items else (*items, Ellipsis)])

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return DeviceArray(self._a.transpose(axes) if axes else self._a.T)

    def copy(self):
        return DeviceArray(np.array(self._a, order="C"))

    def astype(self, dtype, copy=True):
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        return DeviceArray(np.array(self._a.astype(dtype), order="C"))

    def get(self, out=None, non_blocking=False):
        if out is None:
            return np.array(self._a)
        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError("get() argument 'out': shape or dtype differs")
        out[...] = self._a
        return out

    # The number protocol: + - * / and their in-place forms.
    def _binary(self, other, op, reflected=False, inplace=False):
        if not isinstance(other, (DeviceArray, bool, int, float, np.generic)):
            return NotImplemented
        args = (other, self) if reflected else (self, other)
        return _run(op, args, self if inplace else None)


for _name in P.OPERATOR_OPS:
    setattr(DeviceArray, f"__{'truediv' if _name == 'div' else _name}__",
            lambda self, o, _op=_name: self._binary(o, _op))
    setattr(DeviceArray, f"__r{'truediv' if _name == 'div' else _name}__",
            lambda self, o, _op=_name: self._binary(o, _op, reflected=True))
    setattr(DeviceArray, f"__i{'truediv' if _name == 'div' else _name}__",
            lambda self, o, _op=_name: self._binary(o, _op, inplace=True))


def _key(x):
    if isinstance(x, DeviceArray):
        return x.dtype
    if isinstance(x, np.generic):
        return x.dtype
    return x


def _host(x):
    return x._a if isinstance(x, DeviceArray) else x


def _write(out, values):
    """out= takes the values cast to its dtype; the values were computed first,
    so an out= overlapping the inputs reads them as they were."""
    out._a[...] = np.asarray(values).astype(out.dtype)
    return out


def _new(values, dtype):
    return DeviceArray(np.array(np.asarray(values).astype(dtype), order="C"))


def _run(op, operands, out):
    """An element-wise op: cudalab's result dtype and out= rules, values rounded
    once from the float64 reference."""
    r = P.elementwise_result(op, [_key(o) for o in operands])
    arrays = [o for o in operands if isinstance(o, DeviceArray)]
    if r is None or not arrays:
        raise TypeError(f"{op}(): unsupported operands")
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if out is not None:
        if out.shape != shape:
            raise ValueError(f"{op}() argument 'out': has shape {out.shape}")
        if not P.can_cast(r, out.dtype):
            raise TypeError(f"{op}() argument 'out': does not cast under 'same_kind'")
    values = np.broadcast_to(P.elementwise_reference(op, [_host(o) for o in operands], r), shape)
    return _new(values, r) if out is None else _write(out, values)


def _function(op):
    def call(*args, out=None):
        return _run(op, args, out)

    call.__name__ = op
    return call


for _name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "axpy", "where",
              "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu"):
    globals()[_name] = _function(_name)


def gelu(a, approximate="none", out=None):
    return _run("gelu" if approximate == "none" else "gelu_tanh", (a,), out)


def clamp(a, lo=None, hi=None, out=None):
    return _run("clamp", (a, lo, hi), out)


def _reduction(op):
    def call(a, axis=None, keepdims=False, dtype=None, out=None):
        if isinstance(axis, tuple):
            (axis,) = axis
        if axis is not None and not -a.ndim <= axis < a.ndim:
            raise ValueError(f"{op}() argument 'axis': out of bounds")
        ref, final = P.reduce_reference(op, a._a, axis, keepdims, dtype)  # ValueError when empty
        if out is None:
            return _new(ref, final)
        if out.shape != ref.shape:
            raise ValueError(f"{op}() argument 'out': has shape {out.shape}")
        return _write(out, ref.astype(final))

    return call


sum, mean, max, min, argmax = (_reduction(op) for op in P.REDUCE_OPS)  # noqa: A001


def _softmax(func):
    def call(a, axis=-1, out=None):
        if not is_float(a.dtype):
            raise TypeError(f"{func}() argument 'a': expected a float array")
        values = P.softmax_reference(func, a._a, axis).astype(a.dtype)
        if out is None:
            return _new(values, a.dtype)
        if out.shape != a.shape or out.dtype != a.dtype:
            raise ValueError(f"{func}() argument 'out': shape or dtype differs")
        return _write(out, values)

    return call


softmax, log_softmax = _softmax("softmax"), _softmax("log_softmax")


def matmul(a, b, out=None, precision=None, pad=None):
    if a.dtype != b.dtype or not is_float(a.dtype):
        raise TypeError("matmul(): dtypes")
    values = np.matmul(a._a.astype(np.float64), b._a.astype(np.float64))
    if out is None:
        return _new(values, a.dtype)
    if out.shape != values.shape or out.dtype != a.dtype:
        raise ValueError("matmul() argument 'out': shape or dtype differs")
    if not out.is_contiguous:
        raise ValueError("matmul() argument 'out': must be C-contiguous")
    return _write(out, values)


def get_float32_matmul_precision():
    return "highest"


def transpose(a, method="best"):
    if a.ndim != 2:
        raise ValueError("transpose() argument 'a': expected a 2-D array")
    return DeviceArray(np.array(a._a.T, order="C"))


def ascontiguousarray(a):
    return DeviceArray(np.array(a._a, order="C"))


def copyto(dst, src):
    if not P.can_cast(src.dtype, dst.dtype):
        raise TypeError("copyto() argument 'src': cannot cast under 'same_kind'")
    dst._a[...] = np.broadcast_to(src._a.astype(dst.dtype), dst.shape)  # astype copies first


def asarray(obj, dtype=None, non_blocking=False):
    if isinstance(obj, DeviceArray):
        return obj if dtype is None else obj.astype(dtype)
    obj = np.asarray(obj)
    return DeviceArray(np.array(obj, dtype=obj.dtype if dtype is None else dtype, order="C"))


def asnumpy(a):
    return a.get()


def pinned_empty(shape, dtype=np.float32):
    return np.empty(shape, dtype=dtype)


def synchronize(device=None):
    return None

