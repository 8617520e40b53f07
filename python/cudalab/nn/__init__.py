"""cudalab.nn: train a small MLP on cudalab's own kernels and cuBLASLt, explicitly.

PyTorch-like pieces without autograd: every backward is a call you make.

* :mod:`~cudalab.nn.functional`: the primitives (Linear GEMMs with fused
  bias / ReLU / GELU epilogues and their backward, the fused softmax
  cross-entropy, ReLU / GELU gradients);
* :class:`Parameter`, :class:`Linear`, :class:`MLP` (float32 master weights,
  forward in a :class:`Precision`, explicit backward into float32 grads,
  gradient accumulation);
* :class:`GradScaler` (dynamic loss scaling on the device), :class:`SGD` and
  :class:`AdamW` (fused multi-tensor steps that skip themselves on inf/NaN);
* :class:`TeacherData` (learnable synthetic data), :class:`ArrayLoader`
  (batches of host arrays, shuffled, staged in pinned memory and prefetched
  on a side stream), :func:`train_step` and :class:`Trainer` (a step
  captured in a CUDA graph);
* :mod:`~cudalab.nn.reference`: the same step in float64 NumPy, to check against;
* :mod:`~cudalab.nn.fusion`: whether GELU runs in the GEMM's epilogue or as its
  own kernel, measured once per problem size.

A step, with no host synchronization::

    import cudalab.nn as nn

    data = nn.TeacherData(64, 10, batch_size=256)
    model = nn.MLP([64, 256, 256, 16])
    opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = nn.GradScaler()
    for x, labels in data:
        loss = nn.train_step(model, opt, x, labels, "fp16", scaler)

The same data fed from the host, shuffled, each batch's copy overlapping the
step before it::

    loader = nn.ArrayLoader(*data.to_host(), batch_size=256, shuffle=True)
    for x, labels in loader:
        loss = nn.train_step(model, opt, x, labels, "fp16", scaler)
"""

from . import functional, fusion, reference
from .data import TeacherData
from .layers import MLP, Linear, Parameter
from .loader import ArrayLoader
from .optim import SGD, AdamW
from .precision import PRECISIONS, Precision, get_precision
from .scaler import GradScaler
from .train import Trainer, train_step

__all__ = [
    "MLP",
    "PRECISIONS",
    "SGD",
    "AdamW",
    "ArrayLoader",
    "GradScaler",
    "Linear",
    "Parameter",
    "Precision",
    "TeacherData",
    "Trainer",
    "functional",
    "fusion",
    "reference",
    "get_precision",
    "train_step",
]
