"""CPU tier: byte formatting and the memory summary table, with fake stats (no GPU)."""

from __future__ import annotations

import pytest

from cudalab import memory
from cudalab.memory import format_bytes, format_memory_summary

GiB = 1 << 30
MiB = 1 << 20


def fake_stats(**overrides):
    """A dict shaped like _core.memory_stats() returns, with distinct values."""
    stats = {
        "allocated_bytes.all.current": 3 * MiB + 512 * 1024,  # 3.50 MiB
        "allocated_bytes.all.peak": 5 * GiB // 4,  # 1.25 GiB
        "reserved_bytes.all.current": 2 * GiB,
        "reserved_bytes.all.peak": 3 * GiB,
        "requested_bytes.all.current": 3 * MiB + 256 * 1024,  # 3.25 MiB
        "requested_bytes.all.peak": 1536,  # 1.50 KiB
        "allocation.all.current": 17,
        "allocation.all.allocated": 4242,
        "allocation.all.freed": 4225,
        "num_alloc_retries": 6,
        "num_ooms": 2,
        "limit_bytes": 72 * GiB,
        "fraction": 0.9,
        "device_free_bytes": 70 * GiB,
        "device_total_bytes": 80 * GiB,
    }
    stats.update(overrides)
    return stats


# ---- format_bytes -------------------------------------------------------------


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (MiB, "1.00 MiB"),
        (3 * MiB + 512 * 1024, "3.50 MiB"),
        (GiB, "1.00 GiB"),
        (GiB - 1, "1.00 GiB"),  # not "1024.00 MiB"
        (80 * GiB, "80.00 GiB"),
        (1 << 40, "1.00 TiB"),
        (5 << 50, "5120.00 TiB"),  # TiB is the largest unit
        (-1536, "-1.50 KiB"),
        (-5, "-5 B"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


# ---- format_memory_summary ------------------------------------------------------


def test_summary_rows_and_values():
    text = format_memory_summary(fake_stats(), device=3)
    lines = text.splitlines()
    assert "cudalab memory summary, device 3" in lines[1]

    def row(label):
        found = [line for line in lines if line.startswith(f"| {label}")]
        assert len(found) == 1, label
        return [cell.strip() for cell in found[0].strip("|").split("|")]

    assert row("Metric") == ["Metric", "Current", "Peak", "Total", "Freed"]
    assert row("Allocated memory") == ["Allocated memory", "3.50 MiB", "1.25 GiB", "-", "-"]
    assert row("Requested memory") == ["Requested memory", "3.25 MiB", "1.50 KiB", "-", "-"]
    assert row("Reserved memory") == ["Reserved memory", "2.00 GiB", "3.00 GiB", "-", "-"]
    assert row("Allocations") == ["Allocations", "17", "-", "4242", "4225"]
    assert row("Per-process limit") == ["Per-process limit", "72.00 GiB (fraction 0.90)"]
    assert row("Device free / total") == ["Device free / total", "70.00 GiB / 80.00 GiB"]
    assert "OOMs: 2" in text
    assert "alloc retries: 6" in text


def test_summary_is_fixed_width_and_framed():
    text = format_memory_summary(fake_stats(), device=0)
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    assert lines[0] == lines[-1] and set(lines[0][1:-1]) == {"="}
    assert not text.endswith("\n")


def test_summary_width_holds_for_widest_values():
    widest = fake_stats(**{"allocated_bytes.all.current": 1023 * MiB + 1000 * 1024})
    lines = format_memory_summary(widest, device=0).splitlines()
    assert "1023.98 MiB" in "\n".join(lines)
    assert len({len(line) for line in lines}) == 1


def test_summary_zeros():
    zeros = {key: 0 for key in fake_stats()}
    zeros["fraction"] = 1.0
    text = format_memory_summary(zeros, device=0)
    assert "0 B" in text
    assert "fraction 1.00" in text
    assert "OOMs: 0" in text


def test_abbreviated_keeps_only_memory_rows():
    text = format_memory_summary(fake_stats(), device=0, abbreviated=True)
    for label in ("Allocated memory", "Requested memory", "Reserved memory"):
        assert label in text
    for label in ("Allocations", "Per-process limit", "Device free / total"):
        assert label not in text


def test_missing_keys_are_named():
    stats = fake_stats()
    del stats["num_ooms"]
    del stats["fraction"]
    with pytest.raises(KeyError, match="num_ooms.*fraction"):
        format_memory_summary(stats, device=0)


# ---- memory_summary (thin wrapper) ----------------------------------------------


class FakeCore:
    def __init__(self, current=0):
        self.current = current
        self.asked = []
        self.parsed = []

    def _parse_device(self, device, caller, check_only=False):
        self.parsed.append((device, caller))
        return self.current if device is None else device

    def memory_stats(self, device=None):
        self.asked.append(device)
        return fake_stats()


def test_memory_summary_current_device(monkeypatch):
    core = FakeCore(current=4)
    monkeypatch.setattr(memory, "_core", core)
    text = memory.memory_summary()
    assert core.parsed == [(None, "memory_summary")]
    assert core.asked == [4]
    assert "device 4" in text
    assert text == format_memory_summary(fake_stats(), 4)


def test_memory_summary_explicit_device_and_abbreviated(monkeypatch):
    core = FakeCore(current=0)
    monkeypatch.setattr(memory, "_core", core)
    text = memory.memory_summary(1, abbreviated=True)
    assert core.asked == [1]
    assert text == format_memory_summary(fake_stats(), 1, abbreviated=True)
