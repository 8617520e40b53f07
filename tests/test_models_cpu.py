"""cudalab.models on the host (no GPU): the layer list, weights, folding, im2col,
preprocessing and the NumPy reference forward, checked against naive
implementations written independently here (NCHW direct convolution from
torchvision's unfolded weights, per-pixel loops)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cudalab
import cudalab.models as models
from cudalab.models import arch, imagenet, reference
from cudalab.models.params import conv_weight_matrix, fold_batchnorm

from _support import assert_arg_error, max_rel_err

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


@pytest.fixture(scope="module")
def state():
    """Random weights with random BatchNorm statistics, so folding changes every value."""
    return models.init_weights(seed=7, random_stats=True)


@pytest.fixture(scope="module")
def params(state):
    return models.fold(state)


@pytest.fixture(scope="module")
def params64(state):
    return models.fold(state, dtype=np.float64)


# ---- naive references (loops and NCHW, nothing shared with the code under test) ----------


def naive_im2col(x, kh, kw, stride, padding, k_padded):
    n, h, w, c = x.shape
    ho = (h + 2 * padding - kh) // stride + 1
    wo = (w + 2 * padding - kw) // stride + 1
    out = np.zeros((n, ho, wo, k_padded), x.dtype)
    for b in range(n):
        for y in range(ho):
            for xx in range(wo):
                col = 0
                for i in range(kh):
                    for j in range(kw):
                        for ch in range(c):
                            sy, sx = y * stride + i - padding, xx * stride + j - padding
                            if 0 <= sy < h and 0 <= sx < w:
                                out[b, y, xx, col] = x[b, sy, sx, ch]
                            col += 1
    return out


def naive_conv(x, w, stride, padding):
    """Direct convolution, NCHW x (N, C, H, W), torch weight (O, C, kh, kw), float64."""
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho = (xp.shape[2] - kh) // stride + 1
    wo = (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, ho, wo))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def naive_bn(x, st, name, eps=1e-5):
    shape = (1, -1, 1, 1)
    mean, var = st[f"{name}.running_mean"].reshape(shape), st[f"{name}.running_var"].reshape(shape)
    gamma, beta = st[f"{name}.weight"].reshape(shape), st[f"{name}.bias"].reshape(shape)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def naive_maxpool(x):
    """3x3, stride 2, padding 1, NCHW, by explicit loops over output pixels."""
    n, c, h, w = x.shape
    ho, wo = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    out = np.empty((n, c, ho, wo))
    for y in range(ho):
        for xx in range(wo):
            y0, x0 = max(2 * y - 1, 0), max(2 * xx - 1, 0)
            out[:, :, y, xx] = x[:, :, y0:2 * y + 2, x0:2 * xx + 2].max(axis=(2, 3))
    return out


def naive_resnet50(st, x_nhwc):
    """torchvision's ResNet-50 v1.5 forward, eval mode, float64, NCHW, BatchNorm unfolded."""
    s = {k: v.astype(np.float64) for k, v in st.items()}
    relu = lambda t: np.maximum(t, 0.0)  # noqa: E731
    x = np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2), dtype=np.float64)
    x = relu(naive_bn(naive_conv(x, s["conv1.weight"], 2, 3), s, "bn1"))
    x = naive_maxpool(x)
    for stage, blocks in enumerate((3, 4, 6, 3), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            stride = 2 if stage > 1 and b == 0 else 1
            out = relu(naive_bn(naive_conv(x, s[f"{p}.conv1.weight"], 1, 0), s, f"{p}.bn1"))
            out = relu(naive_bn(naive_conv(out, s[f"{p}.conv2.weight"], stride, 1), s, f"{p}.bn2"))
            out = naive_bn(naive_conv(out, s[f"{p}.conv3.weight"], 1, 0), s, f"{p}.bn3")
            if b == 0:
                x = naive_bn(naive_conv(x, s[f"{p}.downsample.0.weight"], stride, 0), s,
                             f"{p}.downsample.1")
            x = relu(out + x)
    return x.mean(axis=(2, 3)) @ s["fc.weight"].T + s["fc.bias"]


# ---- the architecture -------------------------------------------------------------------


def test_parameter_count_is_torchvisions():
    assert models.parameter_count() == models.RESNET50_PARAMETERS == 25_557_032
    st = models.init_weights(seed=0)
    trainable = sum(v.size for k, v in st.items() if "running_" not in k)
    assert trainable == 25_557_032


def test_layer_list():
    layers = models.RESNET50
    convs = [l for l in layers if isinstance(l, models.Conv)]
    assert len(convs) == 53 and sum(c.downsample for c in convs) == 4
    assert [type(l).__name__ for l in layers[:2]] == ["Conv", "MaxPool"]
    assert [type(l).__name__ for l in layers[-2:]] == ["GlobalAvgPool", "Linear"]
    assert len(arch.state_shapes()) == 267  # torchvision's 320 keys less 53 num_batches_tracked
    stem = layers[0]
    assert (stem.kh, stem.kw, stem.stride, stem.padding, stem.cin, stem.cout) == (7, 7, 2, 3, 3, 64)
    assert (stem.k, stem.k_padded) == (147, 152)
    for c in convs:
        assert c.k_padded % 8 == 0 and c.cout % 8 == 0
        assert c.k_padded == c.k or c.name == "conv1"
        assert c.relu != c.downsample
        # v1.5: only a 3x3 conv2 or a downsample branch strides.
        assert c.stride == 1 or c.name.endswith((".conv2", ".downsample.0")) or c.name == "conv1"
        assert (c.residual is not None) == c.name.endswith(".conv3")
    strided = [c.name for c in convs if c.stride == 2 and c.kh == 3]
    assert strided == ["layer2.0.conv2", "layer3.0.conv2", "layer4.0.conv2"]
    by_name = {l.name: l for l in layers}
    assert by_name["layer1.0.conv3"].residual == "layer1.0.downsample"
    assert by_name["layer1.1.conv3"].residual == "layer1.0"
    assert by_name["layer3.0.downsample.0"].src == "layer2.3"
    # Data flow: every layer reads what an earlier one wrote, the shortcut before conv3.
    written = {"input"}
    for layer in layers:
        assert layer.src in written and getattr(layer, "residual", None) in written | {None}
        written.add(layer.dst)


def test_tensor_shapes():
    shapes = models.tensor_shapes(2)
    assert shapes["conv1"] == (2, 112, 112, 64)
    assert shapes["maxpool"] == (2, 56, 56, 64)
    assert [shapes[f"layer{i}.0"] for i in range(1, 5)] == [
        (2, 56, 56, 256), (2, 28, 28, 512), (2, 14, 14, 1024), (2, 7, 7, 2048)]
    assert shapes["avgpool"] == (2, 2048) and shapes["fc"] == (2, 1000)
    assert models.tensor_shapes(1, 40, 56)["layer4.2"] == (1, 2, 2, 2048)


def test_last_reads():
    last = arch.last_reads()
    index = {l.name: i for i, l in enumerate(models.RESNET50)}
    assert last["input"] == 0 and "fc" not in last
    # A stage's first block input is read by its conv1 and, last, by its downsample.
    assert last["layer1.2"] == index["layer2.0.downsample.0"]
    # Any other block's input is read last by its conv3, as the shortcut.
    assert last["layer2.0"] == index["layer2.1.conv3"]
    assert last["layer2.0.downsample"] == index["layer2.0.conv3"]


# ---- GEMM layouts and folding -----------------------------------------------------------


def test_conv_weight_matrix_ordering():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3, 2, 4))
    m = conv_weight_matrix(w, 32)
    assert m.shape == (32, 5) and m.flags.c_contiguous
    for i in range(2):
        for j in range(4):
            for c in range(3):
                np.testing.assert_array_equal(m[(i * 4 + j) * 3 + c], w[:, c, i, j])
    assert not m[24:].any()


def test_folded_params_layout(params, state):
    assert len(params.gemms) == 54 and params.state is not state
    stem = params["conv1"]
    assert stem.weight.shape == (152, 64) and stem.weight.dtype == F32
    assert not stem.weight[147:].any()
    assert params["layer2.0.conv2"].weight.shape == (3 * 3 * 128, 128)
    assert params["fc"].weight.shape == (2048, 1000)
    np.testing.assert_array_equal(params["fc"].weight, state["fc.weight"].T)
    for g in params.gemms.values():
        assert g.weight.flags.c_contiguous and g.bias.dtype == F32
        assert g.weight.shape[0] % 8 == 0 and g.weight.shape[1] % 8 == 0
    np.testing.assert_array_equal(params.state["conv1.weight"], state["conv1.weight"])


@pytest.mark.parametrize("name", ["conv1", "layer2.0.conv2", "layer3.0.downsample.0"])
def test_fold_equals_conv_then_batchnorm(state, params, name):
    """Folded GEMM == conv then BatchNorm on the unfolded weights, float64."""
    layer = params[name].layer
    bn = layer.bn
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 11, 9, layer.cin))
    w64 = {k: v.astype(np.float64) for k, v in state.items()}
    want = naive_bn(naive_conv(x.transpose(0, 3, 1, 2), w64[f"{name}.weight"], layer.stride,
                               layer.padding), w64, bn).transpose(0, 2, 3, 1)
    w, b = fold_batchnorm(w64[f"{name}.weight"], w64[f"{bn}.weight"], w64[f"{bn}.bias"],
                          w64[f"{bn}.running_mean"], w64[f"{bn}.running_var"])
    cols = reference.im2col(x, layer.kh, layer.kw, layer.stride, layer.padding, layer.k_padded)
    got = cols @ conv_weight_matrix(w, layer.k_padded) + b
    assert max_rel_err(got, want) < 1e-12
    # The stored float32 operands: the same within float32 rounding.
    got32 = reference.conv2d(x, params[name])
    want_relu = np.maximum(want, 0) if layer.relu else want
    assert got32.dtype == F64 and max_rel_err(got32, want_relu) < 1e-6


def test_fold_changes_values_and_identity_bn_keeps_them(state):
    assert not np.allclose(models.fold(state)["conv1"].weight[:147],
                           conv_weight_matrix(state["conv1.weight"]))
    fresh = models.init_weights(seed=3)
    folded = models.fold(fresh)
    want = conv_weight_matrix(fresh["layer1.0.conv2.weight"]) / np.sqrt(1 + 1e-5)
    np.testing.assert_allclose(folded["layer1.0.conv2"].weight, want, rtol=1e-6)
    assert not folded["layer1.0.conv2"].bias.any()


# ---- im2col and pooling -----------------------------------------------------------------

IM2COL_CASES = [  # (N, H, W, C, kh, kw, stride, padding, k_padded)
    (2, 5, 7, 3, 1, 1, 1, 0, None),
    (1, 5, 7, 3, 1, 1, 2, 0, 8),
    (2, 9, 11, 5, 3, 3, 1, 1, None),
    (2, 9, 11, 5, 3, 3, 2, 1, 48),
    (1, 6, 5, 2, 3, 3, 2, 0, None),
    (1, 13, 10, 3, 7, 7, 2, 3, 152),
    (1, 7, 7, 3, 7, 7, 1, 0, None),
    (2, 8, 9, 4, 3, 1, 2, 2, None),
]


@pytest.mark.parametrize("case", IM2COL_CASES, ids=lambda c: "x".join(map(str, c[:8])))
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_im2col_matches_naive_loops(case, dtype):
    n, h, w, c, kh, kw, stride, padding, k_padded = case
    rng = np.random.default_rng(sum(case[:8]))
    x = (rng.standard_normal((n, h, w, c)) + 2.0).astype(dtype)
    got = reference.im2col(x, kh, kw, stride, padding, k_padded)
    want = naive_im2col(x, kh, kw, stride, padding, k_padded or kh * kw * c)
    assert got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


def test_im2col_of_a_strided_view():
    x = np.random.default_rng(2).standard_normal((2, 10, 12, 6))[:, ::-2, 1::2, ::2]
    np.testing.assert_array_equal(reference.im2col(x, 3, 3, 2, 1),
                                  naive_im2col(x, 3, 3, 2, 1, 27))


@pytest.mark.parametrize("shape", [(2, 7, 9, 3), (1, 8, 8, 5), (1, 1, 2, 2)])
def test_max_pool_matches_naive(shape):
    x = np.random.default_rng(3).standard_normal(shape) - 5.0  # all negative: padding must lose
    got = reference.max_pool(x)
    want = naive_maxpool(x.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(got, want)


# ---- the reference forward --------------------------------------------------------------


def test_forward_matches_naive_direct_convolution(state, params, params64):
    """The whole network, float64, against NCHW direct convolution with unfolded BatchNorm."""
    x = np.random.default_rng(4).standard_normal((2, 40, 56, 3))
    want = naive_resnet50(state, x)
    got = reference.forward(params64, x, dtype=np.float64)
    assert got.shape == (2, 1000) and got.dtype == F64
    assert max_rel_err(got, want) < 1e-10
    # float32 weights and float32 arithmetic.
    got32 = reference.forward(params, x)
    assert got32.dtype == F32 and max_rel_err(got32, want) < 1e-4


def test_forward_keeps_activations(params):
    x = np.random.default_rng(5).standard_normal((1, 64, 64, 3)).astype(np.float32)
    logits, acts = reference.forward(params, x, keep=True)
    shapes = models.tensor_shapes(1, 64, 64)
    assert set(acts) == set(shapes)
    assert all(acts[k].shape == shapes[k] for k in shapes)
    assert all(acts[k].dtype == F32 for k in shapes)
    np.testing.assert_array_equal(logits, reference.forward(params, x))


def test_forward_224_float32_agrees_with_float64(params):
    images = np.random.default_rng(6).integers(0, 256, (1, 240, 300, 3), dtype=np.uint8)
    x = models.preprocess(images)
    l32 = reference.forward(params, x)
    l64 = reference.forward(params, x, np.float64)
    assert max_rel_err(l32, l64) < 1e-5


# ---- weights ----------------------------------------------------------------------------


def test_init_weights_seeded_and_torchvision_like():
    a, b = models.init_weights(seed=11), models.init_weights(seed=11)
    assert a.keys() == b.keys() == arch.state_shapes().keys()
    assert all(np.array_equal(a[k], b[k]) and a[k].dtype == F32 for k in a)
    c = models.init_weights(seed=12)
    assert not np.array_equal(a["conv1.weight"], c["conv1.weight"])
    w = a["layer3.0.conv2.weight"]  # fan_out = 256 * 9
    assert abs(w.std() / np.sqrt(2 / (256 * 9)) - 1) < 0.02 and abs(w.mean()) < 1e-3
    assert (a["bn1.weight"] == 1).all() and not a["bn1.bias"].any()
    assert not a["bn1.running_mean"].any() and (a["bn1.running_var"] == 1).all()
    assert np.abs(a["fc.weight"]).max() <= 1 / np.sqrt(2048)
    r = models.init_weights(seed=11, random_stats=True)
    assert (r["bn1.running_var"] > 0).all() and r["bn1.running_mean"].any()


def test_safetensors_round_trip(tmp_path, state):
    st_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "w.safetensors"
    models.save_weights(state, path)
    back = models.load_weights(str(path))
    assert back.keys() == state.keys()
    assert all(np.array_equal(back[k], state[k]) for k in state)
    # A torchvision-style file: num_batches_tracked counters, float16 values.
    extra = {k: v.astype(np.float16) for k, v in state.items()}
    extra["bn1.num_batches_tracked"] = np.array(0, np.int64)
    st_numpy.save_file(extra, tmp_path / "h.safetensors")
    half = models.load_weights(tmp_path / "h.safetensors")
    assert half["conv1.weight"].dtype == F32 and "bn1.num_batches_tracked" not in half
    np.testing.assert_array_equal(half["fc.bias"], state["fc.bias"].astype(np.float16))
    del extra["fc.bias"]
    st_numpy.save_file(extra, tmp_path / "m.safetensors")
    with assert_arg_error(ValueError, "load_weights", "path", "missing .*'fc.bias'"):
        models.load_weights(tmp_path / "m.safetensors")


def test_load_weights_errors(tmp_path, monkeypatch):
    with assert_arg_error(TypeError, "load_weights", "path", "str or os.PathLike"):
        models.load_weights(3)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails
    with pytest.raises(ImportError, match=r'load_weights\(\) needs the safetensors package: '
                                          r'pip install "cudalab\[models\]"'):
        models.load_weights(tmp_path / "w.safetensors")
    with pytest.raises(ImportError, match=r"cudalab\[models\]"):
        models.save_weights({}, tmp_path / "w.safetensors")


def test_load_weights_missing_file(tmp_path):
    pytest.importorskip("safetensors")
    with pytest.raises(FileNotFoundError, match="no such file"):
        models.load_weights(tmp_path / "nope.safetensors")


class _FakeTensor:
    """What from_torchvision uses of a torch tensor."""

    def __init__(self, value):
        self.value = value

    def detach(self):
        return self

    def to(self, device):
        assert device == "cpu"
        return self

    def float(self):
        return _FakeTensor(self.value.astype(np.float32))

    def numpy(self):
        return self.value


class _FakeModule:
    def __init__(self, st):
        self.st = st

    def state_dict(self):
        out = {k: _FakeTensor(v.astype(np.float64)) for k, v in self.st.items()}
        out["bn1.num_batches_tracked"] = _FakeTensor(np.array(5, np.int64))
        return out


def test_from_torchvision_reads_state_dict(state):
    got = models.from_torchvision(_FakeModule(state))
    assert got.keys() == state.keys()
    assert all(np.array_equal(got[k], state[k]) and got[k].dtype == F32 for k in state)
    assert models.from_torchvision(dict(state)).keys() == state.keys()
    with assert_arg_error(TypeError, "from_torchvision", "module", "torch.nn.Module"):
        models.from_torchvision(object())


def test_state_checks(state):
    bad = dict(state)
    bad["extra.weight"] = np.zeros(3)
    with assert_arg_error(ValueError, "fold", "state", "unexpected keys: 'extra.weight'"):
        models.fold(bad)
    bad = dict(state)
    bad["fc.weight"] = bad["fc.weight"][:10]
    with assert_arg_error(ValueError, "fold", "state", r"'fc.weight' has shape \(10, 2048\)"):
        models.fold(bad)
    bad = dict(state)
    bad["bn1.running_var"] = np.full(64, np.nan)
    with assert_arg_error(ValueError, "fold", "state", "inf or NaN"):
        models.fold(bad)
    bad["bn1.running_var"] = np.array(["a"] * 64)
    with assert_arg_error(TypeError, "fold", "state", "real numbers"):
        models.fold(bad)
    with assert_arg_error(ValueError, "fold", "state", r"missing .* and \d+ more"):
        models.fold({})
    with assert_arg_error(TypeError, "fold", "state", "mapping"):
        models.fold([1, 2])
    with assert_arg_error(ValueError, "fold", "eps", "> 0"):
        models.fold(state, eps=0.0)
    with assert_arg_error(TypeError, "fold", "dtype", "float32 or float64"):
        models.fold(state, dtype=np.float16)
    with assert_arg_error(TypeError, "init_weights", "seed", "int"):
        models.init_weights(seed=1.5)
    with assert_arg_error(ValueError, "init_weights", "seed", r"\[0, 2\*\*64\)"):
        models.init_weights(seed=-1)
    with assert_arg_error(TypeError, "init_weights", "random_stats", "bool"):
        models.init_weights(random_stats=1)


# ---- preprocessing ----------------------------------------------------------------------


def test_preprocess_shape_dtype_and_normalisation():
    img = np.full((300, 400, 3), (10, 128, 250), np.uint8)
    out = models.preprocess(img)
    assert out.shape == (1, 224, 224, 3) and out.dtype == F32 and out.flags.c_contiguous
    want = (np.array([10, 128, 250]) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=1e-6, atol=1e-6)
    batch = models.preprocess(np.stack([img, img[::-1]]))
    assert batch.shape == (2, 224, 224, 3)
    mixed = models.preprocess([img, np.zeros((256, 100, 3), np.uint8)], size=64, resize=80)
    assert mixed.shape == (2, 64, 64, 3)


def test_preprocess_center_crop_without_resize():
    """A 256 x 320 image keeps its size; the crop is rows 16..240, columns 48..272."""
    img = np.random.default_rng(8).integers(0, 256, (256, 320, 3), dtype=np.uint8)
    out = models.preprocess(img)[0]
    want = (img[16:240, 48:272] / np.float32(255) - imagenet.IMAGENET_MEAN) / imagenet.IMAGENET_STD
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_resize_bilinear_matches_pixel_loop():
    rng = np.random.default_rng(9)
    img = rng.integers(0, 256, (7, 10, 3)).astype(np.float32)
    # Halving with half-pixel centres averages 2x2 blocks exactly.
    half = imagenet.resize_bilinear(img[:6], 3, 5)
    np.testing.assert_allclose(half, img[:6].reshape(3, 2, 5, 2, 3).mean(axis=(1, 3)), rtol=1e-6)
    got = imagenet.resize_bilinear(img, 11, 6)
    want = np.empty((11, 6, 3))
    for y in range(11):
        for x in range(6):
            sy = min(max((y + 0.5) * 7 / 11 - 0.5, 0), 6)
            sx = min(max((x + 0.5) * 10 / 6 - 0.5, 0), 9)
            y0, x0 = int(sy), int(sx)
            y1, x1 = min(y0 + 1, 6), min(x0 + 1, 9)
            fy, fx = sy - y0, sx - x0
            want[y, x] = ((1 - fy) * ((1 - fx) * img[y0, x0] + fx * img[y0, x1])
                          + fy * ((1 - fx) * img[y1, x0] + fx * img[y1, x1]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    crop = imagenet.resize_bilinear(img, 11, 6, top=3, left=2, crop=(4, 3))
    np.testing.assert_array_equal(crop, got[3:7, 2:5])


def test_preprocess_argument_checks():
    img = np.zeros((40, 50, 3), np.uint8)
    with assert_arg_error(TypeError, "preprocess", "images", "uint8"):
        models.preprocess(img.astype(np.float32))
    with assert_arg_error(ValueError, "preprocess", "images", r"\(H, W, 3\)"):
        models.preprocess(img[..., :2])
    with assert_arg_error(ValueError, "preprocess", "images", "shape"):
        models.preprocess(img[..., 0])
    with assert_arg_error(TypeError, "preprocess", "images", "list"):
        models.preprocess([])
    with assert_arg_error(ValueError, "preprocess", "size", "<= resize"):
        models.preprocess(img, size=300)
    with assert_arg_error(TypeError, "preprocess", "resize", "int"):
        models.preprocess(img, resize=256.0)


# ---- reference argument checks ----------------------------------------------------------


def test_reference_argument_checks(params):
    x = np.zeros((1, 8, 8, 3), np.float32)
    with assert_arg_error(TypeError, "im2col", "x", "NumPy array"):
        reference.im2col([[1.0]], 3, 3)
    with assert_arg_error(ValueError, "im2col", "x", r"\(N, H, W, C\)"):
        reference.im2col(x[0], 3, 3)
    with assert_arg_error(TypeError, "im2col", "x", "float32 or float64"):
        reference.im2col(x.astype(np.int32), 3, 3)
    with assert_arg_error(ValueError, "im2col", "kh", ">= 1"):
        reference.im2col(x, 0, 3)
    with assert_arg_error(TypeError, "im2col", "stride", "int"):
        reference.im2col(x, 3, 3, stride=True)
    with assert_arg_error(ValueError, "im2col", "padding", ">= 0"):
        reference.im2col(x, 3, 3, padding=-1)
    with assert_arg_error(ValueError, "im2col", "k_padded", ">= 27"):
        reference.im2col(x, 3, 3, k_padded=26)
    with assert_arg_error(ValueError, "im2col", "x", "smaller than the 9x9 kernel"):
        reference.im2col(x, 9, 9)
    with assert_arg_error(ValueError, "max_pool", "padding", "kernel // 2"):
        reference.max_pool(x, 3, 2, 2)
    with assert_arg_error(ValueError, "conv2d", "x", "expects 64 channels"):
        reference.conv2d(x, params["layer1.0.conv1"])
    with assert_arg_error(TypeError, "conv2d", "gemm", "convolution"):
        reference.conv2d(x, params["fc"])
    with assert_arg_error(TypeError, "forward", "params", "FoldedParams"):
        reference.forward({}, x)
    with assert_arg_error(TypeError, "forward", "dtype", "float32 or float64"):
        reference.forward(params, x, dtype=np.float16)
    with assert_arg_error(ValueError, "forward", "x", r"\(N, H, W, 3\)"):
        reference.forward(params, x[..., :1])
    with assert_arg_error(TypeError, "forward", "x", "models.preprocess"):
        reference.forward(params, np.zeros((1, 32, 32, 3), np.uint8))
    with assert_arg_error(ValueError, "forward", "x", "at least 32x32"):
        reference.forward(params, x)
    with assert_arg_error(TypeError, "forward", "keep", "bool"):
        reference.forward(params, np.zeros((1, 32, 32, 3)), keep=None)
    with assert_arg_error(ValueError, "conv_weight_matrix", "k_padded", "= 27, got 20"):
        conv_weight_matrix(np.zeros((4, 3, 3, 3)), 20)


# ---- lazy import ------------------------------------------------------------------------


def test_models_load_lazily():
    code = ("import sys, cudalab; assert 'cudalab.models' not in sys.modules; "
            "m = cudalab.models; assert m.parameter_count() == 25557032; "
            "assert 'cudalab.models' in sys.modules and 'models' in cudalab.__all__")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(cudalab.__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ---- against torchvision (where torch is installed) -------------------------------------


def test_reference_matches_torchvision():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial running statistics, so folding matters
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.normal_(0.0, 0.1, generator=gen)
                m.running_mean.normal_(0.0, 0.1, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)
                assert m.running_var.shape == (n,)
    model.eval()
    x = np.random.default_rng(10).standard_normal((2, 224, 224, 3)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).double().numpy()
    got = reference.forward(models.fold(models.from_torchvision(model)), x)
    err = max_rel_err(got, want)
    print(f"max |ours - torchvision| / max |logit| = {err:.3g}")
    assert err < 1e-4
