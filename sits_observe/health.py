"""The health of the daemon's parts: each source's and consumer's errors, counted and told once per change of state.

A part that raises is counted (``sits_source_errors_total{source}``) and logged when its error differs from the last
one, and ``recovered`` once it next succeeds; a part in back-off (:class:`~sits_observe.errors.StillDown`, not asked
this tick) stays down under its last error without a new count.  The records go to the daemon's logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import StillDown
from .frame import Frame, Sample

__all__ = ["Health", "PartHealth"]

log = logging.getLogger("sits_observe.daemon")  # the tick loop's records, where operators look for them


@dataclass
class PartHealth:
    errors: int = 0
    last_error: str | None = None
    ok_ticks: int = 0


class Health(dict[str, PartHealth]):
    """Part name -> :class:`PartHealth`, for every source and consumer that has run (the store's once it failed)."""

    def guard(self, name: str, call: Callable[[], Any], frame: Frame | None) -> None:
        """Run ``call`` for the part ``name``: an exception it raises is counted against the part (and written to
        ``frame.errors``), never raised."""
        h = self.setdefault(name, PartHealth())
        try:
            call()
        except StillDown as exc:  # not asked this tick: down since its last error, counted then
            if frame is not None:
                frame.errors[name] = h.last_error or str(exc)
            return
        except Exception as exc:  # a source or consumer failing must never stop the loop
            self.failed(name, exc, frame)
            return
        self.ok(name)

    def failed(self, name: str, exc: Exception, frame: Frame | None) -> None:
        h = self.setdefault(name, PartHealth())
        msg = f"{type(exc).__name__}: {exc}"
        h.errors += 1
        if frame is not None:
            frame.errors[name] = msg
        if h.last_error != msg:
            log.warning("%s failed: %s (counting in sits_source_errors_total; will go on)", name, msg)
        h.last_error = msg

    def ok(self, name: str) -> None:
        h = self[name]
        if h.last_error is not None:
            log.info("%s recovered", name)
        h.last_error = None
        h.ok_ticks += 1

    def count_error(self, name: str) -> None:
        """Count an error of ``name`` raised outside the tick (its metrics failing a scrape); it is not marked down."""
        self.setdefault(name, PartHealth()).errors += 1

    def samples(self) -> Iterator[Sample]:
        for name, h in sorted(self.items()):
            yield Sample("sits_source_errors_total", "counter", "Errors raised by a source or consumer.",
                         (("source", name),), float(h.errors))
            yield Sample("sits_source_up", "gauge", "1 when the source's last tick succeeded.",
                         (("source", name),), 0.0 if h.last_error else 1.0)

    def report(self) -> list[dict[str, Any]]:
        """Each part's health as the status API shows it, by name."""
        return [{"name": name, "healthy": h.last_error is None, "errors": h.errors, "last_error": h.last_error}
                for name, h in sorted(self.items())]
