"""CPU tier: models.cache.LRUCache, the bounded cache ResNet50 keeps its
compiled forwards in: least recently used first out, both bounds (entries and
bytes), room made before an entry is added, the newest entry always kept,
bounds changed in place, argument checks.
"""

from __future__ import annotations

import pytest

from cudalab.models import LRUCache
from _support import assert_arg_error

# ---- LRUCache -----------------------------------------------------------------------------


def test_lru_drops_the_least_recently_used_first():
    c = LRUCache(max_entries=2)
    assert c.put("a", 1, 10) == []
    assert c.put("b", 2, 10) == []
    assert c.get("a") == 1           # "a" is now the most recent
    assert c.put("c", 3, 10) == [("b", 2)]
    assert c.keys() == ["a", "c"] and len(c) == 2 and c.nbytes == 20
    assert "b" not in c and c.get("b") is None
    assert c.put("a", 4, 5) == []    # replacing a key drops nothing else
    assert c.keys() == ["c", "a"] and c.get("a") == 4 and c.nbytes == 15


def test_lru_make_room_before_adding():
    c = LRUCache(max_entries=2, max_bytes=100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.make_room(30) == [("a", 1)]       # count: one slot must be free
    assert c.keys() == ["b"]
    assert c.make_room(60) == []               # 40 + 60 fits 100
    assert c.make_room(61) == [("b", 2)]
    assert len(c) == 0 and c.nbytes == 0


def test_lru_byte_bound_keeps_the_newest_even_if_too_large():
    c = LRUCache(max_entries=None, max_bytes=100)
    c.put("a", 1, 30)
    c.put("b", 2, 30)
    c.put("c", 3, 30)
    assert c.keys() == ["a", "b", "c"]
    assert c.put("d", 4, 500) == [("a", 1), ("b", 2), ("c", 3)]
    assert c.keys() == ["d"] and c.nbytes == 500
    c.max_bytes = 10                           # still the newest: stays
    assert c.keys() == ["d"]


def test_lru_lowering_a_bound_drops_at_once():
    c = LRUCache(max_entries=None)
    for i in range(5):
        c.put(i, str(i), 10)
    c.max_entries = 2
    assert c.keys() == [3, 4] and c.nbytes == 20
    c.max_entries = None
    c.max_bytes = 10
    assert c.keys() == [4]
    assert c.pop(4) == "4" and c.pop(4) is None and c.nbytes == 0
    c.put(1, "x", 1)
    c.clear()
    assert len(c) == 0 and c.nbytes == 0 and list(c) == []


def test_lru_argument_checks():
    with assert_arg_error(ValueError, "LRUCache", "max_entries", ">= 1"):
        LRUCache(max_entries=0)
    with assert_arg_error(TypeError, "LRUCache", "max_entries", "expected an int"):
        LRUCache(max_entries=2.0)
    with assert_arg_error(ValueError, "LRUCache", "max_bytes", ">= 0"):
        LRUCache(max_bytes=-1)
    c = LRUCache()
    assert c.max_entries == 4 and c.max_bytes is None
    with assert_arg_error(TypeError, "LRUCache", "max_entries"):
        c.max_entries = True
