"""What the training lessons share: the MLP and its data, a NumPy loss, and PyTorch twins.

The `profiling`, `amp` and `grad_accumulation` lessons train
:mod:`cudalab.nn`'s MLP on :class:`cudalab.nn.TeacherData`; where PyTorch is
installed they train the same network (the same initial weights, copied
through DLPack) on the same batches (shared through DLPack) beside it, with
the same step (autocast, GradScaler) written once here.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

import cudalab
from cudalab import nn
from cudalab.nn import reference

# The teacher network that labels the inputs: small, so labelling costs little.
TEACHER_HIDDEN = (64,)
# The measured matmul peak each precision's GEMMs run against (lessons place their step's
# GEMM rate against it in full mode only: quick sizes are launch-bound, and measuring a
# peak costs more than a quick lesson).
MATMUL_CEILINGS = {"fp32": "matmul_float32", "tf32": "matmul_tf32", "fp16": "matmul_float16",
                   "bf16": "matmul_bfloat16"}


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
    """The GEMM FLOPs of one step: every layer's forward and weight-gradient GEMMs, and the
    input-gradient GEMMs of every layer but the first (the data needs no gradient)."""
    weights = [a * b for a, b in zip(sizes[:-1], sizes[1:])]
    return 2.0 * batch * (3 * sum(weights) - weights[0])


def cycle(step: Callable[[Any, Any], Any],
          batches: Sequence[tuple[Any, Any]]) -> Callable[[], Any]:
    """A no-argument call that runs `step(x, labels)` on the next batch, round and round."""
    it = itertools.cycle(batches)

    def one() -> Any:
        x, labels = next(it)
        return step(x, labels)
    return one


def teacher_batches(sizes: Sequence[int], rows: int, count: int,
                    seed: int) -> list[tuple[Any, Any]]:
    """`count` batches (x, labels) of `rows` rows, made once on the device before timing."""
    data = nn.TeacherData(sizes[0], sizes[-1], rows, hidden=TEACHER_HIDDEN, batches=count,
                          seed=seed)
    return list(data)


def numpy_loss(model: nn.MLP, x: np.ndarray, labels: np.ndarray) -> float:
    """The model's mean softmax cross-entropy on (x, labels) in float64 NumPy."""
    hidden = model.layers[:-1]  # an MLP's activation follows every layer but the last
    activation = hidden[0].activation if hidden else None
    hs, _ = reference.forward(reference.mlp_params(model), x, activation)
    return reference.cross_entropy(hs[-1], labels)[0]


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
