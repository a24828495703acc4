"""The generic dataset format written as a set (:mod:`.dataset` reads it): ``metrics.csv``, ``labels.csv`` and
any text files beside them go into place together or not at all, one entity's rows at a time."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path

import numpy as np
import pandas as pd

from ..files import flush, flush_renames, temporary_name
from .dataset import LABELS, METRICS, Dataset, Entity, Label

__all__ = ["Writer", "write"]


class Writer:
    """Write a dataset one entity at a time, so that only the entity in hand is held in memory::

        with Writer(directory, features, step) as out:
            for entity in ...:
                out.add(entity)
            out.commit(labels, extra)

    ``metrics.csv`` (empty cells for NaN; all-NaN steps omitted), ``labels.csv`` and the text files of ``extra``
    (name -> text) each go to ``NAME.<pid>-<random>.tmp`` first (this writer's own) and :meth:`commit` flushes them
    to disk and renames all into place together; leaving the
    ``with`` block without it (an error, a full disk, an interrupt) removes them.  So what the directory held
    (``rca dataset --force``) stays whole: never a half-written metrics.csv beside the labels of another dataset,
    which a later ``rca train`` would read as complete."""

    def __init__(self, directory: str | Path, features: Sequence[str], step: float) -> None:
        self.dir = Path(directory)
        self.features = list(features)
        self.step = step
        self._tmps: dict[str, Path] = {}  # NAME -> this writer's temporary file for it, in the order written

    def __enter__(self) -> Writer:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._put(METRICS, pd.DataFrame(columns=["timestamp", "entity", *self.features]).to_csv, index=False)
        return self

    def __exit__(self, *exc: object) -> None:
        for tmp in self._tmps.values():
            with suppress(OSError):
                tmp.unlink(missing_ok=True)

    def _put(self, name: str, put: Callable[..., object], **kwargs: object) -> None:
        """``put(<NAME's temporary file>, **kwargs)``, renamed by :meth:`commit` or removed; an OSError names NAME."""
        if name not in self._tmps:
            self._tmps[name] = temporary_name(self.dir / name)
        tmp = self._tmps[name]
        try:
            put(tmp, **kwargs)
        except OSError as exc:  # pandas' has no file name: "No space left on device" alone
            raise OSError(exc.errno, exc.strerror, str(self.dir / name)) from exc

    def add(self, ent: Entity) -> None:
        """Append ``ent``'s observed steps to metrics.csv."""
        keep = ~np.isnan(ent.values).all(axis=1)
        df = pd.DataFrame(ent.values[keep].astype(np.float64), columns=self.features)
        df.insert(0, "entity", ent.name)
        df.insert(0, "timestamp", [f"{t:.3f}" for t in ent.times(self.step)[keep]])
        self._put(METRICS, df.to_csv, mode="a", header=False, index=False, float_format="%.6g", na_rep="")

    def commit(self, labels: Sequence[Label], extra: Mapping[str, str] | None = None) -> None:
        """Write labels.csv and ``extra``, then rename every file into place, all or none."""
        rows = pd.DataFrame([(lab.entity, f"{lab.start:.3f}", f"{lab.end:.3f}", lab.cause) for lab in labels],
                            columns=["entity", "start", "end", "cause"])
        self._put(LABELS, rows.to_csv, index=False)
        for name, text in (extra or {}).items():
            self._put(name, Path.write_text, data=text)
        for tmp in self._tmps.values():  # on disk before any takes its name: a power loss leaves no empty metrics.csv
            flush(tmp)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # all renamed, or none
        try:
            for name, tmp in self._tmps.items():
                tmp.replace(self.dir / name)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        flush_renames(self.dir)


def write(directory: str | Path, dataset: Dataset, extra: Mapping[str, str] | None = None) -> None:
    """Write ``dataset`` and the text files of ``extra`` to ``directory``, all or none (:class:`Writer`)."""
    with Writer(directory, dataset.features, dataset.step) as out:
        for ent in dataset.entities:
            out.add(ent)
        out.commit(dataset.labels, extra)
