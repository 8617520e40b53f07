"""Lesson conv_as_gemm's per-layer table on the GPU: its device-side error against NumPy's,
its float64 reference on odd shapes (and that it catches a wrong output), and a quick run over
a strided 3x3 and a strided 1x1 shape."""

from __future__ import annotations

import numpy as np
import pytest

import cudalab
from cudalab import lessons
from cudalab.lessons import conv_as_gemm as CG
from cudalab.lessons._measuring import rel_error
from cudalab.models import ops

pytestmark = pytest.mark.gpu

ODD = [dict(n=3, h=9, w=7, cin=8, cout=24, kh=3, kw=3, stride=2, padding=1),
       dict(n=2, h=11, w=5, cin=16, cout=40, kh=3, kw=3, stride=1, padding=1),
       dict(n=3, h=7, w=9, cin=24, cout=8, kh=1, kw=1, stride=2, padding=0),
       dict(n=1, h=13, w=6, cin=8, cout=16, kh=1, kw=1, stride=1, padding=0)]


def _needs_conv2d():
    if getattr(ops, "conv2d", None) is None:
        pytest.skip("this build has no models.ops.conv2d")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_device_error_is_numpys_rel_error(dtype):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 7, 5, 11)).astype(np.float32)
    b = a + 0.01 * rng.standard_normal(a.shape).astype(np.float32)
    da, db = cudalab.asarray(a, dtype=dtype), cudalab.asarray(b, dtype=dtype)
    want = rel_error(da.astype("float32").get(), db.astype("float32").get())
    assert CG.device_error(da, db) == pytest.approx(want, rel=1e-5)
    assert CG.device_error(da, db[:2]) == float("inf")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", ODD, ids=lambda s: f"{s['kh']}x{s['kw']}s{s['stride']}")
def test_routes_against_the_float64_reference(shape, dtype):
    _needs_conv2d()
    s = CG.ConvShape(layer="odd", count=1, **shape)
    t = CG._TableShape(s, dtype, seed=11)
    # float32 runs true fp32 in the lesson: no implicit (TF32-only) form then.
    implicit = ops.implicit_gemm_available(dtype, "highest")
    forms = [CG.IM2COL_FORM] + ([CG.IMPLICIT_FORM] if implicit else [])
    for form in forms:
        t.call(form, dtype)()
        assert t.reference_error(t.outs[form]) <= CG.TOLERANCE[dtype], form
    if len(forms) == 2:
        err = CG.device_error(t.outs[CG.IMPLICIT_FORM], t.outs[CG.IM2COL_FORM])
        assert err <= CG.TOL_FORMS[dtype]
    # The reference catches a wrong output: one output channel shifted.
    wrong = t.outs[CG.IM2COL_FORM].astype("float32").get()
    wrong[..., 0] += 1.0
    assert t.reference_error(cudalab.asarray(wrong)) > CG.TOLERANCE[dtype]


def test_quick_table_over_strided_shapes():
    _needs_conv2d()
    layers = ("layer2.0.conv2", "layer2.0.downsample.0")
    r = lessons.run("conv_as_gemm", quick=True, table_layers=layers)
    table = [x for x in r.rows if x.get("batch") is not None]
    assert {x["layer"] for x in table} == set(layers)
    assert all(c.passed for c in r.checks)
    assert any("first image" in c.what for c in r.checks)
    for x in table:
        s = next(s for s in CG.table_shapes(8, layers) if s.layer == x["layer"])
        if x["path"] == CG.IM2COL_FORM:
            assert x["mb"] == pytest.approx(CG.im2col_form_bytes(s, 2) / 1e6)
            assert x["vs_im2col"] == pytest.approx(1.0)
        elif x["path"] == CG.IMPLICIT_FORM:
            assert x["mb"] == pytest.approx(CG.implicit_bytes(s, 2) / 1e6)
        assert x["ms"] > 0 and x["pct_ceiling"] > 0
    if ops.implicit_gemm_available():
        assert [c.claim for c in r.claims if "implicit" in c.claim]
