"""The seeds' mistakes named in lessons 0, 1, 2, 3, 6, 12 and 15: the pure functions that say
what each measurement means, the new parameters' checks and the notebook text, without a GPU."""

from __future__ import annotations

import pytest

from cudalab import lessons
from cudalab.lessons import context, creation, dtypes, streams, tensor_cores, timing, transfers
from cudalab.lessons.registry import resolve_params

from _support import REPO_ROOT, fake_measurement

TEXTS = REPO_ROOT / "python" / "cudalab" / "lessons" / "notebooks"


def _recorder(name):
    return lessons.LessonRun(lessons.get(name), lessons.get(name).defaults(True), quick=True)


# ---- lesson 0: module loading ---------------------------------------------------------------


def test_loading_verdict_explains_the_gap_only_when_eager_reaches_a_gib():
    explains, text = context.loading_verdict(1600.0, 520.0)
    assert explains and "EAGER 1600 MiB, LAZY 520 MiB" in text and "1080 MiB" in text
    explains, text = context.loading_verdict(900.0, 600.0)
    assert not explains and "EAGER stays below 1 GiB" in text and "only part" in text
    explains, text = context.loading_verdict(2500.0, 1200.0)
    assert not explains and "LAZY is already at 1 GiB" in text
    explains, text = context.loading_verdict(700.0, 656.0)
    assert not explains and "does not explain" in text and "+44 MiB" in text


def test_loading_verdict_threshold():
    low = context.LOADING_MATTERS_MIB
    assert "does not explain" in context.loading_verdict(1100.0 + low - 1, 1100.0)[1]
    assert "does not explain" not in context.loading_verdict(500.0 + low, 500.0)[1]


def test_context_loading_params():
    x = lessons.get("context")
    assert x.params["loading"] is True and x.params["loading_torch"] is True
    assert x.defaults(True)["loading_torch"] is False  # torch's EAGER child is seconds
    assert context.LOADING == ("EAGER", "LAZY")
    for name in ("loading", "loading_torch"):
        with pytest.raises(ValueError, match=f"lessons.run\\(\\): lesson 'context': {name} must "
                                             f"be True or False, got 1"):
            resolve_params(x, {name: 1}, quick=True)


# ---- lesson 1: cpu + gpu operands -------------------------------------------------------------


def test_mixing_verdict():
    moves, text = creation.mixing_verdict(None)
    assert moves and "transfers is right" in text
    err = ("RuntimeError: Expected all tensors to be on the same device, but found at least "
           "two devices, cuda:0 and cpu!\nmore")
    moves, text = creation.mixing_verdict(err)
    assert not moves and "Expected all tensors to be on the same device" in text
    assert "more" not in text and "RuntimeError is right" in text
    assert not creation.mixing_verdict("")[0]
    assert "automatically" in creation.MIXING_CLAIM


# ---- lesson 2: the quoted peaks ----------------------------------------------------------------


def test_quoted_peaks_text_names_the_a100_and_the_t4():
    text = dtypes.quoted_peaks_text(989.4, 66.9, 700.0, 50.0)
    assert "312 vs 19.5 TFLOP/s (16x) are an A100's" in text
    assert "T4's it ran on (65 / 8.1, 8x)" in text
    assert "this GPU's datasheet: 989 / 66.9 (15x)" in text and "(14.0x)" in text
    assert "not known" in dtypes.quoted_peaks_text(None, 66.9, 700.0, 50.0)


def test_dtypes_finding_on_the_quoted_peaks():
    rate = {"float32": 50.0, "float16": 700.0}
    r = _recorder("dtypes")
    for d in rate:
        r.add(fake_measurement(f"matmul {d}"))
    dtypes._findings(r, rate, {"float32": 1e-7, "float16": 1e-3}, (9, 0),
                     {"float16": 989.4e12, "float32": 66.9e12})
    [f] = [f for f in r.findings if "A100" in f.text]
    assert f.value == pytest.approx(14.0) and "989 / 66.9" in f.text


# ---- lesson 3: the tutorial's timing -----------------------------------------------------------


def test_timing_method_text():
    text = transfers.timing_method_text(80.0, 17.7, 100)
    assert "80.0x against 17.7x" in text and "4.5x the one" in text and "100 calls" in text
    text = transfers.timing_method_text(10.0, 17.7, 100)
    assert "does not inflate" in text


def test_transfers_seed_finding_and_params():
    r = _recorder("transfers")
    r.add(fake_measurement("sum on device, get the scalar", median=100e-6))
    r.add(fake_measurement("get the array, sum in NumPy", median=1.77e-3))
    r.add(fake_measurement(transfers.SEED_DEVICE, median=20e-6))
    r.add(fake_measurement(transfers.SEED_HOST, median=1.6e-3))
    transfers._seed_finding(r, r.measurements["sum on device, get the scalar"],
                            r.measurements["get the array, sum in NumPy"])
    [f] = r.findings
    assert f.value == pytest.approx(80.0) and "17.7x" in f.text and "20.0 us" in f.text
    assert transfers.TORCH_TWINS["torch " + transfers.SEED_HOST] == transfers.SEED_HOST
    assert lessons.get("transfers").params["seed_calls"] == 100
    with pytest.raises(ValueError, match="seed_calls must be an int >= 1"):
        resolve_params(lessons.get("transfers"), {"seed_calls": 0}, quick=True)


# ---- lesson 6: what runs misaligned sizes ------------------------------------------------------


def test_simt_size_is_the_largest_float32_aligned():
    assert tensor_cores.simt_size([4095, 4096, 4097, 4104, 8191]) == 4104
    assert tensor_cores.simt_size([1023, 1024, 1025, 1032]) == 1032
    assert tensor_cores.simt_size([1023, 1025]) == 1025


def test_cuda_core_verdict():
    beyond, text = tensor_cores.cuda_core_verdict("tf32", 137.0, 50.0, 67.0)
    assert beyond and "2.0x the most" in text and "datasheet peak 67.0" in text
    assert "still run on the tensor cores" in text
    # The bound is the higher of measured and datasheet.
    assert not tensor_cores.cuda_core_verdict("float16", 60.0, 50.0, 67.0)[0]
    beyond, text = tensor_cores.cuda_core_verdict("float16", 60.0, 50.0, None)
    assert beyond and "datasheet" not in text


def test_tensor_cores_params_are_checked_before_the_gpu():
    with pytest.raises(ValueError, match="tensor_cores: sizes must be ints >= 16"):
        resolve_params(lessons.get("tensor_cores"), {"sizes": (8,)}, quick=True)
    # The row check and the parameter check are two functions (one shadowed the other).
    assert tensor_cores._check is not lessons.get("tensor_cores").check


# ---- lesson 12: the race -----------------------------------------------------------------------


def test_race_text():
    text = streams.race_text(1000, 4000, 5.0)
    assert "1,000 of 4,000 elements (25.0%)" in text and "5.00 ms upload" in text
    text = streams.race_text(0, 4000, 5.0)
    assert "no stale element" in text and "still" in text and "wait_stream" in text
    assert lessons.get("streams").params["race_mib"] >= lessons.get("streams").defaults(True)[
        "race_mib"]


# ---- lesson 15: the first call -----------------------------------------------------------------


def test_first_call_text():
    text = timing.first_call_text(timing.FIRST_HANDLE, 0.05, 0.01)
    assert "5.0x" in text and "setup (40.00 ms)" in text
    text = timing.first_call_text(timing.FIRST_LESSON, 0.0101, 0.01)
    assert "already paid" in text
    assert set(timing.FIRST_WHAT) == {timing.FIRST_LESSON, timing.FIRST_HANDLE}
    assert not set(timing.FIRST_WHAT) & set(timing.WHAT)  # the plot's methods stay four


# ---- the notebooks' text -----------------------------------------------------------------------


@pytest.mark.parametrize("name,words", [
    ("context", ("CUDA_MODULE_LOADING", "EAGER", "LAZY")),
    ("creation", ("cpu_tensor + gpu_tensor", "cudalab.asarray(h)")),
    ("dtypes", ("A100", "T4_FP16_TFLOPS")),
    ("transfers", ("100 calls", "def loop(")),
    ("tensor_cores", ("2047", 'precision="highest"')),
    ("streams", ("side.wait_stream(producer)",)),
    ("timing", ("threading.Thread", "fresh cuBLAS handle")),
])
def test_notebook_text_names_the_mistake_and_shows_the_fix(name, words):
    text = (TEXTS / f"{name}.md").read_text()
    for w in words:
        assert w in text, (name, w)


# ---- the new parts' records, from stand-in readings -------------------------------------------

MIB = 1 << 20


def _child(impl, loading, used_mib):
    base, total = 80_000 * MIB, 81_000 * MIB
    stages = [{"stage": s, "seconds": 0.1, "free": base - u * MIB, "total": total,
               "allocated": 0, "reserved": 0, "import_s": 0.2, "value": None,
               "outside_free": base - u * MIB} for s, u in zip(context.STAGES, used_mib)]
    return {"impl": impl, "loading": loading, "baseline_free": base, "stages": stages,
            "wall_s": 1.0, "after_free": base}


@pytest.fixture
def host_measurements(monkeypatch):
    """host_measurement without a device (it asks the driver for the device's name)."""
    def fake(times, *, calls, label, **other):
        return fake_measurement(label, times=[t / calls for t in times])

    for module in (context, timing):
        monkeypatch.setattr(module, "host_measurement", fake)


def test_context_loading_records_judge_with_torch_when_it_ran(host_measurements):
    runs = [_child("cudalab", "EAGER", (700, 705, 720)), _child("cudalab", "LAZY", (500, 502, 510)),
            _child("torch", "EAGER", (1500, 1510, 1600)), _child("torch", "LAZY", (400, 410, 520))]
    r = _recorder("context")
    context._loading(r, runs, ["cudalab", "torch"])
    assert {x["loading"] for x in r.rows} == {"EAGER", "LAZY"} and len(r.rows) == 12
    assert "context (torch, EAGER)" in r.measurements
    texts = [f.text for f in r.findings]
    assert texts[0].startswith("cudalab with CUDA_MODULE_LOADING=EAGER: 700 MiB")
    assert texts[-1].startswith("torch: eager module loading explains")
    [claim] = r.claims
    assert not claim.held and claim.measured == pytest.approx(520.0)
    r = _recorder("context")
    context._loading(r, runs[:2], ["cudalab"])
    assert r.findings[-1].text.startswith("cudalab: eager module loading adds 210 MiB")


def test_timing_first_calls_recorded_beside_the_warmed_time(monkeypatch, host_measurements):
    import cudalab

    monkeypatch.setattr(cudalab, "set_device", lambda d: None)
    monkeypatch.setattr(cudalab, "synchronize", lambda *a: None)
    monkeypatch.setattr(cudalab, "current_device", lambda: 0)
    r = _recorder("timing")
    r.add(fake_measurement("host clock + synchronize", median=0.01))
    r.add(fake_measurement("cudalab.bench", median=0.01))
    timing._first_calls(r, lambda: None, 0.05)
    assert [x["method"] for x in r.rows] == [timing.FIRST_LESSON, timing.FIRST_HANDLE]
    assert r.findings[0].text.startswith("First call (this lesson) took 50.00 ms")
    assert r.findings[0].value == pytest.approx(5.0)

    def boom():
        raise RuntimeError("in the thread")

    with pytest.raises(RuntimeError, match="in the thread"):
        timing._first_in_thread(boom, 0)
