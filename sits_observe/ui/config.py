"""The ``ui:`` config section."""

from __future__ import annotations

from pydantic import Field

from ..section import Section

__all__ = ["UiConfig"]


class UiConfig(Section):
    """Dash UI served at ``/`` on the daemon's port."""

    enabled: bool = Field(True, description="serve the UI at / (the API and /metrics are served either way)")
    update_interval: float = Field(5.0, ge=0.5, le=300, description="seconds between live updates of a page")
    history: float = Field(3600.0, ge=60, le=86400,
                           description="seconds of history a page shows by default (capped at store.history ticks)")
