"""The UI pages by URL path.  Each page module has ``PATH``, ``TITLE``, ``PARAMS`` (query parameters it
accepts), ``options(ctx, query)`` (checks them: 4xx on a bad one), ``layout(ctx, options)`` and
``register(app, ctx)`` (its live-update callbacks)."""

from __future__ import annotations

from types import ModuleType

from . import causes, load, slos, stages, topology

PAGES: dict[str, ModuleType] = {m.PATH: m for m in (topology, load, stages, slos, causes)}
DEFAULT = topology.PATH
