"""GPU tier: the implicit-GEMM convolution and its routes (models.ops.conv2d, conv steps).

Every route against a float64 NumPy convolution of the same (rounded)
operands, on random data (no zeros), odd spatial sizes and batch counts,
strides 1 and 2, every tile shape the build has, with and without bias and
ReLU, the stem's 3 channels widened to a vector, and the residual epilogue
in place as ResNet's blocks use it.
"""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from cudalab import _core
from cudalab.models import conv_routes, ops
from cudalab.models.arch import Conv
from cudalab.models.plan import conv_steps

pytestmark = pytest.mark.gpu

HALF = ("float16", "bfloat16")
# max |got - want| / max |want|: half outputs round to 8 (bf16) or 11 (fp16) bits,
# TF32 rounds its inputs to 10 bits.
TOLERANCE = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 4e-3}


def _implicit_or_skip(dtype: str) -> None:
    if not ops.implicit_gemm_available(dtype, "high"):
        pytest.skip(f"no implicit-GEMM kernels for {dtype} here (build or GPU below SM80)")


def _rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """`a` as the GPU sees it in `dtype`, back in float64."""
    return cudalab.asarray(a.astype(np.float32)).astype(dtype).astype("float32").get() \
        .astype(np.float64)


def _reference(x: np.ndarray, w: np.ndarray, bias, stride: int, padding: int,
               relu: bool, residual=None) -> np.ndarray:
    """float64 NHWC convolution: x (n, h, w, c), w (cout, kh, kw, c)."""
    n, h, wd, c = x.shape
    cout, kh, kw, _ = w.shape
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    out = np.zeros((n, oh, ow, cout))
    for ky in range(kh):
        for kx in range(kw):
            window = xp[:, ky:ky + stride * (oh - 1) + 1:stride,
                        kx:kx + stride * (ow - 1) + 1:stride, :]
            out += window @ w[:, ky, kx, :].T
    if bias is not None:
        out += bias
    if residual is not None:
        out += residual
    return np.maximum(out, 0) if relu else out


def _operands(rng, n, h, w, c, cout, k, dtype):
    x = _rounded(rng.uniform(-1, 1, (n, h, w, c)), dtype)
    wt = _rounded(rng.uniform(-1, 1, (cout, k, k, c)) / np.sqrt(k * k * c), dtype)
    b = _rounded(rng.uniform(-0.5, 0.5, cout), dtype)
    return x, wt, b


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    scale = np.abs(want).max()
    assert scale > 0
    err = np.abs(got.astype(np.float64) - want).max() / scale
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


def _dev(a: np.ndarray, dtype: str):
    return cudalab.asarray(np.ascontiguousarray(a, dtype=np.float32)).astype(dtype)


CASES = [  # n, h, w, c, cout, k, stride, padding
    (3, 13, 11, 16, 24, 3, 1, 1),
    (2, 15, 9, 32, 64, 3, 2, 1),
    (5, 7, 7, 8, 136, 1, 2, 0),     # ResNet's strided 1x1 downsample
    (1, 19, 17, 24, 16, 5, 1, 2),
    (2, 23, 21, 8, 64, 7, 2, 3),    # the stem's geometry on widened channels
    (1, 6, 5, 64, 72, 3, 1, 0),
]


@pytest.mark.parametrize("dtype", [*HALF, "float32"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bias,relu", [(True, True), (True, False), (False, False)])
def test_implicit_matches_numpy(rng, dtype, case, bias, relu):
    _implicit_or_skip(dtype)
    n, h, w, c, cout, k, stride, padding = case
    x, wt, b = _operands(rng, n, h, w, c, cout, k, dtype)
    got = ops.conv2d(_dev(x, dtype), _dev(wt, dtype), _dev(b, dtype) if bias else None,
                     stride=stride, padding=padding, relu=relu, route="implicit",
                     precision="high")
    want = _reference(x, wt, b if bias else None, stride, padding, relu)
    assert got.shape == want.shape
    _close(got.astype("float32").get(), want, dtype)


@pytest.mark.parametrize("dtype", [*HALF, "float32"])
def test_every_tile_matches_numpy(rng, dtype):
    """Each tile shape the build has, through a conv step that names it."""
    _implicit_or_skip(dtype)
    n, h, w, c, cout, k, stride, padding = 2, 17, 15, 16, 200, 3, 1, 1
    x, wt, b = _operands(rng, n, h, w, c, cout, k, dtype)
    want = _reference(x, wt, b, stride, padding, True)
    layer = Conv("c", "bn", "x", "y", c, cout, k, k, stride, padding, True)
    tiles = conv_routes.implicit_tiles(dtype)
    # "_c4" tiles (kFixedChannels) take exactly 4 input channels: the stem tests run them.
    for tile in [i for i, name in enumerate(tiles) if not name.endswith("_c4")]:
        xd, wd, bd = _dev(x, dtype), _dev(wt, dtype), _dev(b, dtype)
        out = cudalab.full(want.shape, 7.0, dtype=dtype)
        steps = conv_steps(layer, x.shape, "implicit", tile, dtype, "high", x=(0, 0),
                           w=(1, 0), bias=(2, 0), out=(3, 0), scratch=(4, 0))
        slots = (xd, wd, bd, out, cudalab.empty(16, dtype="uint8"))
        _core._convnet_run(_core._convnet_compile(tuple(steps), slots, "tile"), slots)
        _close(out.astype("float32").get(), want, dtype)


@pytest.mark.parametrize("dtype", [*HALF, "float32"])
def test_routes_agree(rng, dtype):
    _implicit_or_skip(dtype)
    x, wt, b = _operands(rng, 3, 14, 14, 64, 128, 3, dtype)
    args = (_dev(x, dtype), _dev(wt, dtype), _dev(b, dtype))
    a = ops.conv2d(*args, stride=2, padding=1, relu=True, route="implicit", precision="high")
    i = ops.conv2d(*args, stride=2, padding=1, relu=True, route="im2col", precision="high")
    want = _reference(x, wt, b, 2, 1, True)
    _close(a.astype("float32").get(), want, dtype)
    _close(i.astype("float32").get(), want, dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", [3, 12])
def test_unaligned_channels_are_widened(rng, dtype, c):
    """c not a whole vector: x and w get zero channels first (3 -> 4, 12 -> 16 in halves)."""
    _implicit_or_skip(dtype)
    x, wt, b = _operands(rng, 2, 21, 19, c, 64, 7, dtype)
    got = ops.conv2d(_dev(x, dtype), _dev(wt, dtype), _dev(b, dtype), stride=2, padding=3,
                     relu=True, route="implicit", precision="high")
    _close(got.astype("float32").get(), _reference(x, wt, b, 2, 3, True), dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_stem_steps_cast_float32_images(rng, dtype):
    """pad_channels reads the float32 images and writes dtype with 4 channels."""
    _implicit_or_skip(dtype)
    images = rng.uniform(-1, 1, (2, 29, 31, 3))
    _, wt, b = _operands(rng, 1, 1, 1, 4, 64, 7, dtype)
    wt[..., 3:] = 0.0
    layer = Conv("conv1", "bn1", "input", "y", 3, 64, 7, 7, 2, 3, True)
    oh, ow = layer.output_size(29, 31)
    out = cudalab.full((2, oh, ow, 64), 3.0, dtype=dtype)
    slots = (cudalab.asarray(images.astype(np.float32)), _dev(wt, dtype), _dev(b, dtype), out,
             cudalab.full((2 * 29 * 31 * 4 * 2,), 255, dtype="uint8"))
    steps = conv_steps(layer, images.shape, "implicit", -1, dtype, "high", x=(0, 0),
                       w=(1, 0), bias=(2, 0), out=(3, 0), scratch=(4, 0))
    assert [s[0] for s in steps] == ["pad_channels", "conv"]
    _core._convnet_run(_core._convnet_compile(tuple(steps), slots, "stem"), slots)
    want = _reference(_rounded(images, dtype), wt[..., :3], b, 2, 3, True)
    _close(out.astype("float32").get(), want, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_residual_epilogue_in_place(rng, dtype):
    """Epilogue 2: out = relu(conv + out), C and D the same buffer (ResNet's shortcut)."""
    _implicit_or_skip(dtype)
    x, wt, _ = _operands(rng, 2, 9, 11, 16, 32, 3, dtype)
    shortcut = _rounded(rng.uniform(-1, 1, (2, 9, 11, 32)), dtype)
    out = _dev(shortcut, dtype)
    slots = (_dev(x, dtype), _dev(wt, dtype), out)
    step = ("conv", 0, 0, 1, 0, 2, 0, 2, 0, dtype, 2, 9, 11, 16, 9, 11, 3, 3, 1, 1, 32, 2, 1,
            -1)
    _core._convnet_run(_core._convnet_compile((step,), slots, "residual"), slots)
    _close(out.astype("float32").get(), _reference(x, wt, None, 1, 1, True, shortcut), dtype)


def test_conv_step_refuses_what_it_cannot_do(rng):
    _implicit_or_skip("float16")
    x = _dev(rng.uniform(-1, 1, (1, 8, 8, 12)), "float16")  # 12 channels: not whole vectors
    w = _dev(rng.uniform(-1, 1, (16, 3, 3, 12)), "float16")
    out = cudalab.empty((1, 8, 8, 16), dtype="float16")
    step = ("conv", 0, 0, 1, 0, -1, 0, 2, 0, "float16", 1, 8, 8, 12, 8, 8, 3, 3, 1, 1, 16, 0,
            0, -1)
    with pytest.raises(cudalab.CudalabError, match="no implicit-GEMM kernel"):
        _core._convnet_compile((step,), (x, w, out), "bad")
    x16 = _dev(rng.uniform(-1, 1, (1, 8, 8, 16)), "float16")
    w16 = _dev(rng.uniform(-1, 1, (16, 3, 3, 16)), "float16")
    bad_tile = step[:13] + (16,) + step[14:-1] + (60,)
    with pytest.raises(cudalab.CudalabError, match="invalid geometry or tile"):
        _core._convnet_compile((bad_tile,), (x16, w16, out), "bad")
    # A bias operand with epilogue 0 is refused at parse time.
    with pytest.raises(ValueError, match="C operand exactly when"):
        _core._convnet_compile((step[:5] + (2, 0) + step[7:],), (x, w, out), "bad")


def test_auto_measures_once_and_keeps_the_fastest(rng):
    _implicit_or_skip("float16")
    conv_routes.forget()
    x, wt, b = _operands(rng, 4, 28, 28, 64, 64, 3, "float16")
    args = (_dev(x, "float16"), _dev(wt, "float16"), _dev(b, "float16"))
    got = ops.conv2d(*args, padding=1, relu=True)
    _close(got.astype("float32").get(), _reference(x, wt, b, 1, 1, True), "float16")
    decided = conv_routes.decisions()
    assert len(decided) == 1
    (entry,) = decided.values()
    times = entry["times_ms"]
    general = [t for t in conv_routes.implicit_tiles("float16") if not t.endswith("_c4")]
    assert "im2col" in times and len(times) == 1 + len(general)
    best = min(times, key=times.get)
    assert best == ("im2col" if entry["route"] == "im2col" else f"implicit {entry['tile']}")
    ops.conv2d(*args, padding=1, relu=True)
    assert len(conv_routes.decisions()) == 1  # measured once
    conv_routes.forget()
    assert conv_routes.decisions() == {}


def test_forced_modes(rng):
    _implicit_or_skip("float16")
    try:
        conv_routes.set_conv_route("im2col")
        assert conv_routes.choose(conv_routes.ConvShape(1, 8, 8, 8, 8, 3, 3, 1, 1,
                                                        "float16")) == ("im2col", -1)
        conv_routes.set_conv_route("implicit")
        assert conv_routes.choose(conv_routes.ConvShape(1, 8, 8, 8, 8, 3, 3, 1, 1,
                                                        "float16")) == ("implicit", -1)
        # fp32 without TF32 has no implicit kernel: im2col whatever the mode.
        assert conv_routes.choose(conv_routes.ConvShape(1, 8, 8, 8, 8, 3, 3, 1, 1, "float32",
                                                        "highest")) == ("im2col", -1)
    finally:
        conv_routes.set_conv_route("auto")


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_resnet_routes_agree(precision):
    """The whole network with every convolution implicit vs every one im2col."""
    _implicit_or_skip("float16" if precision == "fp16" else "float32")
    from cudalab import models
    rng = np.random.default_rng(3)
    images = rng.uniform(-2, 2, (3, 64, 72, 3)).astype(np.float32)
    logits = {}
    try:
        for mode in ("implicit", "im2col"):
            conv_routes.set_conv_route(mode)
            model = models.resnet50(precision=precision, seed=1)
            routes = model.conv_routes(3, 64, 72)
            assert all(r.startswith(mode) for r in routes.values()), routes
            logits[mode] = model(cudalab.asarray(images)).get()
    finally:
        conv_routes.set_conv_route("auto")
    scale = np.abs(logits["im2col"]).max()
    err = np.abs(logits["implicit"] - logits["im2col"]).max() / scale
    assert err < (2e-2 if precision == "fp16" else 5e-3), err
    assert (logits["implicit"].argmax(1) == logits["im2col"].argmax(1)).mean() >= 2 / 3


def test_repeated_conv2d_reuses_its_program(rng):
    """Calls of one shape hit one cached program, however the pool places small buffers
    (a scratch slot that changed alignment recompiled the CUTLASS kernel on every call)."""
    _implicit_or_skip("float16")
    x, wt, b = _operands(rng, 2, 12, 12, 64, 64, 3, "float16")
    args = (_dev(x, "float16"), _dev(wt, "float16"), _dev(b, "float16"))
    out = cudalab.empty((2, 12, 12, 64), dtype="float16")
    ops.conv2d(*args, padding=1, route="implicit", out=out)
    before = len(ops._programs)
    keep = []
    for size in (16, 48, 80, 112, 144):
        keep.append(cudalab.empty((size,), dtype="uint8"))  # moves the pool's next address
        ops.conv2d(*args, padding=1, route="implicit", out=out)
    assert len(ops._programs) == before
