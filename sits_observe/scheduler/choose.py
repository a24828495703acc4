"""Which shard a fired trigger moves, and which GPUs its new placement must avoid (pure functions)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..topology import Topology
from .states import State
from .triggers import Trigger
from .view import ShardView, locked_gpus

__all__ = ["pick_shard", "avoid"]


def pick_shard(t: Trigger, culprits: set[int], views: dict[str, ShardView], cooldown: float,
               last_reshard: Callable[[str], float | None],
               halted: Collection[str] = ()) -> tuple[ShardView | None, list[str]]:
    """The launched shard on the most culprit GPUs (then the smallest, then by id), or None and why not.

    A shard migrating, in its cooldown, sharing a GPU with a migration in flight, or ``halted`` (dropped from the
    config, its removal to come) is never picked; with ``t.other_node`` every shard is a candidate (host CPU
    saturation).
    """
    locked = locked_gpus(views)
    movable, why_not = [], []
    for v in views.values():
        overlap = len(culprits & set(v.gpus))
        if not (overlap or t.other_node):
            continue
        last = last_reshard(v.spec.id)
        if v.migrating or v.state is not State.LAUNCHED:
            why_not.append(f"{v.spec.id} is {'migrating' if v.migrating else 'not launched'}")
        elif v.spec.id in halted:
            why_not.append(f"{v.spec.id} is no longer in the config")
        elif last is not None and t.ts - last < cooldown:
            why_not.append(f"{v.spec.id} in cooldown for {cooldown - (t.ts - last):.0f} s more")
        elif set(v.gpus) & locked:
            why_not.append(f"{v.spec.id} shares a GPU with a migration in flight")
        else:
            movable.append((-overlap, v.spec.gpus, v.spec.id, v))
    return (min(movable, key=lambda m: m[:3])[3] if movable else None), why_not


def avoid(topo: Topology, t: Trigger, culprits: set[int], view: ShardView) -> frozenset[int]:
    """GPUs the new placement must not use: the culprits, their NUMA nodes for CPU contention (the host
    cores feeding those GPUs are what is contended), the whole node for host CPU saturation."""
    out = set(culprits)
    if t.cause == "cpu_contention":
        busy = {(topo.gpus[g].node, topo.gpus[g].numa_node) for g in culprits}
        out |= {g.index for g in topo.gpus if (g.node, g.numa_node) in busy}
    if t.other_node:
        out |= {g.index for g in topo.gpus if g.node == topo.gpus[view.gpus[0]].node}
    return frozenset(out)
