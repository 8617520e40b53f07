"""GPU tier: cudalab.nn end to end.

* MLP forward and backward (GELU and ReLU, every precision) against a NumPy
  float64 MLP fed the same rounded weights and inputs; the inputs are a
  row-strided view, the batch is odd (37 rows); odd feature counts either
  work or raise cuBLASLt's documented "offers no algorithm" error.
* Gradient accumulation over 2 micro-batches equals one batch.
* GradScaler: unscale values, injected inf/NaN make found_inf 1, the optimizer
  skip (params and AdamW's step count unchanged) and the scale back off; the
  scale sequence of a scripted inf pattern follows PyTorch's rule, and equals
  torch.amp.GradScaler's when torch is installed.
* SGD / AdamW single steps against NumPy.
* Training on TeacherData: the loss falls; with torch installed, 200 fp32
  steps of SGD(momentum) and of AdamW give torch's per-step losses within
  1e-4 relative; fp16 + scaler and bf16 end within 2% of fp32.
* A Trainer step captured in a CUDA graph and replayed gives eager's losses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support import F32, random_array, rel_err, torch_cuda, widen

import cudalab
import cudalab.nn as nn
from cudalab.nn import reference as ref
from cudalab.nn.torch_twin import torch_twin  # the same MLP in torch.nn

pytestmark = pytest.mark.gpu

N = 37
SIZES = [32, 72, 40, 16]          # multiples of 8: every fused epilogue applies
ODD_SIZES = [33, 45, 29, 11]      # cuBLASLt may refuse some epilogues at these
TOL = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 1e-2, "bf16": 3e-2}
PRECISION_NAMES = list(nn.PRECISIONS)

# Training runs (TeacherData): sizes where SGD's loss falls well within 200 steps.
IN, CLASSES, BATCH, HIDDEN = 32, 16, 256, [128, 128]
STEPS = 200


# ---- the NumPy float64 MLP: cudalab.nn.reference ---------------------------------------


def host_params(model):
    return [(widen(l.weight.value), widen(l.bias.value)) for l in model.layers]


def host_grads(model):
    return [(widen(l.weight.grad), widen(l.bias.grad)) for l in model.layers]


def strided_input(rng, rows, features):
    """A float32 (rows, features) view of a wider buffer, and its host values."""
    wide = random_array(rng, (rows, features + 5), F32)
    return cudalab.asarray(wide)[:, :features], wide[:, :features].astype(np.float64)


def _run_or_skip(fn):
    """Run fn; skip on cuBLASLt's documented refusal of an epilogue at odd sizes."""
    try:
        return fn()
    except cudalab.CudalabError as exc:
        if "offers no algorithm" in str(exc):
            pytest.skip(f"cuBLASLt refuses this size: {exc}")
        raise


# ---- MLP forward / backward -------------------------------------------------------------


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("sizes", [SIZES, ODD_SIZES], ids=["aligned", "odd"])
@pytest.mark.parametrize("name", PRECISION_NAMES)
def test_mlp_forward_backward_against_numpy(rng, name, sizes, activation):
    prec = nn.PRECISIONS[name]
    dt = prec.compute_dtype
    model = nn.MLP(sizes, activation, seed=11)
    x, x_h = strided_input(rng, N, sizes[0])
    g_h = random_array(rng, (N, sizes[-1]), dt)

    def run():
        logits = model.forward(x, name)
        got = widen(logits)
        model.backward(cudalab.asarray(g_h))
        return got

    got_logits = _run_or_skip(run)
    params = host_params(model)
    hs, zs = ref.forward(params, x_h, activation, dt)
    assert got_logits.shape == (N, sizes[-1])
    assert rel_err(got_logits, hs[-1]) < TOL[name], name
    want = ref.backward(params, hs, zs, widen(g_h), activation, dt)
    for i, layer in enumerate(model.layers):
        assert layer.weight.grad.dtype == F32 and layer.bias.grad.dtype == F32
        assert rel_err(layer.weight.grad, want[i][0]) < TOL[name], (name, i, "weight")
        assert rel_err(layer.bias.grad, want[i][1]) < TOL[name], (name, i, "bias")


def test_mlp_initialization_is_torchs_and_deterministic():
    a, b, c = nn.MLP(SIZES, seed=3), nn.MLP(SIZES, seed=3), nn.MLP(SIZES, seed=4)
    for la, lb, lc in zip(a.layers, b.layers, c.layers):
        bound = 1.0 / math.sqrt(la.in_features)
        for pa, pb, pc in zip(la.parameters(), lb.parameters(), lc.parameters()):
            va = pa.value.get()
            np.testing.assert_array_equal(va, pb.value.get())
            assert not np.array_equal(va, pc.value.get())
            assert va.min() >= -bound and va.max() < bound
            assert va.std() > 0.45 * bound  # uniform: std = bound / sqrt(3) = 0.577 bound
    assert [p.name for p in a.parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias",
                                                "2.weight", "2.bias"]
    # Layers differ from one another (each has its own key).
    assert not np.array_equal(a.layers[1].weight.value.get()[:16, :32],
                              a.layers[0].weight.value.get()[:16, :32])


def test_linear_standalone_gelu_aux_and_backward(rng):
    """A single Linear: its aux is GELU's pre-activation in a row-padded view."""
    layer = nn.Linear(24, 20, activation="gelu", seed=5)
    x, x_h = strided_input(rng, N, 24)
    y = layer.forward(x, "fp32")
    w, b = widen(layer.weight.value), widen(layer.bias.value)
    z = x_h @ w.T + b
    assert rel_err(y, ref.gelu_tanh(z)) < 1e-5
    assert layer.aux.shape == (N, 20) and layer.aux.strides[0] == 24 * 4  # padded to 8
    assert rel_err(layer.aux, z) < 1e-5
    g_h = random_array(rng, (N, 20), F32)
    gx = layer.backward(cudalab.asarray(g_h))
    assert rel_err(gx, widen(g_h) @ w) < 1e-5
    assert rel_err(layer.weight.grad, widen(g_h).T @ x_h) < 1e-5
    assert rel_err(layer.bias.grad, widen(g_h).sum(0)) < 1e-5
    assert layer.backward(cudalab.asarray(g_h), input_grad=False) is None


def test_forward_buffers_are_reused(rng):
    model = nn.MLP(SIZES, seed=2)
    x, _ = strided_input(rng, N, SIZES[0])
    for name in ("fp32", "fp16"):
        first = model.forward(x, name)
        ptrs = [l.aux.data_ptr for l in model.layers[:-1]]
        again = model.forward(x, name)
        assert again.data_ptr == first.data_ptr
        assert [l.aux.data_ptr for l in model.layers[:-1]] == ptrs


def test_backward_argument_checks(rng):
    model = nn.MLP(SIZES, seed=2)
    with pytest.raises(RuntimeError, match="before forward"):
        model.backward(cudalab.zeros((N, SIZES[-1]), dtype=F32))
    x, _ = strided_input(rng, N, SIZES[0])
    model.forward(x, "bf16")
    with pytest.raises(ValueError, match=r"^backward\(\) argument 'grad': expected shape"):
        model.backward(cudalab.zeros((N, SIZES[-1]), dtype=F32))  # float32, not bfloat16
    with pytest.raises(ValueError, match=r"^forward\(\) argument 'x': expected shape"):
        model.forward(cudalab.zeros((N, 7), dtype=F32))


def test_backward_writes_input_gradients_over_dead_outputs(rng):
    """MLP's backward keeps no gradient buffers: each input gradient overwrites
    the previous layer's output (its own input), which the weight gradient has
    read; a layer's out= is checked."""
    model = nn.MLP(SIZES, seed=2)
    x, _ = strided_input(rng, N, SIZES[0])
    for name in ("fp32", "bf16"):
        logits = model.forward(x, name)
        inputs = [l.input.data_ptr for l in model.layers]
        model.backward(cudalab.ones_like(logits))
        assert not any("grad_input" in l._buffers._arrays for l in model.layers)
        assert [l.input.data_ptr for l in model.layers] == inputs
    layer = model.layers[1]
    with pytest.raises(ValueError, match=r"^backward\(\) argument 'out': expected shape"):
        layer.backward(cudalab.ones((N, SIZES[2]), dtype=nn.PRECISIONS["bf16"].compute_dtype),
                       out=cudalab.empty((N, SIZES[1]), dtype=F32))


# ---- gradient accumulation ------------------------------------------------------------------


@pytest.mark.parametrize("name", PRECISION_NAMES)
def test_accumulation_over_two_micro_batches_equals_one_batch(rng, name):
    dt = nn.PRECISIONS[name].compute_dtype
    rows = 2 * 19
    x = cudalab.asarray(random_array(rng, (rows, SIZES[0]), F32))
    g = cudalab.asarray(random_array(rng, (rows, SIZES[-1]), dt))
    whole, parts = nn.MLP(SIZES, seed=9), nn.MLP(SIZES, seed=9)
    whole.forward(x, name)
    whole.backward(g)
    parts.cast_weights(name)
    for k, acc in ((0, False), (1, True)):
        rows_k = slice(19 * k, 19 * (k + 1))
        parts.forward(x[rows_k], name, cast_weights=False)
        parts.backward(g[rows_k], accumulate=acc)
    for pw, pp in zip(whole.parameters(), parts.parameters()):
        assert rel_err(pp.grad, widen(pw.grad)) < max(TOL[name], 1e-5), (name, pw.name)


def test_accumulate_adds_to_existing_grads(rng):
    model = nn.MLP(SIZES, seed=1)
    x = cudalab.asarray(random_array(rng, (N, SIZES[0]), F32))
    g = cudalab.asarray(random_array(rng, (N, SIZES[-1]), F32))
    model.forward(x)
    model.backward(g)
    once = [widen(p.grad) for p in model.parameters()]
    with pytest.raises(RuntimeError, match="called twice after one forward"):
        model.backward(g, accumulate=True)  # its activations were overwritten
    model.forward(x)
    model.backward(g, accumulate=True)
    for p, o in zip(model.parameters(), once):
        assert rel_err(p.grad, 2 * o) < 1e-5
    model.zero_grad()
    for p in model.parameters():
        assert not p.grad.get().any()


# ---- GradScaler -------------------------------------------------------------------------------


def _param(rng, shape, name="p"):
    return nn.Parameter(name, cudalab.asarray(random_array(rng, shape, F32)))


def _set_grad(p, values):
    p.grad = cudalab.asarray(np.asarray(values, dtype=np.float32).reshape(p.shape))


def test_unscale_divides_by_the_scale_and_clears_found_inf(rng):
    scaler = nn.GradScaler(init_scale=2.0**12)
    ps = [_param(rng, (7, 5)), _param(rng, (3,))]
    raw = [random_array(rng, p.shape, F32) for p in ps]
    for p, r in zip(ps, raw):
        _set_grad(p, r * 2.0**12)
    scaler.unscale_(ps)
    assert scaler.found_inf.get()[0] == 0.0
    for p, r in zip(ps, raw):
        np.testing.assert_array_equal(p.grad.get(), r)
    # found_inf is zeroed by the next unscale_, on the device.
    _set_grad(ps[0], np.full(35, np.inf))
    scaler.unscale_(ps)
    assert scaler.found_inf.get()[0] == 1.0
    _set_grad(ps[0], raw[0])
    scaler.unscale_(ps)
    assert scaler.found_inf.get()[0] == 0.0


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_injected_non_finite_grad_skips_the_step(rng, bad, opt_name):
    model = nn.MLP(SIZES, seed=4)
    opt = (nn.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else nn.AdamW(model.parameters(), lr=1e-3))
    scaler = nn.GradScaler()
    x = cudalab.asarray(random_array(rng, (N, SIZES[0]), F32))
    labels = cudalab.asarray(rng.integers(0, SIZES[-1], N))
    logits = model.forward(x, "fp16")
    nn.functional.cross_entropy(logits, labels, grad=logits, loss_scale=scaler.scale)
    model.backward(logits)
    before = [p.value.get() for p in model.parameters()]
    w = model.layers[1].weight
    g = w.grad.get()
    g[3, 5] = bad
    _set_grad(w, g)
    scaler.unscale_(opt)
    assert scaler.found_inf.get()[0] == 1.0
    opt.step(found_inf=scaler.found_inf)
    scaler.update()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.value.get(), b)
    assert scaler.get_scale() == 2.0**15
    assert scaler.growth_tracker.get()[0] == 0
    if opt_name == "adamw":
        assert opt.step_count.get()[0] == 0.0
    else:
        assert not any(b.get().any() for b in opt.momentum_buffers)


PATTERN = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]  # 1: inf in a grad


def _scripted_scales(init, growth, backoff, interval, pattern):
    """PyTorch's rule: products in double, rounded to float32, as on the device."""
    scale, tracker, out = np.float32(init), 0, []
    for bad in pattern:
        if bad:
            scale, tracker = np.float32(float(scale) * backoff), 0
        else:
            tracker += 1
            if tracker == interval:
                scale, tracker = np.float32(float(scale) * growth), 0
        out.append(float(scale))
    return out


def _cudalab_scales(rng, pattern, **kwargs):
    scaler = nn.GradScaler(**kwargs)
    p = _param(rng, (5,))
    opt = nn.SGD([p], lr=0.1)
    out = []
    for bad in pattern:
        before = p.value.get()
        _set_grad(p, np.full(5, np.inf if bad else 1.0) * scaler.get_scale())
        scaler.unscale_(opt)
        opt.step(found_inf=scaler.found_inf)
        scaler.update()
        out.append(scaler.get_scale())
        changed = not np.array_equal(p.value.get(), before)
        assert changed is (not bad)
    return out


def test_scale_sequence_follows_pytorchs_rule(rng):
    kwargs = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    got = _cudalab_scales(rng, PATTERN, **kwargs)
    assert got == _scripted_scales(2.0**10, 2.0, 0.5, 3, PATTERN)
    assert got[:5] == [1024.0, 1024.0, 2048.0, 1024.0, 1024.0]
    # Odd factors: rounding as the device's float32.
    kwargs = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=2)
    assert _cudalab_scales(rng, PATTERN, **kwargs) == _scripted_scales(1000.0, 3.0, 0.3, 2,
                                                                        PATTERN)


def test_scale_sequence_equals_torch_grad_scaler(rng):
    torch = torch_cuda()
    kwargs = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    make = getattr(torch.amp, "GradScaler", None)
    scaler = make("cuda", **kwargs) if make is not None else torch.cuda.amp.GradScaler(**kwargs)
    p = torch.zeros(5, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    want = []
    for bad in PATTERN:
        scaler.scale(torch.ones((), device="cuda"))  # initializes the scale lazily
        p.grad = torch.full((5,), math.inf if bad else 1.0, device="cuda")
        scaler.step(opt)
        scaler.update()
        want.append(float(scaler.get_scale()))
    got = _cudalab_scales(rng, PATTERN, **kwargs)
    print(f"\nscale sequence, inf pattern {PATTERN}:\n  cudalab {got}\n  torch   {want}")
    assert got == want


def test_disabled_scaler_in_a_step_changes_nothing(rng):
    model = nn.MLP(SIZES, seed=4)
    opt = nn.SGD(model.parameters(), lr=0.05)
    x = cudalab.asarray(random_array(rng, (N, SIZES[0]), F32))
    labels = cudalab.asarray(rng.integers(0, SIZES[-1], N))
    loss = nn.train_step(model, opt, x, labels, "bf16", nn.GradScaler(enabled=False))
    assert loss.shape == () and loss.dtype == F32 and np.isfinite(loss.get())


# ---- optimizers against NumPy -------------------------------------------------------------------


def test_sgd_momentum_two_steps_against_numpy(rng):
    ps = [_param(rng, (9, 4)), _param(rng, (4,))]
    opt = nn.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2)
    w = [widen(p.value) for p in ps]
    buf = [None, None]
    for step in range(2):
        gs = [random_array(rng, p.shape, F32) for p in ps]
        for p, g in zip(ps, gs):
            _set_grad(p, g)
        opt.step()
        for i, g in enumerate(gs):
            d = g + 1e-2 * w[i]
            buf[i] = d if step == 0 else 0.9 * buf[i] + 0.9 * d
            w[i] = w[i] - 0.05 * buf[i]
    for p, want in zip(ps, w):
        assert rel_err(p.value, want) < 1e-6


def test_adamw_two_steps_against_numpy(rng):
    ps = [_param(rng, (9, 4)), _param(rng, (4,))]
    opt = nn.AdamW(ps, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    w = [widen(p.value) for p in ps]
    m = [0.0, 0.0]
    v = [0.0, 0.0]
    for t in (1, 2):
        gs = [random_array(rng, p.shape, F32) for p in ps]
        for p, g in zip(ps, gs):
            _set_grad(p, g)
        opt.step()
        for i, g in enumerate(gs):
            w[i], m[i], v[i] = ref.adamw_step(w[i], g, m[i], v[i], t, 1e-2, (0.8, 0.99), 1e-6, 0.1)
    assert opt.step_count.get()[0] == 2.0
    for p, want in zip(ps, w):
        assert rel_err(p.value, want) < 1e-5


def test_zero_grad_clears_non_finite_grads(rng):
    p = _param(rng, (6,))
    _set_grad(p, [np.inf, np.nan, -np.inf, 1.0, -2.0, 3.0])
    nn.SGD([p], lr=0.1).zero_grad()
    np.testing.assert_array_equal(p.grad.get(), np.zeros(6, np.float32))


# ---- training ------------------------------------------------------------------------------------


def _data(seed=0):
    return nn.TeacherData(IN, CLASSES, BATCH, hidden=(64,), batches=STEPS, seed=seed)


def _train(precision, opt_name, steps=STEPS, scaler=None):
    model = nn.MLP([IN, *HIDDEN, CLASSES], "gelu", seed=21)
    opt = (nn.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else nn.AdamW(model.parameters(), lr=1e-3))
    data = _data()
    losses = []
    for i in range(steps):
        x, labels = data.batch(i)
        losses.append(float(nn.train_step(model, opt, x, labels, precision, scaler).get()))
    return np.array(losses)


def test_teacher_data_is_deterministic_and_balanced_enough():
    a, b = _data(), _data()
    xa, la = a.batch(5)
    xb, lb = b.batch(5)
    np.testing.assert_array_equal(xa.get(), xb.get())
    np.testing.assert_array_equal(la.get(), lb.get())
    assert la.dtype == np.int64 and la.shape == (BATCH,) and xa.shape == (BATCH, IN)
    assert not np.array_equal(a.batch(6)[0].get(), xa.get())
    assert not np.array_equal(_data(seed=1).batch(5)[0].get(), xa.get())
    assert len(np.unique(la.get())) >= CLASSES // 2  # not one class everywhere
    assert len(a) == STEPS and sum(1 for _ in nn.TeacherData(8, 8, 16, batches=3)) == 3


def test_sgd_training_loss_falls():
    losses = _train("fp32", "sgd")
    assert np.all(np.isfinite(losses))
    assert losses[-10:].mean() < 0.5 * losses[0], (losses[0], losses[-10:])


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_fp32_training_matches_torch_step_by_step(opt_name):
    torch = torch_cuda()
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = nn.MLP([IN, *HIDDEN, CLASSES], "gelu", seed=21)
        twin = torch_twin(torch, model)
        if opt_name == "sgd":
            opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9)
            topt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
        else:
            opt = nn.AdamW(model.parameters(), lr=1e-3)
            topt = torch.optim.AdamW(twin.parameters(), lr=1e-3)
        data = _data()
        ours, theirs = [], []
        for i in range(STEPS):
            x, labels = data.batch(i)
            ours.append(float(nn.train_step(model, opt, x, labels, "fp32").get()))
            tx, tl = torch.from_dlpack(x), torch.from_dlpack(labels)
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(twin(tx), tl)
            loss.backward()
            topt.step()
            theirs.append(loss.item())
        worst = np.max(np.abs(np.array(ours) - theirs) / np.abs(theirs))
        print(f"\n{opt_name}: {STEPS} fp32 steps, loss {ours[0]:.6f} -> {ours[-1]:.6f} "
              f"(torch {theirs[0]:.6f} -> {theirs[-1]:.6f}), largest per-step relative "
              f"difference {worst:.2e}")
        np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("name", ["fp16", "bf16", "tf32"])
def test_mixed_precision_ends_near_fp32(name):
    ref = _train("fp32", "sgd")
    scaler = nn.GradScaler() if name == "fp16" else None
    got = _train(name, "sgd", scaler=scaler)
    assert np.all(np.isfinite(got))
    final_ref, final = ref[-20:].mean(), got[-20:].mean()
    print(f"\n{name}: final loss {final:.5f} vs fp32 {final_ref:.5f} "
          f"({(final - final_ref) / final_ref:+.3%})")
    assert abs(final - final_ref) <= 0.02 * final_ref, (name, final, final_ref)


# ---- CUDA graph ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,opt_name", [("fp32", "sgd"), ("fp32", "adamw"), ("fp16", "sgd"),
                                           ("bf16", "adamw")])
def test_captured_trainer_replays_eager_losses(name, opt_name):
    steps = 12
    results = []
    for graph in (False, True):
        model = nn.MLP([IN, *HIDDEN, CLASSES], "gelu", seed=21)
        opt = (nn.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
               else nn.AdamW(model.parameters(), lr=1e-3))
        scaler = nn.GradScaler(init_scale=2.0**16, growth_interval=4) if name == "fp16" else None
        trainer = nn.Trainer(model, opt, name, scaler, graph=graph)
        data = _data()
        losses = []
        for i in range(steps):
            x, labels = data.batch(i)
            losses.append(float(trainer.step(x, labels).get()[0]))
        assert (trainer.cuda_graph is not None) is graph
        scale = scaler.get_scale() if scaler is not None else None
        results.append((np.array(losses), [p.value.get() for p in model.parameters()], scale))
    (eager, eager_params, eager_scale), (replayed, graph_params, graph_scale) = results
    np.testing.assert_allclose(replayed, eager, rtol=1e-5)
    for a, b in zip(graph_params, eager_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert graph_scale == eager_scale


def test_trainer_refuses_another_batch_shape():
    model = nn.MLP([IN, *HIDDEN, CLASSES], seed=21)
    trainer = nn.Trainer(model, nn.SGD(model.parameters(), lr=0.1), graph=True)
    x, labels = _data().batch(0)
    trainer.step(x, labels)
    with pytest.raises(ValueError, match=r"^step\(\) argument 'x': expected shape"):
        trainer.step(x[:10], labels[:10])
