"""The alert dispatcher: the durable outbox plus one :class:`~.sender.Sender` thread per receiver.

The SLO engine talks to it only: :meth:`Dispatcher.notify` queues an alert state change for every
receiver (the outbox deduplicates, see :mod:`.outbox`) and wakes their senders; :meth:`Dispatcher.refresh`
re-queues firing alerts for Alertmanager receivers every ``resend_interval`` and, every
:data:`REFUSED_RETRY_ROUNDS`-th time, offers any receiver again the firing states it refused with an answer a fix on
its side can lift.  It also answers the
delivery metrics and the receiver part of ``GET /api/v1/alerts``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..frame import Sample
from .config import AlertingConfig
from .formats import Alert
from .outbox import Outbox
from .sender import OUTCOMES as SENT, Sender

__all__ = ["Dispatcher"]

OUTCOMES = (*SENT, "folded")  # folded: left out of a flapping alert's queue (outbox.PENDING_PER_ALERT)
# every 15th re-send interval also offers every receiver (webhooks too) the firing states it refused with an answer a
# fix on its side can lift (answers.refusal_may_lift: 15 minutes at the default 60 s)
REFUSED_RETRY_ROUNDS = 15

log = logging.getLogger("sits_observe.alerting")


class Dispatcher:
    """The outbox plus one :class:`Sender` per receiver; what the SLO engine talks to."""

    def __init__(self, cfg: AlertingConfig, state_dir: Path, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.counts: Counter[tuple[str, str]] = Counter()
        self.outbox = Outbox(Path(state_dir) / "outbox.db", self.counts)
        # firing alerts re-sent every resend_interval stay valid for four of them, as Prometheus sends them
        self.senders = {r.label: Sender(r, self.outbox, cfg.backoff, cfg.max_batch, self.counts, rng,
                                        hold=4 * cfg.resend_interval) for r in cfg.receivers}
        self._am = [r.label for r in cfg.receivers if r.type == "alertmanager"]
        self._hooks = [r.label for r in cfg.receivers if r.type != "alertmanager"]
        self._clock = clock
        self._last_refresh = clock()
        self._rounds = 0  # re-sends so far

    def start(self) -> None:
        """Start the senders; say once if the outbox holds messages for receivers no longer configured."""
        unconfigured = self.unconfigured()
        if unconfigured:
            # names only: a receiver's URL may be its secret
            log.warning("alert outbox holds messages for receivers no longer configured (%s): they are kept, "
                        "not sent; they go out if a receiver of that name is configured again",
                        ", ".join(f"{n}: {k}" for n, k in sorted(unconfigured.items())))
        for s in self.senders.values():
            s.start()

    def unconfigured(self) -> dict[str, int]:
        """Messages queued for receiver names this configuration does not have (renamed or removed)."""
        return {n: k for n, k in self.outbox.depth().items() if n not in self.senders}

    def notify(self, alert: Alert) -> None:
        """Queue a state change (or new annotations) of ``alert`` for every receiver."""
        if self.senders and self.outbox.enqueue(list(self.senders), alert):
            self._wake(self.senders)

    def refresh(self, firing: Iterable[Alert]) -> None:
        """Re-send firing alerts to Alertmanager receivers every ``resend_interval`` (wall clock); every
        :data:`REFUSED_RETRY_ROUNDS`-th time also offer any receiver (a webhook too, which gets no re-sends) the
        firing states it refused with an answer a fix on its side can lift."""
        now = self._clock()
        if not self.senders or now - self._last_refresh < self.cfg.resend_interval:
            return
        self._last_refresh = now
        self._rounds += 1
        retry = self._rounds % REFUSED_RETRY_ROUNDS == 0
        firing = list(firing)
        for names, resend in ((self._am, True), (self._hooks if retry else [], False)):
            if names and sum(self.outbox.enqueue(names, a, refresh=True, retry_refused=retry, resend=resend)
                             for a in firing):
                self._wake(names)

    def _wake(self, names: Iterable[str]) -> None:
        for n in names:
            self.senders[n].wake()

    def metrics(self) -> Iterable[Sample]:
        depth = self.outbox.depth()
        for name in self.senders:
            for outcome in OUTCOMES:
                yield Sample("sits_webhook_deliveries_total", "counter",
                             "Alert deliveries by receiver and outcome (retried: an attempt that will be retried; "
                             "folded: left out of a flapping alert's queue).",
                             (("receiver", name), ("outcome", outcome)), float(self.counts[(name, outcome)]))
        for name in sorted(self.senders.keys() | depth.keys()):
            yield Sample("sits_webhook_queue_depth", "gauge",
                         "Alert messages waiting in the outbox (also for a receiver no longer configured).",
                         (("receiver", name),), float(depth.get(name, 0)))

    def state(self) -> dict[str, Any]:
        """JSON-ready receiver state for the API (names and types only: no URLs, no secrets)."""
        depth, errors = self.outbox.depth(), self.outbox.last_errors()
        receivers = [{"name": n, "type": s.cfg.type, "queue_depth": depth.get(n, 0),
                      **{o: self.counts[(n, o)] for o in OUTCOMES}, "last_error": errors.get(n)}
                     for n, s in self.senders.items()]
        unconfigured = [{"name": n, "queue_depth": k} for n, k in sorted(self.unconfigured().items())]
        return {"receivers": receivers, "unconfigured_receivers": unconfigured,
                "failed": self.outbox.recent_failures()}

    def close(self, timeout: float = 5.0) -> None:
        """Stop every sender, wait for them (``timeout`` seconds for all: one still connecting to a receiver that
        drops packets cannot be cut off), close the outbox: each step runs even if an earlier one raised."""
        deadline = time.monotonic() + timeout
        with contextlib.ExitStack() as steps:  # run last-in first-out
            steps.callback(self.outbox.close)
            for s in self.senders.values():
                steps.callback(lambda s=s: s.join_stopped(max(0.0, deadline - time.monotonic())))
            for s in self.senders.values():
                steps.callback(s.stop)
