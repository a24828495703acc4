"""Topology-aware shard scheduler: placement states, scoring, triggers, actuators, decision spans."""

__all__: list[str] = []
