"""Which shards the scheduler tracks: registration (``POST /api/v1/shards``), removal (``DELETE
/api/v1/shards/<id>``) and ``scheduler.max_shards``, the cap on how many.

Every shard costs each decision, registration and read (they see them all), so the API may not grow them
without bound: past ``max_shards`` (config and simulator shards count too) a registration is refused.  A removal
stops tracking a shard: its rows, its history too, go in one transaction with the span of its ``shard.remove``
decision, and its GPUs take other shards once the readings show its memory gone.  The actuator is told nothing:
whoever retires a deployment runs it.  Refused (409, changing nothing): a shard with a placement in flight (a
step on its way would come back for a shard no longer tracked), and one the config or the simulator declares
(the next SIGHUP or start would register it again).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..errors import ConfigError, SchedulerError
from ..topology import Topology
from .bodies import clip
from .config import SchedulerConfig, ShardSpec
from .decide import Decider
from .placement import Result
from .states import NotFound
from .triggers import Trigger
from .view import ShardView, request_for

__all__ = ["on_this_host", "register", "remove"]


def on_this_host(spec: ShardSpec, topo: Topology) -> None:
    """Refuse a shard whose ``placement`` or ``numa_node`` the topology lacks: a NUMA node without a GPU would
    score every GPU set the same (none on it), dropping the NUMA preference silently.  With no GPU's NUMA
    node known (NVML could not read them) any node is taken."""
    bad = [g for g in spec.placement or () if not 0 <= g < topo.n]  # -1 would index the last GPU
    if bad:
        raise ConfigError(f"shard {spec.id}: placement: GPUs {bad} not on this host (0-{topo.n - 1})")
    nodes = sorted(topo.numa_nodes())
    if spec.numa_node is not None and nodes and spec.numa_node not in nodes:
        raise ConfigError(f"shard {spec.id}: numa_node: no GPU of this host is on NUMA node {spec.numa_node} "
                          f"(its GPUs are on nodes {nodes}); leave it unset for CPUs on a node without GPUs")


def _check_room(spec: ShardSpec, views: dict[str, ShardView], cfg: SchedulerConfig) -> None:
    """Refuse a new shard past ``max_shards``: the registered ones and the config's (also those waiting for GPU
    values to be placed) count."""
    tracked = len(views.keys() | {s.id for s in cfg.shards})
    if tracked >= cfg.max_shards:
        raise SchedulerError(f"shard {spec.id}: cannot register: {tracked} shards are tracked, scheduler.max_shards "
                             f"is {cfg.max_shards}; remove one no longer served (DELETE /api/v1/shards/<id>) or "
                             "raise scheduler.max_shards")


MAX_TEXT_CHARS = 256  # a registration's free text (model, workload, tenant), at most


def _check_text(spec: ShardSpec) -> None:
    """Refuse a registration's free text past :data:`MAX_TEXT_CHARS`: it is kept and repeated in every shard list,
    plan and span (a 900 kB ``model`` was taken).  Not a field limit: shards stored before it still load."""
    for name in ("model", "workload", "tenant"):
        if len(text := getattr(spec, name)) > MAX_TEXT_CHARS:
            raise ConfigError(f"shard {spec.id}: {name}: at most {MAX_TEXT_CHARS} characters, got {clip(text)}")


def register(decider: Decider, spec: ShardSpec, origin: str) -> dict[str, Any]:
    """Place ``spec`` (or adopt its ``placement``), then store it; refused -> unchanged.  Only the API's
    registrations are held to ``max_shards``: the config's are counted at load, the simulator's are few."""
    now, planner, views, seen = decider.seen.now, decider.planner, decider.views(), decider.seen
    if spec.id in views:
        raise SchedulerError(f"shard {spec.id}: already registered; re-shard it instead")
    if origin == "api":
        _check_room(spec, views, decider.cfg)
        _check_text(spec)
    if spec.placement is None and (why := seen.gpus_unknown()):  # as a re-shard: the target could be full
        raise SchedulerError(f"shard {spec.id}: cannot place: {why}; try again when it reports, or give "
                             "the placement it runs on")
    req, load = request_for(spec, views, seen.util), seen.load(views)
    t = Trigger("adopt" if spec.placement else "register", "none", True, now, f"registered by {origin}")
    if spec.placement is not None:
        c = planner.score(req, load, tuple(sorted(spec.placement)))
        res = Result(c, [c], "given", 1)
    else:
        res = planner.place(req, load)
        if res.best is None:
            raise SchedulerError(f"shard {spec.id}: fits nowhere: {res.reason}")
    decider.store.add_shard(spec, now)
    d = decider.assign(spec, t, res)
    return decider.views()[spec.id].to_dict() | {k: d[k] for k in ("outcome", "failure")} | {"decision_id": d["id"]}


def _in_flight(view: ShardView) -> str:
    """What of ``view``'s placements is on its way, for a refusal."""
    what = "a re-shard" if view.serving is not None else "its first placement"
    steps = ", ".join(f"placement {p.id} {p.state.value}" + (f" waiting for step {p.step}" if p.step else "")
                      for p in view.live if p is not view.serving)
    return f"{what} is in flight ({steps})"


def remove(decider: Decider, shard_id: str, simulated: Collection[str]) -> dict[str, Any]:
    """Stop tracking ``shard_id`` (a ``shard.remove`` decision); returns it as it was, with the decision's id."""
    if any(s.id == shard_id for s in decider.cfg.shards):
        raise SchedulerError(f"shard {shard_id}: cannot remove a shard of the config (scheduler.shards): the next "
                             "SIGHUP or start would register it again; remove it from the config, reload (SIGHUP), "
                             "then delete it")
    if shard_id in simulated:
        raise SchedulerError(f"shard {shard_id}: cannot remove a shard the simulator runs: the next start would "
                             "register it again")
    view = decider.views().get(shard_id)
    if view is None:
        raise NotFound(f"shard {shard_id}: not registered")
    if view.migrating:
        raise SchedulerError(f"shard {shard_id}: cannot remove while {_in_flight(view)}; try again when it has "
                             "finished, or failed (its orchestrator's failed ack, or scheduler.step_timeout)")
    t = Trigger("unregister", "none", True, decider.seen.now,
                "removed by api" + (f"; GPUs {list(view.gpus)} freed" if view.gpus else ""))
    d = decider.decision(t, "shard.remove", "remove", t.reason, shard_id, None, view.gpus)
    decider.store.remove_shard(shard_id, view.live, decider.tracer.span(d))
    return view.to_dict() | {"decision_id": decider.record(d)["id"]}
