"""In-daemon SLO evaluation: a Consumer (``name = "slo"``) and a metrics provider (docs/slo.md has the rules).

Each tick adds the Frame's good/total events of every SLO to its window rings (:mod:`.window`, on the source
clock), computes (:mod:`.plan`) the burn rate of every alert window and the budget left, and decides per SLO
which burn tier fires (:func:`.burn.fire`: a tier's condition kept through dips of its ``keep_firing_for``,
only the fastest kept tier firing).  State changes are kept in ``state_dir/slo.db`` (:mod:`.state`) and sent
through the alert outbox (:mod:`sits_observe.alerting`): a firing alert is recorded before it is queued and a
resolution queued before it is recorded, and memory changes only once both are stored, so a crash or a failed
write repeats rather than loses a change.  Hooks: ``annotate(slo_name, {...})`` (the RCA consumer adds the
likely cause to the SLO's alerts); ``slos_state()`` and ``alerts_state()`` (the API's bodies).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..alerting.config import AlertingConfig
from ..alerting.dispatch import Dispatcher
from ..alerting.formats import QUIET_ANNOTATIONS, Alert
from ..errors import SloError
from ..frame import Frame, Sample
from ..snapshot import Snapshot
from .plan import Evaluation, Plan
from .restore import restore
from .sli import SliReader
from .spec import SloSpec
from .state import SloState
from .tiers import TIER_NAMES, Tier
from .views import alerts_view, metrics_of, slo_view
from .window import WindowRing

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["SloEngine"]

log = logging.getLogger("sits_observe.slo")
RECENT_KEPT = 50
UNSAVED_KEPT = 10000  # ring edges kept for the next write while slo.db refuses writes (newest first kept)


class SloEngine:
    """Evaluates every configured SLO each tick and sends alert state changes to the dispatcher."""

    name = "slo"
    # from slo.db at start-up (restore.py)
    stopped_at: float | None  # the last source time evaluated before the restart
    notes: dict[str, dict[str, str]]  # annotations per SLO for its next alerts
    alerts: dict[tuple[int, str], Alert]  # firing, by (SLO, tier)
    firing_tiers: np.ndarray  # (SLOs, tiers) bool
    saved: np.ndarray  # when a tier's condition last held, as stored: NaN not kept, inf held at the last evaluation
    held_until: np.ndarray
    last_true: np.ndarray
    resume: np.ndarray  # tiers held up to the restart, counted as held at the first evaluation
    reconcile: tuple[list[Alert], list[Alert]]  # (announced but not firing now, firing): sent after the first tick

    def __init__(self, specs: Sequence[SloSpec], buckets: Sequence[float], state_dir: Path | str,
                 alerting: AlertingConfig | None = None, *, dispatcher: Dispatcher | None = None) -> None:
        if not specs:
            raise SloError("no SLOs configured")
        self.specs = list(specs)
        self.reader = SliReader(self.specs, buckets)
        self.alerting = alerting
        self.external = dict(alerting.external_labels) if alerting else {}
        self.plan = plan = Plan(self.specs)
        self.state = SloState(Path(state_dir) / "slo.db", [s.name for s in self.specs],
                              [s.sli_key() for s in self.specs], plan.levels.res)
        try:
            self.ring = WindowRing(len(self.specs), plan.levels)
            self._unsaved: list[tuple[int, int, np.ndarray]] = []  # ring edges a failed slo.db write did not store
            restore(self)
            # also without receivers when messages wait in the outbox (all removed): they are shown, not lost
            if dispatcher is None and alerting is not None and (alerting.receivers or
                                                                (Path(state_dir) / "outbox.db").exists()):
                dispatcher = Dispatcher(alerting, Path(state_dir))
        except BaseException:  # a damaged slo.db or outbox.db: leave no database open behind the error
            self.state.close()
            raise
        self.dispatcher = dispatcher
        self.last: Evaluation | None = None
        self.recent: deque[Alert] = deque(maxlen=RECENT_KEPT)
        self._lock = threading.Lock()
        self._started = False
        # readers that find the tick holding the lock (slo.db slow or locked) get the last values
        self._scrape: Snapshot[list[Sample]] = Snapshot(self._lock, [])  # a scrape never waits long
        # the API's first read answers the state as restored (the first waited for a stuck tick, however long)
        views = [slo_view(self, i) for i in range(len(specs))]
        self._slos: Snapshot[list[dict[str, Any]]] = Snapshot(self._lock, views)
        self._alerts: Snapshot[dict[str, Any]] = Snapshot(self._lock, alerts_view(self))

    @classmethod
    def from_config(cls, config: Config) -> SloEngine | None:
        """The engine for ``config.slos`` (None when there are none)."""
        if not config.slos:
            return None
        return cls(config.slos, config.store.buckets, config.state_dir, config.alerting)

    @property
    def firing(self) -> list[str | None]:
        """Per SLO, the fastest tier whose alert fires (None when none does)."""
        return [TIER_NAMES[int(row.argmax())] if row.any() else None for row in self.firing_tiers]

    def start(self) -> None:
        """Start delivering alerts (done by the first tick if not before)."""
        if not self._started and self.dispatcher is not None:
            self.dispatcher.start()
        self._started = True

    # ---- one tick ------------------------------------------------------------------------------

    def on_tick(self, frame: Frame, store: Any = None) -> None:
        self.start()
        good, total = self.reader.read(frame)
        with self._lock:
            try:
                written = self.ring.add(frame.ts, good, total)
            except SloError as exc:
                log.warning("%s: SLO windows and budgets start afresh", exc)
                self.state.clear_edges()
                self.ring = WindowRing(len(self.specs), self.plan.levels)
                self._unsaved = []
                # the flap guard's times are in the abandoned future: or a firing alert would be kept
                # until the clock caught up with them; with empty windows it resolves now
                self.last_true = np.full_like(self.last_true, np.nan)
                self.held_until = np.full_like(self.held_until, np.nan)
                self.resume = np.zeros_like(self.resume)
                written = self.ring.add(frame.ts, good, total)
            ts = frame.ts if self.ring.ts is None else self.ring.ts
            # held up to a restart: held when the engine stopped, so the downtime counts against the flap guard
            # (never after now: a stored time of a timeline the clock has left, the edges that would say so dropped)
            stop = ts if self.stopped_at is None else min(self.stopped_at, ts)
            last_true = np.where(self.resume, stop, self.last_true)
            self.last = ev = self.plan.evaluate(self.ring, ts, last_true, self.held_until)
            try:
                self._save(list(written), ts)
                unsaved = None
            except SloError as exc:  # kept for a later tick; the alerts go on (they are recorded on their own)
                unsaved = exc
            for i in np.flatnonzero((~_same(ev.held_until, self.held_until)).any(axis=1)):
                self.state.set_held(self.specs[i].name, {t: float(u) for t, u in zip(TIER_NAMES, ev.held_until[i])
                                                         if not np.isnan(u)})
            self.held_until, self.last_true, self.resume = ev.held_until, ev.last_true, np.zeros_like(self.resume)
            saved = np.where(ev.active, np.inf, ev.last_true)
            for i in np.flatnonzero(((ev.firing != self.firing_tiers) | ~_same(saved, self.saved)).any(axis=1)):
                self._transition(int(i), ev, saved[i])
            if any(self.reconcile):  # after the first evaluation: an alert that ended is resolved, not announced
                self._announce_restored(frame.ts)
            if self.dispatcher is not None and self.alerts:
                self.dispatcher.refresh(list(self.alerts.values()))
        if unsaved is not None:
            raise unsaved

    def alert(self, i: int, tier: Tier, since: float) -> Alert:
        """The alert of SLO ``i``'s ``tier``, firing since ``since``."""
        spec = self.specs[i]  # an empty label value is no label (as Alertmanager takes it: the same fingerprint)
        labels = {k: v for k, v in {**self.external, **spec.alert_labels(tier)}.items() if v}
        return Alert(labels, {**spec.alert_annotations(tier), **self.notes.get(spec.name, {})}, "firing", since)

    def _transition(self, i: int, ev: Evaluation, saved: np.ndarray) -> None:
        """Announce the SLO's alerts that started or resolved and record its kept tiers (``saved``: NaN not
        kept, inf condition holds, else when it last held), in the order the module docstring gives.  Any
        write may raise (disk full, locked): memory changes only after the last one, so the next tick
        finds the same transition and tries it again."""
        name = self.specs[i].name
        started = [t for j, t in enumerate(TIER_NAMES) if ev.firing[i, j] and not self.firing_tiers[i, j]]
        ended = [t for j, t in enumerate(TIER_NAMES) if self.firing_tiers[i, j] and not ev.firing[i, j]]
        new = {t: self.alert(i, self.plan.tiers[i][t], ev.ts) for t in started}
        resolved = [replace(self.alerts[(i, t)], status="resolved", ends_at=ev.ts) for t in ended]
        since = {t: (new[t] if t in new else self.alerts[(i, t)]).starts_at
                 for t, f in zip(TIER_NAMES, ev.firing[i]) if f}
        if new:
            self.state.set_announced(list(new.values()))
        for alert in (*new.values(), *resolved):
            self._notify(alert)
        self.state.set_tiers(name, {t: (since.get(t), None if np.isinf(v) else float(v))
                                    for t, v in zip(TIER_NAMES, saved) if not np.isnan(v)}, resolved)
        self.recent.extend(resolved)
        for t in ended:
            del self.alerts[(i, t)]
            log.info("SLO %s: %s resolved", name, t)
        for t, alert in new.items():
            self.alerts[(i, t)] = alert
            log.info("SLO %s: %s firing", name, t)
        if not since:
            self.notes.pop(name, None)
        self.firing_tiers[i], self.saved[i] = ev.firing[i], saved

    def _announce_restored(self, ts: float) -> None:
        """After a restart's first evaluation: resolve announced alerts that did not fire at the restart,
        announce again every one still firing (outbox first; a receiver that has it already drops it there
        as a duplicate).  One that fired at the restart and not at the first evaluation was resolved by it:
        announcing it again would page anew (killed after queuing a resolution, before recording it)."""
        gone, restored = self.reconcile
        now = {a.fingerprint: a for a in self.alerts.values()}  # with the annotations given since the restart
        firing = [now[a.fingerprint] for a in restored if a.fingerprint in now]
        resolved = [replace(a, status="resolved", ends_at=ts) for a in gone]
        for alert in (*resolved, *firing):  # may raise (disk): tried again at the next tick
            self._notify(alert)
        self.state.set_announced(firing, gone)
        for a in gone:
            log.info("SLO alert %s (%s) announced before the restart does not fire now: resolved",
                     a.labels.get("slo"), a.labels.get("burn_tier"))
        self.recent.extend(resolved)
        self.reconcile = ([], [])

    def _notify(self, alert: Alert) -> None:
        if self.dispatcher is not None:
            self.dispatcher.notify(alert)

    # ---- hooks ---------------------------------------------------------------------------------

    def annotate(self, slo_name: str, annotations: dict[str, Any]) -> None:
        """Add annotations (e.g. ``likely_cause``, ``confidence``) to the SLO's current or next alert.

        A firing alert is announced again only when an annotation other than ``QUIET_ANNOTATIONS`` changes
        (a verdict every few seconds must not become a chat message every few seconds); quiet ones ride
        on its next message and on Alertmanager's periodic re-send."""
        with self._lock:
            index = {s.name: i for i, s in enumerate(self.specs)}
            if slo_name not in index:
                raise SloError(f"annotate: unknown SLO {slo_name!r}; configured: {sorted(index)}")
            old = self.notes.get(slo_name, {})
            notes = {**old, **{str(k): str(v) for k, v in annotations.items()}}
            loud = any(old.get(k) != v for k, v in notes.items() if k not in QUIET_ANNOTATIONS)
            alerts = {key: replace(a, annotations={**a.annotations, **notes})
                      for key, a in self.alerts.items() if key[0] == index[slo_name]}
            self.state.set_notes(slo_name, notes)  # the writes first: one that fails leaves the change to the next
            for alert in alerts.values() if loud else ():  # call (still loud then), not half made
                self._notify(alert)
            self.notes[slo_name] = notes
            self.alerts.update(alerts)

    def metrics(self) -> Iterable[Sample]:
        out = list(self._scrape.read(lambda: metrics_of(self)))  # a copy: the dispatcher's samples join it
        if self.dispatcher is not None:
            out += list(self.dispatcher.metrics())
        return out

    def slos_state(self) -> list[dict[str, Any]]:
        return self._slos.read(lambda: [slo_view(self, i) for i in range(len(self.specs))])

    def alerts_state(self) -> dict[str, Any]:
        out = dict(self._alerts.read(lambda: alerts_view(self)))
        if self.dispatcher is not None:
            out.update(self.dispatcher.state())
        return out

    def reload(self, config: Config) -> None:
        """SLOs and receivers are fixed at start-up; say so when a reloaded config changes them."""
        if config.slos != self.specs or config.alerting != self.alerting:
            log.warning("SIGHUP: slos or alerting changed; these take effect after a restart")

    def _save(self, written: list[tuple[int, int, np.ndarray]], ts: float, wait: bool = False) -> None:
        """Store ring edges, with those a failed write left (a full disk, a locked file) first; ``wait``: for
        another process's lock as long as SQLite waits (at a stop), not a tick's 0.25 s."""
        written = self._unsaved + written
        prune = [(lvl, idx - self.plan.levels.slots + 1) for lvl, idx, _ in written]
        try:
            self.state.save(written, prune, ts, wait)
        except SloError:
            self._unsaved = written[-UNSAVED_KEPT:]  # stored with the next tick's, not lost
            raise
        self._unsaved = []

    def close(self) -> None:
        """Store the event counts since the last slot edge, stop delivering, close ``slo.db``; each step
        runs even if an earlier one raised."""
        with contextlib.ExitStack() as steps:  # run last-in first-out
            steps.callback(self.state.close)
            if self.dispatcher is not None:
                steps.callback(self.dispatcher.close)
            with self._lock:
                if self.ring.ts is not None:
                    # the edges failed writes left first: the counts since the last stored edge alone were
                    # spread at the restart over every edge from it on, as if all those events came at once
                    try:
                        if self._unsaved:
                            self._save([], self.ring.ts, wait=True)
                    finally:  # the counts since the last edge in any case
                        self.state.save_now(self.ring.ts, self.ring.cum)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality in which NaN (nothing stored) equals NaN."""
    return (a == b) | (np.isnan(a) & np.isnan(b))
