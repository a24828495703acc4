"""What every page reads: the daemon's parts, the UI settings and the shared column caches."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from werkzeug.exceptions import BadRequest

from .cache import MAX_COLUMNS, CacheSet, ColumnCache, Read
from .params import fmt_range, parse_range
from .verdicts import VerdictLog

if TYPE_CHECKING:
    from .config import UiConfig

__all__ = ["UiContext", "Window"]


@dataclass(frozen=True)
class Window:
    """The time span a page shows: seconds (source clock), ticks, ticks per column and columns."""

    seconds: float
    ticks: int

    @property
    def bin(self) -> int:
        return max(1, -(-self.ticks // MAX_COLUMNS))

    @property
    def columns(self) -> int:
        return max(1, self.ticks // self.bin)


@dataclass
class UiContext:
    """``incremental=False`` makes every update recompute from the store (the bench's baseline)."""

    daemon: Any
    incremental: bool = True
    caches: CacheSet = field(default_factory=CacheSet)
    verdicts: VerdictLog = field(default_factory=VerdictLog)

    @property
    def cfg(self) -> UiConfig:
        return self.daemon.config.ui

    @property
    def store(self) -> Any:
        return self.daemon.store

    @property
    def tick_interval(self) -> float:
        return float(self.daemon.config.tick_interval)

    @property
    def interval_ms(self) -> int:
        return int(self.cfg.update_interval * 1000)

    @property
    def gpu_indices(self) -> list[int]:
        """The host's GPU indices: the topology's, else those the GPU source reports (DCGM may skip one)."""
        topo = self.daemon.topology
        if topo is not None:
            return [g.index for g in topo.gpus]
        return [g.index for g in self.store.gpu_info()]

    def part(self, name: str) -> Any:
        """An optional subsystem (``slo``, ``rca``, ``scheduler``) or None when not enabled."""
        return getattr(self.daemon, name, None)

    def window(self, query: Mapping[str, str]) -> Window:
        """The ``range`` parameter (default ``ui.history``), bounded by the history the store keeps."""
        seconds = parse_range(query.get("range"), self.cfg.history, self.store.history * self.tick_interval)
        if seconds < self.tick_interval:  # a column is a tick at least (it was labelled "events per 0.5s")
            raise BadRequest(f"range: shorter than one tick ({self.tick_interval:g} s), got "
                             f"{query.get('range', '')[:40]!r}; ask for {self.tick_interval:g}s or more")
        return Window(seconds, max(1, int(round(seconds / self.tick_interval))))

    def held_window(self, raw: Any) -> Window:
        """The window (seconds) a page's browser-side state carries: one :meth:`window` gave (a value checked
        again as text rounded to 3 decimals was refused: 0.0004 became '0.000', a kept 7.53086 s '7.531')."""
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise BadRequest(f"window: expected seconds from the page's state, got {str(raw)[:60]!r}; reload the page")
        kept = self.store.history * self.tick_interval
        if not self.tick_interval <= raw <= kept:
            raise BadRequest(f"window: {str(raw)[:40]} s is not between one tick and the history kept "
                             f"({fmt_range(kept)}); reload the page")
        return Window(float(raw), max(1, int(round(raw / self.tick_interval))))

    def cache(self, key: Hashable, rows: tuple[str, ...], read: Read, bin: int) -> ColumnCache:
        """The shared cache of one derived series at one bin size."""
        return self.caches.get((key, rows, bin), lambda: ColumnCache(self.store, rows, read, self.store.history, bin,
                                                                     self.incremental))
