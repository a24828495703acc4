"""Topology-aware shard scheduler: placement states, scoring, triggers, actuators, decision spans.

The top-level config is imported first: it imports this package's section models, which need its
``Section`` base, so importing ``sits_observe.scheduler.config`` on its own must not start the cycle.
"""

from .. import config as _config  # noqa: F401

__all__: list[str] = []
