"""Lesson amp_memory without a GPU (registration, parameter checks, the numbers' meaning,
the notebook text), and the amp lesson's missing-zero_grad wording."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from cudalab import lessons
from cudalab.lessons import amp
from cudalab.lessons import amp_memory as M
from cudalab.nn.layers import activation_elements

NOTEBOOKS = Path(M.__file__).parent / "notebooks"


def _p(**over):
    return {**lessons.get("amp_memory").defaults(True), **over}


def test_registered_as_27_with_plot_and_small_quick_params():
    x = lessons.get("amp_memory")
    assert x.number == 27 and x.plot is not None and x.check is M.check_params
    assert set(x.quick_params) <= set(x.params)
    sizes, names, batches = M.check_params(x.defaults(False))
    assert names == ("fp32", "tf32", "fp16", "bf16") and len(batches) >= 2
    assert batches == tuple(sorted(batches))
    qsizes, _, qbatches = M.check_params(x.defaults(True))
    assert max(qsizes) <= max(sizes) and max(qbatches) < max(batches)


@pytest.mark.parametrize("over,match", [
    ({"hidden": ()}, "hidden must be a non-empty sequence"),
    ({"classes": 1}, "classes must be >= 2"),
    ({"batch_sizes": ()}, "batch_sizes must be a non-empty sequence"),
    ({"batch_sizes": (0, 8)}, "batch_sizes must be a non-empty sequence"),
    ({"batch_sizes": (8, 8)}, "batch_sizes must be distinct"),
    ({"precisions": ("fp8",)}, "precisions must be a non-empty sequence of names"),
    ({"precisions": ("bf16",)}, "precisions must be distinct and include 'fp32'"),
    ({"precisions": ("fp32", "fp32")}, "precisions must be distinct and include 'fp32'"),
    ({"underflow_sizes": (64,)}, "underflow_sizes must hold at least"),
    ({"underflow_sizes": (64, 1)}, "underflow_sizes must hold at least"),
    ({"underflow_sizes": (64, 0, 16)}, "underflow_sizes must be a non-empty sequence"),
    ({"underflow_batch": 0}, "underflow_batch must be an int >= 1"),
    ({"steps": 5}, "steps must be >= 10"),
    ({"steps": True}, "steps must be an int >= 1"),
    ({"batches": 0}, "batches must be an int >= 1"),
    ({"lr": 0}, r"lr must be a number in \(0, 1\]"),
    ({"lr": "0.1"}, r"lr must be a number in \(0, 1\]"),
    ({"loss_weight": 2.0}, r"loss_weight must be a number in \(0, 1\]"),
    ({"loss_weight": True}, r"loss_weight must be a number in \(0, 1\]"),
    ({"seed": -1}, "seed must be an int >= 0"),
])
def test_rejects_bad_params(over, match):
    with pytest.raises(ValueError, match=r"^lesson 'amp_memory': " + match):
        M.check_params(_p(**over))


def test_bad_value_reported_by_run_before_the_gpu():
    with pytest.raises(ValueError, match=r"^lessons\.run\(\): lesson 'amp_memory': steps"):
        lessons.run("amp_memory", quick=True, steps=3)


def test_batch_sizes_come_back_sorted():
    assert M.check_params(_p(batch_sizes=(4096, 256)))[2] == (256, 4096)


def test_kept_activation_bytes_follows_the_layers():
    # outputs 10 + 4, GELU aux of the hidden layer padded from 10 to 16, 3 rows, 2 bytes
    assert M.kept_activation_bytes((5, 10, 4), 3, np.float16, False) == 3 * (14 + 16) * 2
    assert M.kept_activation_bytes((5, 10, 4), 3, np.float16, True) == 3 * (14 + 16 + 5) * 2
    aux_row = [activation_elements(n, 1, np.float16, "gelu")["aux"][0] for n in (8, 9, 1)]
    assert aux_row == [8, 16, 8]
    full = M.kept_activation_bytes((64, 256, 16), 100, np.float32, False)
    assert M.kept_activation_bytes((64, 256, 16), 100, np.float16, False) * 2 == full


def test_line_fit_and_the_batch_where_the_ratio_reaches_the_target():
    assert M.line_fit([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError):
        M.line_fit([2, 2], [1, 3])
    # half: 18 + 1 * b; fp32: 16 + 2 * b; 18 + b <= 0.55 (16 + 2 b) from b = 9.2 / 0.1 = 92
    assert M.batch_for_ratio((18.0, 1.0), (16.0, 2.0), 0.55) == pytest.approx(92.0)
    assert M.batch_for_ratio((18.0, 1.0), (16.0, 2.0), 0.5) is None  # only in the limit
    assert M.batch_for_ratio((1.0, 1.0), (16.0, 2.0), 0.55) == 0.0  # already below


def test_final_loss_and_underflow_counts():
    assert M.final_loss([5.0] * 90 + [1.0] * 10) == 1.0
    with pytest.raises(ValueError):
        M.final_loss([])
    half = np.array([0.0, 0.0, 1.0, 0.0], dtype=np.float16)
    full = np.array([1e-9, 0.0, 1.0, 2e-8], dtype=np.float32)
    assert M.underflow(half, full) == (2, 3)
    assert M.underflow(full, full) == (0, 3)


def test_texts_follow_the_thresholds():
    text = M.part_text("fp16", {"masters": 1.0, "activations": 0.5, "whole step": 0.8})
    assert "halved: activations" in text and "not halved: masters, whole step" in text
    assert "nothing halved" in M.part_text("bf16", {"masters": 1.0})
    assert "never falls" in M.ratio_text("fp16", {256: 0.9}, None, 0.56)
    assert "from about 92 rows" in M.ratio_text("fp16", {256: 0.9, 4096: 0.7}, 92.0, 0.5)
    assert "did not fall" in M.training_text(0.1, 3.0, 0.1, 2.7)
    assert "did not fall" in M.training_text(0.1, math.nan, 0.1, 2.7)
    assert "3.0x less far" in M.training_text(0.1, 0.3, 0.1, 2.7)
    assert "came close" in M.training_text(0.1, 0.12, 0.1, 2.7)


def test_row_keys_are_distinct():
    for keys in (M.MEMORY_KEYS, M.UNDERFLOW_KEYS, M.TRAINING_KEYS):
        assert len(set(keys)) == len(keys) and keys[0] == "section"


def test_notebook_texts():
    text = (NOTEBOOKS / "amp_memory.md").read_text()
    assert "## What the tutorial says" in text and "## The code being timed" in text
    assert "requested_bytes.all.current" in text and "GradScaler(enabled=False)" in text
    amp_text = (NOTEBOOKS / "amp.md").read_text()
    assert "optimizer.zero_grad(set_to_none=True)" in amp_text
    assert "accumulate=True" in amp_text


def test_amp_zero_grad_text():
    wrong = amp.zero_grad_text("fp32", 12.0, 0.3, (0, 0), 50)
    assert "12x the correct loop's" in wrong and "trains wrong, silently" in wrong
    hidden = amp.zero_grad_text("fp16", 1.00001, 0.001, (1, 1), 50)
    assert "hidden here" in hidden and "skipped" not in hidden
    stuck = amp.zero_grad_text("fp16", math.inf, 0.5, (1, 49), 50)
    assert "49 steps skipped (vs 1)" in stuck and "trains wrong" in stuck
