"""Lesson 6 `tensor_cores` without a GPU: alignment, the cliff and padding
summaries, the findings' wording decisions and the claim verdict."""

from __future__ import annotations

import pytest

from cudalab import lessons
from cudalab.lessons import tensor_cores as tc


def test_registered_with_its_parameters():
    x = lessons.get("tensor_cores")
    assert x.number == 6 and x.plot is not None
    assert tuple(x.params["sizes"]) == (4095, 4096, 4097, 4104, 8191)
    assert set(x.params["dtypes"]) == {"float16", "bfloat16", "tf32"}
    quick = x.defaults(True)
    assert any(tc.is_aligned(s, "float16") for s in quick["sizes"])
    assert any(not tc.is_aligned(s, "float16") for s in quick["sizes"])
    assert min(quick["sizes"]) >= 1000  # still tensor-core sized


@pytest.mark.parametrize(
    "size,dtype,aligned",
    [(4096, "float16", True), (4095, "float16", False), (4097, "bfloat16", False),
     (4104, "bfloat16", True), (4100, "float16", False), (4100, "tf32", True),
     (4097, "tf32", False), (1032, "tf32", True)],
)
def test_is_aligned(size, dtype, aligned):
    assert tc.is_aligned(size, dtype) is aligned


def test_elements_per_16_bytes():
    assert tc.elements_per_16_bytes("float16") == 8
    assert tc.elements_per_16_bytes("bfloat16") == 8
    assert tc.elements_per_16_bytes("tf32") == 4


def _rates(aligned=600.0, off=100.0, on=500.0, dtype="float16"):
    sizes = (4095, 4096, 4097, 4104)
    out = {}
    for s in sizes:
        if tc.is_aligned(s, dtype):
            out[s, "off"] = out[s, "on"] = aligned
        else:
            out[s, "off"], out[s, "on"] = off, on
    return out


def test_summarize_ratios():
    s = tc.summarize(_rates(), "float16")
    assert s["aligned"] == 600.0 and s["misaligned_off"] == 100.0
    assert s["cliff"] == pytest.approx(6.0)
    assert s["recovered"] == pytest.approx(500 / 600)
    assert s["gain"] == pytest.approx(5.0)


def test_summarize_uses_medians():
    rates = {(4096, "off"): 600.0, (4104, "off"): 500.0, (8192, "off"): 700.0,
             (4095, "off"): 100.0, (4095, "on"): 400.0, (4097, "off"): 300.0,
             (4097, "on"): 450.0, (8191, "off"): 200.0, (8191, "on"): 420.0}
    s = tc.summarize(rates, "float16")
    assert s["aligned"] == 600.0 and s["misaligned_off"] == 200.0 and s["misaligned_on"] == 420.0


def test_summarize_needs_both_kinds_of_size():
    assert tc.summarize({(4096, "off"): 1.0, (4096, "on"): 1.0}, "float16") is None
    assert tc.summarize({(4095, "off"): 1.0, (4095, "on"): 1.0}, "float16") is None
    assert tc.summarize({}, "float16") is None


def test_summarize_depends_on_dtype():
    # 4100 is misaligned for float16 (8 elements) but aligned for tf32 (4)
    rates = {(4100, "off"): 50.0, (4100, "on"): 50.0, (4097, "off"): 10.0, (4097, "on"): 40.0}
    assert tc.summarize(rates, "tf32")["cliff"] == pytest.approx(5.0)
    assert tc.summarize(rates, "float16") is None


def test_cliff_text_follows_the_numbers():
    big = tc.summarize(_rates(600, 100, 500), "float16")
    small = tc.summarize(_rates(600, 550, 560), "float16")
    assert "6.0x cliff" in tc.cliff_text("float16", big)
    assert tc.cliff_text("float16", small).startswith("float16: no cliff")
    edge = tc.summarize(_rates(150, 100, 140), "float16")
    assert "cliff" in tc.cliff_text("float16", edge) and "no cliff" not in tc.cliff_text(
        "float16", edge)  # exactly CLIFF_SEEN counts


def test_padding_text_follows_the_numbers():
    good = tc.summarize(_rates(600, 100, 500), "float16")
    poor = tc.summarize(_rates(600, 100, 200), "float16")
    assert "removes the cliff" in tc.padding_text("float16", good)
    assert "83%" in tc.padding_text("float16", good)
    assert "recovers only 33%" in tc.padding_text("float16", poor)


@pytest.mark.parametrize("cliff,held", [(16.0, True), (8.0, True), (7.9, False), (1.0, False)])
def test_claim_verdict(cliff, held):
    got, why = tc.claim_verdict(cliff)
    assert got is held
    assert f"{cliff:.1f}x" in why


@pytest.mark.parametrize(
    "sizes,dtypes",
    [((), ("float16",)), ((8,), ("float16",)), ((True,), ("float16",)), ((4096.0,), ("float16",)),
     ((4096,), ()), ((4096,), ("float32",)), ((4096,), ("tf32", "int8"))],
)
def test_check_params_rejects(sizes, dtypes):
    with pytest.raises(ValueError, match="tensor_cores"):
        tc.check_params(sizes, dtypes)


def test_check_params_accepts():
    tc.check_params((1023, 1024), ("float16", "bfloat16", "tf32"))
