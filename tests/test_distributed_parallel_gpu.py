"""GPU tier: placement (.to) and the parallelism layer against one GPU.

* ``MLP.to`` / ``ResNet50.to``: to the same device changes nothing (same
  buffers, same output); to another device and back gives the same outputs
  and gradients, from whichever device is current; an input on the wrong
  device is refused naming both devices; a CUDA graph captured before a move
  keeps running.
* ``DataParallel`` over 2 GPUs: logits and gradients equal one GPU's on the
  whole batch (fp32, 1e-5 relative; odd batch so the split is uneven), the
  losses of a few AdamW steps too; a batch of one row (an idle replica adds
  nothing), another output device, bf16 loosely.
* ``Pipeline`` over 2 GPUs: loss, gradients and logits equal the unsplit
  MLP's (fp32, GELU and ReLU: the stage boundary's explicit activation
  derivative), a few AdamW steps' losses, the timings' bubble arithmetic and
  per-device peak memory.
* ``DistributedDataParallel`` over 2 processes (tests/dist_workers/ddp_training.py):
  every check of the worker (fp32 / bf16 / fp16 wire, no_sync accumulation,
  the optimizer stepped in the backward, a captured step) against one GPU on
  the same global batch.
"""

from __future__ import annotations

import numpy as np
import pytest
from _distributed import launch_workers, needs_gpus
from _support import random_array, rel_err

import cudalab
import cudalab.models as models
import cudalab.nn as nn
from cudalab.distributed.data_parallel import DataParallel
from cudalab.distributed.pipeline import Pipeline

pytestmark = pytest.mark.gpu

F32 = np.dtype(np.float32)
SIZES = [32, 64, 48, 40, 16]  # 4 layers: 2 stages of 2
N = 37                        # odd: uneven splits (19 + 18 rows; micro-batches 10, 10, 10, 7)
LR = 1e-3
TOL = 1e-5                    # fp32 (sums in another order)
BF16_TOL = 3e-2


def batch(rng, rows=N, sizes=SIZES, device=0):
    with cudalab.device(device):
        x = cudalab.asarray(random_array(rng, (rows, sizes[0]), F32))
        labels = cudalab.asarray(rng.integers(0, sizes[-1], rows).astype(np.int64))
    return x, labels


def one_gpu_step(model, x, labels, precision="fp32"):
    """Forward, mean cross-entropy (gradient over the logits), backward; the loss (host)."""
    logits = model.forward(x, precision)
    loss = nn.functional.cross_entropy(logits, labels, grad=logits)
    model.backward(logits)
    return float(loss.get())


def host_grads(params):
    return [p.grad.get() for p in params]


def assert_grads_close(got, want, tol, what):
    for g, w, p in zip(got, want, range(len(want))):
        err = rel_err(g, w)
        assert err < tol, f"{what}: parameter {p}'s gradient differs by {err:.3g} (>= {tol:g})"


# ---- MLP.to / ResNet50.to --------------------------------------------------------------------------


def test_mlp_to_its_own_device_changes_nothing(rng):
    model = nn.MLP(SIZES, seed=3)
    x, _ = batch(rng)
    first = model.forward(x, "fp32").get()
    ptrs = [(l.weight.value.data_ptr, l.weight.grad.data_ptr, l.input.data_ptr)
            for l in model.layers]
    dev = cudalab.current_device()
    assert model.to(dev) is model and model.to(f"cuda:{dev}") is model
    assert model.to("cuda") is model and model.device == dev
    assert [(l.weight.value.data_ptr, l.weight.grad.data_ptr, l.input.data_ptr)
            for l in model.layers] == ptrs, "to() its own device moved or dropped something"
    model.backward(cudalab.ones((N, SIZES[-1]), dtype=F32))  # the forward's state survived
    np.testing.assert_array_equal(model.forward(x, "fp32").get(), first)


@needs_gpus(2)
def test_mlp_to_another_device_and_back(rng):
    model = nn.MLP(SIZES, "gelu", seed=3)
    x, labels = batch(rng)
    g = cudalab.asarray(random_array(rng, (N, SIZES[-1]), F32))
    logits0 = model.forward(x, "fp32").get()
    model.backward(g)
    grads0 = host_grads(model.parameters())
    values0 = [p.value.get() for p in model.parameters()]

    assert model.to(1) is model and model.device == 1
    for p in model.parameters():
        assert p.value.device == 1 and p.grad.device == 1, p.name
    np.testing.assert_array_equal(host_grads(model.parameters())[0], grads0[0])  # grads moved
    assert cudalab.current_device() == 0
    with pytest.raises(ValueError, match=r"^forward\(\) argument 'x': is on device 0 but the "
                                         r"layer is on device 1"):
        model.forward(x, "fp32")
    x1, g1 = x.to(1), g.to(1)
    logits1 = model.forward(x1, "fp32")  # device 0 current: the model switches to its own
    assert logits1.device == 1 and cudalab.current_device() == 0
    assert rel_err(logits1, logits0) < 1e-6
    model.backward(g1)
    assert_grads_close(host_grads(model.parameters()), grads0, 1e-6, "on device 1")
    # bf16 on the new device (the weight casts are allocated there).
    assert model.forward(x1, "bf16").device == 1

    model.to(0)
    assert [p.value.get() for p in model.parameters()][0].tobytes() == values0[0].tobytes()
    np.testing.assert_array_equal(model.forward(x, "fp32").get(), logits0)
    model.backward(g)
    for got, want in zip(host_grads(model.parameters()), grads0):
        np.testing.assert_array_equal(got, want)


@needs_gpus(2)
def test_linear_to_and_an_optimizer_made_after(rng):
    layer = nn.Linear(SIZES[0], 24, activation="relu", seed=2).to(1)
    x, _ = batch(rng)
    y = layer.forward(x.to(1), "fp32")
    assert y.device == 1 and layer.aux.device == 1
    gx = layer.backward(cudalab.ones((N, 24), dtype=F32).to(1))
    assert gx.device == 1
    with cudalab.device(1):
        opt = nn.SGD(layer.parameters(), lr=0.1)
    opt.step()  # the fused kernel runs on the parameters' device


def _images(rng, batch=2, size=64):
    return rng.standard_normal((batch, size, size, 3)).astype(np.float32)


def test_resnet_to_its_own_device_keeps_the_compiled_forward(rng):
    model = models.resnet50(seed=1)
    x = _images(rng)
    first = model.forward(x).get()
    compiled = dict(model._compiled)
    dev = cudalab.current_device()
    assert model.to(dev) is model and model.device == dev
    assert model._compiled == compiled
    np.testing.assert_array_equal(model.forward(x).get(), first)


@needs_gpus(2)
def test_resnet_to_another_device_and_back(rng):
    model = models.resnet50(seed=1)
    x = _images(rng)
    logits0 = model.forward(x).get()
    graphed = model.capture(2, 64, 64)  # captured on device 0
    assert model.to(1) is model and model.device == 1 and not model._compiled
    x1 = cudalab.asarray(x).to(1)
    out = model.forward(x1)  # device 0 current
    assert out.device == 1 and cudalab.current_device() == 0
    assert np.max(np.abs(out.get() - logits0)) <= 1e-5 * np.max(np.abs(logits0))
    np.testing.assert_array_equal(model.forward(x).get(), out.get())  # NumPy input: there
    with pytest.raises(ValueError, match=r"^forward\(\) argument 'x': is on device 0 but the "
                                         r"model is on device 1"):
        model.forward(cudalab.asarray(x))
    with pytest.raises(ValueError, match=r"argument 'out': is on device 0"):
        model.forward(x1, out=cudalab.empty((2, 1000), dtype=F32))
    g1 = model.capture(2, 64, 64)
    assert g1.input.device == 1 and g1.output.device == 1
    np.testing.assert_array_equal(g1(x).get(), out.get())
    # The graph captured on device 0 still runs there, on the weights it captured.
    old = graphed(x)
    assert old.device == 0
    np.testing.assert_array_equal(old.get(), logits0)
    model.to(0)
    np.testing.assert_array_equal(model.forward(x).get(), logits0)


# ---- DataParallel ------------------------------------------------------------------------------


@needs_gpus(2)
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_data_parallel_equals_one_gpu(rng, activation):
    ref = nn.MLP(SIZES, activation, seed=7)
    model = nn.MLP(SIZES, activation, seed=7)
    dp = DataParallel(model, device_ids=[0, 1])
    assert dp.replicas[0] is model and dp.replicas[1].device == 1
    ref_opt = nn.AdamW(ref.parameters(), lr=LR)
    opt = nn.AdamW(model.parameters(), lr=LR)
    for step in range(3):
        x, labels = batch(rng)
        want_logits = ref.forward(x, "fp32").get()
        got_logits = dp.forward(x, "fp32")
        assert dp.last_split == [(0, 19), (19, 37)]
        assert got_logits.device == 0 and got_logits.shape == (N, SIZES[-1])
        assert rel_err(got_logits, want_logits) < TOL, step
        loss = nn.functional.cross_entropy(got_logits, labels, grad=got_logits)
        dp.backward(got_logits)
        ref_loss = one_gpu_step(ref, x, labels)
        assert abs(float(loss.get()) - ref_loss) <= TOL * abs(ref_loss), step
        assert_grads_close(host_grads(model.parameters()), host_grads(ref.parameters()), TOL,
                           f"step {step}")
        opt.step()
        ref_opt.step()
    with pytest.raises(RuntimeError, match="without a forward"):
        dp.backward(got_logits)


@needs_gpus(2)
def test_data_parallel_small_batches_output_device_and_accumulation(rng):
    ref = nn.MLP(SIZES, seed=8)
    model = nn.MLP(SIZES, seed=8)
    dp = DataParallel(model, device_ids=[0, 1], output_device=1)
    # Two rows then one row: the second leaves replica 1 idle; its old grads must not count.
    for rows, acc in ((2, False), (1, True)):
        x, labels = batch(rng, rows)
        logits = dp.forward(x, "fp32")
        assert logits.device == 1 and len(dp.last_split) == rows
        nn.functional.cross_entropy(logits, labels.to(1), grad=logits)
        dp.backward(logits, accumulate=acc)
        want = ref.forward(x, "fp32")
        nn.functional.cross_entropy(want, labels, grad=want)
        ref.backward(want, accumulate=acc)
    assert_grads_close(host_grads(model.parameters()), host_grads(ref.parameters()), TOL,
                       "accumulated over a 2-row and a 1-row batch")


@needs_gpus(2)
def test_data_parallel_bf16_and_replication_without_cast(rng):
    ref = nn.MLP(SIZES, seed=9)
    model = nn.MLP(SIZES, seed=9)
    dp = DataParallel(model, device_ids=[0, 1])
    x, labels = batch(rng)
    ref_logits = ref.forward(x, "bf16")
    got = dp.forward(x, "bf16").get()
    assert rel_err(got, ref_logits) < BF16_TOL
    # cast_weights=False keeps the replicas' weights: the same logits again.
    again = dp.forward(x, "bf16", cast_weights=False).get()
    np.testing.assert_array_equal(again, got)
    traffic = dp.step_traffic(N, "bf16")
    assert traffic["replicate"] == sum(p.size for p in model.parameters()) * 2


# ---- Pipeline -----------------------------------------------------------------------------------


@needs_gpus(2)
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_pipeline_equals_the_unsplit_mlp(rng, activation):
    ref = nn.MLP(SIZES, activation, seed=5)
    model = nn.MLP(SIZES, activation, seed=5)
    pipe = Pipeline(model, [0, 1], chunks=4, timing=True)
    assert pipe.bounds == [(0, 2), (2, 4)]
    assert [l.device for l in model.layers] == [0, 0, 1, 1]
    ref_opt = nn.AdamW(ref.parameters(), lr=LR)
    opts = pipe.optimizers(nn.AdamW, lr=LR)
    assert len(opts) == 2 and opts[1].step_count.device == 1
    for step in range(3):
        x, labels = batch(rng)
        loss = pipe.forward_backward(x, labels, "fp32")
        assert pipe.last_split == [(0, 10), (10, 20), (20, 30), (30, 37)]
        assert loss.device == 1 and loss.shape == ()
        ref_loss = one_gpu_step(ref, x, labels)
        assert abs(float(loss.get()) - ref_loss) <= TOL * abs(ref_loss), (step, ref_loss)
        assert_grads_close(host_grads(model.parameters()), host_grads(ref.parameters()), TOL,
                           f"step {step}")
        for opt in opts:
            opt.step()
        ref_opt.step()
    x, labels = batch(rng)
    logits = pipe.forward(x, "fp32")
    assert logits.device == 1
    assert rel_err(logits, ref.forward(x, "fp32")) < TOL
    # train_step: the same as forward_backward and each stage's step.
    loss = pipe.train_step(x, labels, opts, "fp32")
    ref_loss = one_gpu_step(ref, x, labels)
    ref_opt.step()
    assert abs(float(loss.get()) - ref_loss) <= TOL * abs(ref_loss)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert rel_err(p.value, q.value) < TOL, p.name


@needs_gpus(2)
def test_pipeline_timings_memory_and_bf16(rng):
    ref = nn.MLP(SIZES, seed=6)
    model = nn.MLP(SIZES, seed=6)
    pipe = Pipeline(model, [0, 1], chunks=3, timing=True)
    x, labels = batch(rng, rows=36)
    for d in (0, 1):
        cudalab.reset_peak_memory_stats(d)
    loss = float(pipe.forward_backward(x, labels, "bf16").get())
    ref_loss = one_gpu_step(ref, x, labels, "bf16")
    assert abs(loss - ref_loss) < 1e-2 * abs(ref_loss), (loss, ref_loss)
    assert_grads_close(host_grads(model.parameters()), host_grads(ref.parameters()), 5e-2,
                       "bf16")
    t = pipe.timings()
    assert t.stages == 2 and t.micro_batches == 3
    assert t.bubble_theory == pytest.approx(1 / 4)
    assert t.step_ms > 0 and all(len(f) == 3 for f in t.forward_ms + t.backward_ms)
    assert all(ms > 0 for row in t.forward_ms + t.backward_ms for ms in row)
    for busy, bubble in zip(t.busy_ms, t.bubble):
        assert 0 < busy <= t.step_ms * 1.001, (busy, t.step_ms)
        assert bubble == pytest.approx(1 - busy / t.step_ms)
    peaks = pipe.peak_memory()
    assert len(peaks) == 2 and all(p > 0 for p in peaks)
    with pytest.raises(ValueError, match="'fp16' needs loss scaling"):
        pipe.forward_backward(x, labels, "fp16")
    with pytest.raises(ValueError, match="argument 'labels'"):
        pipe.forward_backward(x, labels[:5], "fp32")
    with pytest.raises(ValueError, match="one optimizer per stage"):
        pipe.train_step(x, labels, [], "fp32")


# ---- DistributedDataParallel ---------------------------------------------------------------------


@needs_gpus(2)
def test_ddp_on_two_processes_equals_one_gpu():
    run = launch_workers("ddp_training.py", 2, ["--timeout", "60"], timeout=300)
    assert len(run.results) == 2, run.explain()
    problems = []
    for res in run.results:
        if res.get("init_error"):
            problems.append(f"rank {res['rank']}: init(): {res['init_error']}")
            continue
        problems += [f"rank {res['rank']}: {c['name']}: {c['error']}"
                     for c in res["checks"] if not c["ok"]]
    assert not problems, "\n".join(problems) + "\n" + run.explain()
    for res in run.results:
        names = [c["name"] for c in res["checks"]]
        assert names == ["fp32", "bf16 wire", "fp16 wire", "no_sync", "optimizer in backward",
                         "optimizer in backward bf16 wire", "graph"], names
    assert run.returncode == 0, run.explain()
    fp32 = {c["name"]: c for c in run.by_rank()[0]["checks"]}["fp32"]
    assert fp32["loss_err"] < TOL and len(fp32["losses"]) >= 3
