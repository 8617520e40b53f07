"""PyTorch twins of cudalab.nn's MLP training step, for side-by-side comparisons.

The same network as an :class:`~cudalab.nn.MLP` (its layers and a copy of
its current weights) as a ``torch.nn.Sequential``, the same device batches
shared through DLPack, and PyTorch's training step in each precision
(autocast, GradScaler, fused AdamW). The lessons (amp, profiling,
grad_accumulation, data and pipeline parallelism) and
benchmarks/bench_nn.py measure cudalab's step beside this one.

torch is never imported here: every function takes the ``torch`` module
(from `cudalab.bench.torch_cuda`), so cudalab does not depend on it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import cudalab

from .. import _precision
from .layers import MLP

__all__ = ["Tf32", "torch_adamw", "torch_batches", "torch_grad_scaler", "torch_train_step",
           "torch_twin"]


def torch_twin(torch: Any, model: MLP) -> Any:
    """A torch.nn.Sequential with `model`'s layers and a copy of its current weights."""
    layers = []
    cudalab.synchronize()  # the weights are written on cudalab's stream
    for layer in model.layers:
        lin = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                              device="cuda")
        with torch.no_grad():
            lin.weight.copy_(torch.from_dlpack(layer.weight.value))
            if layer.bias is not None:
                lin.bias.copy_(torch.from_dlpack(layer.bias.value))
        layers.append(lin)
        if layer.activation == "gelu":
            layers.append(torch.nn.GELU(approximate="tanh"))
        elif layer.activation == "relu":
            layers.append(torch.nn.ReLU())
    torch.cuda.synchronize()
    return torch.nn.Sequential(*layers)


def torch_batches(torch: Any, batches: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The same device batches as torch tensors (shared memory, no copy)."""
    return [(torch.from_dlpack(x), torch.from_dlpack(labels)) for x, labels in batches]


def torch_train_step(torch: Any, twin: Any, opt: Any, scaler: Any,
                     precision: str) -> Callable[[Any, Any], Any]:
    """``step(x, labels) -> loss``: PyTorch's training step of `twin` in `precision`.

    autocast to float16 / bfloat16 for "fp16" / "bf16", the mean cross-entropy,
    backward (through `scaler` when given: scale, step, update), the optimizer
    step; returns the loss detached (on the device).
    """
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    ce = torch.nn.functional.cross_entropy

    def step(x: Any, labels: Any) -> Any:
        opt.zero_grad(set_to_none=True)
        if dtype is None:
            loss = ce(twin(x), labels)
        else:
            with torch.autocast("cuda", dtype=dtype):
                loss = ce(twin(x), labels)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()
    return step


def torch_grad_scaler(torch: Any, init_scale: float, growth_interval: int) -> Any:
    """torch.amp.GradScaler, or torch.cuda.amp's in PyTorch versions before it moved."""
    make = getattr(torch.amp, "GradScaler", None)
    if make is None:
        return torch.cuda.amp.GradScaler(init_scale=init_scale, growth_interval=growth_interval)
    return make("cuda", init_scale=init_scale, growth_interval=growth_interval)


def torch_adamw(torch: Any, params: Iterable[Any], lr: float) -> Any:
    """torch.optim.AdamW with ``fused=True`` (one multi-tensor kernel, as cudalab's), or
    the default implementation in PyTorch versions without a fused one."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    except (TypeError, RuntimeError):  # no `fused` argument, or no fused kernel here
        return torch.optim.AdamW(params, lr=lr)


class Tf32(_precision.TorchTf32):
    """``with Tf32(torch, on):`` torch's float32 matmuls in TF32 or not, restored after
    (the one TF32 switch, cudalab._precision.TorchTf32, for torch matmuls only)."""

    def __init__(self, torch: Any, on: bool) -> None:
        super().__init__(torch, on)
