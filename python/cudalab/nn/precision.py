"""Precision modes for training: the compute dtype and the float32 matmul precision.

Master weights, gradients and optimizer state are always float32; a mode only
decides what the GEMMs, activations and the loss read and write.

======  ==============  ====================  ===========
name    compute dtype   float32 matmul        loss scaler
======  ==============  ====================  ===========
fp32    float32         'highest' (true fp32) no
tf32    float32         'high' (TF32 cores)   no
fp16    float16         (not used)            GradScaler
bf16    bfloat16        (not used)            no
======  ==============  ====================  ===========
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import ml_dtypes
import numpy as np

from .. import _precision as _table

__all__ = ["PRECISIONS", "Precision", "get_precision"]


@dataclass(frozen=True)
class Precision:
    """Precision(name, compute_dtype, matmul_precision, needs_scaler)

    One precision mode (see :data:`PRECISIONS`).

    Attributes
    ----------
    name : str
        "fp32", "tf32", "fp16" or "bf16".
    compute_dtype : numpy.dtype
        The dtype of activations, weight copies and gradients inside a step.
    matmul_precision : str or None
        For float32 compute: "highest" (true fp32) or "high" (TF32); None for
        the half types (their GEMMs always accumulate in float32).
    needs_scaler : bool
        True for float16, whose gradients underflow without loss scaling.
    master_dtype : numpy.dtype
        Always float32: parameters, their gradients and optimizer state.
    """

    name: str
    compute_dtype: np.dtype
    matmul_precision: Optional[str]
    needs_scaler: bool
    master_dtype: np.dtype = np.dtype(np.float32)

    @property
    def is_half(self) -> bool:
        """True when the compute dtype is float16 or bfloat16."""
        return self.compute_dtype != self.master_dtype


def _mode(name: str, needs_scaler: bool) -> Precision:
    # The compute dtype and matmul precision come from the one table (cudalab._precision).
    spec = _table.resolve(name)
    dtype = np.dtype(ml_dtypes.bfloat16) if spec.storage == "bfloat16" else np.dtype(spec.storage)
    return Precision(spec.name, dtype, spec.matmul_precision, needs_scaler)


PRECISIONS: dict[str, Precision] = {
    "fp32": _mode("fp32", False),
    "tf32": _mode("tf32", False),
    "fp16": _mode("fp16", True),
    "bf16": _mode("bf16", False),
}


def get_precision(precision: Any, func: str = "get_precision") -> Precision:
    """get_precision(precision, func='get_precision') -> Precision

    A :class:`Precision`, or its name, as a Precision.

    Parameters
    ----------
    precision : Precision or str
        One of ``PRECISIONS``' names or another spelling of one ("float16",
        "half", "bfloat16", "float32"), or a Precision (returned as it is).
    func : str, optional
        The function named in an error message.

    Raises
    ------
    TypeError, ValueError
        Neither a Precision nor a known name.
    """
    if isinstance(precision, Precision):
        return precision
    if not isinstance(precision, str):
        raise TypeError(f"{func}() argument 'precision': expected a Precision or one of "
                        f"{', '.join(map(repr, PRECISIONS))}, got {type(precision).__name__}")
    try:
        return PRECISIONS[_table.short_name(precision) or precision]
    except KeyError:
        raise ValueError(f"{func}() argument 'precision': expected one of "
                         f"{', '.join(map(repr, PRECISIONS))}, got {precision!r}") from None
