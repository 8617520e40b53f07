"""The NumPy reference of every element-wise op: one table for every test.

``NUMPY_REFERENCES`` maps each function of the op table
(cuda/ops/elementwise_ops.h; ``cudalab._core._ELEMENTWISE_OPS`` lists them)
to a NumPy function of the same operands, in the same order, plus the forms
``approximate='tanh'`` selects (``gelu_tanh``, ``gelu_grad_tanh``). A table op
without a reference fails tests/test_references_cpu.py (no GPU needed) and
test_elementwise_gpu.py's test_every_table_op_matches_its_reference.

A reference computes in the dtype of its inputs: callers pass float64 arrays
for a float result (the inputs' exact values) and arrays of the result dtype
for an integer or bool one (so wrapping matches NumPy's). The binary and
float unary entries are NumPy's ufuncs themselves, so tests can also ask them
for NumPy's result dtypes. Used by test_elementwise_gpu.py,
test_elementwise_cpu.py and _properties.py.
"""

from __future__ import annotations

import math

import numpy as np

from _support import erf as erf64
from _support import gelu_reference as _gelu

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_grad(grad, x, approximate: str) -> np.ndarray:
    """grad * d/dx gelu(x), as torch.ops.aten.gelu_backward, in float64."""
    grad = np.asarray(grad, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        t = np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3))
        slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (
            1.0 + 3.0 * 0.044715 * x * x)
    else:
        slope = 0.5 * (1.0 + erf64(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(
            2.0 * math.pi)
    return grad * slope


def _clamp(a, lo, hi):
    """minimum(maximum(a, lo), hi); an absent (None) bound is skipped."""
    if lo is not None:
        a = np.maximum(a, lo)
    if hi is not None:
        a = np.minimum(a, hi)
    return a


def _relu_grad(grad, x):
    """grad where x > 0, else 0 (NaN in x keeps grad), as torch's threshold_backward."""
    grad = np.asarray(grad)
    return np.where(np.asarray(x) <= 0, np.zeros((), grad.dtype), grad)


NUMPY_REFERENCES = {
    # binary (a, b)
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
    # axpy(alpha, x, y): NumPy rounds twice; _properties rounds float64 once itself
    "axpy": lambda alpha, x, y: alpha * x + y,
    # unary (a)
    "neg": np.negative,
    "abs": np.absolute,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "gelu": lambda x: _gelu(x, "none"),
    "gelu_tanh": lambda x: _gelu(x, "tanh"),
    # three operands
    "clamp": _clamp,
    "where": lambda cond, a, b: np.where(cond != 0, a, b),
    # activation backward (grad, x)
    "relu_grad": _relu_grad,
    "gelu_grad": lambda grad, x: _gelu_grad(grad, x, "none"),
    "gelu_grad_tanh": lambda grad, x: _gelu_grad(grad, x, "tanh"),
}

# The forms approximate='tanh' selects: reference key -> (function, keyword arguments).
FORMS = {
    "gelu_tanh": ("gelu", {"approximate": "tanh"}),
    "gelu_grad_tanh": ("gelu_grad", {"approximate": "tanh"}),
}
