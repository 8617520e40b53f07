"""CPU tier: the convolution routes in the ResNet plan (models.plan, models.conv_routes)."""

from __future__ import annotations

import pytest

from cudalab import _core
from cudalab.models import conv_routes, ops
from cudalab.models.arch import RESNET50, Conv
from cudalab.models.plan import (IMPLICIT_ALIGN, ITEMSIZE, implicit_channels, needs_route,
                                 plan_forward, weight_layout)

ROUTED = [layer for layer in RESNET50 if isinstance(layer, Conv) and needs_route(layer)]


def _all(route, tile=0):
    return {layer.name: (route, tile) for layer in ROUTED}


def test_the_routed_layers_are_the_kxk_and_strided_ones():
    assert len(ROUTED) == 20  # the stem, 16 3x3 convs, 3 strided 1x1 downsamples
    assert all(layer.residual is None for layer in ROUTED)


@pytest.mark.parametrize("dtype,precision", [("float16", "highest"), ("float32", "high")])
def test_all_implicit_plan_has_no_im2col(dtype, precision):
    layout = weight_layout(RESNET50, dtype)
    plan = plan_forward(4, dtype, precision, layout, 64, 64, routes=_all("implicit", 1))
    kinds = [s[0] for s in plan.steps]
    assert "im2col" not in kinds
    assert kinds[0] == "pad_channels" and kinds.count("pad_channels") == 1
    assert kinds.count("conv") == len(ROUTED)
    cin = implicit_channels(3, dtype)
    assert plan.scratch_bytes >= 4 * 64 * 64 * cin * ITEMSIZE[dtype]
    # The stem reads its widened weight copy, every other conv its GEMM weight.
    convs = [s for s in plan.steps if s[0] == "conv"]
    assert convs[0][4] == layout.implicit["conv1"]
    assert [s[-1] for s in convs] == [1] * len(ROUTED)
    assert set(plan.routes.values()) == {("implicit", 1)}


def test_default_plan_is_unchanged_im2col():
    layout = weight_layout(RESNET50, "float16")
    plan = plan_forward(2, "float16", "highest", layout, 64, 64)
    kinds = [s[0] for s in plan.steps]
    assert kinds.count("im2col") == len(ROUTED) and "conv" not in kinds
    assert set(plan.routes.values()) == {("im2col", -1)}


def test_implicit_plan_needs_less_scratch():
    layout = weight_layout(RESNET50, "float16")
    im2col = plan_forward(32, "float16", "highest", layout)
    implicit = plan_forward(32, "float16", "highest", layout, routes=_all("implicit"))
    assert implicit.scratch_bytes < im2col.scratch_bytes / 4
    assert implicit.workspace_bytes < im2col.workspace_bytes


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_weight_layout_widens_only_the_stem(dtype):
    layout = weight_layout(RESNET50, dtype)
    assert list(layout.implicit) == ["conv1"]
    cin = implicit_channels(3, dtype)
    assert cin == 4  # the stem's kernel of exactly 4 channels
    assert implicit_channels(12, dtype) == (12 if dtype == "float32" else 16)
    assert layout.nbytes >= layout.implicit["conv1"] + 64 * 7 * 7 * cin * ITEMSIZE[dtype]


def test_routes_refused():
    layout = weight_layout(RESNET50, "float32")
    with pytest.raises(ValueError, match="cannot take the implicit route"):
        plan_forward(1, "float32", "highest", layout, 64, 64, routes={"conv1": ("implicit", 0)})
    with pytest.raises(ValueError, match="unknown route"):
        plan_forward(1, "float32", "high", layout, 64, 64, routes={"conv1": ("winograd", 0)})
    residual = next(layer for layer in RESNET50 if getattr(layer, "residual", None))
    with pytest.raises(ValueError, match="take no route"):
        plan_forward(1, "float16", "highest", weight_layout(RESNET50, "float16"), 64, 64,
                     routes={residual.name: ("implicit", 0)})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_alignment_agrees_with_the_extension(dtype):
    tiles, align = _core._conv_implicit_tiles(dtype)
    assert align == IMPLICIT_ALIGN[dtype]
    assert conv_routes.implicit_tiles(dtype) == tiles


def test_set_conv_route_checks_its_argument():
    with pytest.raises(ValueError, match="expected one of 'auto', 'implicit', 'im2col'"):
        conv_routes.set_conv_route("fast")
    assert conv_routes.get_conv_route() == "auto"


def test_conv2d_argument_errors():
    with pytest.raises(TypeError, match=r"conv2d\(\) argument 'x': expected a DeviceArray"):
        ops.conv2d([1.0], None)
