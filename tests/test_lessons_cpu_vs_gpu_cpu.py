"""Lesson 9 `cpu_vs_gpu` without a GPU: the crossover and floor arithmetic, the texts,
the parameter checks, and the NumPy side of the training step and the convolution
against independent references (the GPU sides are checked by the lesson itself)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import _numpy_side as NS
from cudalab.lessons import cpu_vs_gpu as L
from cudalab.nn import reference

# ---- crossover -------------------------------------------------------------------------


def test_crossover_interpolates_on_a_log_scale():
    sizes = [16, 32, 64, 128]
    # CPU/GPU = 0.5 at 32 and 2 at 64: log-symmetric, so the crossing is at sqrt(32 * 64)
    kind, n = L.crossover(sizes, [1.0, 1.0, 4.0, 16.0], [4.0, 2.0, 2.0, 2.0])
    assert kind == "between" and n == pytest.approx(math.sqrt(32 * 64))
    # ratio 1/8 at 16 and 8 at 128 (one interval): the geometric midpoint, sqrt(16 * 128)
    kind, n = L.crossover([16, 128], [1.0, 8.0], [8.0, 1.0])
    assert kind == "between" and n == pytest.approx(math.sqrt(16 * 128))


def test_crossover_takes_the_last_crossing_and_ties_go_to_the_cpu():
    # GPU wins at 16, loses at 32 (a blip), then wins for good from between 32 and 64.
    kind, n = L.crossover([16, 32, 64, 128], [2.0, 1.0, 2.0, 4.0], [1.0, 2.0, 1.0, 1.0])
    assert kind == "between" and 32 < n < 64
    kind, n = L.crossover([16, 32], [1.0, 2.0], [1.0, 1.0])  # a tie at 16 is the CPU's
    assert kind == "between" and n == pytest.approx(16.0)


def test_crossover_always_and_never():
    assert L.crossover([16, 32], [2.0, 4.0], [1.0, 1.0]) == ("below", 16.0)
    assert L.crossover([16, 32], [1.0, 4.0], [2.0, 8.0]) == ("never", None)
    assert L.crossover([16, 32], [1.0, 4.0], [2.0, 4.0]) == ("never", None)  # tie at the top
    with pytest.raises(ValueError, match="one length"):
        L.crossover([16, 32], [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-empty"):
        L.crossover([], [], [])


def test_at_floor_is_the_flat_run_from_the_smallest_size():
    floor = 10e-6
    sizes = [16, 32, 64, 128]
    assert L.at_floor(sizes, [11e-6, 15e-6, 19e-6, 50e-6], floor) == 64
    assert L.at_floor(sizes, [11e-6, 30e-6, 12e-6, 12e-6], floor) == 16  # stops at the first rise
    assert L.at_floor(sizes, [21e-6, 22e-6, 23e-6, 24e-6], floor) is None
    assert L.at_floor(sizes, [10e-6] * 4, floor) == 128
    assert L.at_floor(sizes, [25e-6] * 4, floor, factor=3.0) == 128


def test_crossover_phrases():
    sizes = [16, 2048]
    assert L.crossover_phrase("between", 181.2, sizes) == "from n~181"
    assert L.crossover_phrase("below", 16.0, sizes) == "at every n from 16"
    assert L.crossover_phrase("never", None, sizes) == "at no n up to 2048"


def test_regime_text_ties_the_crossover_to_the_floor():
    sizes = [16, 32, 64, 128]
    floor = 10e-6
    cpu = [1e-6, 5e-6, 40e-6, 300e-6]
    gpu = [12e-6, 12e-6, 14e-6, 30e-6]
    trip = [40e-6, 45e-6, 80e-6, 400e-6]
    text = L.regime_text("matmul", "float32", sizes, cpu, gpu, trip, floor)
    assert text.startswith("matmul float32: the GPU wins from n~")
    assert "at no n up to 128 with the upload and download included" in text
    assert "up to n=64" in text and "10.0 us floor" in text and "1.0 us at n=16" in text
    assert "overhead-bound" in text
    # The GPU already above the floor at the smallest size
    text = L.regime_text("add", "float64", sizes, cpu, [30e-6] * 4, trip, floor)
    assert "already takes 30.0 us, 3.0x the 10.0 us floor" in text


def test_tiny_verdict():
    held, why = L.tiny_verdict({"matmul float32": 0.1, "add float32": 0.5}, 16)
    assert held and "NumPy wins 2 of 2" in why and "matmul float32 10x" in why
    held, why = L.tiny_verdict({"matmul float32": 0.1, "add float32": 1.5}, 16)
    assert not held and "NumPy wins 1 of 2" in why


@pytest.mark.parametrize("low, high, speedup, held, word", [
    (10, 50, 5.0, False, "below"), (10, 50, 30.0, True, "within"),
    (30, 60, 200.0, True, "above")])
def test_speedup_verdict_other_ranges(low, high, speedup, held, word):
    got, why = L.speedup_verdict(speedup, low, high)
    assert got is held and word in why and f"{low}-{high}x" in why


# ---- the CPU's description -----------------------------------------------------------------


def test_blas_text():
    config = {"Build Dependencies": {"blas": {"name": "scipy-openblas", "version": "0.3.27"}}}
    assert L.blas_text(config) == "BLAS scipy-openblas 0.3.27"
    assert L.blas_text({"Build Dependencies": {"blas": {"name": "mkl"}}}) == "BLAS mkl"
    assert L.blas_text({}) == "an unknown BLAS"
    assert L.blas_text(None) == "an unknown BLAS"
    assert L.numpy_blas().startswith(("BLAS ", "an unknown BLAS"))


# ---- the NumPy side ----------------------------------------------------------------------


def _params(rng, sizes):
    return [(rng.standard_normal((o, i)).astype(np.float32) / np.float32(np.sqrt(i)),
             rng.uniform(-0.1, 0.1, o).astype(np.float32)) for i, o in zip(sizes[:-1], sizes[1:])]


def test_numpy_train_step_matches_the_float64_reference_and_updates_in_place():
    rng = np.random.default_rng(3)
    sizes = (13, 37, 29, 5)
    params = _params(rng, sizes)
    x = rng.standard_normal((23, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], 23)
    before = [(w.copy(), b.copy()) for w, b in params]
    want_loss, want = reference.loss_and_grads([(w.astype(np.float64), b.astype(np.float64))
                                                for w, b in before], x.astype(np.float64), labels)
    loss, grads = NS.train_step(params, x, labels, 0.1)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for (dw, db), (ww, wb) in zip(grads, want):
        assert dw.dtype == np.float32 and db.dtype == np.float32
        assert np.max(np.abs(dw - ww)) <= 1e-5 * np.max(np.abs(ww))
        assert np.max(np.abs(db - wb)) <= 1e-5 * np.max(np.abs(wb))
    for (w, b), (w0, b0), (dw, db) in zip(params, before, grads):
        assert w.dtype == np.float32
        np.testing.assert_allclose(w, w0 - np.float32(0.1) * dw, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b, b0 - np.float32(0.1) * db, rtol=1e-6, atol=1e-7)


def _direct_conv(x, w, b, kh, kw, stride, padding, relu):
    """A plain loop over the kernel taps, float64: no im2col."""
    n, h, wd, cin = x.shape
    cout = w.shape[0]
    taps = w[:, :kh * kw * cin].reshape(cout, kh, kw, cin)
    xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    ho, wo = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, ho, wo, cout))
    for i in range(kh):
        for j in range(kw):
            window = xp[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :]
            out += window @ taps[:, i, j, :].T
    out += b
    return (np.maximum(out, 0) if relu else out).reshape(-1, cout)


@pytest.mark.parametrize("stride, padding, relu, pad_k", [(1, 1, True, 0), (2, 1, False, 3),
                                                          (1, 0, True, 0)])
def test_numpy_conv_matches_a_direct_convolution(stride, padding, relu, pad_k):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 7, 9, 5))
    k = 3 * 3 * 5
    w = rng.standard_normal((6, k + pad_k))
    w[:, k:] = 0
    b = rng.standard_normal(6)
    got = NS.conv3x3(x, w, b, 3, 3, stride, padding, relu)
    want = _direct_conv(x, w, b, 3, 3, stride, padding, relu)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv_layer_is_a_resnet50_3x3():
    from cudalab.models import arch

    c = next(x for x in arch.RESNET50 if getattr(x, "name", None) == L.CONV_LAYER)
    assert (c.kh, c.kw) == (3, 3)


# ---- parameters ------------------------------------------------------------------------------


def _check(**changes):
    p = dict(lessons.get("cpu_vs_gpu").params)
    p.update(changes)
    L.check_params(p)


def test_defaults_pass_the_check():
    x = lessons.get("cpu_vs_gpu")
    L.check_params(x.defaults(False))
    L.check_params(x.defaults(True))
    assert x.params["matrix_size"] == 8192 and x.params["iterations"] == 100


@pytest.mark.parametrize("changes, message", [
    ({"dtypes": ("float32", "int8")}, r"dtypes \['int8'\] are not among"),
    ({"matrix_size": 0}, "matrix_size must be an int >= 1, got 0"),
    ({"iterations": 2.5}, "iterations must be an int >= 1"),
    ({"mlp_batch": 0}, "mlp_batch must be an int >= 1"),
    ({"conv_batch": True}, "conv_batch must be an int >= 1"),
    ({"conv_batch": 257}, r"conv_batch must be an int in 1..256, got 257"),
    ({"cpu_seconds": 0}, "cpu_seconds must be a number > 0"),
    ({"sweep_seconds": -1.0}, "sweep_seconds must be a number > 0"),
    ({"sweep_sizes": ()}, "sweep_sizes must be a non-empty sequence of ints"),
    ({"sweep_sizes": (16, 0)}, "sweep_sizes must be a non-empty sequence of ints >= 1"),
    ({"sweep_sizes": (16,)}, "sweep_sizes must be at least 2 distinct sizes <= 4096"),
    ({"sweep_sizes": (16, 16)}, "sweep_sizes must be at least 2 distinct sizes"),
    ({"sweep_sizes": (16, 8192)}, r"<= 4096, got \(16, 8192\)"),
    ({"sweep_dtypes": ("float16",)}, "sweep_dtypes must be a non-empty sequence of names among "
                                     "float32, float64"),
    ({"sweep_dtypes": ()}, "sweep_dtypes must be a non-empty sequence"),
    ({"mlp_sizes": (64,)}, "mlp_sizes must be at least"),
    ({"mlp_sizes": (64, 32, 1)}, "classes >= 2"),
    ({"mlp_sizes": (64, 0, 4)}, "mlp_sizes must be a non-empty sequence of ints >= 1"),
])
def test_bad_parameters_are_refused_before_the_gpu(changes, message):
    with pytest.raises(ValueError, match=message):
        _check(**changes)
    with pytest.raises(ValueError, match=r"^lessons\.run\(\): lesson 'cpu_vs_gpu': "):
        lessons.run("cpu_vs_gpu", **changes)


def test_sweep_sizes_in_any_order_are_accepted():
    _check(sweep_sizes=(256, 16, 64))
