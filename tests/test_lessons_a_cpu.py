"""Lessons 0-3 (context, creation, dtypes, transfers): their pure logic, without a GPU."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import analysis as common
from cudalab.lessons import _measuring, context, creation, dtypes, transfers
from cudalab.lessons.result import LessonResult

from _support import fake_measurement

MIB = 1 << 20


def test_lessons_0_to_3_are_registered_in_order():
    assert [lessons.get(n).number for n in ("context", "creation", "dtypes", "transfers")] == \
        [0, 1, 2, 3]
    for name in ("context", "creation", "dtypes", "transfers"):
        assert lessons.get(name).plot is not None, name


# ---- shared verdicts and the fit -------------------------------------------------------


@pytest.mark.parametrize("latency, bandwidth", [(10e-6, 12e9), (3e-6, 50e9), (40e-6, 2e9)])
def test_fit_recovers_known_latency_and_bandwidth(latency, bandwidth):
    rng = np.random.default_rng(0)
    sizes = [4 << 10 << (2 * i) for i in range(9)]  # 4 KiB .. 256 MiB
    times = [(latency + s / bandwidth) * (1 + 0.01 * rng.standard_normal()) for s in sizes]
    lat, bw, residual = common.fit_latency_bandwidth(sizes, times)
    assert lat == pytest.approx(latency, rel=0.05)
    assert bw == pytest.approx(bandwidth, rel=0.05)
    assert residual < 0.05


def test_fit_is_exact_on_exact_data_and_rejects_bad_input():
    sizes = [1e3, 1e5, 1e7]
    lat, bw, residual = common.fit_latency_bandwidth(sizes, [5e-6 + s / 1e10 for s in sizes])
    assert (lat, bw) == (pytest.approx(5e-6, rel=1e-9), pytest.approx(1e10, rel=1e-9))
    assert residual < 1e-9
    with pytest.raises(ValueError, match="two distinct sizes"):
        common.fit_latency_bandwidth([1e3, 1e3], [1e-5, 1e-5])
    with pytest.raises(ValueError, match="finite and > 0"):
        common.fit_latency_bandwidth([1e3, 1e6], [1e-5, 0.0])


def test_fit_reports_a_bad_model_through_its_residual():
    sizes = [1 << k for k in range(10, 28, 2)]
    times = [1e-5 + s / 1e10 + (1e-2 if s == 1 << 18 else 0.0) for s in sizes]  # one outlier
    assert common.fit_latency_bandwidth(sizes, times)[2] > transfers.FIT_RESIDUAL_OK


def test_claim_verdicts():
    assert common.at_least_fraction(110.0, 206.0)
    assert not common.at_least_fraction(90.0, 206.0)
    assert not common.at_least_fraction(None, 2.0)
    assert not common.at_least_fraction(math.nan, 2.0)
    assert common.within_factor(25.0, 10.0) and common.within_factor(4.0, 10.0)
    assert not common.within_factor(31.0, 10.0) and not common.within_factor(3.0, 10.0)
    assert not common.within_factor(-1.0, 10.0) and not common.within_factor(None, 10.0)


def test_claim_helpers_record_verdict_and_reason():
    r = _recorder("transfers")
    common.claim_at_least(r, "fast", 100.0, 60.0, "x", "60x here")
    common.claim_at_least(r, "fast", 100.0, 40.0, "x", "40x here")
    common.claim_within(r, "latency", 10.0, 25.0, "us", "25 us here")
    common.claim_within(r, "latency", 10.0, 35.0, "us", "35 us here")
    assert [c.held for c in r.claims] == [True, False, True, False]
    assert r.claims[0].why == "60x here; holds from 50x"
    assert r.claims[2].why == "25 us here; holds within 3x of 10 us"
    assert r.claims[1].measured == 40.0 and r.claims[1].tutorial == 100.0


def test_first_at_least_finds_the_crossing_for_good():
    xs = [256, 512, 1024, 2048]
    assert common.first_at_least(xs, [2.0, 12.0, 30.0, 80.0], 10.0) == 512
    assert common.first_at_least(xs, [12.0, 8.0, 30.0, 80.0], 10.0) == 1024  # dips back under
    assert common.first_at_least(xs, [12.0, 30.0, 80.0, 9.0], 10.0) is None
    assert common.first_at_least(xs, [None, 11.0, 12.0, 13.0], 10.0) == 512


def test_format_bytes_short():
    assert common.format_bytes_short(4096) == "4 KiB"
    assert common.format_bytes_short(1.5 * MIB) == "1.5 MiB"
    assert common.format_bytes_short(256 * MIB) == "256 MiB"
    assert common.format_bytes_short(2 << 30) == "2 GiB"
    assert common.format_bytes_short(100) == "100 B"


# ---- lesson 0: context -----------------------------------------------------------------


def _child_run(impl="cudalab", base=80_000 * MIB, total=81_000 * MIB,
               used_mib=(500, 502, 510), allocated=(0, 4096, 20480)):
    stages = []
    for stage, used, alloc in zip(context.STAGES, used_mib, allocated):
        free = base - used * MIB
        stages.append({"stage": stage, "seconds": 0.1, "free": free, "total": total,
                       "allocated": alloc, "reserved": 2 * MIB if alloc else 0,
                       "import_s": 0.2, "value": None, "outside_free": free})
    return {"impl": impl, "baseline_free": base, "stages": stages, "wall_s": 1.0,
            "after_free": base}


def test_context_rows_split_the_driver_memory_by_stage():
    rows = context.stage_rows(_child_run(), 0)
    assert [x["stage"] for x in rows] == list(context.STAGES)
    assert [x["driver_mib"] for x in rows] == pytest.approx([500, 502, 510])
    assert [x["added_mib"] for x in rows] == pytest.approx([500, 2, 8])
    assert rows[0]["allocated_mib"] == 0 and rows[2]["allocated_mib"] == pytest.approx(20480 / MIB)


def test_context_consistency_errors():
    assert context.consistency_errors(_child_run()) == []
    bad = _child_run()
    bad["stages"][1]["free"] = bad["stages"][1]["total"] + 1
    assert any("outside [0," in e for e in context.consistency_errors(bad))
    changed = _child_run()
    changed["stages"][2]["total"] += MIB
    assert any("total memory changed" in e for e in context.consistency_errors(changed))
    negative = _child_run()
    negative["stages"][0]["outside_free"] = negative["baseline_free"] + MIB  # uses < 0
    assert any("driver-seen use" in e for e in context.consistency_errors(negative))
    pool = _child_run()
    pool["stages"][1]["reserved"] = 0
    assert any("reserved 0 < allocated" in e for e in context.consistency_errors(pool))


def test_context_claim_verdict():
    assert context.claim_verdict(1500.0)[0]
    held, why = context.claim_verdict(520.0)
    assert not held and "below" in why and "520" in why
    held, why = context.claim_verdict(3000.0)
    assert not held and "above" in why


def test_context_child_script_compiles_and_sets_the_path():
    compile(context.CHILD, "<child>", "exec")
    env = context._child_env()
    import cudalab, os
    root = os.path.dirname(os.path.dirname(os.path.abspath(cudalab.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == root


# ---- lesson 1: creation ----------------------------------------------------------------


def test_normal_stats_z_accepts_normals_and_rejects_others():
    rng = np.random.default_rng(5)
    mean_z, std_z = creation.normal_stats_z(rng.standard_normal(1 << 16))
    assert mean_z < creation.STAT_Z and std_z < creation.STAT_Z
    mean_z, _ = creation.normal_stats_z(rng.standard_normal(1 << 16) + 0.05)
    assert mean_z > creation.STAT_Z
    _, std_z = creation.normal_stats_z(1.05 * rng.standard_normal(1 << 16))
    assert std_z > creation.STAT_Z


# ---- lesson 2: dtypes ------------------------------------------------------------------


def test_fp64_verdict_from_rates():
    # H100-like: fp64 DMMA 60 TFLOP/s against fp32 50 TFLOP/s.
    full, text = dtypes.fp64_verdict(60 / 50, (9, 0))
    assert full and "faster than" in text and "FP64 tensor cores" in text
    full, text = dtypes.fp64_verdict(0.9, (8, 0))
    assert full and "about as fast as" in text
    full, text = dtypes.fp64_verdict(0.5, (7, 0))  # V100: half rate, no DMMA
    assert full and "full-rate fp64 units" in text and "at a good fraction of" in text
    assert "about as fast as" in dtypes.fp64_verdict(1.05, (9, 0))[1]  # noise, not "faster"
    # T4-like: 1/32.
    full, text = dtypes.fp64_verdict(1 / 32, (7, 5))
    assert not full and "1/32" in text
    full, text = dtypes.fp64_verdict(1 / 64, (8, 9))
    assert not full and "1/64" in text


def test_relative_error_and_storage():
    want = np.array([[1.0, -4.0], [2.0, 0.5]])
    assert _measuring.rel_error(want, want) == 0.0
    assert _measuring.rel_error(want + 0.04, want) == pytest.approx(0.01)
    assert dtypes.storage("tf32") == "float32" and dtypes.storage("bfloat16") == "bfloat16"
    assert set(dtypes.TOLERANCE) == set(dtypes.ITEMSIZE)


def _recorder(name):
    return lessons.LessonRun(lessons.get(name), lessons.get(name).defaults(True), quick=True)


def test_dtypes_findings_and_claims_from_given_rates():
    rate = {"float64": 60.0, "float32": 50.0, "tf32": 380.0, "float16": 700.0, "bfloat16": 710.0}
    err = {"float64": 1e-16, "float32": 2e-7, "tf32": 4e-4, "float16": 5e-4, "bfloat16": 4e-3}
    r = _recorder("dtypes")
    for d in rate:
        r.add(fake_measurement(f"matmul {d}"))
    dtypes._findings(r, rate, err, (9, 0))
    dtypes._claims(r, rate)
    texts = [f.text for f in r.findings]
    assert texts[0].startswith("Float64 runs faster than float32")
    assert any("bfloat16 at 710.0 TFLOP/s" in t for t in texts)
    held = {c.claim.split(" ")[0] + str(c.tutorial): c.held for c in r.claims}
    assert held == {"float3215.63": False, "float1662.09": False, "float1616.0": True}
    r = _recorder("dtypes")
    for d in rate:
        r.add(fake_measurement(f"matmul {d}"))
    t4 = {"float64": 0.25, "float32": 8.0, "tf32": 8.0, "float16": 30.0, "bfloat16": 30.0}
    dtypes._findings(r, t4, err, (7, 5))
    dtypes._claims(r, t4)
    assert "1/32 of the float32 rate" in r.findings[0].text
    assert [c.held for c in r.claims] == [True, True, False]


# ---- lesson 3: transfers ---------------------------------------------------------------


def test_transfers_claims_from_given_numbers():
    r = _recorder("transfers")
    sizes = [4096, 65536]
    r.add(fake_measurement("sum on device, get the scalar", median=30e-6))
    r.add(fake_measurement("get the array, sum in NumPy", median=1.5e-3))
    for d in transfers.DIRECTIONS:
        for s in sizes:
            r.add(fake_measurement(f"{d} {common.format_bytes_short(s)}"))
    fits = {"h2d": (9e-6, 20e9, 0.05), "d2h": (12e-6, 18e9, 0.4)}
    with mock.patch.object(transfers, "ceiling", lambda name: mock.Mock(value=50e9)):
        transfers._findings(r, 1000, fits, sizes)
    assert r.findings[0].value == pytest.approx(50.0)
    assert "40% of the pinned ceiling" in r.findings[1].text
    assert "holds within 5%" in r.findings[1].text
    assert "misses a point by 40%" in r.findings[2].text
    assert [c.held for c in r.claims] == [True, True]  # 9 us ~ 10 us; 50x >= 37.6x
    r2 = _recorder("transfers")
    for m in r.measurements.values():
        r2.add(m)
    with mock.patch.object(transfers, "ceiling", lambda name: mock.Mock(value=50e9)):
        transfers._findings(r2, 1000, {"h2d": (40e-6, 5e9, 0.1), "d2h": (40e-6, 5e9, 0.1)},
                            sizes)
    assert [c.held for c in r2.claims] == [False, True]


# ---- plots: each drawer handles its lesson's rows -----------------------------------------


def _result(name, rows):
    return LessonResult(lesson=name, number=lessons.get(name).number, title="t", seed="s",
                        params={}, quick=True, device={"name": "Fake GPU"}, env={},
                        measurements={}, rows=tuple(rows), findings=(), claims=(), checks=(),
                        wall_seconds=0.0, created="2026-11-23T00:00:00+00:00")


def test_plots_draw_from_rows():
    ctx_rows = context.stage_rows(_child_run(), 0) + context.stage_rows(_child_run("torch"), 0)
    creation_rows = [{"impl": i, "n": n, "mib": 4 * n * n / MIB, "host_total_ms": 5.0,
                      "device_ms": 0.05} for i in ("cudalab", "torch") for n in (256, 1024)]
    dtype_rows = [{"impl": i, "dtype": d, "tflops": 50.0, "rel_err": 1e-6}
                  for i in ("cudalab", "torch") for d in ("float64", "float16")]
    transfer_rows = [{"case": f"{d} pageable", "nbytes": s, "ms": 1.0, "fit_ms": 1.1}
                     for d in ("h2d", "d2h") for s in (4096, 1 << 20)]
    for name, rows in (("context", ctx_rows), ("creation", creation_rows),
                       ("dtypes", dtype_rows), ("transfers", transfer_rows)):
        ax = mock.MagicMock()
        lessons.get(name).plot(_result(name, rows), ax)
        assert ax.set_ylabel.called, name


# ---- lesson 0's process protocol, with a stand-in child (no GPU) -------------------------

FAKE_CHILD = r"""
import json, sys
for i, stage in enumerate(("context", "first op", "first matmul")):
    print(json.dumps({"stage": stage, "seconds": 0.01, "free": 100 - i, "total": 200,
                      "allocated": 0, "reserved": 0, "import_s": 0.0, "value": None,
                      "argv": sys.argv[1:]}), flush=True)
    assert sys.stdin.readline() == "\n"
"""


def _fake_driver(monkeypatch, child):
    import cudalab
    readings = iter(range(1000, 0, -1))
    monkeypatch.setattr(context, "CHILD", child)
    monkeypatch.setattr(context, "cudalab", mock.Mock(
        __file__=cudalab.__file__, mem_get_info=lambda device: (next(readings), 2000)))


def test_run_child_reads_each_stage_while_the_child_waits(monkeypatch):
    _fake_driver(monkeypatch, FAKE_CHILD)
    run = context.run_child("cudalab", 0)
    assert run["baseline_free"] == 1000 and run["after_free"] == 996
    assert [s["stage"] for s in run["stages"]] == list(context.STAGES)
    assert [s["outside_free"] for s in run["stages"]] == [999, 998, 997]
    assert run["stages"][0]["argv"] == ["cudalab", "0"] and run["wall_s"] > 0


def test_run_child_reports_a_child_that_dies(monkeypatch):
    _fake_driver(monkeypatch, "import sys; sys.stderr.write('no CUDA here' * 10000); sys.exit(3)")
    with pytest.raises(RuntimeError, match="torch child process ended early:\n.*no CUDA here"):
        context.run_child("torch", 0)
