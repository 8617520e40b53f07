"""What the training lessons share: the MLP's sizes and FLOPs, its data, a NumPy loss.

The `profiling`, `amp` and `grad_accumulation` lessons (and data and
pipeline parallelism) train :mod:`cudalab.nn`'s MLP on
:class:`cudalab.nn.TeacherData`; where PyTorch is installed they train the
same network on the same batches beside it, with the PyTorch twin of
:mod:`cudalab.nn.torch_twin`. benchmarks/bench_nn.py measures the same step
with these helpers. A framework module of cudalab.lessons, not a lesson.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from cudalab import nn
from cudalab.nn import reference

from ._measuring import rel_error

# The teacher network that labels the inputs: small, so labelling costs little.
TEACHER_HIDDEN = (64,)
# A training run's final loss is the mean of its last tenth of steps (one batch's is noisy).
FINAL_FRACTION = 0.1
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


def final_loss(losses: Sequence[float]) -> float:
    """The mean of the last `FINAL_FRACTION` of the losses (at least one)."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.size == 0:
        raise ValueError("final_loss() needs at least one loss")
    tail = max(1, int(round(losses.size * FINAL_FRACTION)))
    return float(losses[-tail:].mean())


def initial_loss_error(sizes: Sequence[int], seed: int, x: Any, labels: Any,
                       rows: int) -> tuple[int, float]:
    """(rows used, relative error): a fresh GELU MLP's fp32 loss on the first `rows` rows
    of (x, labels) against float64 NumPy, the check every training lesson starts with."""
    model = nn.MLP(sizes, "gelu", seed=seed)
    rows = min(rows, x.shape[0])
    got = nn.functional.cross_entropy(model.forward(x[:rows], "fp32"), labels[:rows])
    want = numpy_loss(model, x[:rows].get(), labels[:rows].get())
    return rows, rel_error(got.get(), want)
