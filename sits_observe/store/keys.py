"""KeyTable: (name, workload) -> ring column, with a cardinality cap and per-name lookups."""

from __future__ import annotations

from collections.abc import Iterator, KeysView

__all__ = ["KeyTable"]


class KeyTable:
    """Assigns each (first, second) key a stable column; refuses (and counts) keys past ``cap``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._rows: dict[tuple[str, str], int] = {}
        self._by_first: dict[str, list[int]] = {}
        self.rejected = 0

    def row(self, key: tuple[str, str]) -> int | None:
        r = self._rows.get(key)
        if r is not None:
            return r
        if len(self._rows) >= self.cap:
            self.rejected += 1
            return None
        r = len(self._rows)
        self._rows[key] = r
        self._by_first.setdefault(key[0], []).append(r)
        return r

    def has_all(self, keys: KeysView[tuple[str, str]]) -> bool:
        """Whether every key (a dict's keys) already has a column; one pass in C."""
        return keys <= self._rows.keys()

    def rows_for(self, first: str, second: str | None = None) -> list[int]:
        if second is None:
            return self._by_first.get(first, [])
        r = self._rows.get((first, second))
        return [] if r is None else [r]

    def items(self) -> Iterator[tuple[tuple[str, str], int]]:
        return iter(list(self._rows.items()))

    def keys(self) -> list[tuple[str, str]]:
        return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)
