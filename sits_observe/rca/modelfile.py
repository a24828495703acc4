"""What a model file must pass before :meth:`RcaModel.load <sits_observe.rca.model.RcaModel.load>` builds a model
from it: the checksums of its zip archive (:func:`archive_damage`), the sizes it gives (:func:`check_sizes`, before
any tensor is allocated from them) and the types of its names and records (:func:`check_types`).  A damaged,
foreign or hostile file is refused with what is wrong in it, never half-loaded."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from .config import MAX_WIDTH

__all__ = ["archive_damage", "check_sizes", "check_types"]


def archive_damage(path: Path) -> str | None:
    """What in the model file's zip archive fails its checks: the first entry whose CRC does not match, or the
    archive itself (None: all is well, or the file is no zip archive: torch's legacy format has no checksums)."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"its archive cannot be read back ({exc})"
    return None if bad is None else f"its entry {bad} fails its checksum"


def check_types(meta: dict[str, Any]) -> None:
    """Names are strings and the records mappings (a foreign or hand-edited file could hold numbers there, which
    would fail later, in the daemon's start or an API answer); ValueError naming the first that is not."""
    for key in ("features", "classes", "relative_only"):
        if not all(isinstance(x, str) for x in meta.get(key, ())):
            raise ValueError(f"{key} are not all names")
    if not isinstance(meta.get("training", {}), dict):
        raise ValueError("training is not a mapping")
    metrics = meta.get("metrics", {})
    if not isinstance(metrics, dict) or not all(isinstance(v, dict) for v in metrics.values()):
        raise ValueError("metrics is not a mapping of mappings")


def check_sizes(meta: dict[str, Any]) -> None:
    """The sizes a model file gives, within what a model can be (a damaged or hostile file could ask for
    tensors of any size, a zero refresh interval or a window of one step); ValueError naming the first."""
    limits = {"window": (int(meta["window"]), 2, 100_000), "features": (len(meta["features"]), 1, 10_000),
              "classes": (len(meta["classes"]), 2, 1_000), "summary": (int(meta.get("summary", 0)), 0, MAX_WIDTH),
              "baseline.horizon": (int(meta["baseline"]["horizon"]), 1, 10_000_000),
              "baseline.every": (int(meta["baseline"]["every"]), 1, 1_000_000)}
    limits.update({f"hidden[{i}]": (int(h), 1, MAX_WIDTH) for i, h in enumerate(meta["hidden"])})
    for name, (value, lo, hi) in limits.items():
        if not lo <= value <= hi:
            raise ValueError(f"{name} {value} is outside {lo}..{hi}")
    if not 0 <= float(meta["dropout"]) < 1:
        raise ValueError(f"dropout {meta['dropout']} is outside [0, 1)")
