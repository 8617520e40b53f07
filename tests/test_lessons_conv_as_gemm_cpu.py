"""Lesson conv_as_gemm's per-layer table without a GPU: its parameters, the distinct ResNet-50
conv shapes, the byte models, the findings' sentences from given numbers, the torch pairing,
the plot and the notebook text."""

from __future__ import annotations

from unittest import mock

import pytest

import cudalab
from cudalab import lessons
from cudalab.lessons import conv_as_gemm as CG
from cudalab.lessons.result import LessonResult
from cudalab.models import arch
from _support import REPO_ROOT, no_gpu_only

LESSON = lessons.get("conv_as_gemm")


# ---- registration and parameters ---------------------------------------------------------------


def test_registered_with_the_table_parameters_and_torch_pairing():
    assert LESSON.check is CG.check_params and LESSON.torch_twin is CG.torch_twin
    assert CG.table_params(LESSON.defaults(False)) == (128, "all", "columns")
    assert CG.table_params(LESSON.defaults(True)) == (8, CG.LAYERS, "none")
    assert CG.check_params(LESSON.defaults(True)) == (8, "float16")


@pytest.mark.parametrize("change,match", [
    ({"table_batch": 0}, r"table_batch must be an int in 1\.\.256, got 0"),
    ({"table_batch": 257}, "table_batch .* got 257"),
    ({"table_batch": True}, "table_batch .* got True"),
    ({"table_batch": 8.0}, "table_batch .* got 8.0"),
    ({"table_layers": "layer2.1.conv2"}, "table_layers must be 'all' or a non-empty tuple"),
    ({"table_layers": ()}, "table_layers must be 'all' or a non-empty tuple"),
    ({"table_layers": 3}, "table_layers must be 'all' or a non-empty tuple .* got 3"),
    ({"table_layers": ("layer2.1.conv2", "layer9.conv1")}, "no conv 'layer9.conv1' in ResNet-50"),
    ({"table_layers": ("fc",)}, "no conv 'fc'"),
    ({"torch_compile": "max-autotune"}, "torch_compile must be one of 'none', 'columns', 'all'"),
    ({"torch_compile": True}, "torch_compile must be one of"),
])
def test_table_params_are_checked(change, match):
    p = {**LESSON.defaults(True), **change}
    with pytest.raises(ValueError, match=match):
        CG.table_params(p)
    with pytest.raises(ValueError, match=match):
        CG.check_params(p)  # the registry's check covers the table's parameters too


def test_table_layers_may_be_a_list():
    p = {**LESSON.defaults(True), "table_layers": ["conv1", "layer4.2.conv3"]}
    assert CG.table_params(p)[1] == ("conv1", "layer4.2.conv3")


def test_bad_table_parameters_fail_before_the_gpu():
    with pytest.raises(ValueError, match=r"lessons\.run\(\): lesson 'conv_as_gemm': torch_compile"):
        lessons.run("conv_as_gemm", quick=True, torch_compile="sometimes")


@no_gpu_only
def test_without_a_gpu_the_table_parameters_pass_then_no_device():
    with pytest.raises(cudalab.NoDeviceError):
        lessons.run("conv_as_gemm", quick=True, table_layers=("conv1",), torch_compile="all")


# ---- the distinct shapes ---------------------------------------------------------------------


def _brute_force(batch):
    """(cin, cout, kh, kw, stride, padding, h, w) of every conv, by walking the network."""
    shapes = arch.tensor_shapes(batch)
    return [(c.cin, c.cout, c.kh, c.kw, c.stride, c.padding, *shapes[c.src][1:3])
            for c in arch.RESNET50 if isinstance(c, arch.Conv)]


def _key(s):
    return (s.cin, s.cout, s.kh, s.kw, s.stride, s.padding, s.h, s.w)


def test_every_distinct_resnet50_conv_shape_once_in_network_order():
    shapes = CG.table_shapes(128)
    every = _brute_force(128)
    assert len(shapes) == 23 == len(set(every))
    assert [_key(s) for s in shapes] == list(dict.fromkeys(every))
    assert sum(s.count for s in shapes) == len(every) == 53
    assert all(s.n == 128 for s in shapes)
    first = shapes[0]
    assert (first.layer, first.kh, first.stride, first.h, first.oh, first.m) == \
        ("conv1", 7, 2, 224, 112, 128 * 112 * 112)
    assert first.text == "224x224x3 -> 112x112x64, 7x7/2"
    by_layer = {s.layer: s for s in shapes}
    s = by_layer["layer2.1.conv2"]
    assert (s.count, s.k, s.flops) == (3, 1152, 2.0 * 128 * 28 * 28 * 1152 * 128)
    assert by_layer["layer4.0.downsample.0"].oh == 7


def test_named_layers_pick_their_shapes_and_name_them():
    shapes = CG.table_shapes(8, CG.LAYERS)
    assert sorted(s.layer for s in shapes) == sorted(CG.LAYERS)
    assert {s.n for s in shapes} == {8}
    # Two layers of one shape give one row, named by the first of them the network runs.
    same = CG.table_shapes(4, ("layer2.3.conv2", "layer2.2.conv2"))
    assert [(s.layer, s.count) for s in same] == [("layer2.2.conv2", 3)]


@pytest.mark.parametrize("kh,kw,stride,padding,want", [
    (1, 1, 1, 0, False), (1, 1, 2, 0, True), (3, 3, 1, 1, True), (7, 7, 2, 3, True),
    (1, 1, 1, 1, True),
])
def test_writes_columns(kh, kw, stride, padding, want):
    assert CG.writes_columns(kh, kw, stride, padding) is want


def test_eleven_shapes_write_columns_and_torch_compile_choices():
    shapes = CG.table_shapes(128)
    assert sum(s.columns for s in shapes) == 11
    assert [sum(CG.compiles(s, c) for s in shapes) for c in CG.COMPILE_CHOICES] == [0, 11, 23]


def test_only_the_stem_may_be_refused_by_the_implicit_route():
    assert [s.layer for s in CG.table_shapes(1) if CG.implicit_may_refuse(s.cin)] == ["conv1"]


def test_reference_shape_is_the_cheapest_spatial_one():
    shapes = CG.table_shapes(128)
    got = CG.reference_shape(shapes)
    assert got.kh == 3 and got.flops == min(s.flops for s in shapes if s.kh == 3)
    ones = [s for s in shapes if s.kh == 1]
    assert CG.reference_shape(ones).flops == min(s.flops for s in ones)


# ---- bytes -------------------------------------------------------------------------------------


def _shape(**kw):
    base = dict(layer="l", count=1, n=2, h=5, w=5, cin=8, cout=16, kh=3, kw=3, stride=1,
                padding=1)
    return CG.ConvShape(**{**base, **kw})


def test_implicit_reads_input_and_weights_once_and_writes_the_output():
    s = _shape()
    assert (s.oh, s.m, s.k) == (5, 50, 72)
    assert CG.implicit_bytes(s, 2) == (2 * 5 * 5 * 8 + 16 * 72 + 50 * 16) * 2


def test_im2col_form_adds_writing_and_reading_the_columns():
    s = _shape()
    cols = 50 * 72
    assert CG.im2col_form_bytes(s, 2) == CG.implicit_bytes(s, 2) + 2 * cols * 2
    assert CG.im2col_form_bytes(s, 2) == CG.im2col_bytes(50, 72, 400, 2) + \
        CG.gemm_bytes(50, 72, 16, 2)


def test_a_1x1_stride_1_conv_moves_the_same_bytes_either_way():
    s = _shape(kh=1, kw=1, padding=0)
    assert not s.columns
    assert CG.im2col_form_bytes(s, 4) == CG.implicit_bytes(s, 4)


def test_the_stem_columns_are_padded_to_the_gemm_alignment():
    stem = CG.table_shapes(1)[0]
    k = arch.round_up(stem.k)
    assert (stem.k, k) == (147, 152)
    assert CG.im2col_form_bytes(stem, 2) == CG.im2col_bytes(stem.m, k, 224 * 224 * 3, 2) + \
        CG.gemm_bytes(stem.m, k, 64, 2)


# ---- findings from given numbers ---------------------------------------------------------------


def _t(layer, columns, im2col_ms, implicit_ms, cudnn_ms=None, compile_ms=None,
       im2col_b=300, implicit_b=100):
    ms = (lambda v: None if v is None else v * 1e-3)
    return CG.LayerTiming(layer, columns, im2col_ms * 1e-3, ms(implicit_ms), im2col_b,
                          implicit_b if columns else im2col_b, ms(cudnn_ms), ms(compile_ms))


def test_geomean():
    assert CG.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert CG.geomean([4.0, 0.0, float("inf")]) == pytest.approx(4.0)  # only positive, finite
    assert CG.geomean([]) != CG.geomean([])  # nan


def test_implicit_text_counts_and_lists_where_implicit_loses():
    timings = [_t("a", True, 2.0, 1.0), _t("b", True, 1.0, 1.0), _t("c", False, 1.0, 1.25),
               _t("d", False, 1.0, None)]
    g, text = CG.implicit_text(timings, 128)
    assert g == pytest.approx((2.0 * 1.0 * 0.8) ** (1 / 3))
    assert "on 3 shapes of ResNet-50's convolutions at batch 128" in text
    assert "faster on 1, best 2.00x on a; slower on 1: c (0.80x)" in text


def test_implicit_text_when_it_never_loses_or_never_ran():
    g, text = CG.implicit_text([_t("a", True, 2.0, 1.0), _t("b", False, 1.0, 0.98)], 8)
    assert text.endswith("never more than 5% slower") and g > 1
    g, text = CG.implicit_text([_t("a", True, 2.0, None)], 8)
    assert text == "implicit GEMM did not run on any shape" and g != g


def test_implicit_text_names_at_most_a_few_losers():
    timings = [_t(f"l{i}", True, 1.0, 1.0 + i / 10) for i in range(1, 7)]
    _, text = CG.implicit_text(timings, 8)
    assert "slower on 6: l6 (0.62x), l5 (0.67x), l4 (0.71x), l3 (0.77x) and 2 more" in text


def test_columns_text_sets_saved_bytes_beside_the_flat_shapes():
    timings = [_t("a", True, 3.0, 1.0, im2col_b=400, implicit_b=100),
               _t("b", True, 1.0, 1.0, im2col_b=600, implicit_b=400),
               _t("c", False, 1.0, 2.0)]
    g, saved, text = CG.columns_text(timings)
    assert g == pytest.approx(3 ** 0.5) and saved == pytest.approx(0.5)
    assert text.startswith("Where im2col writes columns (2 shapes) implicit GEMM moves 50% "
                           "fewer bytes and runs 1.73x")
    assert "on the 1 1x1 stride-1 shape," in text and "runs 0.50x" in text


def test_columns_text_with_only_flat_shapes():
    g, saved, text = CG.columns_text([_t("c", False, 1.0, 0.5)])
    assert saved == 0.0 and g != g and text.startswith("On the 1 1x1 stride-1 shape,")


def test_torch_text_against_cudalabs_faster_form():
    timings = [_t("a", True, 2.0, 1.0, cudnn_ms=1.5), _t("b", True, 1.0, None, cudnn_ms=0.5),
               _t("c", True, 1.0, 1.0)]
    g, text = CG.torch_text(timings)
    assert g == pytest.approx((1.5 * 0.5) ** 0.5)
    assert "over 2 shapes:" in text and "at parity or faster on 1" in text
    assert text.endswith("cuDNN faster on b (0.50x)")
    assert CG.torch_text([_t("a", True, 1.0, 1.0)])[1] == "torch's cuDNN did not run"


def test_compile_text():
    timings = [_t("a", True, 1.0, 1.0, cudnn_ms=1.0, compile_ms=0.5),
               _t("b", True, 1.0, 1.0, cudnn_ms=1.0)]
    g, text = CG.compile_text(timings, [2.0, 4.0, 30.0])
    assert g == pytest.approx(2.0)
    assert "over 1 shape: 2.00x geometric mean, after 4.0 s of compiling" in text
    assert CG.compile_text(timings[1:], [])[1] == "torch.compile did not run"


def test_peak_text():
    text = CG.peak_text("implicit GEMM", [("a", 40.0), ("b", None), ("c", 60.0), ("d", 50.0)],
                        "matmul_float16")
    assert text == ("implicit GEMM reaches a median 50% of the measured GEMM peak "
                    "(matmul_float16), from 40% on a to 60% on c")
    assert "no share" in CG.peak_text("x", [("a", None)], "matmul_float16")


@pytest.mark.parametrize("label,twin", [
    ("layer2.1.conv2 b128 torch cudnn", "layer2.1.conv2 b128 implicit gemm"),
    ("conv1 b8 torch compile", "conv1 b8 implicit gemm"),
    ("layer2.1.conv2 b128 im2col + gemm", None),
    ("layer2.1.conv2 im2col", None),
])
def test_torch_twin(label, twin):
    assert CG.torch_twin(label) == twin


# ---- the plot ----------------------------------------------------------------------------------


def _result(rows):
    return LessonResult(lesson="conv_as_gemm", number=LESSON.number, title="t", seed="s",
                        params={}, quick=True, device={"name": "Fake GPU"}, env={},
                        measurements={}, rows=tuple(rows), findings=(), claims=(), checks=(),
                        wall_seconds=0.0, created="2026-11-23T00:00:00+00:00")


def test_plot_draws_each_form_over_im2col_per_shape():
    old = [{"layer": "layer2.1.conv2", "kernel": "3x3", "path": "im2col", "ms": 0.03}]
    table = [{"layer": layer, "path": form, "batch": 8, "ms": 1.0, "vs_im2col": v}
             for layer in ("conv1", "layer1.0.conv1")
             for form, v in ((CG.IM2COL_FORM, 1.0), (CG.IMPLICIT_FORM, 1.5),
                             (CG.CUDNN_FORM, 1.2))]
    ax = mock.MagicMock()
    LESSON.plot(_result(old + table), ax)
    assert ax.barh.call_count == 2  # implicit and cuDNN; no compile rows
    assert list(ax.barh.call_args_list[0].args[1]) == [1.5, 1.5]
    assert ax.set_xlabel.call_args.args[0] == "speed over im2col + GEMM (x)"
    ax = mock.MagicMock()
    LESSON.plot(_result(old), ax)  # a result without the table draws the times
    assert ax.barh.call_count == 1 and ax.set_xlabel.call_args.args[0] == "median time (ms)"


# ---- the notebook text -------------------------------------------------------------------------


def test_notebook_text_times_both_routes_of_conv2d():
    text = (REPO_ROOT / "python" / "cudalab" / "lessons" / "notebooks" /
            "conv_as_gemm.md").read_text()
    assert 'route="implicit"' in text and 'route="im2col"' in text
    assert "ops.implicit_gemm_available()" in text and "timer.measure(" in text
    assert "implicit GEMM" in text.split("## What the tutorial says")[0]
