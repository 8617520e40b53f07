"""Lessons amp and grad_accumulation without a GPU: registration, parameter checks, the
findings' arithmetic and wording, and both lessons end to end on a NumPy stand-in for the GPU
and for cudalab.nn."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _training
from cudalab.lessons import amp
from cudalab.lessons import grad_accumulation as ga

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
    assert ga._flops((4, 8, 2), 10) == 3 * 2 * 10 * (4 * 8 + 8 * 2)


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
