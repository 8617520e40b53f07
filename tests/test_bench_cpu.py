"""cudalab.bench without a GPU: statistics, JSON, merging, tables, argument checks."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import math
import types

import numpy as np
import pytest

import cudalab
from cudalab.bench import CEILING_NAMES, Compare, Measurement, format_time
from cudalab.bench.ceilings import Ceiling, Ceilings, resolve_ceiling
from cudalab.bench.measurement import quartiles
from _support import assert_arg_error, fake_measurement, no_gpu_only


def test_statistics_match_numpy(rng):
    times = rng.uniform(1e-4, 2e-4, size=37)
    m = fake_measurement(times=times, flops=1e9, bytes=4e6)
    q1, q2, q3 = np.percentile(times, [25, 50, 75])
    assert m.median == pytest.approx(q2)
    assert m.iqr == pytest.approx(q3 - q1)
    assert m.mean == pytest.approx(times.mean())
    assert m.min == times.min() and m.max == times.max()
    assert m.repeats == 37
    assert m.tflops == pytest.approx(1e9 / q2 / 1e12)
    assert m.gbps == pytest.approx(4e6 / q2 / 1e9)
    assert m.relative_iqr == pytest.approx((q3 - q1) / q2)


def test_quartiles_of_one_value_and_empty():
    assert quartiles([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        quartiles([])


def test_noisy_flag_and_warning():
    steady = fake_measurement(times=[1.0, 1.0, 1.01, 0.99, 1.0])
    assert not steady.noisy and steady.warning is None
    noisy = fake_measurement(times=[1.0, 2.0, 1.0, 2.0, 1.5, 3.0])
    assert noisy.noisy and "noisy" in noisy.warning
    assert "only 1 repeat" in fake_measurement(times=[1.0]).warning


def test_percent_of_ceiling_uses_the_ceiling_unit():
    m = fake_measurement(times=[0.5] * 4, flops=100.0, bytes=10.0, ceiling_name="matmul_float16",
                         ceiling_value=400.0, ceiling_unit="FLOP/s")
    assert m.percent_of_ceiling == pytest.approx(50.0)
    m = fake_measurement(times=[0.5] * 4, bytes=10.0, ceiling_name="copy", ceiling_value=40.0,
                         ceiling_unit="B/s")
    assert m.percent_of_ceiling == pytest.approx(50.0)
    assert fake_measurement(times=[0.5] * 4, bytes=10.0).percent_of_ceiling is None


@pytest.mark.parametrize("times, message", [
    ((), "at least one time"),
    ((1.0, -1.0), "finite times >= 0"),
    ((1.0, math.nan), "finite times >= 0"),
])
def test_bad_times_are_rejected(times, message):
    with pytest.raises(ValueError, match=message):
        Measurement(label="x", times=times)


def test_json_round_trip_keeps_everything(rng):
    m = fake_measurement(times=rng.uniform(1, 2, 11), sub_label="4096", description="cudalab",
                         number_per_run=7, host_time=3e-6, launch_gap=1e-6, flops=5.0, bytes=6.0,
                         ceiling_name="copy", ceiling_value=1e12, ceiling_unit="B/s", device="GPU",
                         device_index=0, clocks={"sm_mhz": 1980, "memory_mhz": 2619},
                         flush_l2=True, held=True, stop_reason="max_repeats",
                         metadata={"shape": [3, 5]})
    text = m.to_json()
    data = json.loads(text)
    assert data["derived"]["median"] == pytest.approx(m.median)
    back = Measurement.from_json(text)
    assert back == m
    assert back.metadata == {"shape": [3, 5]}


def test_from_dict_rejects_unknown_schema():
    data = fake_measurement(times=[1.0]).to_dict()
    data["schema"] = "something/9"
    with pytest.raises(ValueError, match="unknown schema"):
        Measurement.from_dict(data)


def test_merge_pools_times_per_key():
    a1 = fake_measurement(times=[1.0, 2.0], sub_label="a", host_time=1.0)
    a2 = fake_measurement(times=[3.0], sub_label="a", host_time=3.0)
    b = fake_measurement(times=[5.0], sub_label="b")
    merged = Measurement.merge([a1, b, a2])
    assert [m.sub_label for m in merged] == ["a", "b"]
    assert merged[0].times == (1.0, 2.0, 3.0)
    assert merged[0].stop_reason == "merged"
    assert merged[0].host_time == 2.0
    assert merged[1] is b


def test_merge_refuses_different_work():
    with pytest.raises(ValueError, match="disagree on flops"):
        Measurement.merge([fake_measurement(times=[1.0], flops=1.0),
                           fake_measurement(times=[1.0], flops=2.0)])


def test_format_time_units():
    assert format_time(1.5) == "1.5 s"
    assert format_time(0.0123) == "12.3 ms"
    assert format_time(4.5e-6) == "4.5 us"
    assert format_time(3e-9) == "3 ns"


def test_compare_layout_rows_columns_and_unit():
    ms = [
        fake_measurement("matmul", times=[1e-3] * 4, sub_label="1024", description="cudalab",
                         device="GPU"),
        fake_measurement("matmul", times=[2e-3] * 4, sub_label="1024", description="torch",
                         device="GPU"),
        fake_measurement("matmul", times=[8e-3] * 4, sub_label="2048", description="cudalab",
                         device="GPU"),
        fake_measurement(times=[5e-6] * 4, label="add", sub_label="1M", description="cudalab"),
    ]
    text = str(Compare(ms))
    tables = text.split("\n\n")
    assert len(tables) == 2
    matmul = tables[0].splitlines()
    assert matmul[0] == "[-- matmul --]"
    assert matmul[1].split() == ["cudalab", "torch"]
    assert matmul[2].split() == ["1024", "1.00", "2.00"]
    assert matmul[3].split() == ["2048", "8.00"]
    assert "in ms" in matmul[-1] and "GPU" in matmul[-1]
    assert "in us" in tables[1]


def test_compare_merges_repeated_runs_and_marks_noise():
    ms = [fake_measurement(times=[1.0, 1.0], sub_label="x"),
          fake_measurement(times=[3.0, 3.0], sub_label="x")]
    text = str(Compare(ms).highlight_warnings())
    assert "(!)" in text and "noisy" in text
    assert "2.00" in text  # the median of the pooled times


def test_compare_rates_and_colour():
    fast = fake_measurement(times=[1e-3] * 4, sub_label="n", description="a", flops=2e9)
    slow = fake_measurement(times=[4e-3] * 4, sub_label="n", description="b", flops=2e9)
    text = str(Compare([fast, slow], value="tflops").colorize(rowwise=True))
    assert "\033[92m" in text and "\033[91m" in text
    assert "TFLOP/s" in text


def test_compare_argument_errors():
    with pytest.raises(ValueError, match="'value'"):
        Compare([], value="speed")
    with pytest.raises(TypeError, match="Measurement objects"):
        Compare([1.0])
    with pytest.raises(ValueError, match="'digits'"):
        Compare([]).trim_significant_figures(0)


def test_resolve_ceiling_validation_without_gpu():
    assert resolve_ceiling(None, 1.0, 1.0) == (None, None, None)
    assert resolve_ceiling("auto", 1.0, None, check_only=True) == (None, None, None)
    with pytest.raises(ValueError, match="unknown ceiling 'fast'"):
        resolve_ceiling("fast", None, 1.0, check_only=True)
    with pytest.raises(ValueError, match="flops must be given"):
        resolve_ceiling("matmul_float16", None, 1.0, check_only=True)
    with pytest.raises(ValueError, match="bytes must be given"):
        resolve_ceiling("copy", 1.0, None, check_only=True)
    with pytest.raises(ValueError, match="'launch' is a time"):
        resolve_ceiling("launch", None, 1.0, check_only=True)
    with pytest.raises(TypeError, match="'ceiling'"):
        resolve_ceiling(3.0, None, 1.0, check_only=True)
    c = Ceiling(name="copy", value=2e12, unit="B/s", theoretical=4e12,
                measurement=fake_measurement(times=[1.0]))
    assert resolve_ceiling(c, None, 1.0) == ("copy", 2e12, "B/s")


def test_ceilings_table_and_dict():
    entries = {
        "copy": Ceiling("copy", 4.0e12, "B/s", 4.8e12, fake_measurement(times=[1e-3] * 4)),
        "launch": Ceiling("launch", 2.5e-6, "s", None, fake_measurement(times=[2.5e-6] * 4)),
        "matmul_float16": Ceiling("matmul_float16", 7.0e14, "FLOP/s", 1.0e15,
                                  fake_measurement(times=[1e-3] * 4)),
    }
    c = Ceilings(device="GPU", device_index=0, entries=entries)
    assert list(c) == ["copy", "launch", "matmul_float16"] and len(c) == 3
    text = c.table()
    assert "4000 GB/s" in text and "700 TFLOP/s" in text and "2.5 us" in text
    assert "83.3" in text and "70.0" in text
    data = json.loads(json.dumps(c.to_dict()))
    assert data["ceilings"]["copy"]["percent_of_theoretical"] == pytest.approx(4 / 4.8 * 100)


def test_ceiling_names():
    assert CEILING_NAMES[:4] == ("copy", "h2d", "d2h", "launch")
    assert "matmul_tf32" in CEILING_NAMES


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"warmup": -1}, ValueError, "'warmup'"),
    ({"min_run_time": 0}, ValueError, "'min_run_time'"),
    ({"min_run_time": "1"}, TypeError, "'min_run_time'"),
    ({"min_run_time": 2.0, "max_run_time": 1.0}, ValueError, "'max_run_time'"),
    ({"min_repeats": 0}, ValueError, "'min_repeats'"),
    ({"min_repeats": 20, "max_repeats": 10}, ValueError, "'max_repeats'"),
    ({"max_repeats": 1.5}, TypeError, "'max_repeats'"),
    ({"noise_threshold": -0.1}, ValueError, "'noise_threshold'"),
    ({"flops": -1}, ValueError, "'flops'"),
    ({"stream": 0}, TypeError, "'stream'"),
    ({"ceiling": "warp"}, ValueError, "unknown ceiling"),
])
def test_measure_checks_arguments_before_the_gpu(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        cudalab.bench.measure(lambda: None, **kwargs)


def test_measure_rejects_a_non_callable():
    with pytest.raises(TypeError, match="'fn': expected a callable"):
        cudalab.bench.measure(3)


@no_gpu_only
def test_measure_and_ceilings_without_gpu_raise_no_device():
    with pytest.raises(cudalab.NoDeviceError, match="measure()"):
        cudalab.bench.measure(lambda: None)
    with pytest.raises(cudalab.NoDeviceError, match="ceilings()"):
        cudalab.bench.ceilings()
    with pytest.raises(ValueError, match="unknown ceiling"):
        cudalab.bench.ceiling("nope")


# ---- presets and Timer ---------------------------------------------------------------------

from cudalab.bench import (MATMUL_DTYPES, MEASURE_OPTIONS, PRESETS, CopyCase, LaunchCase,  # noqa: E402
                           MatmulCase, Preset, Timer, TransferCase, get_preset, host_clock)
from cudalab.bench.cases import Prepared  # noqa: E402


def test_presets_are_named_frozen_and_ordered_by_care():
    assert list(PRESETS) == ["quick", "default", "sustained"]
    quick, default, sustained = PRESETS.values()
    assert all(p.name == name for name, p in PRESETS.items())
    assert quick.min_run_time < default.min_run_time < sustained.min_run_time
    assert sustained.warmup >= 0.25  # long enough for a power-capped clock to settle
    assert all(p.noise_threshold == 0.02 and not p.flush_l2 for p in PRESETS.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.warmup = 1.0


def test_docs_preset_table_matches_the_presets():
    from _support import DOCS

    rows = {}
    for line in (DOCS / "measuring.md").read_text().splitlines():
        cells = [c.strip(" `") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in PRESETS:
            rows[cells[0]] = cells
    assert set(rows) == set(PRESETS)
    for name, p in PRESETS.items():
        warmup, min_run, max_run = (float(c.split()[0]) for c in rows[name][1:4])
        assert (warmup, min_run, max_run) == (p.warmup, p.min_run_time, p.max_run_time), name


def test_presets_docstring_table_matches_the_presets():
    from cudalab.bench import presets

    lines = {line.split()[0]: line.split() for line in presets.__doc__.splitlines()
             if line.split() and line.split()[0] in PRESETS}
    for name, p in PRESETS.items():
        words = lines[name]
        assert (float(words[1]), float(words[3]), float(words[5])) == (
            p.warmup, p.min_run_time, p.max_run_time), name
        assert words[7] == f"{p.min_repeats}+"


def test_measure_takes_a_preset_and_the_documented_options():
    keyword_only = [n for n, p in inspect.signature(cudalab.bench.measure).parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert list(MEASURE_OPTIONS) == keyword_only
    assert inspect.signature(cudalab.bench.measure).parameters["preset"].default == "default"


def test_preset_replace_and_budget_rule():
    default = PRESETS["default"]
    assert default.replace() == default
    assert default.replace(warmup=None) == default  # None keeps the preset's value
    longer = default.replace(min_run_time=2.0)
    assert longer.max_run_time == 10.0  # raised to 5 x min_run_time
    assert longer.name == "default" and default.min_run_time == 0.2
    assert default.replace(min_run_time=0.1).max_run_time == default.max_run_time
    assert default.replace(min_run_time=2.0, max_run_time=3.0).max_run_time == 3.0
    with pytest.raises(TypeError, match="unexpected setting"):
        default.replace(hold=False)
    with pytest.raises(TypeError, match="'flush_l2': expected a bool"):
        default.replace(flush_l2=1)


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"warmup": -1.0}, ValueError, "Preset\\(\\) argument 'warmup'"),
    ({"min_run_time": 2.0, "max_run_time": 1.0}, ValueError, "'max_run_time': expected >= min_run_time"),
    ({"min_repeats": 0}, ValueError, "'min_repeats'"),
    ({"noise_threshold": "x"}, TypeError, "'noise_threshold'"),
    ({"name": ""}, TypeError, "'name'"),
])
def test_preset_validation(kwargs, exc, message):
    fields = {"name": "mine", "warmup": 0.1, "min_run_time": 0.1, "max_run_time": 1.0, **kwargs}
    with pytest.raises(exc, match=message):
        Preset(**fields)


def test_get_preset():
    assert get_preset("quick") is PRESETS["quick"]
    mine = Preset("mine", warmup=0.0, min_run_time=0.01, max_run_time=0.1)
    assert get_preset(mine) is mine
    with pytest.raises(ValueError, match="unknown preset 'fast' \\(expected one of 'quick', 'default', "
                                         "'sustained'\\)"):
        get_preset("fast")
    with pytest.raises(TypeError, match="'preset': expected a str or a Preset"):
        get_preset(3)


def test_preset_describe():
    assert PRESETS["sustained"].describe() == (
        "0.25 s warm-up; repeats until IQR/median <= 2% after 0.5 s, within 2 s (10 to 10,000 repeats)")
    assert "L2 flushed" in PRESETS["quick"].replace(flush_l2=True).describe()


def test_timer_settings_repr_and_replace():
    t = Timer("sustained", min_run_time=1.0, hold=False)
    assert t.settings == PRESETS["sustained"].replace(min_run_time=1.0)
    assert t.to_dict() == {**t.settings.to_dict(), "hold": False}
    assert repr(t).startswith("Timer('sustained', warmup=0.25, min_run_time=1.0, max_run_time=5.0")
    held = t.replace(hold=True, warmup=0.5)
    assert (held.hold, held.settings.warmup, held.settings.min_run_time) == (True, 0.5, 1.0)
    assert t.hold is False  # unchanged


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"preset": "slow"}, ValueError, "Timer\\(\\) argument 'preset': unknown preset 'slow'"),
    ({"warmup": -1}, ValueError, "Timer\\(\\) argument 'warmup'"),
    ({"hold": 1}, TypeError, "'hold': expected a bool"),
    ({"stream": 0}, TypeError, "'stream'"),
    ({"progress": 5}, TypeError, "'progress'"),
])
def test_timer_argument_errors(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        Timer(**kwargs)


def test_measure_checks_preset_and_overrides_before_the_gpu():
    with assert_arg_error(ValueError, "measure", "preset", match="^unknown preset"):
        cudalab.bench.measure(lambda: None, preset="fast")
    with assert_arg_error(ValueError, "measure", "max_run_time"):
        cudalab.bench.measure(lambda: None, preset="quick", max_run_time=0.01)
    with pytest.raises(TypeError, match="'fn': expected a callable"):
        Timer().measure(None)


@no_gpu_only
def test_timer_without_gpu_raises_no_device():
    with pytest.raises(cudalab.NoDeviceError, match="Timer\\(\\): no CUDA device"):
        Timer("quick").measure(lambda: None)


# ---- benchmark cases -------------------------------------------------------------------------


def test_matmul_case_names_and_work():
    assert MATMUL_DTYPES == ("float64", "float32", "tf32", "float16", "bfloat16")
    c = MatmulCase("tf32", 1031)
    assert (c.name, c.label, c.sub_label, c.ceiling) == ("matmul_tf32", "matmul", "tf32", "matmul_tf32")
    assert (c.storage, c.precision, c.peak_key) == ("float32", "high", "tfloat32")
    assert c.flops == 2.0 * 1031 ** 3
    assert MatmulCase("float32").precision == "highest" and MatmulCase("float32").n == 8192
    assert (MatmulCase("bfloat16").storage, MatmulCase("bfloat16").precision) == ("bfloat16", None)
    assert MatmulCase.sized_for("float16", 80 << 30).n == 8192
    assert MatmulCase.sized_for("float16", 2 << 30).n == 4096


def test_copy_case_names_and_work():
    c = CopyCase()
    assert (c.name, c.label, c.sub_label, c.ceiling, c.nbytes) == ("copy", "copy", "1 GiB", "copy", 1 << 30)
    assert CopyCase(96 << 20).sub_label == "96 MiB"
    assert CopyCase.sized_for(80 << 30).nbytes == 1 << 30
    small = CopyCase.sized_for(1_000_003)
    assert small.nbytes == (1_000_003 // 4) & ~0xFFFF and small.nbytes % 65536 == 0


def test_transfer_and_launch_case_names():
    t = TransferCase("d2h", "pageable", 16 << 20)
    assert (t.name, t.label, t.sub_label, t.ceiling) == ("d2h_pageable", "d2h", "pageable", "d2h")
    assert TransferCase("h2d").nbytes == 256 << 20 and TransferCase("h2d").memory == "pinned"
    launch = LaunchCase()
    assert (launch.name, launch.launches, launch.ceiling) == ("launch", 10_000, None)


@pytest.mark.parametrize("make, exc, message", [
    (lambda: MatmulCase("int8"), ValueError, "MatmulCase\\(\\) argument 'dtype': expected one of"),
    (lambda: MatmulCase("float16", 0), ValueError, "'n': expected an int >= 1"),
    (lambda: MatmulCase("float16", 2.0), TypeError, "'n': expected an int"),
    (lambda: CopyCase(2), ValueError, "CopyCase\\(\\) argument 'nbytes': expected an int >= 4"),
    (lambda: TransferCase("up"), ValueError, "'direction': expected one of 'h2d', 'd2h'"),
    (lambda: TransferCase("h2d", "paged"), ValueError, "'memory': expected one of 'pinned', 'pageable'"),
    (lambda: LaunchCase(repeats=0), ValueError, "'repeats'"),
])
def test_case_validation(make, exc, message):
    with pytest.raises(exc, match=message):
        make()


@no_gpu_only
def test_cases_need_a_gpu_to_prepare():
    for case in (CopyCase(1 << 20), MatmulCase("float16", 64), TransferCase("h2d", nbytes=1 << 20)):
        with pytest.raises(cudalab.NoDeviceError):
            case.prepare()


class _FakeTimer:
    """Records what Prepared.measure asks of a Timer."""

    def __init__(self, hold=True):
        self.hold, self.calls = hold, []

    def replace(self, **kw):
        return _FakeTimer(**kw)

    def measure(self, fn, **kw):
        self.calls.append((self.hold, fn, kw))
        return kw


def test_prepared_measure_passes_the_work_and_names():
    case = MatmulCase("float16", 64)
    p = Prepared(case, fn=print, flops=case.flops, metadata={"n": 64})
    timer = _FakeTimer()
    kw = p.measure(timer, ceiling="matmul_float16", metadata={"extra": 1})
    assert kw == {"flops": case.flops, "bytes": None, "ceiling": "matmul_float16", "label": "matmul",
                  "sub_label": "float16", "description": "cudalab", "metadata": {"n": 64, "extra": 1}}
    assert timer.calls[0][0] is True and timer.calls[0][1] is print
    assert p.measure(timer, label="L", sub_label="S", description="torch")["label"] == "L"


def test_prepared_that_may_not_be_held_gets_an_unheld_timer():
    p = Prepared(TransferCase("h2d", "pageable"), fn=print, bytes=1.0, hold=False)
    fake = _FakeTimer(hold=True)
    p.measure(fake)
    assert fake.calls == []  # a replaced timer measured it
    unheld = _FakeTimer(hold=False)
    p.measure(unheld)
    assert unheld.calls[0][0] is False


def test_prepared_torch_twin():
    p = Prepared(CopyCase(1 << 20), fn=print, bytes=2.0, _torch=lambda torch: torch.twin)
    torch = types.SimpleNamespace(twin=len)
    twin = p.torch_twin(torch)
    assert twin.fn is len and twin.bytes == 2.0 and twin.case is p.case
    with pytest.raises(ValueError, match="case 'copy' has no PyTorch counterpart"):
        twin.torch_twin(torch)


def test_launch_case_refuses_a_ceiling():
    with pytest.raises(ValueError, match="a launch is a time"):
        LaunchCase().measure(Timer(), ceiling="copy")


# ---- host clock ------------------------------------------------------------------------------


def test_host_clock_warms_up_then_interleaves():
    calls: list[str] = []
    cases = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = host_clock(cases, repeats=3, warmup=0.0)
    assert calls == ["a", "b"] + ["a", "b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_measurement_rates_text():
    m = fake_measurement(times=[0.5] * 4, flops=1e12, bytes=1e9, ceiling_name="copy",
                         ceiling_value=4e9, ceiling_unit="B/s")
    assert m.rates() == ["2 TFLOP/s", "2 GB/s", "50.0% of measured copy"]
    assert fake_measurement(times=[1.0]).rates() == []


# ---- ceiling_preset: which preset a first measurement uses, and cache reuse ----


def test_ceiling_preset_rejects_unknown_presets():
    from cudalab.bench import ceiling_preset

    with pytest.raises(ValueError, match=r"ceiling_preset\(\) argument 'preset'.*'quick'"):
        with ceiling_preset("fast"):
            pass


def test_ceiling_cache_is_reused_for_lighter_presets_only(monkeypatch):
    mod = importlib.import_module("cudalab.bench.ceilings")  # not the ceilings() function
    measured = []

    def fake_run(name, props, preset):
        measured.append(preset)
        return f"{name} at {preset}"

    monkeypatch.setattr(mod, "_cache", {})
    monkeypatch.setattr(mod, "_run", fake_run)
    monkeypatch.setattr(mod, "_device_index", lambda device, func: 0)
    monkeypatch.setattr(mod, "get_device_properties", lambda index: None)
    monkeypatch.setattr("cudalab.devices.device", lambda index: contextlib.nullcontext())
    with mod.ceiling_preset("quick"):
        assert mod.ceiling("copy") == "copy at quick"
        assert mod.ceiling("copy") == "copy at quick"  # cached
    assert mod.ceiling("copy") == "copy at sustained"  # a quick one does not serve sustained
    with mod.ceiling_preset("quick"):
        assert mod.ceiling("copy") == "copy at sustained"  # a sustained one serves quick
    assert measured == ["quick", "sustained"]
