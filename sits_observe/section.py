"""The base of every config section (kept apart so subsystem sections and config.py import it freely)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Section"]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
