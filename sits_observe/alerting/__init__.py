"""Alert delivery: payload formats, the durable SQLite outbox and the per-receiver sender threads.

``sits_observe.config`` is imported first because it imports this package's config section.
"""

from .. import config as _config  # noqa: F401

__all__: list[str] = []
