"""The root-cause verdict: what the classifier concluded about the latest window.

Shared by the RCA engine (producer), the scheduler (consumer of ``on_verdict``), the alert annotations,
the REST API and the UI.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CAUSES", "HEALTHY", "UNKNOWN", "Verdict"]

HEALTHY = "healthy"
UNKNOWN = "unknown"
# The cause vocabulary of the shipped model (docs/rca.md); models trained on other data may use others.
CAUSES = (
    HEALTHY,
    "gpu_compute_saturation",
    "gpu_memory_pressure",
    "interconnect_contention",
    "cpu_contention",
    "network_ingress",
    "thermal_throttling",
    "scheduler_stall",
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One classification: ``cause`` is a class name or ``unknown`` when confidence was too low.

    ``gpus`` and ``stages`` are ranked by their contribution to the verdict (most implicated first);
    ``top_features`` pairs feature names with their occlusion contribution (drop in the cause's
    probability when the feature is replaced by its typical value).  ``ts`` is the source clock.
    ``network`` says which of the model file's networks scored the window: ``main``, or ``fallback`` for a
    window lacking a whole optional feature group (docs/rca.md).
    """

    cause: str
    confidence: float
    ts: float
    gpus: tuple[int, ...] = ()
    stages: tuple[str, ...] = ()
    top_features: tuple[tuple[str, float], ...] = ()
    trigger: str = "periodic"
    network: str = "main"
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    @property
    def actionable(self) -> bool:
        """True for a named fault cause (not healthy, not unknown)."""
        return self.cause not in (HEALTHY, UNKNOWN)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"] = list(self.gpus)
        d["stages"] = list(self.stages)
        d["top_features"] = [{"feature": n, "contribution": c} for n, c in self.top_features]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(
            cause=str(d["cause"]),
            confidence=float(d["confidence"]),
            ts=float(d["ts"]),
            gpus=tuple(int(g) for g in d.get("gpus", ())),
            stages=tuple(str(s) for s in d.get("stages", ())),
            top_features=tuple((str(f["feature"]), float(f["contribution"])) for f in d.get("top_features", ())),
            trigger=str(d.get("trigger", "periodic")),
            network=str(d.get("network", "main")),  # verdicts stored before the field: one-network files
            id=str(d.get("id") or uuid.uuid4().hex[:16]),
        )
