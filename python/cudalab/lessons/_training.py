"""What the training lessons share: the MLP and its data, a NumPy loss, and PyTorch twins.

The `amp` and `grad_accumulation` lessons train :mod:`cudalab.nn`'s MLP on
:class:`cudalab.nn.TeacherData`; where PyTorch is installed they train the
same network (the same initial weights, copied through DLPack) on the same
batches (shared through DLPack) beside it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn

# The teacher network that labels the inputs: small, so labelling costs little.
TEACHER_HIDDEN = (64,)


def check_sizes(lesson: str, p: Mapping[str, Any]) -> tuple[int, ...]:
    """The MLP's sizes (in_features, *hidden, classes) from the params, checked."""
    hidden = p["hidden"]
    if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__len__") or not hidden:
        raise ValueError(f"lesson {lesson!r}: hidden must be a non-empty sequence of sizes, "
                         f"got {hidden!r}")
    sizes = (p["in_features"], *hidden, p["classes"])
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(f"lesson {lesson!r}: layer sizes must be ints >= 1, got {s!r}")
    if p["classes"] < 2:
        raise ValueError(f"lesson {lesson!r}: classes must be >= 2, got {p['classes']}")
    return tuple(int(s) for s in sizes)


def check_positive(lesson: str, p: Mapping[str, Any], *names: str) -> None:
    """ValueError unless every named parameter is an int >= 1."""
    for name in names:
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"lesson {lesson!r}: {name} must be an int >= 1, got {v!r}")


def step_flops(sizes: Sequence[int], batch: int) -> float:
    """The GEMM FLOPs of one step: forward, input- and weight-gradient GEMMs of every layer."""
    return 3 * 2.0 * batch * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


def teacher_batches(sizes: Sequence[int], rows: int, count: int,
                    seed: int) -> list[tuple[Any, Any]]:
    """`count` batches (x, labels) of `rows` rows, made once on the device before timing."""
    data = nn.TeacherData(sizes[0], sizes[-1], rows, hidden=TEACHER_HIDDEN, batches=count,
                          seed=seed)
    return list(data)


def _gelu_tanh(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))


def numpy_loss(model: nn.MLP, x: np.ndarray, labels: np.ndarray) -> float:
    """The model's mean softmax cross-entropy on (x, labels) in float64 NumPy."""
    h = x.astype(np.float64)
    last = len(model.layers) - 1
    for i, layer in enumerate(model.layers):
        h = h @ layer.weight.value.get().astype(np.float64).T
        if layer.bias is not None:
            h = h + layer.bias.value.get().astype(np.float64)
        if i < last:
            h = _gelu_tanh(h) if layer.activation == "gelu" else np.maximum(h, 0.0)
    h = h - h.max(axis=1, keepdims=True)
    logp = h - np.log(np.exp(h).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def torch_twin(torch: Any, model: nn.MLP) -> Any:
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


class Tf32:
    """``with Tf32(torch, on):`` torch's float32 matmuls in TF32 or not, restored after."""

    def __init__(self, torch: Any, on: bool) -> None:
        self.matmul = torch.backends.cuda.matmul
        self.on = on

    def __enter__(self) -> None:
        self.saved = self.matmul.allow_tf32
        self.matmul.allow_tf32 = self.on

    def __exit__(self, *exc: Any) -> None:
        self.matmul.allow_tf32 = self.saved


def torch_step(torch: Any, twin: Any, opt: Any, scaler: Any,
               name: str) -> Callable[[Any, Any], Any]:
    """One PyTorch training step in precision `name` as a function of (x, labels):
    autocast for fp16/bf16, the loss scaled by `scaler` when given, the loss
    returned detached."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(name)
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


def torch_scaler(torch: Any, init_scale: float = 2.0**16, growth_interval: int = 2000) -> Any:
    """torch.amp.GradScaler, or torch.cuda.amp's in PyTorch versions before it moved."""
    make = getattr(torch.amp, "GradScaler", None)
    if make is None:
        return torch.cuda.amp.GradScaler(init_scale=init_scale, growth_interval=growth_interval)
    return make("cuda", init_scale=init_scale, growth_interval=growth_interval)
