"""The in-daemon consumer: classify the latest window when an SLO starts to burn, every N ticks while it burns, and
every K ticks otherwise.

A verdict is stored in the verdict log (SQLite under ``state_dir``), counted for export, added to the
annotations of every firing SLO alert (``likely_cause``, ``confidence``, ``rca_verdict``) through the SLO
engine's ``annotate(slo_name, annotations)``, and handed to the scheduler's ``on_verdict``.  A missing
or corrupt model, a store that lacks the model's features, or a store ring shorter than the model's
window, is logged once and RCA stays off; the daemon runs on without it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError, StoreError
from ..frame import Frame, Sample
from ..store.features import unseen
from ..store.series import SeriesStore
from .checks import other_buckets, other_step, short_history
from .config import RcaConfig
from .steps import observed_columns
from .floors import Floors
from .explain import explain
from .features import OPTIONAL_FEATURES, gpu_field_of
from .log import VerdictLog
from .model import RcaModel
from .verdict import HEALTHY, UNKNOWN, Verdict

__all__ = ["RcaEngine"]

log = logging.getLogger("sits_observe.rca")


class RcaEngine:
    """Consumer ``rca``; ``firing()`` names the SLOs whose burn tier fires now (empty: none)."""

    name = "rca"

    def __init__(self, cfg: RcaConfig, state_dir: str | Path, *,
                 firing: Callable[[], Sequence[str]] | None = None,
                 annotate: Callable[[str, Mapping[str, str]], None] | None = None,
                 on_verdict: Callable[[Verdict], Any] | None = None, tick_seconds: float | None = None) -> None:
        self.cfg = cfg
        self.tick_seconds = tick_seconds  # the daemon's tick_interval: a model trained at another step is refused
        self.firing = firing
        self.annotate = annotate
        self.on_verdict = on_verdict
        self.log = VerdictLog(Path(state_dir) / "rca.sqlite", keep=cfg.keep_verdicts)
        self.model: RcaModel | None = None
        self.error: str | None = None
        self._since = 0  # ticks since the last due one
        self._onset = False  # a burn began and has no verdict yet: classified at the first tick that can be
        self._burning = False
        self._gpu = np.zeros(0, dtype=bool)  # the model's GPU features (none of an optional group's)
        self._gpu_out = False  # a window without GPU readings was passed over (said once per outage)
        self._base: np.ndarray | None = None
        self._base_tick = -1
        self._loaded: tuple[int, int] | None = None  # the model file's (mtime_ns, size) when loaded
        self._short_history_logged = False
        self._observed = np.zeros(0, dtype=bool)  # the model's features that say whether a tick had data
        self._unseen_checked = False
        self._proba: dict[str, float] = {}
        self._proba_ts = float("nan")  # the source time of the window ``_proba`` is of
        self._counts: dict[str, int] = {}
        self._load()

    def _load(self, before: RcaConfig | None = None) -> None:
        """Load the model ``self.cfg`` names.  ``before`` (SIGHUP: the config it replaces): a model that cannot
        be loaded leaves the one loaded before in place, as a bad new config leaves the old one."""
        path = self.cfg.model_path()
        stamp = _file_stamp(path)
        try:
            import torch

            torch.set_num_threads(self.cfg.threads)
            model = RcaModel.load(path)
            why = other_step(model, path, self.tick_seconds)
        except ModelError as exc:
            why = str(exc)
        if why is not None and before is not None and self.model is not None:
            log.warning("rca: SIGHUP: %s; the model loaded before (%s) stays", why, before.model_path())
            self.cfg = self.cfg.model_copy(update={"model": before.model})
            return
        self._base, self._base_tick = None, -1  # a baseline belongs to the model's features
        self._proba = {}  # the previous model's probabilities (its classes) are not this one's
        self._loaded = stamp
        if why is not None:
            self._disable(why)
            return
        self.model, self.error = model, None
        self._observed = observed_columns(self.model.features)
        self._gpu = np.array([gpu_field_of(f) is not None and f not in OPTIONAL_FEATURES for f in model.features])
        self._unseen_checked = False
        log.info("rca: model %s loaded (%d features, window %d, classes %s)", path, len(self.model.features),
                 self.model.window, ", ".join(self.model.classes))
        self._check_floors()

    def _check_floors(self) -> None:
        """One warning for floors given to causes the model does not name (a typo, or another vocabulary)."""
        extra = [] if self.model is None else Floors.of(self.cfg.min_confidence).unknown_causes(self.model.classes)
        if extra:
            log.warning("rca: rca.min_confidence gives floors to %s, which the model (classes %s) never names; "
                        "they have no effect", ", ".join(extra), ", ".join(self.model.classes))

    def _disable(self, why: str) -> None:
        self.model = None
        self._base, self._base_tick = None, -1
        self._proba = {}  # no classification now: no confidence series is exported as if it were current
        self.error = why
        log.warning("rca: root-cause classification is off: %s", why)

    def reload(self, cfg: Any) -> None:
        """SIGHUP: take the new ``rca`` section; reload the model when its path or file changed (a model
        retrained in place), or when RCA is off (the file fixed since, or turned on again); ``enabled: false``
        turns it off, a new ``threads`` applies at once."""
        new: RcaConfig = cfg.rca
        changed = new.model_path() != self.cfg.model_path() or _file_stamp(new.model_path()) != self._loaded
        before, self.cfg = self.cfg, new
        if not new.enabled:
            self._disable("rca.enabled is false (SIGHUP); set it true and send SIGHUP again to turn it back on")
        elif changed or self.model is None:
            self._load(before)
        else:
            import torch

            torch.set_num_threads(new.threads)  # a new rca.threads, with the same model
            self._check_floors()
        self.log.set_keep(new.keep_verdicts)  # last: a log that cannot be pruned now still gets the model

    # ---- per tick ------------------------------------------------------------------------------

    def on_tick(self, frame: Frame, store: SeriesStore) -> None:
        if self.model is None or store.latest_ts != frame.ts:  # a tick the store did not take: no window ends at it
            return
        if (why := short_history(self.model, store.history)) is not None:
            self._disable(why)
            return
        burning = list(self.firing()) if self.firing is not None else []
        self._onset = bool(burning) and (self._onset or not self._burning)  # at once, not up to N - 1 ticks late
        self._burning = bool(burning)
        self._since += 1
        due = self._onset or self._since >= (self.cfg.burn_every_ticks if burning else self.cfg.every_ticks)
        try:
            if (store.ticks - 1) % self.model.baseline.every == 0:
                self._baseline(store)  # at its refresh point: the same ticks as in training, whatever the ring holds
            if not due:
                return
            self._since = 0
            if store.ticks < self.model.window:
                return
            raw = store.window(self.model.features, self.model.window)
            base = self._baseline(store)
        except StoreError as exc:
            self._disable(f"the store cannot compute the model's features: {exc}")
            return
        if not _covered(raw, self._observed):  # ticks with data: observed_columns, as in training
            return
        if self._without_gpus(raw, store):
            return
        if not self._unseen_checked:  # once per model: a host's series do not go away
            self._unseen_checked = True
            if missing := unseen(store, [f for f in self.model.features if f not in OPTIONAL_FEATURES]):
                log.warning("rca: this host has no series for %d of the model's features (%s): they read as 0 "
                            "or missing, unlike in training, and verdicts may be off; was the model trained for "
                            "another host (its probes, its workload names)?", len(missing), ", ".join(missing[:8]))
            if (why := other_buckets(self.model, store.layout.edges)) is not None:
                log.warning("rca: %s", why)
        verdict = self.classify(raw, base, frame.ts, "slo_burn" if burning else "periodic", store)
        self._onset = False
        self.record(verdict, burning)

    def _without_gpus(self, raw: np.ndarray, store: SeriesStore) -> bool:
        """A window of a host whose GPU source has reported, without GPU readings on its last tick or on more than
        half of its ticks (the source down): the networks never saw one in training (the fallback only lacks the
        optional groups), and named a cause for it with confidence; passed over, as a tick without data is."""
        if not self._gpu.any() or not store.gpu_info():
            return False
        out = not _covered(raw, self._gpu)
        if out and not self._gpu_out:
            log.warning("rca: no GPU readings on the last tick or on most ticks of the window (is the GPU source "
                        "down?): no verdict until they are back")
        elif not out and self._gpu_out:
            log.info("rca: GPU readings are back; verdicts resume")
        self._gpu_out = out
        return out

    def _baseline(self, store: SeriesStore) -> np.ndarray:
        """The host's per-feature median over the model's baseline horizon, refreshed every ``every`` ticks
        from the ticks up to the refresh point, exactly as :func:`sits_observe.rca.dataset.rolling_baseline`
        computes it for training (row ``t`` = tick ``t + 1``)."""
        b = self.model.baseline  # type: ignore[union-attr]
        if store.history < b.horizon and not self._short_history_logged:
            self._short_history_logged = True
            log.warning("rca: store.history is %d ticks, the model's baseline covers %d: verdicts compare with a "
                        "shorter baseline than in training; set store.history to at least %d", store.history,
                        b.horizon, b.horizon)
        since = (store.ticks - 1) % b.every  # ticks after the refresh point
        due = store.ticks - 1 - since
        if self._base is None or due != self._base_tick:
            hist = store.window(self.model.features, b.horizon + since)  # type: ignore[union-attr]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a feature never seen: NaN
                self._base = np.nanmedian(hist[:len(hist) - since], axis=0).astype(np.float32)
            self._base_tick = due
        return self._base

    def classify(self, raw: np.ndarray, base: np.ndarray, ts: float, trigger: str,
                 store: SeriesStore | None = None) -> Verdict:
        """A verdict for one ``(window, F)`` raw window and its ``(F,)`` baseline, in model feature order."""
        m = self.model
        assert m is not None
        lacking = m.lacking(raw[None])
        proba = m.proba(raw[None], base[None], lacking)[0]
        self._proba, self._proba_ts = {c: float(p) for c, p in zip(m.classes, proba)}, ts
        k = int(proba.argmax())
        cause = str(m.decide(proba[None], self.cfg.min_confidence, self.cfg.healthy_min_confidence)[0])
        network = "fallback" if m.fallback is not None and lacking[0] else "main"
        if cause in (HEALTHY, UNKNOWN):
            return Verdict(cause, round(float(proba[k]), 4), ts, trigger=trigger, network=network)
        ex = explain(m, raw, base, k, store, self.cfg.top_features)
        return Verdict(cause, round(float(proba[k]), 4), ts, ex.gpus, ex.stages, ex.top_features, trigger, network)

    def record(self, v: Verdict, burning: Sequence[str] = ()) -> None:
        """Store and count ``v``, annotate the ``burning`` SLOs' alerts, hand it to the scheduler.

        A verdict the log cannot store (a full disk, a locked or read-only ``rca.sqlite``) is still
        served from memory, annotated and handed on; the write error is raised afterwards, so the daemon
        logs it and counts it in ``sits_source_errors_total{source="rca"}``."""
        self._counts[v.cause] = self._counts.get(v.cause, 0) + 1
        try:
            self.log.append(v)
            failed: StoreError | None = None
        except StoreError as exc:
            failed = exc
        if self.annotate is not None:
            notes = {"likely_cause": v.cause, "confidence": f"{v.confidence:.2f}", "rca_verdict": v.id}
            for slo in burning:
                self._call("annotate", lambda n, s=slo: self.annotate(s, n), notes)  # type: ignore[misc]
        if self.on_verdict is not None:
            self._call("on_verdict", self.on_verdict, v)
        if failed is not None:
            raise failed

    @staticmethod
    def _call(what: str, fn: Callable[[Any], Any], arg: Any) -> None:
        try:
            fn(arg)
        except Exception as exc:  # noqa: BLE001 - a failing hook must not lose the verdict or stop RCA
            log.warning("rca: %s hook failed: %s: %s", what, type(exc).__name__, exc)

    # ---- reporting -----------------------------------------------------------------------------

    def metrics(self) -> Iterable[Sample]:
        yield Sample("sits_rca_model_loaded", "gauge", "1 when the root-cause model is loaded.", (),
                     0.0 if self.model is None else 1.0)
        for cause, p in sorted(self._proba.items()):
            yield Sample("sits_rca_verdict_confidence", "gauge",
                         "Probability of each cause in the latest classification (calibrated).",
                         (("cause", cause),), p)
        if self._proba:  # how old the probabilities above are: none come while ticks have no data
            yield Sample("sits_rca_last_classification_timestamp_seconds", "gauge",
                         "Time of the window the latest classification scored (Unix seconds, source clock).", (),
                         self._proba_ts)
        for cause, n in sorted(self._counts.items()):
            yield Sample("sits_rca_verdicts_total", "counter", "Verdicts given, by cause (unknown included).",
                         (("cause", cause),), float(n))

    def verdicts_state(self, limit: int = 50) -> dict[str, Any]:
        """What GET /api/v1/verdicts serves: the model, the latest probabilities, recent verdicts."""
        m = self.model
        model = None if m is None else {
            "path": str(self.cfg.model_path()), "classes": list(m.classes), "window": m.window,
            "features": list(m.features), "temperature": m.temperature,
            "validation_macro_f1": m.metrics.get("validation", {}).get("macro_f1"),
            "relative_only": list(m.relative_only), "fallback": m.fallback is not None,
        }
        floors = Floors.of(self.cfg.min_confidence)
        return {"enabled": m is not None, "error": self.error, "model": model, "min_confidence": floors.to_json(),
                "healthy_min_confidence": floors.healthy(self.cfg.healthy_min_confidence),  # the floor in force
                "latest_probabilities": dict(self._proba), "latest_ts": self._proba_ts if self._proba else None,
                "verdicts": self.log.recent(limit)}

    def close(self) -> None:
        self.log.close()


def _file_stamp(path: Path | str) -> tuple[int, int] | None:
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _covered(raw: np.ndarray, columns: np.ndarray) -> bool:
    """The rule training windows follow: some of ``columns`` has a value on the window's last tick, and on at least
    half of its ticks."""
    seen = ~np.isnan(raw[:, columns]).all(axis=1)
    return bool(seen[-1]) and 2 * int(seen.sum()) >= len(seen)
