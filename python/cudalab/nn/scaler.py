"""GradScaler: dynamic loss scaling for float16 training, entirely on the device.

PyTorch's rule (torch.amp.GradScaler): the loss gradient is multiplied by
``scale``; before the optimizer step the gradients are divided by it and
checked for inf/NaN in one fused multi-tensor kernel; a step with a
non-finite gradient is skipped by the optimizer kernel itself and halves the
scale, and ``growth_interval`` clean steps in a row double it. ``found_inf``,
the scale and the growth tracker never leave the device, so a training step
needs no host synchronization and can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from .. import _core
from .._check import arg_error, check_array, check_bool, check_real
from .layers import Parameter

__all__ = ["GradScaler"]


def _grad_arrays(grads: Any, func: str) -> list[_core.DeviceArray]:
    """The gradient arrays of an optimizer, of Parameters, or DeviceArrays themselves."""
    params = getattr(grads, "params", None)
    items = params if params is not None else grads
    if isinstance(items, (_core.DeviceArray, Parameter)) or not isinstance(items, Iterable):
        raise arg_error(TypeError, func, "grads",
                        "expected an optimizer or an iterable of Parameters or DeviceArrays, "
                        f"got {type(grads).__name__}")
    out = []
    for g in items:
        if isinstance(g, Parameter):
            out.append(g.grad)
        else:
            out.append(check_array(g, func, "grads"))
    return out


class GradScaler:
    """GradScaler(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True)

    Dynamic loss scaling with PyTorch's rule, kept on the device.

    A step with it::

        logits = model.forward(x, "fp16")
        loss = cross_entropy(logits, labels, grad=logits, loss_scale=scaler.scale)
        model.backward(logits)
        scaler.unscale_(optimizer)               # grads /= scale; found_inf
        optimizer.step(found_inf=scaler.found_inf)  # skipped on the device if inf
        scaler.update()                           # back off or grow the scale

    Parameters
    ----------
    init_scale : float, optional
        > 0.
    growth_factor : float, optional
        > 1.
    backoff_factor : float, optional
        In (0, 1).
    growth_interval : int, optional
        Clean steps before the scale grows, in [1, 2**31 - 1].
    enabled : bool, optional
        False makes every method a no-op: ``scale`` and ``found_inf`` are None,
        ``get_scale()`` is 1.0 (bf16 and float32 training need no scaling).

    Attributes
    ----------
    scale : DeviceArray or None
        (1,) float32: the current scale (cross_entropy's ``loss_scale``).
    growth_tracker : DeviceArray or None
        (1,) int32: clean steps since the last change of the scale.
    found_inf : DeviceArray or None
        (1,) float32: 1.0 when the last ``unscale_`` saw inf or NaN, else 0.0
        (the optimizers' ``found_inf``).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        func = "GradScaler"
        init_scale = check_real(init_scale, func, "init_scale")
        if not init_scale > 0.0:
            raise arg_error(ValueError, func, "init_scale", f"must be > 0, got {init_scale}")
        growth_factor = check_real(growth_factor, func, "growth_factor")
        if not growth_factor > 1.0:
            raise arg_error(ValueError, func, "growth_factor", f"must be > 1, got {growth_factor}")
        backoff_factor = check_real(backoff_factor, func, "backoff_factor")
        if not 0.0 < backoff_factor < 1.0:
            raise arg_error(ValueError, func, "backoff_factor",
                            f"must be in (0, 1), got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer)):
            raise arg_error(TypeError, func, "growth_interval",
                            f"expected an int, got {type(growth_interval).__name__}")
        if not 1 <= growth_interval <= 2**31 - 1:
            raise arg_error(ValueError, func, "growth_interval",
                            f"must be in [1, 2**31 - 1], got {growth_interval}")
        check_bool(enabled, func, "enabled")
        if enabled:  # arguments first, then the device: the error names GradScaler()
            _core._parse_device(None, func)
        self.init_scale = init_scale
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = int(growth_interval)
        self.enabled = enabled
        self._scale: Optional[_core.DeviceArray] = None
        self._growth_tracker: Optional[_core.DeviceArray] = None
        self._found_inf: Optional[_core.DeviceArray] = None
        if enabled:
            self._scale = _core.full((1,), init_scale, dtype=np.float32)
            self._growth_tracker = _core.zeros((1,), dtype=np.int32)
            self._found_inf = _core.zeros((1,), dtype=np.float32)
            self._inv_scale = _core.ones((1,), dtype=np.float32)
            self._zero = _core.zeros((1,), dtype=np.float32)

    @property
    def scale(self) -> Optional[_core.DeviceArray]:
        return self._scale

    @property
    def growth_tracker(self) -> Optional[_core.DeviceArray]:
        return self._growth_tracker

    @property
    def found_inf(self) -> Optional[_core.DeviceArray]:
        return self._found_inf

    def unscale_(self, grads: Any) -> None:
        """unscale_(grads) -> None

        Divide every gradient by the scale, in place, and set ``found_inf``
        to whether any of them held inf or NaN: one fused multi-tensor kernel,
        no host synchronization. Call it once per optimizer step, after the
        last backward of the step.

        Parameters
        ----------
        grads : optimizer, or iterable of Parameter or DeviceArray
            An optimizer (its parameters' grads), Parameters (their grads) or
            the gradient arrays: C-contiguous, one float dtype.
        """
        if not self.enabled:
            return
        arrays = _grad_arrays(grads, "unscale_")
        _core.copyto(self._found_inf, self._zero)
        _core.div(1.0, self._scale, out=self._inv_scale)
        _core._nn_unscale_(arrays, self._inv_scale, self._found_inf)

    def update(self) -> None:
        """update() -> None

        After the optimizer step: back off the scale if ``found_inf`` is set
        (and restart the growth count), else count a clean step and grow the
        scale every ``growth_interval`` of them. On the device.
        """
        if not self.enabled:
            return
        _core._nn_update_scale_(self._scale, self._growth_tracker, self._found_inf,
                                self.growth_factor, self.backoff_factor, self.growth_interval)

    def get_scale(self) -> float:
        """get_scale() -> float

        The current scale read back to the host: this synchronizes with the
        device (for tests and lessons; a training loop never needs it).
        1.0 when disabled.
        """
        if not self.enabled:
            return 1.0
        return float(self._scale.get()[0])

    def is_enabled(self) -> bool:
        return self.enabled

    def __repr__(self) -> str:
        return (f"GradScaler(init_scale={self.init_scale}, growth_factor={self.growth_factor}, "
                f"backoff_factor={self.backoff_factor}, growth_interval={self.growth_interval}, "
                f"enabled={self.enabled})")
