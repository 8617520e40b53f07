"""One table formatter, one time formatter, one byte formatter (cudalab/_table.py):
the other names are the same functions, and their outputs are unchanged."""

from __future__ import annotations

import pytest

from cudalab import _table, memory
from cudalab.bench import format_time
from cudalab.lessons.analysis import format_bytes_short


def _old_short(nbytes):
    # lessons/analysis.format_bytes_short before it became format_bytes(short=True).
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.4g} {unit}"
    return f"{nbytes:.0f} B"


def test_one_of_each():
    assert memory.format_bytes is _table.format_bytes
    assert format_time is _table.format_time


@pytest.mark.parametrize("n", [0, 1, 512, 1023, 1024, 1536, 4096, 1 << 20, 1.5 * (1 << 20),
                               (1 << 30) - 1, 2 << 30, 3 * (1 << 40), -5, 123456789.0])
def test_short_bytes_unchanged(n):
    assert format_bytes_short(n) == _old_short(n) == _table.format_bytes(n, short=True)


def test_long_bytes_and_time():
    assert [memory.format_bytes(n) for n in (0, 1023, 1536, 1073741823, -2048, 5 << 40)] == [
        "0 B", "1023 B", "1.50 KiB", "1.00 GiB", "-2.00 KiB", "5.00 TiB"]
    assert [format_time(t) for t in (812.3e-6, 1.5, 2e-9, 0.01234, float("nan"), None)] == [
        "812.3 us", "1.5 s", "2 ns", "12.34 ms", "-", "-"]


def test_format_table_options():
    rows = [["a", "1"], ["bb", "22"]]
    assert _table.format_table(["k", "v"], rows) == "k    v\n--  --\na    1\nbb  22"
    assert _table.format_table(["k", "v"], rows, title="T", rule=False, strip=False,
                               decorate=lambda r, c, p: f"<{p}>" if (r, c) == (1, 1) else p) \
        == "T\nk    v\na    1\nbb  <22>"
    assert _table.format_table(["k", ""], [["a", ""]], strip=False) == "k  \n-  \na  "
