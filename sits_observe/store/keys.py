"""KeyTable: (name, workload) -> ring column, with a cardinality cap and per-name lookups."""

from __future__ import annotations

from collections.abc import Iterator, KeysView

__all__ = ["KeyTable"]


REFUSED_KEPT = 10_000  # refused keys remembered, so that each is counted once (past it, each refusal counts)


class KeyTable:
    """Assigns each (first, second) key a stable column; refuses keys past ``cap``, counting each refused key once
    (it counted every tick's refusal: 3600 an hour for one series over the cap)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._rows: dict[tuple[str, str], int] = {}
        self._by_first: dict[str, list[int]] = {}
        self._refused: set[tuple[str, str]] = set()
        self.rejected = 0
        self.first_refused: tuple[str, str] | None = None

    def row(self, key: tuple[str, str]) -> int | None:
        r = self._rows.get(key)
        if r is not None:
            return r
        if len(self._rows) >= self.cap:
            if key not in self._refused:
                self.rejected += 1
                self.first_refused = self.first_refused or key
                if len(self._refused) < REFUSED_KEPT:
                    self._refused.add(key)
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
