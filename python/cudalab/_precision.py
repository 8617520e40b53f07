"""The one table of precisions and matmul modes used by bench, lessons, nn and models.

======  ==========  ==================================  ========  =========  ===========
name    long name   aliases                             storage   float32    torch TF32
                                                                  matmul     (allow_tf32)
======  ==========  ==================================  ========  =========  ===========
fp64    float64     fp64, float64                       float64   --         False
fp32    float32     fp32, float32                       float32   'highest'  False
tf32    tf32        tf32, tfloat32                      float32   'high'     True
fp16    float16     fp16, float16, half                 float16   --         False
bf16    bfloat16    bf16, bfloat16                      bfloat16  --         False
======  ==========  ==================================  ========  =========  ===========

Each API keeps its own spelling in what it prints and stores: cudalab.nn and
cudalab.models name precisions by `Spec.name` ("fp16"); bench and the lessons
by `Spec.long_name` ("float16"). :func:`resolve` accepts any alias, so either
spelling may be typed where a precision is read.

"tf32" is float32 storage with TF32 tensor-core math: cudalab's
``matmul(..., precision="high")`` (``set_float32_matmul_precision("high")``)
and torch's ``torch.backends.cuda.matmul.allow_tf32 = True``
(``torch.set_float32_matmul_precision("high")``). This table is the only place
that mapping is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["ALIASES", "SPECS", "Spec", "TorchTf32", "long_name", "lookup", "matmul_precision",
           "resolve", "short_name", "storage"]


@dataclass(frozen=True)
class Spec:
    """One precision: its names, its storage dtype and its matmul settings.

    Attributes
    ----------
    name : str
        The short canonical name ("fp16"): cudalab.nn's and cudalab.models' spelling.
    long_name : str
        The dtype-like name ("float16"; "tf32" stays "tf32"): bench's and the lessons'.
    aliases : tuple of str
        Every spelling :func:`resolve` accepts, canonical names included.
    storage : str
        The NumPy / cudalab array dtype ("float32" for tf32).
    matmul_precision : str or None
        cudalab's float32 matmul precision ("highest" true fp32, "high" TF32);
        None where the storage is not float32.
    torch_dtype : str
        The ``torch`` attribute of the dtype ("float32" for tf32).
    torch_allow_tf32 : bool
        ``torch.backends.cuda.matmul.allow_tf32`` (and cuDNN's) for this precision.
    torch_matmul_precision : str or None
        The matching ``torch.set_float32_matmul_precision`` value; None as above.
    """

    name: str
    long_name: str
    aliases: tuple[str, ...]
    storage: str
    matmul_precision: Optional[str]
    torch_dtype: str
    torch_allow_tf32: bool
    torch_matmul_precision: Optional[str]


SPECS: tuple[Spec, ...] = (
    Spec("fp64", "float64", ("fp64", "float64"), "float64", None, "float64", False, None),
    Spec("fp32", "float32", ("fp32", "float32"), "float32", "highest", "float32",
         False, "highest"),
    Spec("tf32", "tf32", ("tf32", "tfloat32"), "float32", "high", "float32", True, "high"),
    Spec("fp16", "float16", ("fp16", "float16", "half"), "float16", None, "float16", False, None),
    Spec("bf16", "bfloat16", ("bf16", "bfloat16"), "bfloat16", None, "bfloat16", False, None),
)

# Every accepted spelling -> its Spec.
ALIASES: dict[str, Spec] = {alias: spec for spec in SPECS for alias in spec.aliases}


def lookup(name: Any) -> Optional[Spec]:
    """lookup(name) -> Spec or None: the Spec an alias names, None for anything else."""
    return ALIASES.get(name) if isinstance(name, str) else None


def resolve(name: Any, func: str = "resolve", arg: str = "precision") -> Spec:
    """resolve(name, func='resolve', arg='precision') -> Spec

    The Spec of any alias ("fp16", "float16", "half", ...).

    Raises
    ------
    TypeError
        `name` is not a str.
    ValueError
        An unknown name; the message lists every accepted spelling.
    """
    if not isinstance(name, str):
        raise TypeError(f"{func}() argument '{arg}': expected a str, got {type(name).__name__}")
    spec = ALIASES.get(name)
    if spec is None:
        raise ValueError(f"{func}() argument '{arg}': unknown precision {name!r}; expected one of "
                         f"{', '.join(map(repr, ALIASES))}")
    return spec


def short_name(name: Any) -> Optional[str]:
    """The short canonical name ("fp16") of an alias; None when unknown."""
    spec = lookup(name)
    return spec.name if spec else None


def long_name(name: Any) -> Optional[str]:
    """The long canonical name ("float16") of an alias; None when unknown."""
    spec = lookup(name)
    return spec.long_name if spec else None


def storage(name: str) -> str:
    """The array dtype of a precision alias ("float32" for tf32); other names unchanged."""
    spec = lookup(name)
    return spec.storage if spec else name


def matmul_precision(name: str) -> Optional[str]:
    """cudalab matmul()'s precision for a precision alias: "high" for tf32, "highest"
    for float32, None otherwise."""
    spec = lookup(name)
    return spec.matmul_precision if spec else None


class TorchTf32:
    """``with TorchTf32(torch, on, cudnn=False):`` torch's float32 matmuls (and cuDNN's
    convolutions when `cudnn`) in TF32 or not; the previous flags restored after."""

    def __init__(self, torch: Any, on: bool, cudnn: bool = False) -> None:
        self.torch = torch
        self.on = bool(on)
        self.cudnn = cudnn

    def __enter__(self) -> TorchTf32:
        b = self.torch.backends
        self.saved = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 if self.cudnn else None)
        b.cuda.matmul.allow_tf32 = self.on
        if self.cudnn:
            b.cudnn.allow_tf32 = self.on
        return self

    def __exit__(self, *exc: Any) -> None:
        b = self.torch.backends
        b.cuda.matmul.allow_tf32 = self.saved[0]
        if self.cudnn:
            b.cudnn.allow_tf32 = self.saved[1]
