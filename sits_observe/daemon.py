"""The daemon: sources -> Frame -> SeriesStore -> consumers, one tick at a time.

A source or consumer that raises is counted (``sits_source_errors_total{source}``) and logged once per
change of state; it never stops the loop.  Each source collects into a Frame of its own, checked before it
joins the tick's, so one writing malformed data fails the same way, alone; a tick the store still cannot
take is counted as ``store`` and skipped, the ticks stored before kept.  Timestamps come from the daemon's
clock: wall time for real hosts, simulated time (advancing ``tick_interval`` per tick, ``speed`` ticks per
wall interval) for the simulator, so every window downstream is measured on the source clock.  Each tick first
lets every source start its slow reads (``prefetch()``: the page fetches, the NVML sample), so servers that hang
hold it for about one timeout, not the sum of theirs, and a stop ends the waits for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Histogram
from prometheus_client.registry import CollectorRegistry

from . import __version__
from .clock import Clock
from .closing import CLOSE_TIMEOUT, close_all
from .config import Config, restart_only
from .errors import SitsError, StoreError
from .frame import BucketLayout, Frame, Sample
from .health import Health
from .store import SeriesStore
from .topology import Topology

__all__ = ["Source", "Consumer", "Daemon"]

log = logging.getLogger("sits_observe.daemon")
STALLED_AFTER_S = 60.0  # no tick for this long (and 3 tick intervals): the tick loop has stalled
RELOAD_WAIT_S = 0.5  # between ticks, a SIGHUP is applied within this (the wait for the next tick is cut in slices)


class Source(Protocol):
    """Fills its part of a Frame.  Optional: ``prefetch(stop)``, called on every source before any collects, to start
    slow reads (a page fetch, an NVML sample) so that they overlap, a wait for them ending once ``stop`` (the
    daemon's stop event) is set; ``reload(config)``, ``close()``, ``metrics()``."""

    name: str

    def collect(self, frame: Frame) -> None: ...


class Consumer(Protocol):
    name: str

    def on_tick(self, frame: Frame, store: SeriesStore) -> None: ...


@dataclass
class Daemon:
    """Holds the pipeline; subsystems are optional and set by :mod:`sits_observe.wiring`."""

    config: Config
    clock: Clock
    topology: Topology | None = None
    sources: list[Any] = field(default_factory=list)
    consumers: list[Any] = field(default_factory=list)
    slo: Any = None
    rca: Any = None
    scheduler: Any = None
    sim: Any = None
    extra_providers: list[tuple[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.layout = BucketLayout(self.config.store.snapped())
        self.store = SeriesStore(self.layout, self.config.store.history, self.config.store.max_series)
        self.registry = CollectorRegistry(auto_describe=False)
        self.tick_seconds = Histogram("sits_tick_duration_seconds", "Wall time of one daemon tick.",
                                      buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                      registry=self.registry)
        self.health = Health()  # per source and consumer, see sits_observe.health
        # intervals on the monotonic clock (a step of the wall clock neither makes a stall nor hides one)
        self.started_at = time.monotonic()
        self.last_tick_at: float | None = None  # when the last tick ended
        self.last_tick_wall: float | None = None  # the same on the wall clock, as shown
        self._run_at: float | None = None  # when run() began: a first tick that hangs is a stall too
        self._refusal_told = False  # the store's first refused series is logged once
        self.stop_event = threading.Event()
        self._reload_loader: Callable[[], Config | None] | None = None  # SIGHUP's, applied between ticks
        self._watched: list[tuple[str, Callable[[], str | None]]] = []  # see watch()
        self.died: str | None = None  # why run() stopped on a part's death (see watch())

    # ---- one tick ------------------------------------------------------------------------------

    def tick(self) -> Frame:
        t0 = time.perf_counter()
        ts = self.clock.next_ts()
        frame = Frame(ts=ts, interval=self.clock.elapsed(ts))
        for src in self.sources:  # slow reads start together (page fetches): hung servers cost one timeout, not the sum
            if hasattr(src, "prefetch") and not self.stop_event.is_set():
                self._prefetch(src, frame)
        for src in self.sources:
            if self.stop_event.is_set():  # a stop asked: no more sources (each may take its timeout)
                break
            self._collect(src, frame)
        try:
            self.store.ingest(frame)
        except Exception as exc:  # not one source's data (each part was checked): this tick is lost, no other
            self.health.failed("store", exc, frame)
        else:
            if "store" in self.health:  # listed once it has failed
                self.health.ok("store")
            if not self._refusal_told and (first := self.store.first_refused) is not None:
                self._refusal_told = True
                log.warning("store: max_series (%d) reached: series past it are refused, counted in "
                            "sits_store_series_rejected_total (the first: %s of workload %r); raise store.max_series",
                            self.config.store.max_series, first[0], first[1])
        for con in self.consumers:
            self.health.guard(con.name, lambda c=con: c.on_tick(frame, self.store), None)
        self.tick_seconds.observe(time.perf_counter() - t0)
        self.last_tick_at, self.last_tick_wall = time.monotonic(), time.time()
        return frame

    def _prefetch(self, src: Any, frame: Frame) -> None:
        try:
            src.prefetch(self.stop_event)
        except Exception as exc:  # counted like a failed collect, which is still asked (and may recover it)
            self.health.failed(src.name, exc, frame)

    def _collect(self, src: Any, frame: Frame) -> None:
        """Collect ``src`` into a Frame of its own and add that to the tick's when the store can take it:
        malformed data (:meth:`SeriesStore.check`) fails this source for the tick, not the tick.
        What a source wrote before raising is kept, as it always was, when it is well-formed."""
        part = Frame(ts=frame.ts, interval=frame.interval)
        bad: str | None = None

        def collect() -> None:
            nonlocal bad
            try:
                src.collect(part)
            finally:
                bad = self.store.check(part)
            if bad is not None:
                raise StoreError(f"malformed data, none of it kept: {bad}")

        self.health.guard(src.name, collect, part)
        if bad is None:
            frame.merge(part)
        else:
            frame.errors.update(part.errors)

    def note_error(self, name: str, exc: BaseException) -> None:
        self.health.count_error(name)

    # ---- loop ----------------------------------------------------------------------------------

    def run(self, duration: float | None = None) -> None:
        """Tick until :attr:`stop_event` is set, ``duration`` wall seconds pass, or a part :meth:`watch`-ed dies."""
        deadline = None if duration is None else time.monotonic() + duration
        next_at = time.monotonic()
        self._run_at = time.monotonic()
        while not self.stop_event.is_set():
            self.tick()
            if self._part_died():
                break
            self._reload_asked()
            next_at += self.clock.wall_interval
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if next_at < now - 1.0:  # fell far behind (slow machine): do not try to catch up in a burst
                next_at = now
            self._idle_until(next_at)

    def _idle_until(self, at: float) -> None:
        """Wait for the next tick; a stop ends the wait at once, a reload asked meanwhile is applied within
        :data:`RELOAD_WAIT_S` (a tick_interval of a minute held it for up to a minute, saying nothing)."""
        while (left := at - time.monotonic()) > 0:
            if self.stop_event.wait(min(left, RELOAD_WAIT_S)):
                return
            self._reload_asked()

    def _reload_asked(self) -> None:
        loader, self._reload_loader = self._reload_loader, None
        if loader is not None and not self.stop_event.is_set():  # stopping: the next start reads the file
            self._reload_with(loader)

    def watch(self, name: str, dead: Callable[[], str | None]) -> None:
        """Ask ``dead()`` after every tick (it must be cheap): why the part ``name`` (the HTTP server) has died,
        else None.  When it has, :meth:`run` logs it and stops, :attr:`died` saying why, so that the service manager
        starts the daemon again (a dead HTTP server refuses /metrics and /healthz while the ticks go on)."""
        self._watched.append((name, dead))

    def _part_died(self) -> bool:
        for name, dead in self._watched:
            if (why := dead()) is not None:
                self.died = f"{name}: {why}"
                log.error("%s died (%s); stopping, to exit with 1 so that the service manager restarts the daemon",
                          name, why)
                return True
        return False

    def close(self, timeout: float | None = None) -> bool:
        """Close every source and consumer (:func:`~sits_observe.closing.close_all`), waiting at most ``timeout``
        seconds (default :data:`CLOSE_TIMEOUT`), and keep the clock's time where it has one to keep (the simulated
        clock); True when each part closed."""
        closed = close_all([*self.sources, *self.consumers], CLOSE_TIMEOUT if timeout is None else timeout)
        save = getattr(self.clock, "save", None)
        if save is not None:
            save()
        return closed

    def request_reload(self, loader: Callable[[], Config | None]) -> None:
        """From a signal handler: load and apply the config with ``loader`` after the tick in progress (a
        handler runs in the middle of whatever the tick is doing), or, between ticks, within :data:`RELOAD_WAIT_S`."""
        self._reload_loader = loader

    def _reload_with(self, loader: Callable[[], Config | None]) -> None:
        try:
            new = loader()
        except SitsError as exc:  # several mistakes: one record on one line, as log shippers split on newlines
            log.error("SIGHUP: new config rejected, keeping the old one: %s",
                      "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()))
            return
        except Exception as exc:  # noqa: BLE001 - a reload must never take the daemon down
            log.error("SIGHUP: cannot load the new config (%s); keeping the old one", type(exc).__name__)
            return
        if new is not None:
            self.reload(new)

    def reload(self, new: Config) -> None:
        """Apply a validated new config (SIGHUP); parts that can reload take it, the rest need a restart."""
        restart, new = restart_only(self.config, new, rca_built=self.rca is not None)
        if restart:
            log.warning("SIGHUP: %s changed; these take effect after a restart", ", ".join(restart))
        logging.getLogger().setLevel(new.log_level.upper())
        self.config = new
        failed = []
        for part in [*self.sources, *self.consumers]:
            reload = getattr(part, "reload", None)
            if reload is not None:
                try:
                    reload(new)
                except Exception as exc:  # one part refusing its section must not stop the others'
                    failed.append(part.name)
                    log.error("SIGHUP: %s kept part of its old settings: %s: %s", part.name, type(exc).__name__, exc)
        if failed:
            log.warning("SIGHUP: config reloaded except for %s (see above)", ", ".join(failed))
        else:
            log.info("SIGHUP: config reloaded")

    # ---- reporting -----------------------------------------------------------------------------

    def providers(self) -> Iterator[tuple[str, Any]]:
        yield "daemon", self
        for part in [*self.sources, *self.consumers]:
            if hasattr(part, "metrics"):
                yield part.name, part
        yield from self.extra_providers

    def metrics(self) -> Iterable[Sample]:
        yield Sample("sits_build_info", "gauge", "Build information.", (("version", __version__),), 1.0)
        yield from self.health.samples()
        yield Sample("sits_store_series_rejected_total", "counter",
                     "Series refused because the store's max_series cap was reached (each counted once).", (),
                     float(self.store.rejected_series))
        yield Sample("sits_store_ticks_total", "counter", "Ticks ingested.", (), float(self.store.ticks))
        if self.topology is not None:
            t = self.topology
            known = [bool(g.pci_bus_id) for g in t.gpus]  # a GPU not opened at start has no links to report
            for i in range(t.n):
                for j in range(t.n):
                    if i != j and known[i] and known[j]:
                        yield Sample("sits_gpu_link_bandwidth_bytes_per_second", "gauge",
                                     "Nominal one-direction bandwidth between two GPUs by link kind.",
                                     (("gpu", str(i)), ("peer_gpu", str(j)), ("link", t.kinds[i][j].value)),
                                     float(t.bandwidth[i, j]))

    def stalled_seconds(self) -> float | None:
        """Seconds since the last tick (or since the loop began, before the first tick ends) when the tick loop has
        stalled (a source or consumer hung in it), else None (/healthz and /readyz answer 503 then, and the UI says
        so)."""
        last = self.last_tick_at if self.last_tick_at is not None else self._run_at
        if last is None:
            return None
        since = time.monotonic() - last
        return since if since > max(STALLED_AFTER_S, 3 * self.clock.wall_interval) else None

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "uptime_seconds": round(time.monotonic() - self.started_at, 3),
            "ticks": self.store.ticks,
            "last_tick": {"ts": self.store.latest_ts if self.store.ticks else None,
                          "wall": self.last_tick_wall},
            "sources": self.health.report(),
        }
