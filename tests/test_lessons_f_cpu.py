"""Lessons amp and grad_accumulation without a GPU: registration, parameter checks, the
findings' arithmetic and wording, and both lessons end to end on a NumPy stand-in for the GPU
and for cudalab.nn."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import training as _training
from cudalab.lessons import amp
from cudalab.lessons import grad_accumulation as ga
from cudalab.lessons import profiling

# ---- registration and parameters -------------------------------------------------------------


@pytest.mark.parametrize("name,number", [("amp", 17), ("grad_accumulation", 18)])
def test_registered_with_plot_and_quick_params(name, number):
    x = lessons.get(name)
    assert x.number == number and x.plot is not None
    assert set(x.quick_params) <= set(x.params) and x.quick_params
    assert lessons.names().index(name) == len([n for n in lessons.names()
                                               if lessons.get(n).number < number])


def test_amp_params_cover_every_precision_and_quick_is_small():
    x = lessons.get("amp")
    full, quick = x.defaults(False), x.defaults(True)
    assert tuple(full["precisions"]) == ("fp32", "tf32", "fp16", "bf16")
    assert max(quick["hidden"]) <= 512 and quick["steps"] <= 200
    assert quick["batch"] * max(quick["hidden"]) < full["batch"] * max(full["hidden"]) / 16
    sizes, names = amp.check_params(full)
    assert sizes == (512, 4096, 4096, 4096, 4096, 16) and names == amp.PRECISIONS
    assert amp.check_params(quick)[0] == (64, 256, 256, 16)


def test_grad_accumulation_params_and_quick_is_small():
    x = lessons.get("grad_accumulation")
    full, quick = x.defaults(False), x.defaults(True)
    assert ga.check_params(full)[1] == (1, 2, 4, 8)
    assert ga.check_params(quick)[1] == (1, 2, 4)
    assert quick["batch"] * max(quick["hidden"]) < full["batch"] * max(full["hidden"]) / 16


def _amp(**over):
    return {**lessons.get("amp").defaults(True), **over}


def _ga(**over):
    return {**lessons.get("grad_accumulation").defaults(True), **over}


@pytest.mark.parametrize("over,match", [
    ({"precisions": ("fp16", "bf16")}, "precisions must include 'fp32'"),
    ({"precisions": ("fp32", "fp8")}, "precisions must be distinct names among"),
    ({"precisions": ("fp32", "fp32")}, "precisions must be distinct"),
    ({"steps": 1}, "steps must be >= 2"),
    ({"steps": 0}, "steps must be an int >= 1"),
    ({"batch": 2.5}, "batch must be an int >= 1"),
    ({"loop_steps": True}, "loop_steps must be an int >= 1"),
    ({"growth_interval": 0}, "growth_interval must be an int >= 1"),
    ({"lr": 0}, r"lr must be a number in \(0, 1\)"),
    ({"lr": "0.1"}, r"lr must be a number in \(0, 1\)"),
    ({"hidden": ()}, "hidden must be a non-empty sequence"),
    ({"hidden": (256, 0)}, "layer sizes must be ints >= 1"),
    ({"classes": 1}, "classes must be >= 2"),
])
def test_amp_rejects_bad_params(over, match):
    with pytest.raises(ValueError, match=r"^lesson 'amp': " + match):
        amp.check_params(_amp(**over))


def test_amp_takes_a_single_precision_name():
    assert amp.check_params(_amp(precisions="fp32"))[1] == ("fp32",)


@pytest.mark.parametrize("over,match", [
    ({"ks": (1, 2)}, "ks must be ints >= 2"),
    ({"ks": (2, 2)}, "ks must be distinct"),
    ({"ks": ()}, "ks must be distinct"),
    ({"ks": (3,)}, "batch 1024 does not split into 3 equal micro-batches"),
    ({"precision": "fp16"}, "precision must be one of fp32, tf32, bf16 .fp16 needs a loss scaler"),
    ({"precision": "float32"}, "precision must be one of"),
    ({"lr": 1.5}, r"lr must be a number in \(0, 1\)"),
    ({"batch": 0}, "batch must be an int >= 1"),
    ({"hidden": "256"}, "hidden must be a non-empty sequence"),
])
def test_grad_accumulation_rejects_bad_params(over, match):
    with pytest.raises(ValueError, match=r"^lesson 'grad_accumulation': " + match):
        ga.check_params(_ga(**over))


def test_grad_accumulation_sorts_ks_and_takes_one_int():
    assert ga.check_params(_ga(ks=(8, 2)))[1] == (1, 2, 8)
    assert ga.check_params(_ga(ks=4))[1] == (1, 4)


def test_unknown_parameter_is_refused_before_any_gpu_work():
    with pytest.raises(ValueError, match="has no parameter 'size'; its parameters are"):
        lessons.run("amp", quick=True, size=3)
    with pytest.raises(ValueError, match="has no parameter 'k'"):
        lessons.run("grad_accumulation", k=3)


# ---- amp: the arithmetic and the wording ------------------------------------------------------


def test_final_loss_is_the_mean_of_the_last_tenth():
    assert amp.final_loss([5.0] * 90 + [1.0] * 10) == 1.0
    assert amp.final_loss([3.0, 2.0]) == 2.0  # at least one loss
    assert amp.final_loss(np.arange(20.0)) == pytest.approx(18.5)
    with pytest.raises(ValueError):
        amp.final_loss([])


def test_loss_gap():
    assert amp.loss_gap(1.02, 1.0) == pytest.approx(0.02)
    assert amp.loss_gap(0.98, 1.0) == pytest.approx(0.02)
    assert amp.loss_gap(float("nan"), 1.0) == math.inf
    assert amp.loss_gap(1.0, float("inf")) == math.inf
    assert amp.loss_gap(1.0, 0.0) == math.inf


def test_scale_story_counts_skips_backoffs_and_growths():
    # step 1 overflows (scale halves), then two clean steps grow it (interval 2), one more skip
    s = amp.scale_story([32768.0, 32768.0, 65536.0, 32768.0], [1.0, 0.0, 0.0, 1.0], 65536.0)
    assert s == {"skipped": 2, "backoffs": 2, "growths": 1, "final": 32768.0}
    assert amp.scale_story([], [], 8.0) == {"skipped": 0, "backoffs": 0, "growths": 0,
                                            "final": 8.0}


@pytest.mark.parametrize("speedup,words", [
    (3.0, "tensor cores"), (1.0, "no faster"), (1.09, "no faster"), (0.5, "slower")])
def test_speed_text_follows_the_threshold(speedup, words):
    text = amp.speed_text("fp16", speedup, 1e-3 / speedup, 1e-3)
    assert words in text and f"{speedup:.2f}x" in text


def test_sync_text_follows_the_threshold():
    costly = amp.sync_text(1e-3, 1.5e-3)
    assert "500 us (1.50x) per step" in costly and "waits" in costly
    assert "hides the round trip" in amp.sync_text(1e-3, 1.01e-3)


def test_amp_rows_have_one_key_set():
    assert len(set(amp.ROW_KEYS)) == len(amp.ROW_KEYS)
    assert {"impl", "precision", "step_ms", "samples_per_s"} <= set(amp.ROW_KEYS)


# ---- grad_accumulation: the arithmetic and the wording ---------------------------------------


def test_micro_slices_cover_the_batch_in_order():
    s = ga.micro_slices(12, 3)
    assert s == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert ga.micro_slices(5, 1) == [slice(0, 5)]
    with pytest.raises(ValueError, match="does not split into 5 equal"):
        ga.micro_slices(12, 5)
    with pytest.raises(ValueError):
        ga.micro_slices(12, 0)


def test_grad_difference_is_the_worst_parameter_relative_to_its_scale():
    want = [np.array([1.0, -2.0]), np.array([[100.0, 0.0]])]
    got = [np.array([1.0, -2.02]), np.array([[100.0, 3.0]])]
    assert ga.grad_difference(got, want) == pytest.approx(0.03)
    assert ga.grad_difference(want, want) == 0.0
    assert ga.grad_difference(got[:1], want) == math.inf


def test_trade_text_follows_the_thresholds():
    both = ga.trade_text(4, 256, 0.25, 1.4)
    assert "k=4 (256 rows each)" in both and "4.0x less step memory" in both and "1.40x" in both
    assert "about the same step memory" in ga.trade_text(2, 512, 0.9, 1.0)
    assert "no extra time" in ga.trade_text(2, 512, 0.5, 1.0)
    assert "about the same step memory" in ga.trade_text(2, 512, 0.0, 1.0)


def test_flops_of_a_step():
    # forward and weight gradient of both layers, the input gradient of the second only
    assert _training.step_flops((4, 8, 2), 10) == 2 * 10 * (3 * (4 * 8 + 8 * 2) - 4 * 8)


# ---- the shared NumPy loss ----------------------------------------------------------------------


class _Value:
    def __init__(self, a):
        self.a = np.asarray(a)

    def get(self):
        return self.a


def test_numpy_loss_of_a_one_layer_model_is_log_softmax():
    w = np.array([[1.0, 0.0], [0.0, 2.0]])
    layer = type("L", (), {"weight": type("P", (), {"value": _Value(w)})(),
                           "bias": type("P", (), {"value": _Value([0.5, -0.5])})(),
                           "activation": None})()
    model = type("M", (), {"layers": [layer]})()
    x = np.array([[1.0, 1.0], [0.0, 3.0]])
    labels = np.array([1, 0])
    z = x @ w.T + [0.5, -0.5]
    want = -np.mean([z[i, labels[i]] - np.log(np.exp(z[i]).sum()) for i in range(2)])
    assert _training.numpy_loss(model, x, labels) == pytest.approx(want, rel=1e-12)


# ---- both lessons end to end on a NumPy stand-in for the GPU and for cudalab.nn -------------
# Not a measurement: it runs each lesson's Python (setup, training loop, rows, findings,
# claims, checks, JSON round trip and plot) with tiny parameters, so an error in that code
# shows here rather than on the GPU run. The stand-in MLP has real float64 gradients and the
# stand-in AdamW really steps, so the lessons' loss and gradient checks mean something.

import types  # noqa: E402

import cudalab  # noqa: E402
import test_lessons_d_cpu as standin  # noqa: E402  (the NumPy stand-in for cudalab's ops)
from cudalab import nn as real_nn  # noqa: E402
from cudalab.nn import reference  # noqa: E402
from cudalab.lessons import registry  # noqa: E402

_Array, _values = standin._Array, standin._values

_TINY = {
    "amp": {"in_features": 8, "hidden": (16,), "classes": 4, "batch": 32, "steps": 30,
            "batches": 4, "lr": 0.01, "loop_steps": 3, "growth_interval": 5},
    "grad_accumulation": {"in_features": 8, "hidden": (16, 16), "classes": 4, "batch": 32,
                          "ks": (2, 4)},
}


def _view(a):
    v = _Array.__new__(_Array)
    v.a = a  # a NumPy view: writes go through, as into a DeviceArray view
    return v


class _Memory:
    """The pool's counters: models add their bytes, a forward raises the peak by its rows."""

    live = peak = 0


class _Param:
    def __init__(self, name, values):
        self.name, self.value = name, _Array(values.astype(np.float32))
        self.grad = _Array(np.zeros_like(self.value.a))


class _Linear:
    def __init__(self, n_in, n_out, activation, rng):
        bound = 1 / math.sqrt(n_in)
        self.in_features, self.out_features, self.activation = n_in, n_out, activation
        self.weight = _Param("weight", rng.uniform(-bound, bound, (n_out, n_in)))
        self.bias = _Param("bias", rng.uniform(-bound, bound, n_out))


class _MLP:
    def __init__(self, sizes, activation="gelu", *, seed=0):
        rng = np.random.default_rng(seed)
        self.sizes, last = tuple(sizes), len(sizes) - 2
        self.layers = [_Linear(a, b, None if i == last else activation, rng)
                       for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]
        _Memory.live += 8 * sum(p.value.a.size for p in self.parameters())

    def parameters(self):
        return [p for layer in self.layers for p in (layer.weight, layer.bias)]

    def cast_weights(self, precision="fp32"):
        real_nn.get_precision(precision)

    def forward(self, x, precision="fp32", *, cast_weights=True):
        real_nn.get_precision(precision)
        h, self.saved = _values(x).astype(np.float64), []
        for layer in self.layers:
            z = h @ layer.weight.value.a.T + layer.bias.value.a
            self.saved.append((h, z))
            h = reference.gelu_tanh(z) if layer.activation == "gelu" else z
        _Memory.peak = max(_Memory.peak, _Memory.live + 8 * h.shape[0] * sum(self.sizes))
        return _Array(h.astype(np.float32))

    def backward(self, grad, *, accumulate=False):
        g = _values(grad).astype(np.float64)
        for layer, (h, z) in reversed(list(zip(self.layers, self.saved))):
            if layer.activation == "gelu":
                g = g * reference.gelu_tanh_grad(z)
            for p, v in ((layer.weight, g.T @ h), (layer.bias, g.sum(0))):
                p.grad.a[...] = (p.grad.a if accumulate else 0) + v
            g = g @ layer.weight.value.a


def _cross_entropy(logits, labels, *, grad=None, loss_scale=None):
    z = _values(logits).astype(np.float64)
    rows = np.arange(len(z))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[rows, _values(labels)]).mean()
    if grad is not None:
        p[rows, _values(labels)] -= 1
        grad.a[...] = p / len(z) * (1.0 if loss_scale is None else _values(loss_scale)[0])
    return _Array(np.float32(loss))


class _AdamW:
    betas, eps, weight_decay = (0.9, 0.999), 1e-8, 0.01

    def __init__(self, params, lr=1e-3):
        self.params, self.lr, self.t = list(params), lr, 0
        self.m = [np.zeros(p.value.a.shape) for p in self.params]
        self.v = [np.zeros(p.value.a.shape) for p in self.params]

    def step(self, found_inf=None):
        if found_inf is not None and _values(found_inf)[0]:
            return
        self.t += 1
        for i, p in enumerate(self.params):
            w, self.m[i], self.v[i] = reference.adamw_step(
                p.value.a, p.grad.a, self.m[i], self.v[i], self.t, self.lr, self.betas, self.eps,
                self.weight_decay)
            p.value.a[...] = w


class _Scaler:
    """PyTorch's rule; the first step overflows on purpose, so a backoff shows."""

    def __init__(self, init_scale=2.0**16, growth_interval=2000):
        self.init_scale, self.interval, self.clean, self.steps = init_scale, growth_interval, 0, 0
        self.scale = _Array(np.array([init_scale], np.float32))
        self.found_inf = _Array(np.zeros(1, np.float32))

    def unscale_and_update(self, grads):
        found = self.steps == 0 or not all(np.isfinite(g.a).all() for g in grads)
        for g in grads:
            g.a /= self.scale.a[0]
        self.found_inf.a[0] = found
        self.steps += 1
        self.clean = 0 if found else self.clean + 1
        if found:
            self.scale.a[0] *= 0.5
        elif self.clean == self.interval:
            self.scale.a[0] *= 2.0
            self.clean = 0

    def get_scale(self):
        return float(self.scale.a[0])


def _train_step(model, opt, x, labels, precision="fp32", scaler=None):
    logits = model.forward(x, precision)
    loss = _cross_entropy(logits, labels, grad=logits,
                          loss_scale=None if scaler is None else scaler.scale)
    model.backward(logits)
    if scaler is not None:
        scaler.unscale_and_update([p.grad for p in model.parameters()])
    opt.step(found_inf=None if scaler is None else scaler.found_inf)
    return loss


class _TeacherData:
    """A linear teacher: learnable in a few steps."""

    def __init__(self, in_features, classes, batch_size, *, hidden=(64,), batches=100, seed=0):
        self.shape, self.batches, self.seed = (batch_size, in_features), batches, seed
        self.teacher = np.random.default_rng(seed + 1).standard_normal((in_features, classes))

    def __iter__(self):
        for i in range(self.batches):
            x = np.random.default_rng((self.seed, i)).standard_normal(self.shape)
            yield _Array(x.astype(np.float32)), _Array(np.argmax(x @ self.teacher, axis=1))


def _fake_nn(monkeypatch):
    fake = types.SimpleNamespace(
        MLP=_MLP, AdamW=_AdamW, GradScaler=_Scaler, TeacherData=_TeacherData,
        train_step=_train_step, PRECISIONS=real_nn.PRECISIONS,
        functional=types.SimpleNamespace(cross_entropy=_cross_entropy))
    for module in (amp, ga, _training, profiling):
        monkeypatch.setattr(module, "nn", fake)
    monkeypatch.setattr(_Array, "__getitem__", lambda self, key: _view(self.a[key]),
                        raising=False)
    _Memory.live = _Memory.peak = 0

    def reset():
        _Memory.peak = _Memory.live

    for name, fn in {"mul": lambda a, b, out=None: standin._into(out, _values(a) * b),
                     "copyto": lambda dst, src: standin._into(dst, _values(src)) and None,
                     "memory_allocated": lambda: _Memory.live,
                     "max_memory_allocated": lambda: _Memory.peak,
                     "reset_peak_memory_stats": reset}.items():
        monkeypatch.setattr(cudalab, name, fn)


@pytest.mark.parametrize("name", list(_TINY))
def test_lesson_runs_on_a_numpy_stand_in(monkeypatch, name):
    """The other lessons' end-to-end test (rows, checks, JSON round trip, plot), with nn faked."""
    _fake_nn(monkeypatch)
    monkeypatch.setitem(standin._TINY, name, _TINY[name])
    standin.test_lesson_runs_on_a_numpy_stand_in(monkeypatch, name)


def _run_on_stand_in(monkeypatch, name, quick=True):
    timer = standin._fake_gpu(monkeypatch)
    _fake_nn(monkeypatch)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get(name)
    r = registry.LessonRun(x, {**x.defaults(True), **_TINY[name]}, quick)
    r.timer = timer
    x.function(r)
    assert {tuple(row) for row in r.rows} == {amp.ROW_KEYS if name == "amp" else ga.ROW_KEYS}
    for f in r.findings:
        assert set(f.labels) <= set(r.measurements), f
    return r


def test_amp_on_the_stand_in_reads_the_scaler_history(monkeypatch):
    r = _run_on_stand_in(monkeypatch, "amp", quick=False)  # full mode: the peaks too
    assert all(row["pct_peak"] is not None for row in r.rows)
    assert any("measured matmul peak" in f.text for f in r.findings)
    fp16 = next(row for row in r.rows if row["precision"] == "fp16")
    # one skipped step (the first), then a growth every 5 clean steps over the 29 others
    assert fp16["skipped_steps"] == 1
    assert fp16["final_scale"] == 2.0**15 * 2 ** (29 // 5)
    assert all(row["skipped_steps"] is None for row in r.rows if row["precision"] != "fp16")
    assert {row["impl"] for row in r.rows} == {"cudalab"}
    assert amp.SYNCED in r.measurements and "loop fp16" in r.measurements


def test_grad_accumulation_on_the_stand_in_saves_memory(monkeypatch):
    r = _run_on_stand_in(monkeypatch, "grad_accumulation")
    rows = {row["k"]: row for row in r.rows}
    assert sorted(rows) == [1, 2, 4]
    assert rows[4]["step_mib"] == pytest.approx(rows[1]["step_mib"] / 4)
    assert rows[2]["grad_max_rel_diff"] < 1e-6 and rows[1]["grad_max_rel_diff"] is None
    assert len([c for c in r.checks if "accumulated grads" in c.what]) == 2
