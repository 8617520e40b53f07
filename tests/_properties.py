"""Strategies, value domains, dtype rules and NumPy references for the
property-based differential tests (test_properties_gpu.py).

Everything here is pure Python and NumPy, so tests/test_properties_cpu.py
checks it without a GPU: a wrong reference or a strategy that breaks its own
invariants shows up in the CPU tier, not as a puzzling GPU failure.

Every case a strategy draws is a frozen dataclass of plain values (ints,
strings, tuples, `Layout`), and the data is made from its `seed`. So the
"Falsifying example" line hypothesis prints is valid Python: paste it into an
``@example(case=...)`` above the test and it runs again exactly.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from _references import NUMPY_REFERENCES
from _support import (BF16, BOOL, DTYPES, F16, F32, F64, I8, I64, U8, View, is_float, is_int,
                      random_array)

# Every layout of a *device* operand is also drawn with negative steps
# (DeviceArray slicing makes them since issue 21). Host layouts (the
# round-trip family's NumPy views) step backwards as well.
DEVICE_NEGATIVE_STEPS = True

DTYPE_NAMES = [d.name for d in DTYPES]
FLOAT_NAMES = ["float16", "bfloat16", "float32", "float64"]

# Unit roundoff (half an ulp at 1) of each float dtype.
UNIT_ROUNDOFF = {F64: 2.0**-53, F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}

# Python float scalars are k/8 with |k| <= 32: exact in every float dtype
# (bfloat16 keeps 8 significant bits), so rounding a weak scalar to the
# result dtype first (NumPy) or not (a kernel computing in float32) agrees.
SCALAR_EIGHTHS = 8


# ===================================================================== layouts


@dataclass(frozen=True)
class Layout:
    """Where an operand of some logical shape sits: ``root[key].transpose(perm)``.

    steps[i], offsets[i]: the slice taking logical axis i out of its root axis
    (step 1 and offset 0 is dense; a negative step walks backwards); perm[i]:
    the root axis that becomes logical axis i (the identity: no transpose).
    """

    steps: tuple
    offsets: tuple
    perm: tuple

    @property
    def negative(self) -> bool:
        return any(s < 0 for s in self.steps)

    def view(self, shape) -> View:
        """The `View` (root shape, key, perm) giving this layout for `shape`."""
        shape = tuple(shape)
        assert len(shape) == len(self.steps) == len(self.offsets) == len(self.perm), (shape, self)
        root = [0] * len(shape)
        key = [slice(None)] * len(shape)
        for i, n in enumerate(shape):
            axis, step, offset = self.perm[i], self.steps[i], self.offsets[i]
            span = (n - 1) * abs(step) + 1 if n > 0 else 0
            root[axis] = offset + span
            if n == 0:
                key[axis] = slice(offset, offset, step)
            elif step > 0:
                key[axis] = slice(offset, offset + n * step, step)
            else:
                # Backwards from the last element to the offset; stop=None
                # when the offset is 0 (-1 would mean "the last element").
                key[axis] = slice(offset + span - 1, offset - 1 if offset > 0 else None, step)
        return View("layout", tuple(root), tuple(key), tuple(self.perm))


def contiguous(ndim: int) -> Layout:
    return Layout((1,) * ndim, (0,) * ndim, tuple(range(ndim)))


@st.composite
def layouts(draw, ndim: int, negative: bool = False):
    """A dense C layout, or steps 1..3, offsets 0..2 and an axis permutation."""
    if draw(st.booleans()):
        return contiguous(ndim)
    steps = []
    for _ in range(ndim):
        step = draw(st.integers(1, 3))
        if negative and draw(st.booleans()):
            step = -step
        steps.append(step)
    offsets = tuple(draw(st.integers(0, 2)) for _ in range(ndim))
    perm = tuple(draw(st.permutations(range(ndim))))
    return Layout(tuple(steps), offsets, perm)


def device_layouts(ndim: int):
    """Layouts a DeviceArray view can have (see DEVICE_NEGATIVE_STEPS)."""
    return layouts(ndim, negative=DEVICE_NEGATIVE_STEPS)


# ====================================================================== shapes


@st.composite
def shapes(draw, min_ndim: int = 0, max_ndim: int = 4, max_extent: int = 6):
    """Extents 1..max_extent; one shape in ten has an extent of 0 (empty)."""
    ndim = draw(st.integers(min_ndim, max_ndim))
    shape = [draw(st.integers(1, max_extent)) for _ in range(ndim)]
    if ndim and draw(st.integers(0, 9)) == 0:
        shape[draw(st.integers(0, ndim - 1))] = 0
    return tuple(shape)


def elementwise_shapes():
    """Small n-d shapes, or one long axis (the kernels' vector paths and tails)."""
    return st.one_of(shapes(), st.tuples(st.integers(1, 3000)))


@st.composite
def broadcast_to(draw, shape):
    """A shape that broadcasts to `shape`: leading axes dropped, some extents 1."""
    drop = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else n for n in shape[drop:])


# ======================================================================= values
#
# Domains keep every op well conditioned (no overflow, no cancellation that a
# relative error bound cannot absorb) and every value away from 0:
#   signed    floats +-[0.25, 4); integers +-1..9 (uint8 1..9); bool mixed
#   positive  floats [0.25, 4); integers 1..9; bool all True (log, sqrt, sums)
#   exponent  floats +-[0.25, 2); integers 0..3; bool mixed (pow's exponent)
#   gelu      floats [-2, 4) (1 + erf(x / sqrt 2) cancels below -2); integers 1..9
#   cond      like signed, but about 30% zeros (where's condition)
#   raw       any bits a copy must keep: _support.random_array's data (normal
#             floats, integers up to +-2**40) with about 5% NaN, +-inf, -0.0
# bool "mixed" is random with at least one True.

DOMAINS = ("signed", "positive", "exponent", "gelu", "cond", "raw")


def values(rng: np.random.Generator, shape, dtype, domain: str) -> np.ndarray:
    """values(rng, shape, dtype, domain) -> ndarray: random C-contiguous data."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if domain not in DOMAINS:
        raise ValueError(f"values: unknown domain {domain!r}")
    if domain == "raw":
        return special_floats(rng, random_array(rng, shape, dtype))
    if dtype == BOOL:
        if domain == "positive":
            return np.ones(shape, dtype=bool)
        out = np.asarray(rng.random(shape) < 0.5)
        return _not_all_zero(out, True)
    if is_int(dtype):
        low, high = {"signed": (-9, 9), "positive": (1, 9), "exponent": (0, 3),
                     "gelu": (1, 9), "cond": (-3, 3)}[domain]
        if dtype == U8:
            low = max(low, 0)
        out = np.asarray(rng.integers(low, high + 1, size=shape))
        if domain in ("signed", "positive", "gelu"):
            out[out == 0] = high  # never 0
        return _not_all_zero(out.astype(dtype), 1)
    if domain == "signed":
        out = np.asarray(rng.uniform(0.25, 4.0, size=shape) * rng.choice([-1.0, 1.0], size=shape))
    elif domain == "positive":
        out = np.asarray(rng.uniform(0.25, 4.0, size=shape))
    elif domain == "exponent":
        out = np.asarray(rng.uniform(0.25, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape))
    elif domain == "gelu":
        out = np.asarray(rng.uniform(-2.0, 4.0, size=shape))
        out[np.abs(out) < 1e-3] = 1.0
    else:  # cond
        out = np.asarray(rng.uniform(0.25, 4.0, size=shape) * rng.choice([-1.0, 1.0], size=shape))
        out[rng.random(shape) < 0.3] = 0.0
        out = _not_all_zero(out, 1.0)
    return np.asarray(out).astype(dtype)


def _not_all_zero(a: np.ndarray, value) -> np.ndarray:
    """A nonempty `a` with no nonzero element gets `value` in its first element."""
    if a.size and not np.any(a):
        a.reshape(-1)[0] = value
    return a


def cast_values(rng: np.random.Generator, shape, src, dst) -> np.ndarray:
    """cast_values(rng, shape, src, dst) -> ndarray of dtype `src`

    Data whose conversion to `dst` NumPy defines: integers -100..100 (uint8
    0..200), floats in (-100, 100) ([0, 100) when `dst` is uint8, so no
    float -> integer cast is out of range: another change defines those).
    About 20% zeros (casts to bool), never all zeros. Integer -> integer casts
    may wrap (int32 -5 -> uint8 251), as NumPy's astype does.
    """
    src, dst = np.dtype(src), np.dtype(dst)
    shape = tuple(shape)
    if src == BOOL:
        return _not_all_zero(np.asarray(rng.random(shape) < 0.5), True)
    if is_int(src):
        low, high = (0, 200) if src == U8 else (-100, 100)
        out = np.asarray(rng.integers(low, high + 1, size=shape))
    else:
        low = 0.0 if dst == U8 else -99.5
        out = np.asarray(rng.uniform(low, 99.5, size=shape))
    out[rng.random(shape) < 0.2] = 0
    return _not_all_zero(np.asarray(out).astype(src), 1)


def special_floats(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """About 5% of a float array's elements made NaN, +-inf or -0.0 (copies must keep them)."""
    if not is_float(a.dtype) or a.size == 0:
        return a
    a = a.copy()
    where = rng.random(a.shape) < 0.05
    picks = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0]), size=a.shape)
    a[where] = picks[where].astype(a.dtype)
    return a


# ================================================================ operand specs


@dataclass(frozen=True)
class Arr:
    """An array operand: its logical shape, dtype name and memory layout."""

    shape: tuple
    dtype: str
    layout: Layout

    def view(self) -> View:
        return self.layout.view(self.shape)


@dataclass(frozen=True)
class Scalar:
    """A scalar operand: a Python scalar (weak, NEP 50), or a NumPy scalar of
    dtype `numpy` (strong: promotes like a 0-d array)."""

    value: object
    numpy: str | None = None

    def make(self):
        return self.value if self.numpy is None else np.dtype(self.numpy).type(self.value)

    @property
    def dtype_key(self):
        """What promotion sees: the NumPy dtype, or the Python scalar itself."""
        return np.dtype(self.numpy) if self.numpy is not None else self.value


@dataclass(frozen=True)
class Out:
    """out=: mode "none"; "alias" (out is operand `target` itself); "strided"
    (a view of dtype `dtype` and layout `layout` into a larger array whose other
    elements must stay untouched); "overlap" (operand `target` is root[1:] and
    out is root[:-1] of one array: they overlap, shifted by one row)."""

    mode: str = "none"
    dtype: str | None = None
    layout: Layout | None = None
    target: int = 0


def dtype_key(spec):
    """What promotion sees of an operand spec (None: an absent clamp bound)."""
    if spec is None:
        return None
    if isinstance(spec, Arr):
        return np.dtype(spec.dtype)
    return spec.dtype_key


# ================================================================= dtype rules


def strong_result(dtypes) -> np.dtype | None:
    """np.result_type of strong dtypes, or None where NumPy refuses or gives a
    dtype cudalab lacks (int8 with uint8 is int16; bfloat16 with int32, int64
    or float16 raises in NumPy)."""
    try:
        r = np.result_type(*dtypes)
    except TypeError:
        return None
    return r if r in DTYPES else None


def promote(keys) -> np.dtype | None:
    """NEP 50 promotion of operands: NumPy dtypes are strong (arrays, NumPy
    scalars), Python bool/int/float are weak (they never change a dtype of
    their own kind or above). None where the strong part has no result."""
    keys = [k for k in keys if k is not None]
    strong = [k for k in keys if isinstance(k, np.dtype)]
    weak = [k for k in keys if not isinstance(k, np.dtype)]
    r = strong_result(strong) if strong else BOOL
    if r is None:
        return None
    for w in weak:
        if isinstance(w, float) and not is_float(r):
            r = F64
        elif isinstance(w, int) and not isinstance(w, bool) and r == BOOL:
            r = I64
    return r


def compatible(dtypes) -> list[str]:
    """Dtype names that promote with all of `dtypes` (strong) to a supported dtype."""
    return [n for n in DTYPE_NAMES if strong_result([*dtypes, np.dtype(n)]) is not None]


UNARY_OPS = ["neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh"]
BINARY_OPS = ["add", "sub", "mul", "div", "maximum", "minimum", "pow"]
TERNARY_OPS = ["axpy", "clamp", "where"]
OPERATOR_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

# Results that are one of the inputs (or a sign flip of one): exact in any dtype.
EXACT_OPS = {"neg", "abs", "relu", "maximum", "minimum", "clamp", "where"}
# One rounding of the exact result (fma for axpy).
ARITHMETIC_OPS = {"add", "sub", "mul", "div", "axpy"}
# Math library functions: a few ulp.
TRANSCENDENTAL_OPS = {"exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "gelu_tanh", "pow"}
FLOAT_RULE_OPS = {"exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "gelu_tanh"}
NO_BOOL_OPS = {"sub", "neg", "relu"}


def elementwise_result(op: str, keys) -> np.dtype | None:
    """The result dtype of element-wise `op` (cuda/ops/elementwise_ops.h's rules
    over NumPy 2 promotion); None where cudalab and NumPy raise TypeError.

    `keys` are dtype_key()s of the operands in call order (for where: cond first,
    which does not take part; for axpy: alpha, x, y)."""
    if op == "where":
        keys = keys[1:]
    r = promote(keys)
    if r is None:
        return None
    if op in NO_BOOL_OPS and r == BOOL:
        return None
    if op == "div" and not is_float(r):
        return F64
    if op in FLOAT_RULE_OPS and not is_float(r):
        return F16 if r in (BOOL, I8, U8) else F64
    if op == "pow" and r == BOOL:
        return I8  # NumPy has no bool power loop
    return r


def can_cast(src, dst) -> bool:
    return bool(np.can_cast(np.dtype(src), np.dtype(dst), "same_kind"))


def operand_domain(op: str, position: int, dtype) -> str:
    """The value domain of operand `position` of `op` (see values())."""
    if op in ("log", "sqrt"):
        return "positive"
    if op in ("gelu", "gelu_tanh"):
        return "gelu"
    if op == "pow":
        return "positive" if position == 0 else "exponent"
    if op == "where" and position == 0:
        return "cond"
    return "signed"


@st.composite
def scalars(draw, domain: str, numpy_dtypes):
    """A Python or NumPy scalar exact in every dtype it may meet (see SCALAR_EIGHTHS)."""
    kinds = ["int", "float", "bool"] + (["numpy"] if numpy_dtypes else [])
    kind = draw(st.sampled_from(kinds))
    top_int = 3 if domain == "exponent" else 7
    top_k = 16 if domain == "exponent" else 32
    signed_float = domain in ("signed", "exponent", "cond")
    if kind == "bool":
        return Scalar(True)
    if kind == "int":
        return Scalar(draw(st.integers(1, top_int)))
    k = draw(st.integers(2, top_k))
    if signed_float and draw(st.booleans()):
        k = -k
    if kind == "float":
        return Scalar(k / SCALAR_EIGHTHS)
    name = draw(st.sampled_from(numpy_dtypes))
    d = np.dtype(name)
    if d == BOOL:
        return Scalar(True, name)
    if is_int(d):
        return Scalar(draw(st.integers(1, top_int)), name)
    return Scalar(k / SCALAR_EIGHTHS, name)


# ========================================================== element-wise cases


@dataclass(frozen=True)
class EwCase:
    """One element-wise call: `op` on `operands` (Arr, Scalar or None for an
    absent clamp bound), out= as `out` says, as a function or (form="operator")
    through ``a + b`` / ``a += b``; `same` makes b the very array a (binary)."""

    op: str
    operands: tuple
    out: Out = Out()
    form: str = "function"
    same: bool = False
    seed: int = 0


@st.composite
def _operand_dtypes(draw, count: int, first=None) -> list:
    """`count` dtype names that promote together (strongly) to a supported dtype."""
    names = [first] if first is not None else []
    while len(names) < count:
        names.append(draw(st.sampled_from(compatible([np.dtype(n) for n in names]))))
    return names


@st.composite
def _out(draw, op: str, operands, result_shape, modes):
    """An Out for the call: alias/overlap only onto an array operand with the
    full result shape (overlap: also a dense layout and at least one row)."""
    mode = draw(st.sampled_from(modes))
    full = [i for i, o in enumerate(operands)
            if isinstance(o, Arr) and o.shape == tuple(result_shape)]
    if mode == "alias" and full:
        target = draw(st.sampled_from(full))
        return Out("alias", operands[target].dtype, None, target)
    dense_rows = [i for i in full if len(result_shape) >= 1 and result_shape[0] >= 1
                  and operands[i].layout == contiguous(len(result_shape))]
    if mode == "overlap" and dense_rows:
        target = draw(st.sampled_from(dense_rows))
        return Out("overlap", operands[target].dtype, None, target)
    if mode in ("alias", "overlap", "strided"):
        keys = [dtype_key(o) for o in operands]
        r = elementwise_result(op, keys)
        # Mostly the result dtype itself; sometimes any dtype (a same_kind cast, or TypeError).
        if r is not None and draw(st.booleans()):
            name = r.name
        else:
            name = draw(st.sampled_from(DTYPE_NAMES))
        return Out("strided", name, draw(device_layouts(len(result_shape))))
    return Out()


@st.composite
def unary_cases(draw):
    op = draw(st.sampled_from(UNARY_OPS))
    shape = draw(elementwise_shapes())
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    a = Arr(shape, dtype, draw(device_layouts(len(shape))))
    out = draw(_out(op, (a,), shape, ["none", "alias", "strided", "overlap"]))
    return EwCase(op, (a,), out, seed=draw(st.integers(0, 2**32 - 1)))


@st.composite
def _operands(draw, op: str, count: int, shape, full: int):
    """`count` operands of `op` whose shapes broadcast to at most `shape`;
    operand `full` is an array of exactly `shape`; others may be scalars."""
    dtypes = draw(_operand_dtypes(count))
    operands = []
    for i in range(count):
        if i != full and draw(st.integers(0, 3)) == 0:
            numpy_ok = [n for n in compatible([np.dtype(d) for d in dtypes]) if n != "bfloat16"]
            operands.append(draw(scalars(operand_domain(op, i, None), numpy_ok)))
            continue
        s = shape if i == full else draw(broadcast_to(shape))
        operands.append(Arr(s, dtypes[i], draw(device_layouts(len(s)))))
    # A NumPy scalar standing in for an array changes the strong set: keep only
    # cases NumPy itself can promote (cudalab's extra bfloat16 rules aside).
    assume(promote([dtype_key(o) for o in operands]) is not None)
    return tuple(operands)


@st.composite
def binary_cases(draw):
    op = draw(st.sampled_from(BINARY_OPS))
    shape = draw(elementwise_shapes())
    full = draw(st.integers(0, 1))
    operands = draw(_operands(op, 2, shape, full))
    same = draw(st.integers(0, 9)) == 0  # b is a itself: add(x, x, out=x)
    if same:
        operands = (Arr(shape, operands[full].dtype, operands[full].layout),) * 2
        full = 0
    form = "function"
    numpy_first = isinstance(operands[0], Scalar) and operands[0].numpy is not None
    if op in OPERATOR_OPS and not numpy_first and draw(st.booleans()):
        form = "operator"  # (a NumPy scalar on the left would ask NumPy first)
    modes = ["none", "alias", "strided"] + (["overlap"] if not same else [])
    if form == "operator":
        modes = ["none", "alias"]
    out = draw(_out(op, operands, shape, modes))
    if form == "operator" and not (out.mode == "none" or (out.mode == "alias" and out.target == 0)):
        out = Out()  # an operator has no out=; only ``a op= b`` writes into an operand
    return EwCase(op, operands, out, form, same, draw(st.integers(0, 2**32 - 1)))


@st.composite
def ternary_cases(draw):
    op = draw(st.sampled_from(TERNARY_OPS))
    shape = draw(elementwise_shapes())
    if op == "axpy":
        # alpha is always a scalar; x or y holds the full shape.
        full = draw(st.integers(1, 2))
        xy = draw(_operands(op, 2, shape, full - 1))
        strong = [dtype_key(o) for o in xy if isinstance(dtype_key(o), np.dtype)]
        numpy_ok = [n for n in compatible(strong) if n != "bfloat16"]
        alpha = draw(scalars("signed", numpy_ok))
        operands = (alpha, *xy)
        assume(promote([dtype_key(o) for o in operands]) is not None)
    elif op == "clamp":
        operands = list(draw(_operands(op, 3, shape, 0)))
        absent = draw(st.sampled_from([None, 1, 2]))  # at most one bound missing
        if absent is not None:
            operands[absent] = None
        operands = tuple(operands)
    else:  # where: cond (any dtype, any shape that broadcasts), then a and b
        full = draw(st.integers(0, 2))
        ab = draw(_operands(op, 2, shape, 0))
        cond_shape = shape if full == 0 else draw(broadcast_to(shape))
        cond = Arr(cond_shape, draw(st.sampled_from(DTYPE_NAMES)),
                   draw(device_layouts(len(cond_shape))))
        operands = (cond, *ab)
    out = draw(_out(op, operands, shape, ["none", "alias", "strided"]))
    return EwCase(op, operands, out, seed=draw(st.integers(0, 2**32 - 1)))


# ======================================================== element-wise reference


# The one reference table (tests/_references.py), keyed like the ops drawn here.
NUMPY_OPS = NUMPY_REFERENCES


def _axpy_exact(alpha, x, y) -> np.ndarray:
    """alpha * x + y rounded once to float64, as an fma is: exact rationals.
    (NumPy's ``alpha * x + y`` rounds twice, which a float64 result would see.)"""
    def one(a, b, c):
        return float(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))

    return np.vectorize(one, otypes=[np.float64])(alpha, x, y)


def elementwise_reference(op: str, inputs, r) -> np.ndarray:
    """The expected values of `op` on host `inputs` (arrays, scalars, None).

    For a float result dtype `r`: computed in float64 from the inputs' exact
    values (exact ops are then rounded to `r`, which is exact). For integer
    and bool results: computed by NumPy in `r` itself, so wrapping matches.
    where's condition keeps its own dtype (only its truth matters).
    """
    r = np.dtype(r)
    work = np.float64 if is_float(r) else r
    args = []
    for i, x in enumerate(inputs):
        if x is None:
            args.append(None)
        elif op == "where" and i == 0:
            args.append(np.asarray(x))
        else:
            args.append(np.asarray(x).astype(work))
    with np.errstate(all="ignore"):
        if op == "axpy" and r == F64:
            ref = _axpy_exact(*args)
        else:
            ref = np.asarray(NUMPY_OPS[op](*args))
    if not is_float(r) or op in EXACT_OPS:
        return ref.astype(r)
    return ref


def is_exact(op: str, r) -> bool:
    """Whether `op` with result dtype `r` must equal its reference exactly."""
    return op in EXACT_OPS or not is_float(r)


def family_of(op: str) -> str:
    """The tolerance family of an inexact element-wise op."""
    return "arithmetic" if op in ARITHMETIC_OPS else "transcendental"


def cast_bound(src, dst) -> float:
    """The relative error one cast from `src` to `dst` may add: 0 when it is
    exact (same dtype, a safe widening, integers), else two unit roundoffs of
    the float `dst`."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst or np.can_cast(src, dst, "safe") or not is_float(dst):
        return 0.0
    return 2 * UNIT_ROUNDOFF[dst]


# ================================================================== reductions

REDUCE_OPS = ["sum", "mean", "max", "min", "argmax"]


def reduce_natural(op: str, dtype) -> np.dtype:
    """What the kernels produce for `op` on `dtype` (cuda/ops/reduce_ops.h):
    sum of bool/integers int64 (NumPy: uint64 for uint8), mean of bool/integers
    float64, argmax int64, otherwise the input's dtype."""
    dtype = np.dtype(dtype)
    if op == "argmax":
        return I64
    if op in ("max", "min") or is_float(dtype):
        return dtype
    return I64 if op == "sum" else F64


def reduce_dtypes(op: str, dtype, dtype_arg) -> tuple[np.dtype, np.dtype]:
    """(kernel input dtype, result dtype) of a reduction: dtype= casts the input
    to it first unless it is already the natural result (csrc/ops/reduce.c)."""
    dtype = np.dtype(dtype)
    if dtype_arg is None:
        return dtype, reduce_natural(op, dtype)
    want = np.dtype(dtype_arg)
    kernel = dtype if reduce_natural(op, dtype) == want else want
    return kernel, want


@dataclass(frozen=True)
class ReduceCase:
    op: str
    x: Arr
    axis: int | None
    axis_as_tuple: bool = False
    keepdims: bool = False
    dtype: str | None = None
    out: Out = Out()
    seed: int = 0


def reduce_shape(shape, axis, keepdims) -> tuple:
    """The result shape of a reduction over `axis` (None: all axes)."""
    axes = range(len(shape)) if axis is None else [axis % len(shape)]
    return tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdims or i not in axes)


@st.composite
def reduce_cases(draw):
    op = draw(st.sampled_from(REDUCE_OPS))
    alias = draw(st.integers(0, 9)) == 0
    shape = draw(st.one_of(shapes(max_extent=7), st.tuples(st.integers(1, 5000))))
    ndim = len(shape)
    axis = None if ndim == 0 or draw(st.booleans()) else draw(st.integers(-ndim, ndim - 1))
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    dtype_arg = None
    if op in ("sum", "mean") and draw(st.booleans()):
        choices = DTYPE_NAMES if op == "sum" else FLOAT_NAMES
        choices = [n for n in choices if can_cast(dtype, n)]
        dtype_arg = draw(st.sampled_from(choices)) if choices else None
    keepdims = draw(st.booleans())
    layout = draw(device_layouts(ndim))
    out = Out()
    if alias and axis is not None and reduce_natural(op, dtype) == np.dtype(dtype):
        # out= is x itself: reduce an axis of extent 1 with keepdims.
        shape = tuple(1 if i == axis % ndim else n for i, n in enumerate(shape))
        keepdims, dtype_arg, out = True, None, Out("alias", dtype, None, 0)
    elif draw(st.booleans()):
        _, final = reduce_dtypes(op, dtype, dtype_arg)
        rshape = reduce_shape(shape, axis, keepdims)
        out = Out("strided", final.name, draw(device_layouts(len(rshape))))
    return ReduceCase(op, Arr(shape, dtype, layout), axis, draw(st.booleans()), keepdims,
                      dtype_arg, out, draw(st.integers(0, 2**32 - 1)))


def reduce_domain(op: str) -> str:
    # Sums of positive data have no cancellation; max/min/argmax see both signs (and ties).
    return "positive" if op in ("sum", "mean") else "signed"


def reduce_reference(op: str, x: np.ndarray, axis, keepdims: bool, dtype_arg):
    """(expected values, result dtype) of a reduction of host `x`, computed in
    float64 / int64 from x cast to the kernel's input dtype. Raises ValueError
    where NumPy does (max/min/argmax of an empty slice)."""
    kernel, final = reduce_dtypes(op, x.dtype, dtype_arg)
    w = np.asarray(x).astype(kernel)
    w = w.astype(np.float64 if is_float(kernel) else np.int64)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # mean of an empty slice
        if op == "sum":
            ref = np.sum(w, axis=axis, keepdims=keepdims)
        elif op == "mean":
            ref = np.mean(w.astype(np.float64), axis=axis, keepdims=keepdims)
        elif op == "max":
            ref = np.max(w, axis=axis, keepdims=keepdims)
        elif op == "min":
            ref = np.min(w, axis=axis, keepdims=keepdims)
        else:
            ref = np.argmax(w, axis=axis, keepdims=keepdims)
    ref = np.asarray(ref)
    if not is_float(final) or op in ("max", "min", "argmax"):
        ref = ref.astype(final)
    return ref, final


# ===================================================================== softmax


@dataclass(frozen=True)
class SoftmaxCase:
    func: str
    x: Arr
    axis: int = -1
    out: Out = Out()
    seed: int = 0


@st.composite
def softmax_cases(draw):
    func = draw(st.sampled_from(["softmax", "log_softmax"]))
    shape = draw(st.one_of(shapes(min_ndim=1), st.tuples(st.integers(1, 2100)),
                           st.tuples(st.integers(1, 40), st.integers(1, 40))))
    ndim = len(shape)
    dtype = draw(st.sampled_from(FLOAT_NAMES))
    layout = draw(device_layouts(ndim))
    mode = draw(st.sampled_from(["none", "alias", "strided", "overlap"]))
    if mode == "overlap" and shape[0] >= 1:
        layout = contiguous(ndim)
        out = Out("overlap", dtype, None, 0)
    elif mode == "alias":
        out = Out("alias", dtype, None, 0)
    elif mode == "strided":
        out = Out("strided", dtype, draw(device_layouts(ndim)))  # softmax's out= keeps a's dtype
    else:
        out = Out()
    axis = draw(st.integers(-ndim, ndim - 1))
    return SoftmaxCase(func, Arr(shape, dtype, layout), axis, out, draw(st.integers(0, 2**32 - 1)))


def softmax_reference(func: str, x: np.ndarray, axis: int) -> np.ndarray:
    """softmax / log_softmax of `x` along `axis`, in float64."""
    w = np.asarray(x).astype(np.float64)
    if w.size == 0:
        return w
    z = w - np.max(w, axis=axis, keepdims=True)
    s = np.sum(np.exp(z), axis=axis, keepdims=True)
    return z - np.log(s) if func == "log_softmax" else np.exp(z) / s


# ====================================================================== matmul


@dataclass(frozen=True)
class MatmulCase:
    a: Arr
    b: Arr
    precision: str | None = None
    pad: object = None
    out: Out = Out()
    seed: int = 0


def matmul_shape(a_shape, b_shape) -> tuple:
    """np.matmul's result shape (1-D operands promoted and the axis dropped)."""
    return np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape


@st.composite
def _extent(draw, top: int):
    """1..top, and 0 one time in ten."""
    return 0 if draw(st.integers(0, 9)) == 0 else draw(st.integers(1, top))


@st.composite
def matmul_cases(draw):
    dtype = draw(st.sampled_from(FLOAT_NAMES))
    m, k, n = draw(_extent(40)), draw(_extent(40)), draw(_extent(40))
    batch = draw(shapes(max_ndim=2, max_extent=3))
    mode = draw(st.sampled_from(["none", "alias", "strided"]))
    if mode == "alias":
        # out=a: a has the result's shape (n == k, a batched fully) and is C-contiguous.
        n = k
        a_shape, b_shape = batch + (m, k), draw(broadcast_to(batch)) + (k, n)
        a_layout = contiguous(len(a_shape))
    else:
        a_shape = (k,) if draw(st.integers(0, 5)) == 0 else draw(broadcast_to(batch)) + (m, k)
        b_shape = (k,) if draw(st.integers(0, 5)) == 0 else draw(broadcast_to(batch)) + (k, n)
        a_layout = draw(device_layouts(len(a_shape)))
    b_layout = draw(device_layouts(len(b_shape)))
    out = Out()
    if mode == "alias":
        out = Out("alias", dtype, None, 0)
    elif mode == "strided":
        # matmul's out= must be C-contiguous: a leading-axis slice of a larger array.
        rnd = len(matmul_shape(a_shape, b_shape))
        offsets = (draw(st.integers(1, 2)),) + (0,) * (rnd - 1)
        layout = Layout((1,) * rnd, offsets, tuple(range(rnd))) if rnd else None
        out = Out("strided", dtype, layout)
    precision = draw(st.sampled_from([None, "highest", "high"]))
    pad = draw(st.sampled_from([None, "auto", True, False]))
    return MatmulCase(Arr(a_shape, dtype, a_layout), Arr(b_shape, dtype, b_layout), precision,
                      pad, out, draw(st.integers(0, 2**32 - 1)))


# =================================================================== transpose

TRANSPOSE_METHODS = ["naive", "coalesced_write", "tiled", "tiled_padded", "best"]


@dataclass(frozen=True)
class TransposeCase:
    """kind "kernel": cudalab.transpose(x, method) of a 2-D view; kind "view":
    x.transpose(*perm) (x.T when perm is None) materialized by `how`."""

    kind: str
    x: Arr
    method: str | None = None
    perm: tuple | None = None
    how: str = "copy"
    seed: int = 0


@st.composite
def transpose_cases(draw):
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    if draw(st.booleans()):
        # Extents across the kernels' 32 and 64 element tiles.
        shape = (draw(_extent(140)), draw(_extent(140)))
        x = Arr(shape, dtype, draw(device_layouts(2)))
        return TransposeCase("kernel", x, draw(st.sampled_from(TRANSPOSE_METHODS)),
                             seed=draw(st.integers(0, 2**32 - 1)))
    shape = draw(shapes(max_ndim=5, max_extent=5))
    x = Arr(shape, dtype, draw(device_layouts(len(shape))))
    perm = None if draw(st.booleans()) else tuple(draw(st.permutations(range(len(shape)))))
    how = draw(st.sampled_from(["copy", "ascontiguousarray", "get"]))
    return TransposeCase("view", x, None, perm, how, draw(st.integers(0, 2**32 - 1)))


# ============================================================ astype, copyto


@dataclass(frozen=True)
class AstypeCase:
    """x.astype(to) (how="astype"), x.astype(to, copy=False) ("nocopy") or
    cudalab.asarray(x, dtype=to) ("asarray")."""

    x: Arr
    to: str
    how: str = "astype"
    seed: int = 0


@st.composite
def astype_cases(draw):
    shape = draw(elementwise_shapes())
    x = Arr(shape, draw(st.sampled_from(DTYPE_NAMES)), draw(device_layouts(len(shape))))
    to = draw(st.sampled_from(DTYPE_NAMES))
    how = draw(st.sampled_from(["astype", "nocopy", "asarray"]))
    return AstypeCase(x, to, how, draw(st.integers(0, 2**32 - 1)))


@dataclass(frozen=True)
class CopytoCase:
    """copyto(dst, src): dst a view into a larger array; src broadcasts to it.
    overlap=True: src is dst's own root shifted by one row (same dtype and shape)."""

    dst: Arr
    src: Arr
    overlap: bool = False
    seed: int = 0


@st.composite
def copyto_cases(draw):
    shape = draw(elementwise_shapes())
    dst_dtype = draw(st.sampled_from(DTYPE_NAMES))
    dst = Arr(shape, dst_dtype, draw(device_layouts(len(shape))))
    if len(shape) >= 1 and shape[0] >= 1 and draw(st.integers(0, 4)) == 0:
        # dst = root[:-1], src = root[1:] of one dense root.
        dst = Arr(shape, dst_dtype, contiguous(len(shape)))
        return CopytoCase(dst, dst, True, draw(st.integers(0, 2**32 - 1)))
    src_shape = draw(broadcast_to(shape))
    src = Arr(src_shape, draw(st.sampled_from(DTYPE_NAMES)), draw(device_layouts(len(src_shape))))
    return CopytoCase(dst, src, False, draw(st.integers(0, 2**32 - 1)))


# =================================================================== round trips


@dataclass(frozen=True)
class RoundtripCase:
    """Host -> device: cudalab.asarray(host view [, dtype=upload]); device -> host:
    a device view copied back by `download` ("get", "get_out", "asnumpy",
    "pinned": get(out=pinned_empty(...), non_blocking=True) then synchronize)."""

    dtype: str
    shape: tuple
    host_layout: Layout
    upload: str | None
    device_layout: Layout
    download: str
    seed: int = 0


@st.composite
def roundtrip_cases(draw):
    shape = draw(elementwise_shapes())
    ndim = len(shape)
    upload = None if draw(st.booleans()) else draw(st.sampled_from(DTYPE_NAMES))
    return RoundtripCase(
        dtype=draw(st.sampled_from(DTYPE_NAMES)),
        shape=shape,
        host_layout=draw(layouts(ndim, negative=True)),  # NumPy views may step backwards
        upload=upload,
        device_layout=draw(device_layouts(ndim)),
        download=draw(st.sampled_from(["get", "get_out", "asnumpy", "pinned"])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
