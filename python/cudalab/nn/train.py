"""The training step: forward, loss, backward, unscale, optimizer step, scale update.

``train_step`` is the step written out, eager; ``Trainer`` owns the buffers a
step needs (inputs, loss) so that the step can be captured once in a CUDA
graph and replayed: every call then costs one graph launch. Neither reads
anything back from the device: the loss is returned as a device array.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import _core
from ..streams import graph as _graph
from .._check import arg_error, check_array, check_bool
from .layers import MLP
from .optim import Optimizer
from .precision import Precision, get_precision
from .scaler import GradScaler

__all__ = ["Trainer", "train_step"]


def _check_setup(func: str, model: Any, optimizer: Any, precision: Any,
                 scaler: Any) -> Precision:
    if not isinstance(model, MLP):
        raise arg_error(TypeError, func, "model", f"expected an MLP, got {type(model).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise arg_error(TypeError, func, "optimizer",
                        f"expected an SGD or AdamW, got {type(optimizer).__name__}")
    prec = get_precision(precision, func)
    if scaler is not None and not isinstance(scaler, GradScaler):
        raise arg_error(TypeError, func, "scaler",
                        f"expected a GradScaler or None, got {type(scaler).__name__}")
    if prec.needs_scaler and scaler is None:
        raise arg_error(ValueError, func, "scaler",
                        f"precision {prec.name!r} needs a GradScaler (float16 gradients "
                        "underflow without loss scaling); pass GradScaler(enabled=False) to "
                        "train without one on purpose")
    return prec


def _step(model: MLP, optimizer: Optimizer, x: _core.DeviceArray, labels: _core.DeviceArray,
          prec: Precision, scaler: Optional[GradScaler],
          loss_out: Optional[_core.DeviceArray]) -> _core.DeviceArray:
    """One step; the checks are the caller's."""
    enabled = scaler is not None and scaler.enabled
    logits = model.forward(x, prec)
    # The loss gradient overwrites the logits (their buffer is not needed again).
    loss = _core._nn_cross_entropy(logits, labels, logits, "mean",
                                   scaler.scale if enabled else None, loss_out, -100)
    model.backward(logits)
    found_inf = None
    if enabled:
        scaler.unscale_(optimizer)
        found_inf = scaler.found_inf
    optimizer.step(found_inf=found_inf)
    if enabled:
        scaler.update()
    return loss


def train_step(model: MLP, optimizer: Optimizer, x: _core.DeviceArray,
               labels: _core.DeviceArray, precision: Any = "fp32",
               scaler: Optional[GradScaler] = None) -> _core.DeviceArray:
    """train_step(model, optimizer, x, labels, precision='fp32', scaler=None) -> DeviceArray

    One training step on a batch, without any host synchronization.

    forward (the master weights cast to the compute dtype) -> softmax
    cross-entropy (mean over the batch) and its gradient, times the scaler's
    scale -> backward into the float32 grads -> ``scaler.unscale_`` (found_inf)
    -> ``optimizer.step(found_inf)`` (skipped on the device on inf/NaN) ->
    ``scaler.update()``.

    Parameters
    ----------
    model : MLP
    optimizer : SGD or AdamW
        Over the model's parameters.
    x : DeviceArray
        (N, in_features), any float dtype.
    labels : DeviceArray
        (N,) int32 or int64 class indices.
    precision : Precision or str, optional
        "fp32", "tf32", "fp16" (needs a scaler) or "bf16".
    scaler : GradScaler, optional

    Returns
    -------
    DeviceArray
        The unscaled mean loss, a new 0-d float32 array (read it when needed:
        reading synchronizes).
    """
    prec = _check_setup("train_step", model, optimizer, precision, scaler)
    check_array(x, "train_step", "x")
    check_array(labels, "train_step", "labels")
    return _step(model, optimizer, x, labels, prec, scaler, None)


class Trainer:
    """Trainer(model, optimizer, precision='fp32', scaler=None, *, graph=False)

    A training loop's step with buffers of its own, optionally captured in a
    CUDA graph.

    Each ``step(x, labels)`` runs exactly one training step (as
    :func:`train_step`) and returns the loss in the Trainer's own buffer. With
    ``graph=True`` the first step runs eagerly (it allocates every buffer and
    prepares the cuBLASLt plans), the second is captured and replayed, and
    every later one copies the batch into the captured input buffers and
    replays the graph: one launch per step.

    Parameters
    ----------
    model : MLP
    optimizer : SGD or AdamW
    precision : Precision or str, optional
    scaler : GradScaler, optional
    graph : bool, optional
        Capture the step in a CUDA graph after the first one.

    Attributes
    ----------
    loss : DeviceArray or None
        (1,) float32: the last step's loss, overwritten by the next step.
    cuda_graph : CUDAGraph or None
        The captured step (graph=True, from the second step on).

    Notes
    -----
    Python numbers baked into a captured step stay as they were at capture:
    the optimizer's hyper-parameters (give ``lr`` as a device array to change
    it), the batch shape and dtypes (a batch of another shape is refused).
    """

    def __init__(self, model: MLP, optimizer: Optimizer, precision: Any = "fp32",
                 scaler: Optional[GradScaler] = None, *, graph: bool = False) -> None:
        self.precision = _check_setup("Trainer", model, optimizer, precision, scaler)
        check_bool(graph, "Trainer", "graph")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.graph = graph
        self.steps = 0
        self.loss: Optional[_core.DeviceArray] = None
        self.cuda_graph: Optional[_core.CUDAGraph] = None
        self._x: Optional[_core.DeviceArray] = None
        self._labels: Optional[_core.DeviceArray] = None

    def _inputs(self, x: Any, labels: Any) -> None:
        """Copy the batch into the Trainer's input buffers (allocated on the first step)."""
        check_array(x, "step", "x")
        check_array(labels, "step", "labels")
        if self._x is None:
            self._x = _core.empty(x.shape, dtype=x.dtype)
            self._labels = _core.empty(labels.shape, dtype=labels.dtype)
            self.loss = _core.zeros((1,), dtype=np.float32)
        for name, got, have in (("x", x, self._x), ("labels", labels, self._labels)):
            if got.shape != have.shape or got.dtype != have.dtype:
                raise arg_error(ValueError, "step", name,
                                f"expected shape {have.shape} and dtype {have.dtype} (the first "
                                f"step's), got {got.shape} {got.dtype}")
        _core.copyto(self._x, x)
        _core.copyto(self._labels, labels)

    def _run(self) -> None:
        _step(self.model, self.optimizer, self._x, self._labels, self.precision, self.scaler,
              self.loss)

    def step(self, x: _core.DeviceArray, labels: _core.DeviceArray) -> _core.DeviceArray:
        """step(x, labels) -> DeviceArray

        One training step on the batch; returns ``self.loss`` (overwritten by
        the next step: read or copy it first). No host synchronization.
        """
        self._inputs(x, labels)
        if not self.graph or self.steps == 0:
            self._run()
        else:
            if self.cuda_graph is None:
                g = _core.CUDAGraph()
                with _graph(g):
                    self._run()
                self.cuda_graph = g
            self.cuda_graph.replay()
        self.steps += 1
        return self.loss
