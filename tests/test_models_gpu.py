"""GPU tier: ResNet-50 on the GPU (cudalab.models.resnet50) and its ops (cudalab.models.ops).

* the model against torchvision's resnet50 with the same weights (random
  torch init, copied over): fp32 logits within 1e-3 of torch's relative to
  the largest |logit|, batch 1 and 32; fp16 and bf16 top-1 agreement with
  fp32 on 256 random images; the NumPy reference against the GPU in fp32;
  a CUDA graph replay against the eager forward; predict() on uint8 images;
  a second forward at the same batch allocating nothing;
* each op against NumPy (cudalab.models.reference) on random, odd sizes
  (never zeros): im2col (any kernel, stride, padding, K padding, cast on
  store), max_pool2d, global_avg_pool, conv_gemm (bias, ReLU, accumulate,
  every float dtype, TF32).
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
import cudalab.models as models
from cudalab.models import arch, reference
from _support import max_rel_err

pytestmark = pytest.mark.gpu

HALF = ("float16", "bfloat16")
# Logits relative to the largest |logit|: fp32 on both sides (orders of summation differ).
FP32_TOL = 1e-3
# fp16 / bf16 predict the same class as fp32 on at least this share of images.
TOP1_AGREEMENT = 0.99
# Op results vs float64 NumPy of the same rounded inputs, relative to the largest |value|.
OP_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
TF32_TOL = 3e-3


def _upload(values: np.ndarray, dtype: str = "float32"):
    """(device array in `dtype`, its values as float32: what the device holds)."""
    dev = cudalab.asarray(np.ascontiguousarray(values, dtype=np.float32), dtype=dtype)
    return dev, dev.astype("float32").get()


def _images(seed: int, batch: int, size: int = 224) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, size, size, 3), dtype=np.float32)


@pytest.fixture(scope="module")
def state():
    return models.init_weights(seed=5, random_stats=True)


@pytest.fixture(scope="module")
def fp32(state):
    return models.resnet50(state, precision="fp32")


# ---- the model against torchvision ---------------------------------------------------------


@pytest.fixture(scope="module")
def torch_twin():
    """(torch, torchvision's resnet50 in eval mode, float32 on the CPU), torch's own init."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torch, torchvision.models.resnet50().eval()


def _torch_logits(torch, module, x_nhwc: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        t = torch.from_numpy(x_nhwc).permute(0, 3, 1, 2).contiguous()
        return module(t).numpy()


@pytest.mark.parametrize("batch", [1, 32])
def test_fp32_logits_match_torchvision_with_the_same_weights(torch_twin, batch):
    torch, module = torch_twin
    model = models.resnet50(module, precision="fp32")
    x = _images(batch, batch)
    want = _torch_logits(torch, module, x)
    got = model(cudalab.asarray(x)).get()
    assert got.shape == (batch, 1000) and got.dtype == np.float32
    assert max_rel_err(got, want) <= FP32_TOL


def test_weights_from_a_state_dict_equal_weights_from_the_module(torch_twin):
    torch, module = torch_twin
    x = _images(2, 2)
    a = models.resnet50(module)(cudalab.asarray(x)).get()
    b = models.resnet50(models.from_torchvision(module.state_dict()))(cudalab.asarray(x)).get()
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precisions_agree_with_fp32_on_top1(torch_twin, precision):
    _, module = torch_twin
    ours32 = models.resnet50(module, precision="fp32")
    half = models.resnet50(module, precision=precision)
    assert half.dtype == {"fp16": "float16", "bf16": "bfloat16"}[precision]
    agree = total = 0
    for chunk in range(4):  # 256 images, 64 at a time
        x = cudalab.asarray(_images(100 + chunk, 64))
        want = ours32(x).get().argmax(axis=1)
        got = half(x).get()
        assert np.isfinite(got).all()
        agree += int((got.argmax(axis=1) == want).sum())
        total += 64
    assert agree / total >= TOP1_AGREEMENT, f"{agree} of {total}"


# ---- the model against the NumPy reference -------------------------------------------------


def test_numpy_reference_agrees_with_the_gpu_in_fp32(state, fp32):
    x = _images(7, 3)
    want = reference.forward(models.fold(state), x)
    got = fp32(cudalab.asarray(x)).get()
    assert max_rel_err(got, want) <= FP32_TOL


def test_forward_takes_a_numpy_batch_and_writes_out(fp32):
    x = _images(8, 2)
    want = fp32(cudalab.asarray(x)).get()
    out = cudalab.empty((2, 1000), dtype="float32")
    assert fp32.forward(x, out=out) is not None
    np.testing.assert_array_equal(out.get(), want)
    np.testing.assert_array_equal(fp32(x).get(), want)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_graph_replay_equals_the_eager_forward(state, precision):
    model = models.resnet50(state, precision=precision)
    g = model.capture(3)
    for seed in (11, 12):  # a second input through the same graph
        x = cudalab.asarray(_images(seed, 3))
        want = model(x).get()
        got = g(x).get()
        np.testing.assert_array_equal(got, want)
    g.replay()  # replays the last input
    np.testing.assert_array_equal(g.output.get(), want)


def test_predict_on_uint8_images(fp32):
    rng = np.random.default_rng(3)
    images = rng.integers(1, 256, (2, 250, 300, 3), dtype=np.uint8)
    idx, prob = fp32.predict(images, top=5)
    assert idx.shape == prob.shape == (2, 5)
    assert idx.dtype == np.int64 and prob.dtype == np.float32
    assert ((0 <= idx) & (idx < 1000)).all()
    # A randomly initialised network is very confident: the tail underflows to 0.
    assert (np.diff(prob, axis=1) <= 0).all() and (prob >= 0).all() and (prob[:, 0] > 0).all()
    assert (prob.sum(axis=1) <= 1 + 1e-5).all()
    logits = fp32(models.preprocess(images)).get()
    np.testing.assert_array_equal(idx[:, 0], logits.argmax(axis=1))
    one_idx, one_prob = fp32.predict(images[0], top=3)
    np.testing.assert_array_equal(np.reshape(one_idx, -1), idx[0, :3])
    assert np.reshape(one_prob, -1).shape == (3,)


def test_second_forward_at_the_same_batch_allocates_nothing(fp32):
    x = cudalab.asarray(_images(9, 5))
    out = cudalab.empty((5, 1000), dtype="float32")
    fp32.forward(x, out=out)
    cudalab.synchronize()
    before = cudalab.memory_stats()["allocation.all.allocated"]
    fp32.forward(x, out=out)
    cudalab.synchronize()
    assert cudalab.memory_stats()["allocation.all.allocated"] == before
    assert fp32.workspace_bytes(5) > 0
    fp32.release(5)


def test_gemm_flops_counts_the_convolutions_and_fc(fp32):
    shapes = arch.tensor_shapes(4)
    want = 0
    for layer in arch.RESNET50:
        if isinstance(layer, arch.Conv):
            n, h, w, _ = shapes[layer.dst]
            want += 2 * n * h * w * layer.k * layer.cout
        elif isinstance(layer, arch.Linear):
            want += 2 * 4 * layer.cin * layer.cout
    assert fp32.gemm_flops(4) == want == 4 * fp32.gemm_flops(1)


# ---- ops against NumPy -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", *HALF])
@pytest.mark.parametrize("shape,kh,kw,stride,padding,k_padded", [
    ((3, 11, 13, 5), 3, 3, 2, 1, 48),
    ((2, 17, 19, 3), 7, 7, 2, 3, 152),
    ((1, 9, 7, 6), 3, 3, 1, 1, None),
    ((2, 5, 9, 7), 1, 1, 2, 0, 8),
])
def test_im2col_matches_numpy(dtype, shape, kh, kw, stride, padding, k_padded):
    from cudalab.models import ops

    rng = np.random.default_rng(sum(shape))
    x, x_h = _upload(rng.standard_normal(shape) + 0.5 * np.sign(rng.standard_normal(shape)),
                     dtype)
    got = ops.im2col(x, kh, kw, stride, padding, k_padded=k_padded)
    want = reference.im2col(x_h, kh, kw, stride, padding, k_padded)
    want = want.reshape(-1, want.shape[-1])
    assert got.shape == want.shape and got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype("float32").get(), want)
    out = cudalab.full(want.shape, 9.0, dtype=dtype)  # padding columns must be written as 0
    ops.im2col(x, kh, kw, stride, padding, k_padded=k_padded, out=out)
    np.testing.assert_array_equal(out.astype("float32").get(), want)


def test_im2col_casts_on_store():
    from cudalab.models import ops

    x_h = np.random.default_rng(1).standard_normal((2, 9, 11, 3)).astype(np.float32) + 0.25
    got = ops.im2col(cudalab.asarray(x_h), 3, 3, 2, 1, k_padded=32, dtype="float16")
    assert got.dtype == np.float16
    want = reference.im2col(x_h, 3, 3, 2, 1, 32).astype(np.float16)
    np.testing.assert_array_equal(got.get(), want.reshape(-1, 32))


@pytest.mark.parametrize("dtype", ["float32", *HALF])
@pytest.mark.parametrize("shape", [(3, 13, 11, 7), (1, 8, 9, 64)])
def test_max_pool2d_matches_numpy(dtype, shape):
    from cudalab.models import ops

    x, x_h = _upload(np.random.default_rng(shape[1]).standard_normal(shape) - 2.0, dtype)
    got = ops.max_pool2d(x)
    want = reference.max_pool(x_h, 3, 2, 1)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.astype("float32").get(), want)
    out = cudalab.empty(want.shape, dtype=dtype)
    ops.max_pool2d(x, kernel=3, stride=2, padding=1, out=out)
    np.testing.assert_array_equal(out.astype("float32").get(), want)


@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_global_avg_pool_matches_numpy(dtype):
    from cudalab.models import ops

    x, x_h = _upload(np.random.default_rng(4).standard_normal((3, 7, 5, 9)) + 1.0, dtype)
    got = ops.global_avg_pool(x)
    want = x_h.astype(np.float64).mean(axis=(1, 2))
    assert got.shape == (3, 9)
    assert max_rel_err(got.astype("float32").get(), want) <= OP_TOL[dtype]


def _gemm_case(dtype: str, m: int = 37, k: int = 24, n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    a, a_h = _upload(rng.standard_normal((m, k)) + 0.1, dtype)
    w, w_h = _upload(rng.standard_normal((n, k)) + 0.1, dtype)
    b, b_h = _upload(rng.standard_normal(n), dtype)
    return (a, w, b), (a_h.astype(np.float64), w_h.astype(np.float64), b_h.astype(np.float64))


@pytest.mark.parametrize("dtype", ["float32", *HALF])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_conv_gemm_matches_numpy(dtype, relu, bias):
    from cudalab.models import ops

    (a, w, b), (a_h, w_h, b_h) = _gemm_case(dtype, seed=int(relu) + 2 * int(bias))
    want = a_h @ w_h.T + (b_h if bias else 0.0)
    if relu:
        want = np.maximum(want, 0)
    got = ops.conv_gemm(a, w, b if bias else None, relu=relu)
    assert got.shape == (37, 40) and got.dtype == a.dtype
    assert max_rel_err(got.astype("float32").get(), want) <= OP_TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", *HALF])
def test_conv_gemm_accumulate_adds_out(dtype):
    from cudalab.models import ops

    (a, w, b), (a_h, w_h, b_h) = _gemm_case(dtype, seed=9)
    out, out_h = _upload(np.random.default_rng(10).standard_normal((37, 40)) * 3.0, dtype)
    ops.conv_gemm(a, w, b, relu=True, out=out, accumulate=True)
    want = np.maximum(a_h @ w_h.T + b_h + out_h, 0)
    assert max_rel_err(out.astype("float32").get(), want) <= OP_TOL[dtype]
    plain = cudalab.full((37, 40), 5.0, dtype=dtype)  # without accumulate, out is overwritten
    ops.conv_gemm(a, w, b, relu=True, out=plain)
    assert max_rel_err(plain.astype("float32").get(), np.maximum(a_h @ w_h.T + b_h, 0)) \
        <= OP_TOL[dtype]


@pytest.mark.parametrize("precision,tol", [("fp32", OP_TOL["float32"]), ("tf32", TF32_TOL)])
def test_conv_gemm_float32_precisions(precision, tol):
    from cudalab.models import ops

    (a, w, b), (a_h, w_h, b_h) = _gemm_case("float32", m=129, k=72, n=64, seed=3)
    got = ops.conv_gemm(a, w, b, precision=precision)
    assert max_rel_err(got.get(), a_h @ w_h.T + b_h) <= tol
