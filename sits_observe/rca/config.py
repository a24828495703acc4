"""The ``rca:`` config section (see docs/rca.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from ..section import Section
from ..shipped import shipped
from .floors import check_floors

__all__ = ["HEALTHY_MIN_CONFIDENCE", "MAX_WIDTH", "MIN_CONFIDENCE", "SHIPPED_MODEL", "RcaConfig"]

# The model shipped in the repository (``models/rca-lstm.pt``; an installed wheel carries it as
# ``sits_observe/models/rca-lstm.pt``), used when ``rca.model`` is not set.
SHIPPED_MODEL = shipped("models") / "rca-lstm.pt"
# The default operating point (models/README.md, "Operating point"): a fault cause is named from 0.91, the
# lowest floor (0.01 steps from 0.5) at which the shipped model keeps macro-F1 >= 0.90 and calls at most
# 1 % of healthy windows faulty on both development OOD sets; a healthy verdict from 0.6.
MIN_CONFIDENCE = 0.91
HEALTHY_MIN_CONFIDENCE = 0.6
MAX_WIDTH = 4096  # LSTM hidden sizes and the statistics layer's width a model file may give (and `rca train` make)


class RcaConfig(Section):
    enabled: bool = Field(True, description="run the root-cause classifier in the daemon")
    model: str | None = Field(None, description="model file; default: the shipped models/rca-lstm.pt")
    every_ticks: int = Field(60, ge=1, le=86400, description="classify every N ticks when no SLO burns")
    burn_every_ticks: int = Field(5, ge=1, le=3600, description="classify every N ticks while an SLO burns")
    min_confidence: float | dict[str, float] = Field(
        MIN_CONFIDENCE,
        description="a fault cause below this confidence is `unknown`: one floor, or a mapping of causes to "
                    "floors with a `default` for the causes it does not list")
    healthy_min_confidence: float = Field(HEALTHY_MIN_CONFIDENCE, ge=0.0, le=1.0,
                                          description="a healthy verdict below this confidence is `unknown` "
                                                      "(capped at min_confidence's default)")
    top_features: int = Field(5, ge=1, le=64, description="features reported per verdict")
    keep_verdicts: int = Field(10000, ge=10, le=10_000_000, description="verdicts kept in SQLite")
    threads: int = Field(1, ge=1, le=64, description="CPU threads torch may use for inference")

    @field_validator("min_confidence", mode="before")
    @classmethod
    def _floors(cls, v: object) -> float | dict[str, float]:
        return check_floors(v)

    def model_path(self) -> Path:
        return Path(self.model) if self.model else SHIPPED_MODEL
