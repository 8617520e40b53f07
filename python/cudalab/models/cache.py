"""cudalab.models.cache: a least-recently-used cache bounded by entry count and bytes.

:class:`~cudalab.models.ResNet50` keeps one compiled forward and its workspace
per input shape in an :class:`LRUCache`; the class is plain Python (no GPU), so
its policy is tested on its own.

Policy: :meth:`LRUCache.make_room` drops the least recently used entries
until one more entry of the given size fits both bounds, and is called
*before* the new entry's memory is allocated, so the old memory can be reused
for it. The entry being added is never dropped, even when it alone is larger
than ``max_bytes``. Dropping an entry only drops the cache's reference: an
entry someone else still holds stays alive.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator, Optional

from .._check import check_int

__all__ = ["LRUCache"]


def _check_bound(value: Any, func: str, param: str, minimum: int) -> Optional[int]:
    return None if value is None else check_int(value, func, param, minimum)


class LRUCache:
    """LRUCache(max_entries=4, max_bytes=None)

    Values by key, least recently used first, with the bytes each one holds.

    Parameters
    ----------
    max_entries : int or None
        At most this many entries (>= 1); None: no bound.
    max_bytes : int or None
        At most this many bytes in all (>= 0), except that the newest entry
        always stays; None: no bound.
    """

    def __init__(self, max_entries: Optional[int] = 4, max_bytes: Optional[int] = None) -> None:
        self._entries: "OrderedDict[Hashable, tuple[Any, int]]" = OrderedDict()
        self._bytes = 0
        self._max_entries = _check_bound(max_entries, "LRUCache", "max_entries", 1)
        self._max_bytes = _check_bound(max_bytes, "LRUCache", "max_bytes", 0)

    # ---- bounds (changing one drops what no longer fits) --------------------------

    @property
    def max_entries(self) -> Optional[int]:
        return self._max_entries

    @max_entries.setter
    def max_entries(self, value: Optional[int]) -> None:
        self._max_entries = _check_bound(value, "LRUCache", "max_entries", 1)
        self._shrink(0, 0)

    @property
    def max_bytes(self) -> Optional[int]:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: Optional[int]) -> None:
        self._max_bytes = _check_bound(value, "LRUCache", "max_bytes", 0)
        self._shrink(0, 0)

    # ---- use ----------------------------------------------------------------------

    def get(self, key: Hashable) -> Any:
        """The value of `key` (now the most recently used), or None."""
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key][0]

    def make_room(self, nbytes: int) -> list[tuple[Hashable, Any]]:
        """Drop least recently used entries until one more of `nbytes` fits; returns them."""
        return self._shrink(1, nbytes)

    def put(self, key: Hashable, value: Any, nbytes: int) -> list[tuple[Hashable, Any]]:
        """Add (or replace) `key` as the most recently used; returns the entries dropped."""
        self.pop(key)
        dropped = self.make_room(nbytes)
        self._entries[key] = (value, nbytes)
        self._bytes += nbytes
        return dropped

    def pop(self, key: Hashable) -> Any:
        """Remove `key`; returns its value, or None."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._bytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def _shrink(self, adding: int, adding_bytes: int) -> list[tuple[Hashable, Any]]:
        """Drop the oldest entries until `adding` more entries of `adding_bytes` fit."""
        dropped = []
        while self._entries and not self._fits(adding, adding_bytes):
            key, (value, nbytes) = self._entries.popitem(last=False)
            self._bytes -= nbytes
            dropped.append((key, value))
        return dropped

    def _fits(self, adding: int, adding_bytes: int) -> bool:
        count_ok = self._max_entries is None or len(self._entries) + adding <= self._max_entries
        if adding == 0 and len(self._entries) <= 1:
            return count_ok  # the newest entry stays whatever its size
        bytes_ok = self._max_bytes is None or self._bytes + adding_bytes <= self._max_bytes
        return count_ok and bytes_ok

    # ---- inspection -----------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of all entries."""
        return self._bytes

    def keys(self) -> list[Hashable]:
        """The keys, least recently used first."""
        return list(self._entries)

    def items(self) -> list[tuple[Hashable, Any]]:
        """(key, value) pairs, least recently used first."""
        return [(k, v) for k, (v, _) in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return (f"LRUCache({len(self)} entries, {self._bytes} bytes; max_entries="
                f"{self._max_entries}, max_bytes={self._max_bytes})")
