"""CPU tier: nn.fusion's choice between GELU in the epilogue and a separate kernel."""

from __future__ import annotations

import pytest

from cudalab.nn import fusion


@pytest.fixture(autouse=True)
def clean_fusion_state(monkeypatch):
    monkeypatch.setattr(fusion, "_mode", "auto")
    monkeypatch.setattr(fusion, "_measured", {})
    monkeypatch.setattr(fusion._core, "is_current_stream_capturing", lambda: False)


def never():
    raise AssertionError("must not run")


def test_modes_and_their_errors():
    assert fusion.get_gelu_fusion() == "auto"
    for mode in fusion.MODES:
        fusion.set_gelu_fusion(mode)
        assert fusion.get_gelu_fusion() == mode
    with pytest.raises(ValueError, match=r"^set_gelu_fusion\(\) argument 'mode': expected one of "
                                         r"'auto', 'fused', 'split', got 'fast'"):
        fusion.set_gelu_fusion("fast")


def test_forced_modes_run_nothing_and_measure_nothing():
    fusion.set_gelu_fusion("fused")
    assert fusion.use_fused("k", never, never) is True
    fusion.set_gelu_fusion("split")
    assert fusion.use_fused("k", never, never) is False
    assert fusion.decisions() == {}


@pytest.mark.parametrize("fused_ms,split_ms,want", [(1.0, 2.0, True), (2.0, 1.0, False),
                                                    (1.5, 1.5, True)])
def test_auto_measures_once_and_keeps_the_faster(monkeypatch, fused_ms, split_ms, want):
    times = {"fused": fused_ms, "split": split_ms}
    calls = []

    def fake_time(fn):
        calls.append(fn.__name__)
        return times[fn.__name__]

    def fused():
        pass

    def split():
        pass

    monkeypatch.setattr(fusion, "_time_ms", fake_time)
    assert fusion.use_fused(("gelu forward", 8), fused, split) is want
    assert fusion.use_fused(("gelu forward", 8), fused, split) is want
    assert calls == ["fused", "split"]  # measured once
    assert fusion.decisions() == {("gelu forward", 8): {"fused": want, "fused_ms": fused_ms,
                                                        "split_ms": split_ms}}


def test_inside_a_capture_an_unmeasured_problem_runs_fused_unmeasured(monkeypatch):
    monkeypatch.setattr(fusion._core, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(fusion, "_time_ms", lambda fn: never())
    assert fusion.use_fused("k", never, never) is True
    assert fusion.decisions() == {}
