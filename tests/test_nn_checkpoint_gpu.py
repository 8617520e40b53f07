"""MLP gradient checkpointing on the GPU: gradients bitwise equal to the plain step's (odd
sizes, every precision and activation), a lower pool peak, no allocation once a step ran
(so Trainer(graph=True) captures it), accumulation, and the argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
import cudalab.nn as nn
from cudalab.nn.layers import activation_bytes

pytestmark = pytest.mark.gpu

SIZES = [40, 72, 56, 72, 64, 72, 48, 24]  # 7 layers, multiples of 8 (cuBLASLt epilogues)


def _batch(rows, sizes=SIZES, seed=0):
    rng = np.random.default_rng(seed)
    x = cudalab.asarray(rng.standard_normal((rows, sizes[0])).astype(np.float32))
    labels = cudalab.asarray(rng.integers(0, sizes[-1], rows).astype(np.int64))
    return x, labels


def _grads(k, precision, activation, x, labels, accumulate_twice=False):
    model = nn.MLP(SIZES, activation, seed=5, checkpoint_segments=k)
    for step in range(2 if accumulate_twice else 1):
        logits = model.forward(x, precision)
        nn.functional.cross_entropy(logits, labels, grad=logits)
        model.backward(logits, accumulate=step > 0)
    return [p.grad.get() for p in model.parameters()]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("activation", ["gelu", "relu", None])
def test_grads_bitwise_equal_the_plain_step(precision, activation):
    x, labels = _batch(37)
    want = _grads(None, precision, activation, x, labels)
    assert all(np.abs(w).max() > 0 for w in want)
    for k in range(1, len(SIZES)):
        got = _grads(k, precision, activation, x, labels)
        for g, w, p in zip(got, want, nn.MLP(SIZES, seed=5).parameters()):
            np.testing.assert_array_equal(g, w, err_msg=f"k={k} {p.name}")


def test_accumulated_grads_bitwise_equal_the_plain_ones():
    x, labels = _batch(29, seed=1)
    want = _grads(None, "fp32", "gelu", x, labels, accumulate_twice=True)
    got = _grads(3, "fp32", "gelu", x, labels, accumulate_twice=True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _step_memory(k, sizes, rows):
    x, labels = _batch(rows, sizes)
    cudalab.synchronize()
    model = nn.MLP(sizes, seed=0, checkpoint_segments=k)
    opt = nn.SGD(model.parameters(), lr=0.01)
    cudalab.synchronize()
    built = cudalab.memory_allocated()
    cudalab.reset_peak_memory_stats()
    nn.train_step(model, opt, x, labels, "fp32")
    cudalab.synchronize()
    first = cudalab.max_memory_allocated() - built
    after = cudalab.memory_allocated()
    nn.train_step(model, opt, x, labels, "fp32")  # a second step allocates nothing new
    cudalab.synchronize()
    assert cudalab.memory_allocated() == after
    return first


def test_peak_falls_as_the_activation_bytes_predict():
    sizes = [64] + [512] * 16 + [16]
    rows = 2048
    _step_memory(None, sizes, rows)  # nn.fusion measures its GELU forms on the first one
    plain = _step_memory(None, sizes, rows)
    k4 = _step_memory(4, sizes, rows)
    saved = activation_bytes(sizes, rows, np.float32, "gelu") - activation_bytes(
        sizes, rows, np.float32, "gelu", 4)
    assert saved > 0.5 * activation_bytes(sizes, rows, np.float32, "gelu")
    # the step's other allocations (loss, scratch) are the same in both
    assert plain - k4 == pytest.approx(saved, rel=0.02)


def test_trainer_graph_replays_the_checkpointed_step():
    x, labels = _batch(64, seed=2)
    losses = []
    for k in (None, 3):
        model = nn.MLP(SIZES, seed=1, checkpoint_segments=k)
        trainer = nn.Trainer(model, nn.AdamW(model.parameters(), lr=1e-3), "bf16", graph=True)
        losses.append([float(trainer.step(x, labels).get()[0]) for _ in range(5)])
        assert trainer.cuda_graph is not None
    assert losses[0] == losses[1]


def test_checkpoint_argument_errors_and_switching():
    model = nn.MLP(SIZES, seed=0)
    with pytest.raises(TypeError, match=r"^checkpoint\(\) argument 'segments': expected an "
                                        "int, got bool"):
        model.checkpoint(True)
    with pytest.raises(ValueError, match=r"must be in \[1, 7\] \(the number of layers\), got 8"):
        model.checkpoint(8)
    with pytest.raises(ValueError, match=r"^MLP\(\) argument 'checkpoint_segments': must be "
                                         ">= 1, got 0"):
        nn.MLP(SIZES, checkpoint_segments=0)
    x, labels = _batch(16)
    logits = model.forward(x)
    model.checkpoint(2)  # drops the last forward
    with pytest.raises(RuntimeError, match=r"backward\(\) called before forward\(\)"):
        model.backward(logits)
    logits = model.forward(x)
    model.backward(logits)
    with pytest.raises(RuntimeError, match="called twice"):
        model.backward(logits)
