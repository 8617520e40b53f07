"""MLP gradient checkpointing without a GPU: argument checks, the segment arithmetic, and the
checkpointed step on the NumPy device stand-in (bitwise-equal gradients, shared buffers)."""

import numpy as np
import pytest

from cudalab import _core, nn
from cudalab.nn.layers import (SharedActivations, activation_bytes, recomputed_layers,
                               segment_bounds)

from test_distributed_parallel_cpu import NumpyDevice, _np_batch

SIZES = [24, 40, 40, 32, 40, 40, 40, 16]  # 7 layers, widths differ inside segments


@pytest.fixture
def npdev(monkeypatch):
    device = NumpyDevice(monkeypatch)
    yield device
    NumpyDevice.current = 0


def test_segment_bounds_are_contiguous_balanced_larger_last():
    assert segment_bounds(7, 1) == [(0, 7)]
    assert segment_bounds(7, 3) == [(0, 2), (2, 4), (4, 7)]
    assert segment_bounds(7, 7) == [(i, i + 1) for i in range(7)]
    for n in range(1, 14):
        for k in range(1, n + 1):
            b = segment_bounds(n, k)
            sizes = [y - x for x, y in b]
            assert b[0][0] == 0 and b[-1][1] == n and len(b) == k
            assert all(b[i][1] == b[i + 1][0] for i in range(k - 1))
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes)
    for bad in (0, 8):
        with pytest.raises(ValueError, match="need 1 <= segments <= layers"):
            segment_bounds(7, bad)


def test_recomputed_layers_are_the_inner_layers_of_all_segments_but_the_last():
    assert recomputed_layers(7, None) == [] and recomputed_layers(7, 1) == []
    assert recomputed_layers(7, 7) == []
    assert recomputed_layers(7, 3) == [0, 2]  # segments (0,2) (2,4) (4,7)
    assert recomputed_layers(16, 4) == [0, 1, 2, 4, 5, 6, 8, 9, 10]


def test_activation_bytes_counts_checkpoints_and_one_segment():
    sizes = [8] + [64] * 16 + [16]  # 17 layers, GELU, float32: output + aux (64 each) per row
    per_layer = 2 * 64 * 4 * 10
    logits = 16 * 4 * 10
    plain = activation_bytes(sizes, 10, np.float32, "gelu")
    assert plain == 16 * per_layer + logits
    assert activation_bytes(sizes, 10, np.float32, "gelu", 1) == plain
    assert activation_bytes(sizes, 10, np.float32, "gelu", 17) == plain
    # k=4: segments of 4, 4, 4, 5 layers: 3 hidden checkpoints + the logits, 4 shared slots
    assert activation_bytes(sizes, 10, np.float32, "gelu", 4) == 3 * per_layer + logits + \
        4 * per_layer
    # the least (7 hidden layers' worth and the logits) at k = 3 to 6, around sqrt(17)
    least = {k for k in range(1, 18)
             if activation_bytes(sizes, 10, np.float32, "gelu", k) == 7 * per_layer + logits}
    assert least == {3, 4, 5, 6}
    # ReLU keeps a bit mask (16 bytes per 128 features) instead of the pre-activation
    assert activation_bytes([8, 64, 16], 10, np.float16, "relu") == 10 * (64 * 2 + 16 + 16 * 2)


def test_checkpoint_argument_checks():
    model = object.__new__(nn.MLP)
    model.layers = [object()] * 3
    for func, call in (("checkpoint", lambda v: nn.MLP.checkpoint(model, v)),
                       ("MLP", lambda v: model._set_checkpoint(v, "MLP",
                                                              "checkpoint_segments"))):
        param = "segments" if func == "checkpoint" else "checkpoint_segments"
        with pytest.raises(TypeError, match=rf"^{func}\(\) argument '{param}': expected an int, "
                                            "got bool"):
            call(True)
        with pytest.raises(TypeError, match="expected an int, got float"):
            call(2.0)
        with pytest.raises(ValueError, match=r"must be >= 1, got 0"):
            call(0)
        with pytest.raises(ValueError, match=r"must be in \[1, 3\] \(the number of layers\), "
                                             "got 4"):
            call(4)


def test_shared_activations_give_views_at_the_start(npdev):
    shared = SharedActivations()
    shared.reserve("output", 60, np.float32)
    flat = shared._flat["output"]
    v = shared.get("output", (3, 20), np.float32)
    assert v.shape == (3, 20) and np.shares_memory(v, flat)
    shared.reserve("output", 60, np.float32)
    assert shared._flat["output"] is flat  # same size: kept, no allocation
    with pytest.raises(RuntimeError, match="60 float32 reserved, 80 float32 asked for"):
        shared.get("output", (4, 20), np.float32)


def _grads(x, labels, k, activation, steps=2):
    model = nn.MLP(SIZES, activation, seed=1, checkpoint_segments=k)
    for step in range(steps):
        logits = model.forward(x, "fp32")
        _core._nn_cross_entropy(logits, labels, logits, "mean", None, None, -100)
        model.backward(logits, accumulate=step > 0)
    return model, [np.array(p.grad) for p in model.parameters()]


@pytest.mark.parametrize("activation", ["gelu", "relu", None])
def test_checkpointed_grads_equal_the_plain_step_bitwise(npdev, activation):
    x, labels = _np_batch(npdev, np.random.default_rng(0), 9, sizes=SIZES)
    _, want = _grads(x, labels, None, activation)
    for k in range(1, len(SIZES)):
        model, got = _grads(x, labels, k, activation)
        assert model.checkpoint_segments == k
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"k={k}")


def test_inner_layers_write_into_shared_buffers_only(npdev):
    x, labels = _np_batch(npdev, np.random.default_rng(0), 9, sizes=SIZES)
    model, _ = _grads(x, labels, 3, "gelu", steps=1)  # segments (0,2) (2,4) (4,7)
    kept = {1, 3, 6}
    for i, layer in enumerate(model.layers):
        own = set(layer._buffers._arrays)
        assert ("output" in own) == (i in kept), (i, own)
    assert len(model._shared) == 2
    # position 0 holds layers 0, 2 and 4: sized for the widest (40 features, 9 rows)
    assert model._shared[0]._flat["output"].size == 9 * 40
    logits = model.forward(x, "fp32")
    outs = [model.layers[i + 1].input for i in range(len(SIZES) - 2)]
    assert np.shares_memory(outs[4], model._shared[0]._flat["output"])  # layer 4, last segment
    assert np.shares_memory(outs[5], model._shared[1]._flat["output"])
    assert logits.shape == (9, SIZES[-1])


def test_checkpoint_switches_and_drops_the_last_forward(npdev):
    x, labels = _np_batch(npdev, np.random.default_rng(0), 9, sizes=SIZES)
    model, _ = _grads(x, labels, None, "gelu", steps=1)
    logits = model.forward(x, "fp32")
    assert model.checkpoint(2) is model and model.checkpoint_segments == 2
    assert all(not layer._buffers._arrays and layer.input is None for layer in model.layers)
    with pytest.raises(RuntimeError, match="backward\\(\\) called before forward\\(\\)"):
        model.backward(logits)
    assert model.checkpoint(None).checkpoint_segments is None and model._shared == []


def test_train_step_with_checkpointing_matches_the_plain_one(npdev):
    x, labels = _np_batch(npdev, np.random.default_rng(3), 9, sizes=SIZES)
    values = []
    for k in (None, 3):
        model = nn.MLP(SIZES, seed=2, checkpoint_segments=k)
        opt = nn.AdamW(model.parameters(), lr=1e-2)
        losses = [float(np.asarray(nn.train_step(model, opt, x, labels))) for _ in range(3)]
        values.append((losses, [np.array(p.value) for p in model.parameters()]))
    assert values[0][0] == values[1][0]
    for a, b in zip(values[0][1], values[1][1]):
        np.testing.assert_array_equal(a, b)
