"""Lesson checkpointing without a GPU: registration, parameter checks, the arithmetic behind
its findings, and the whole lesson on the NumPy stand-ins of lessons d and f."""

import math

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import checkpointing as ck
from cudalab.lessons import registry
from cudalab.nn.layers import activation_bytes

import test_lessons_d_cpu as standin
import test_lessons_f_cpu as f


def test_registered_with_plot_and_small_quick_params():
    x = lessons.get("checkpointing")
    assert x.number == 26 and x.plot is not None
    full, quick = x.defaults(False), x.defaults(True)
    assert len(full["hidden"]) >= 8 and quick["batch"] < full["batch"]
    assert ck.check_params(full)[1] == tuple(range(1, 14))
    assert ck.check_params(quick)[1] == tuple(range(1, 8))


def _p(**over):
    return {**lessons.get("checkpointing").defaults(True), **over}


@pytest.mark.parametrize("over,match", [
    ({"segments": "some"}, "segments must be 'all' or ints"),
    ({"segments": (0, 2)}, r"segments must be ints in \[1, 7\] \(the number of layers\)"),
    ({"segments": (8,)}, r"segments must be ints in \[1, 7\]"),
    ({"segments": (True,)}, "segments must be ints"),
    ({"segments": (2, 2)}, "segments must be distinct"),
    ({"segments": ()}, "segments must be distinct"),
    ({"precision": "fp16"}, "precision must be one of fp32, tf32, bf16"),
    ({"lr": 0}, r"lr must be a number in \(0, 1\)"),
    ({"budget_gib": 0}, "budget_gib must be a number > 0"),
    ({"budget_gib": True}, "budget_gib must be a number > 0"),
    ({"batch": 0}, "batch must be an int >= 1"),
    ({"hidden": ()}, "hidden must be a non-empty sequence"),
    ({"seed": -1}, "seed"),
])
def test_rejects_bad_params(over, match):
    with pytest.raises(ValueError, match=r"^lesson 'checkpointing': " + match):
        ck.check_params(_p(**over))


def test_segments_sorted_and_one_int_taken():
    assert ck.check_params(_p(segments=(4, 1, 2)))[1] == (1, 2, 4)
    assert ck.check_params(_p(segments=3))[1] == (3,)


def test_unknown_parameter_is_refused_before_any_gpu_work():
    with pytest.raises(ValueError, match="has no parameter 'k'"):
        lessons.run("checkpointing", k=3)


def test_recompute_flops_and_the_predicted_time():
    sizes = (4, 8, 8, 8, 2)  # 4 layers; k=2: (0,2) (2,4): layer 0 is recomputed
    assert ck.recompute_flops(sizes, 10, None) == 0 == ck.recompute_flops(sizes, 10, 1)
    assert ck.recompute_flops(sizes, 10, 2) == 2 * 10 * 4 * 8
    step = 2 * 10 * (3 * (32 + 64 + 64 + 16) - 32)
    assert ck.predicted_time_ratio(sizes, 10, 2) == pytest.approx(1 + 640 / step)


def test_sqrt_rule_best_and_largest_batch():
    assert [ck.sqrt_rule(n) for n in (1, 2, 13, 16, 17)] == [1, 1, 4, 4, 4]
    assert ck.best_segments({1: 9, 2: 5, 3: 5}, {1: 1.0, 2: 1.3, 3: 1.2}) == 3
    assert ck.largest_batch(100, 20, 8) == 10
    assert ck.largest_batch(100, 120, 8) == 0 and ck.largest_batch(100, 20, 0) == 0


def test_trade_text_follows_the_threshold():
    assert "3.0x less activation memory" in ck.trade_text(4, 9, 13, 3.0, 1.2, 1.25)
    text = ck.trade_text(1, 0, 13, 1.0, 1.01, 1.0)
    assert "about the same activation memory (1.00x" in text and "1.01x the step time" in text


# ---- the whole lesson on NumPy stand-ins ----------------------------------------------------


class _MLP(f._MLP):
    """lesson f's stand-in MLP with the checkpointing knob: its forward raises the pool's
    peak by the activation bytes the real MLP keeps (cudalab.nn.layers.activation_bytes)."""

    def __init__(self, sizes, activation="gelu", *, seed=0, checkpoint_segments=None):
        super().__init__(sizes, activation, seed=seed)
        self.k = checkpoint_segments

    def forward(self, x, precision="fp32", *, cast_weights=True):
        out = super().forward(x, precision, cast_weights=cast_weights)
        f._Memory.peak = f._Memory.live + activation_bytes(
            self.sizes, out.a.shape[0], np.float32, "gelu", self.k)
        return out


def test_lesson_runs_on_the_stand_in(monkeypatch):
    timer = standin._fake_gpu(monkeypatch)
    f._fake_nn(monkeypatch)
    monkeypatch.setattr(ck, "nn", f.ga.nn)  # the stand-in nn lesson f installed
    monkeypatch.setattr(ck.nn, "MLP", _MLP)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get("checkpointing")
    params = {**x.defaults(True), "in_features": 8, "hidden": (16,) * 8, "classes": 4,
              "batch": 32}
    r = registry.LessonRun(x, params, True)
    r.timer = timer
    x.function(r)
    assert all(tuple(row) == ck.ROW_KEYS for row in r.rows)
    rows = {row["segments"]: row for row in r.rows}
    assert sorted(rows, key=lambda k: -1 if k is None else k) == [None, *range(1, 10)]
    assert all(row["grad_max_rel_diff"] == 0 and row["bitwise"] for k, row in rows.items() if k)
    assert rows[3]["memory_vs_plain"] < 0.6 and rows[1]["memory_vs_plain"] == 1.0
    assert rows[3]["step_mib"] == pytest.approx(rows[3]["predicted_mib"])
    assert len(r.checks) == 9 and all(c.passed for c in r.checks)
    assert any(f"sqrt(n) rule of thumb (n=9 layers) says k={ck.sqrt_rule(9)}" in x.text
               for x in r.findings)
    assert len(r.claims) == 2 and r.claims[0].held
    for fi in r.findings:
        assert set(fi.labels) <= set(r.measurements), fi
    assert math.isfinite(r.claims[1].measured)
