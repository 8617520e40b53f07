"""Lesson 29 `determinism` without a GPU: registration, every parameter check, the bitwise
tally, the findings' wording from given numbers, torch's flags restored (a stand-in torch),
nn.fusion.forget(), and the notebook text."""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import determinism as D
from cudalab.nn import fusion
from _support import REPO_ROOT, fake_measurement

# ---- registration and parameters -------------------------------------------------------------


def test_registered_as_lesson_29_with_plot_and_quick_params():
    x = lessons.get("determinism")
    assert x.number == 29 and x.plot is not None and x.check is D.check_params
    assert x.quick_params and set(x.quick_params) <= set(x.params)
    assert lessons.names().index("determinism") == len(
        [n for n in lessons.names() if lessons.get(n).number < 29])


def test_full_and_quick_defaults_pass_their_checks():
    x = lessons.get("determinism")
    assert D.check_params(x.defaults(False)) == (256, 1024, 1024, 1024, 16)
    assert D.check_params(x.defaults(True)) == (256, 256, 256, 16)
    quick, full = x.defaults(True), x.defaults(False)
    assert quick["repeats"] < full["repeats"] and quick["size"] < full["size"]


@pytest.mark.parametrize("change,match", [
    ({"repeats": 1}, "repeats must be an int >= 2, got 1"),
    ({"repeats": 2.0}, "repeats must be an int >= 2"),
    ({"size": 0}, "size must be an int >= 1, got 0"),
    ({"matmul_size": True}, "matmul_size must be an int >= 1, got True"),
    ({"batch": -1}, "batch must be an int >= 1"),
    ({"steps": 0}, "steps must be an int >= 1"),
    ({"scatter_size": 0}, "scatter_size must be an int >= 1"),
    ({"bins": 0}, "bins must be an int >= 1"),
    ({"conv_batch": 0}, "conv_batch must be an int >= 1"),
    ({"conv_channels": "64"}, "conv_channels must be an int >= 1"),
    ({"conv_hw": 0}, "conv_hw must be an int >= 1"),
    ({"first_calls": 0}, "first_calls must be an int >= 1"),
    ({"softmax_shape": (16,)}, r"softmax_shape must be \(rows, columns\), got \(16,\)"),
    ({"softmax_shape": (16, 0)}, "softmax_shape must be a non-empty sequence of ints >= 1"),
    ({"softmax_shape": "16x8"}, "softmax_shape must be a non-empty sequence"),
    ({"bins": 4096, "scatter_size": 1024}, "bins must be <= scatter_size"),
    ({"hidden": ()}, "hidden must be a non-empty sequence"),
    ({"classes": 1}, "classes must be >= 2"),
    ({"in_features": 0}, "layer sizes must be ints >= 1"),
    ({"seed": -1}, "seed must be an int >= 0, got -1"),
])
def test_every_parameter_is_checked(change, match):
    p = {**lessons.get("determinism").defaults(True), **change}
    with pytest.raises(ValueError, match=match):
        D.check_params(p)
    with pytest.raises(ValueError, match=r"^lessons\.run\(\): lesson 'determinism': "):
        lessons.run("determinism", quick=True, **change)


# ---- the bitwise tally ---------------------------------------------------------------------------


def test_same_bits_compares_bytes_dtype_and_shape():
    a = np.array([1.0, np.nan, 2.5], dtype=np.float32)
    assert D.same_bits(a, a.copy())  # NaN equals itself bit for bit
    assert not D.same_bits(np.float32(0.0), np.float32(-0.0))
    assert not D.same_bits(a, a.astype(np.float64))
    assert not D.same_bits(a, a.reshape(3, 1))
    assert D.same_bits(np.array(3.0, dtype=np.float32), np.float32(3.0))  # 0-d results
    b = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    assert D.same_bits(b, b.copy()) and not D.same_bits(b, b[::-1].copy())
    strided = np.arange(8, dtype=np.float32)[::2]
    assert D.same_bits(strided, np.array([0, 2, 4, 6], dtype=np.float32))


def test_tally_counts_distinct_results_and_their_spread():
    t = D.Tally()
    assert t.count == 0 and t.runs == 0 and t.spread() == 0.0
    base = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    for _ in range(3):
        t.add(base)
    assert (t.runs, t.count, t.spread()) == (3, 1, 0.0)
    t.add(base + np.float32(0.5))
    t.add(base - np.float32(1.0))
    assert (t.runs, t.count) == (5, 3)
    assert t.spread() == pytest.approx(1.0 / 4.0)  # the largest difference over max |first|


def test_tally_keeps_its_own_copy():
    t = D.Tally()
    a = np.ones(4, dtype=np.float32)
    t.add(a)
    a[0] = 7.0
    t.add(a)
    assert t.count == 2 and t.distinct[0][0] == 1.0


def test_tally_runs_the_function():
    values = iter([1.0, 1.0, 2.0, 1.0])
    t = D.tally(lambda: np.float32(next(values)), 4)
    assert (t.runs, t.count) == (4, 2)


def test_det_costs_only_where_both_settings_were_measured():
    fast, slow = fake_measurement("a", median=1e-4), fake_measurement("b", median=3e-4)
    settings = {"index_add_": {"default_m": fast, "deterministic_m": slow},
                "scatter_add_": {"default_m": fast, "deterministic_m": None},
                "index_put_": {"default_m": slow, "deterministic_m": fast}}
    costs = D.det_costs(settings)
    assert set(costs) == {"index_add_", "index_put_"}
    assert costs["index_add_"] == pytest.approx(3.0)
    assert costs["index_put_"] == pytest.approx(1 / 3)


# ---- the findings' wording -------------------------------------------------------------------


def _tally(*values: float) -> D.Tally:
    t = D.Tally()
    for v in values:
        t.add(np.array([v, 1.0], dtype=np.float32))
    return t


def test_group_text_names_the_identical_and_the_differing():
    text = D.group_text("cudalab", {"sum": _tally(1, 1, 1), "mean": _tally(1, 1, 1)}, "no atomics")
    assert text == "cudalab sum, mean: bitwise identical in 3 of 3 runs each: no atomics"
    text = D.group_text("torch", {"sum": _tally(1, 1), "index_add_": _tally(1, 1.5, 2)})
    assert text.startswith("torch sum: bitwise identical in 2 of 2 runs;")
    assert "index_add_: 3 distinct results in 3 runs, up to 1.0e+00 apart" in text


def test_setting_text_default_vs_deterministic():
    text = D.setting_text("index_add_", _tally(1, 2, 3), _tally(1, 1, 1), 1e-5, 3e-5)
    assert text.startswith("torch index_add_: 3 distinct results in 3 runs by default (up to")
    assert "1 in 3 with the deterministic setting, at 3.00x the time (30.0 vs 10.0 us)" in text
    text = D.setting_text("conv2d weight grad", _tally(1, 1), "no deterministic kernel", 1e-5,
                          None)
    assert "1 distinct result in 2 runs by default;" in text
    assert text.endswith("torch refuses it: no deterministic kernel")


def test_short_error_keeps_the_first_line_within_bounds():
    assert D.short_error(RuntimeError("first line\nsecond")) == "first line"
    long = D.short_error(RuntimeError("x" * 500))
    assert len(long) == D.ERROR_CHARS and long.endswith("...")
    assert D.short_error(RuntimeError()) == "RuntimeError"


@pytest.mark.parametrize("value,ok", [(":4096:8", True), (":16:8", True), (None, False),
                                      ("", False), (":4096:2", False)])
def test_cublas_config_ok(value, ok):
    assert D.cublas_config_ok(value) is ok


def test_cublas_text_says_what_to_set():
    text = D.cublas_text(None, "uses CuBLAS")
    assert text.startswith("CUBLAS_WORKSPACE_CONFIG is not set: under use_deterministic_algo")
    assert "(uses CuBLAS)" in text and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in text
    text = D.cublas_text(":4096:8", None)
    assert text.startswith("CUBLAS_WORKSPACE_CONFIG=:4096:8: torch ran") and "though" not in text
    assert "only guaranteed deterministic" in D.cublas_text(":1:1", None)


def test_benchmark_text_pays_back_or_not():
    speedup, text = D.benchmark_text(0.2, 0.01, 1e-4, 2e-4)
    assert speedup == pytest.approx(2.0)
    assert "200.0 ms with it on" in text and "10.0 ms off" in text
    assert "pays for itself after 1901 calls" in text  # 0.19 s / 0.1 ms saved per call, + 1
    speedup, text = D.benchmark_text(0.2, 0.01, 1e-4, 1.01e-4)
    assert speedup < D.BENCHMARK_FASTER and "does not pay back" in text


def test_fusion_text_gain_and_choices():
    gain, text = D.fusion_text(5e-3, 1e-3, 1e-3, 1e-3, 1.5e-3, 4, 1, 3)
    assert gain == pytest.approx(1.5)
    assert "both GELU forms of 4 problems" in text and "1.50x over the slower form" in text
    assert "repaid after 9 steps" in text and "the same choices each time" in text
    gain, text = D.fusion_text(5e-3, 1e-3, 1e-3, 1e-3, 1.01e-3, 4, 2, 3)
    assert gain < D.FUSION_GAINS and "buys little" in text and "2 different sets" in text
    assert "measured" not in D.fusion_text(5e-3, 1e-3, 1e-3, 1e-3, 1e-3, 4, 1, 1)[1]


def test_fusion_bits_text():
    assert "bitwise identical" in D.fusion_bits_text(True, 0.0)
    text = D.fusion_bits_text(False, 3e-7)
    assert "3.0e-07 apart, not bitwise equal" in text and "set_gelu_fusion" in text


def test_fresh_batches_skip_shapes_seen_and_remember_theirs():
    seen = {(10, 64, 28), (12, 64, 28), (11, 32, 28)}
    assert D.fresh_batches(10, 3, seen, 64, 28) == [11, 13, 14]
    assert {(11, 64, 28), (13, 64, 28), (14, 64, 28)} <= seen
    assert D.fresh_batches(10, 1, seen, 64, 28) == [15]


# ---- torch's flags -----------------------------------------------------------------------------


class FakeTorch:
    """The four global flags TorchFlags touches, as torch keeps them."""

    def __init__(self) -> None:
        self.det, self.warn = False, True
        self.backends = types.SimpleNamespace(
            cudnn=types.SimpleNamespace(deterministic="d0", benchmark="b0"))
        self.calls = []

    def are_deterministic_algorithms_enabled(self):
        return self.det

    def is_deterministic_algorithms_warn_only_enabled(self):
        return self.warn

    def use_deterministic_algorithms(self, mode, *, warn_only=False):
        self.calls.append((mode, warn_only))
        self.det, self.warn = mode, warn_only

    def state(self):
        c = self.backends.cudnn
        return self.det, self.warn, c.deterministic, c.benchmark


def test_torch_flags_set_what_is_given_and_restore_everything():
    t = FakeTorch()
    with D.TorchFlags(t, deterministic=True, cudnn_deterministic=True, benchmark=False):
        assert t.state() == (True, False, True, False)
    assert t.state() == (False, True, "d0", "b0")
    made = len(t.calls)
    with D.TorchFlags(t, benchmark=True):
        assert t.state() == (False, True, "d0", True)
        assert len(t.calls) == made  # use_deterministic_algorithms left alone
    assert t.state() == (False, True, "d0", "b0")


def test_torch_flags_restore_after_an_error_inside():
    t = FakeTorch()
    with pytest.raises(KeyError):
        with D.TorchFlags(t, deterministic=True, benchmark=True):
            raise KeyError("x")
    assert t.state() == (False, True, "d0", "b0")


def test_torch_flags_restore_when_setting_one_fails():
    t = FakeTorch()

    class Refusing(types.SimpleNamespace):
        def __setattr__(self, name, value):
            if name == "benchmark" and value is True:
                raise RuntimeError("no")
            super().__setattr__(name, value)

    t.backends.cudnn = Refusing(deterministic="d0", benchmark="b0")
    with pytest.raises(RuntimeError):
        with D.TorchFlags(t, deterministic=True, cudnn_deterministic=True, benchmark=True):
            pass
    assert t.state() == (False, True, "d0", "b0")


def test_attempt_turns_torch_refusals_into_messages():
    def refuse():
        raise RuntimeError("no deterministic implementation\nmore")

    assert D._attempt(lambda: 3) == 3
    assert D._attempt(refuse) == "no deterministic implementation"
    with pytest.raises(ValueError):
        D._attempt(lambda: int("x"))


# ---- nn.fusion.forget ------------------------------------------------------------------------


@pytest.fixture
def clean_fusion(monkeypatch):
    monkeypatch.setattr(fusion, "_mode", "auto")
    monkeypatch.setattr(fusion, "_measured", {})
    monkeypatch.setattr(fusion._core, "is_current_stream_capturing", lambda: False)


def test_forget_makes_each_problem_measured_again(monkeypatch, clean_fusion):
    timed = []
    monkeypatch.setattr(fusion, "_time_ms", lambda fn: timed.append(fn.__name__) or 1.0)

    def fused():
        pass

    def split():
        pass

    assert "forget" in fusion.__all__
    fusion.use_fused("k", fused, split)
    fusion.use_fused("k", fused, split)
    assert timed == ["fused", "split"] and len(fusion.decisions()) == 1
    fusion.set_gelu_fusion("split")
    fusion.forget()
    assert fusion.decisions() == {} and fusion.get_gelu_fusion() == "split"  # the mode is kept
    fusion.set_gelu_fusion("auto")
    fusion.use_fused("k", fused, split)
    assert timed == ["fused", "split"] * 2


# ---- the notebook text -----------------------------------------------------------------------


def test_notebook_text_has_its_parts_and_real_calls():
    text = (REPO_ROOT / "python/cudalab/lessons/notebooks/determinism.md").read_text()
    assert "## What the tutorial says" in text and "## The code being timed" in text
    assert text.index("## What the tutorial says") < text.index("## The code being timed")
    for call in ("timer.measure(", "use_deterministic_algorithms", "cudnn.benchmark",
                 "nn.fusion.forget()", "tobytes()"):
        assert call in text, call
    assert "finally:" in text  # the notebook puts torch's flags back too
    assert (REPO_ROOT / "notebooks/29_determinism.ipynb").exists()


# ---- rows, findings and claims from stand-in results -------------------------------------------


def _stand_ins(r):
    """What run() hands to _rows, _findings and _claims, with measurements recorded in `r`."""
    def add(label, median):
        return r.add(fake_measurement(label, median=median), label)

    ops = [*D.REDUCTIONS, "softmax", *(f"matmul {m}" for m in D.MATMUL_MODES), D.MLP]
    ours = {op: _tally(1, 1, 1) for op in ops}
    same = {"tallies": {op: _tally(1, 1, 1) for op in ops}, "matmul_det": "uses CuBLAS"}
    settings = {op: {"default": _tally(1, 2, 3), "deterministic": _tally(1, 1, 1),
                     "default_m": add(f"torch {op}", 1e-5),
                     "deterministic_m": add(f"torch {op} deterministic", 2e-5)}
                for op in D.ATOMIC_OPS}
    settings[D.CONV_GRAD] = {"default": _tally(1, 1, 1), "deterministic": "no kernel",
                             "default_m": add(f"torch {D.CONV_GRAD}", 1e-4),
                             "deterministic_m": None}
    tuned = {name: {"first": add(f"torch conv2d first call benchmark {name}", first),
                    "steady": add(f"torch conv2d benchmark {name}", per_call),
                    "per_call": per_call}
             for name, first, per_call in (("off", 0.01, 1.3e-4), ("on", 0.1, 1e-4))}
    fused = {k: add(f"mlp step {k}", v) for k, v in
             {"first": 5e-3, "cached": 1e-3, "auto": 1e-3, "fused": 1e-3, "split": 1.4e-3}.items()}
    fused.update(problems=4, choices=1)
    return ours, same, settings, tuned, fused


def test_rows_findings_and_claims_from_stand_in_results():
    import json

    from cudalab.lessons.registry import LessonRun

    x = lessons.get("determinism")
    r = LessonRun(x, x.defaults(True), True)
    ours, same, settings, tuned, fused = _stand_ins(r)
    D._rows(r, ours, same, settings, tuned, fused)
    D._findings(r, ours, (False, 1e-6), same, settings, tuned, fused)
    D._claims(r, settings, tuned, fused)
    assert all(set(row) == set(D.ROW_KEYS) for row in r.rows)
    assert json.loads(json.dumps(r.rows)) == r.rows
    det = {(row["op"], row["setting"]): row for row in r.rows if row["impl"] == "torch"}
    assert det[("index_add_", "deterministic")]["vs_default"] == pytest.approx(2.0)
    assert det[("matmul fp32", "deterministic")]["note"] == "refused: uses CuBLAS"
    assert det[("conv2d", "benchmark on")]["first_call_ms"] == pytest.approx(100.0)
    texts = [f.text for f in r.findings]
    assert texts[0].startswith("cudalab sum, mean, max: bitwise identical in 3 of 3 runs each")
    assert any(t.startswith("CUBLAS_WORKSPACE_CONFIG") for t in texts)
    assert any("refuses it: no kernel" in t for t in texts)
    held = {c.claim.split(" (")[0].split(":")[0]: c.held for c in r.claims}
    assert held == {"cudnn.benchmark = True speeds up convolutions with fixed input sizes": True,
                    "cudnn.deterministic = True": False,
                    "Deterministic algorithms cost speed": True,
                    "Autotuning": True}


def test_without_torch_only_cudalab_speaks():
    from cudalab.lessons.registry import LessonRun

    x = lessons.get("determinism")
    r = LessonRun(x, x.defaults(True), True)
    ours, _, _, _, fused = _stand_ins(r)
    D._rows(r, ours, None, None, None, fused)
    D._findings(r, ours, (True, 0.0), None, None, None, fused)
    D._claims(r, None, None, fused)
    assert {row["impl"] for row in r.rows} == {"cudalab"}
    assert not any("torch" in f.text for f in r.findings)
    assert [c.claim.split(" (")[0][:10] for c in r.claims] == ["Autotuning"]


class _Axes:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **k: self.calls.append((name, a, k))


def test_plot_draws_the_tallied_rows_only():
    from cudalab.lessons.registry import LessonRun

    x = lessons.get("determinism")
    r = LessonRun(x, x.defaults(True), True)
    ours, same, settings, tuned, fused = _stand_ins(r)
    D._rows(r, ours, same, settings, tuned, fused)
    ax = _Axes()
    D.plot(types.SimpleNamespace(rows=tuple(r.rows)), ax)
    [(_, (ys, widths), _)] = [c for c in ax.calls if c[0] == "barh"]
    tallied = [row for row in r.rows if row["part"] == "repeat" and row["distinct"] is not None]
    assert list(widths) == [row["distinct"] for row in tallied] and len(ys) == len(tallied)
