"""Fused optimizers: SGD (momentum) and AdamW over every parameter in a few launches.

Each ``step`` is one multi-tensor kernel over all parameters (float32 master
weights, float32 state), on the current stream. Given a ``found_inf`` device
scalar (a GradScaler's), the kernel itself skips the update when it is
nonzero: no host synchronization, so a step can be captured in a CUDA graph.
Hyper-parameters given as Python floats are baked into the launch (a captured
graph replays them); an ``lr`` that must change between replays is given as a
1-element float32 DeviceArray. Errors follow torch.optim's wording.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Optional, Union


from .. import _core
from .._check import check_array
from ._util import F32, fill_zero
from .layers import Parameter

__all__ = ["AdamW", "SGD"]

LR = Union[float, _core.DeviceArray]


def _typename(x: Any) -> str:
    return type(x).__name__


def _check_hyper(value: Any, what: str) -> float:
    """A real hyper-parameter (torch compares it with floats; so do we)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Invalid {what}: expected a real number, got {_typename(value)}")
    return float(value)


def _check_lr(lr: Any) -> LR:
    if isinstance(lr, _core.DeviceArray):
        if lr.size != 1:
            raise ValueError("Tensor lr must be 1-element")
        if lr.dtype != F32:
            raise TypeError(f"Tensor lr must be float32, got {lr.dtype}")
        return lr
    value = _check_hyper(lr, "learning rate")
    if not 0.0 <= value:
        raise ValueError(f"Invalid learning rate: {lr}")
    return value


class Optimizer:
    """The parameter list and the gradient helpers both optimizers share."""

    def __init__(self, params: Any) -> None:
        if isinstance(params, (Parameter, _core.DeviceArray)) or not isinstance(params, Iterable):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Parameters, but got {_typename(params)}")
        if hasattr(params, "parameters") and callable(params.parameters):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Parameters, but got {_typename(params)} (pass model.parameters())")
        self.params: list[Parameter] = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        for p in self.params:
            if not isinstance(p, Parameter):
                raise TypeError("optimizer can only optimize Parameters, but one of the params "
                                f"is {_typename(p)}")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("some parameters appear more than once in the parameter list")

    def _state(self) -> list[_core.DeviceArray]:
        """Zeroed float32 state, one array per parameter."""
        return [_core.zeros(p.shape, dtype=F32) for p in self.params]

    def _step_arrays(self) -> tuple[list[_core.DeviceArray], list[_core.DeviceArray]]:
        return [p.value for p in self.params], [p.grad for p in self.params]

    @staticmethod
    def _check_found_inf(found_inf: Any) -> Optional[_core.DeviceArray]:
        if found_inf is None:
            return None
        return check_array(found_inf, "step", "found_inf")

    def zero_grad(self) -> None:
        """Set every parameter's grad to zero on the device."""
        for p in self.params:
            fill_zero(p.grad)


class SGD(Optimizer):
    """SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)

    torch.optim.SGD's update, fused over all parameters.

    Parameters
    ----------
    params : iterable of Parameter
    lr : float or DeviceArray
        >= 0, or one float32 element read on the device at each step.
    momentum : float, optional
        >= 0. Momentum buffers (float32 zeros) are allocated here when > 0.
    dampening : float, optional
    weight_decay : float, optional
        >= 0 (L2, added to the gradient).
    nesterov : bool, optional
        Needs momentum > 0 and dampening == 0.

    Notes
    -----
    The momentum buffers start as the first step's gradient, as in torch.
    "First" is the first call of ``step`` on the host: if that step is then
    skipped on the device (found_inf), the next one updates the zero
    buffers, which differs from torch only when dampening is nonzero.
    """

    def __init__(self, params: Iterable[Parameter], lr: LR, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0, nesterov: bool = False) -> None:
        lr = _check_lr(lr)
        momentum = _check_hyper(momentum, "momentum value")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        weight_decay = _check_hyper(weight_decay, "weight_decay value")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        dampening = _check_hyper(dampening, "dampening value")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params)
        self.lr, self.momentum, self.dampening = lr, momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, bool(nesterov)
        self.momentum_buffers = self._state() if momentum > 0 else None
        self._first_step = True

    def step(self, found_inf: Optional[_core.DeviceArray] = None) -> None:
        """step(found_inf=None) -> None

        One update of every parameter from its grad; nothing changes where
        `found_inf` (one float32 element) is nonzero on the device.
        """
        found_inf = self._check_found_inf(found_inf)
        values, grads = self._step_arrays()
        _core._nn_sgd_(values, grads, self.momentum_buffers, self.lr, self.momentum,
                       self.dampening, self.weight_decay, self.nesterov, found_inf, None,
                       self._first_step)
        self._first_step = False

    def __repr__(self) -> str:
        return (f"SGD(lr={self.lr}, momentum={self.momentum}, dampening={self.dampening}, "
                f"weight_decay={self.weight_decay}, nesterov={self.nesterov})")


class AdamW(Optimizer):
    """AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)

    torch.optim.AdamW's update (decoupled weight decay), fused over all
    parameters.

    Parameters
    ----------
    params : iterable of Parameter
    lr : float or DeviceArray, optional
        >= 0, or one float32 element read on the device at each step.
    betas : tuple of 2 floats, optional
        Each in [0, 1).
    eps : float, optional
        >= 0.
    weight_decay : float, optional
        >= 0.

    Attributes
    ----------
    exp_avgs, exp_avg_sqs : list of DeviceArray
        The moments (float32, zero at construction).
    step_count : DeviceArray
        (1,) float32: the steps taken, counted on the device (a skipped step
        does not count).
    """

    def __init__(self, params: Iterable[Parameter], lr: LR = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        lr = _check_lr(lr)
        eps = _check_hyper(eps, "epsilon value")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a tuple of 2 floats, got {betas!r}")
        beta1, beta2 = (_check_hyper(b, "beta parameter") for b in betas)
        for i, b in enumerate((beta1, beta2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")
        weight_decay = _check_hyper(weight_decay, "weight_decay value")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, (beta1, beta2), eps, weight_decay
        self.exp_avgs = self._state()
        self.exp_avg_sqs = self._state()
        self.step_count = _core.zeros((1,), dtype=F32)

    def step(self, found_inf: Optional[_core.DeviceArray] = None) -> None:
        """step(found_inf=None) -> None

        One update of every parameter from its grad (the step count advances
        on the device); nothing changes, the count included, where
        `found_inf` (one float32 element) is nonzero on the device.
        """
        found_inf = self._check_found_inf(found_inf)
        values, grads = self._step_arrays()
        beta1, beta2 = self.betas
        _core._nn_adamw_(values, grads, self.exp_avgs, self.exp_avg_sqs, self.step_count,
                         self.lr, beta1, beta2, self.eps, self.weight_decay, found_inf, None)

    def __repr__(self) -> str:
        return (f"AdamW(lr={self.lr}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay})")
