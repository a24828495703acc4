"""sits-observe: observability and SLO analytics daemon for GPU inference hosts."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
