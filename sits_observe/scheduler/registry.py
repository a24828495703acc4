"""Which shards the scheduler tracks: registration (``POST /api/v1/shards``), removal (``DELETE
/api/v1/shards/<id>``, or the config no longer listing a shard of its own) and ``scheduler.max_shards``, the cap
on how many.

Every shard costs each decision, registration and read (they see them all), so the API may not grow them
without bound: past ``max_shards`` (config and simulator shards count too) a registration is refused.  A removal
stops tracking a shard: its rows, its history too, go in one transaction with the span of its ``shard.remove``
decision, and its GPUs take other shards once the readings show its memory gone.  The actuator is told nothing:
whoever retires a deployment runs it.  ``DELETE`` refuses (409, changing nothing) a shard with a placement in
flight (a step on its way would come back for a shard no longer tracked), and one the config or the simulator
declares (the next SIGHUP or start would register it again).  The config is the truth about its shards: one it
declared and no longer lists is removed at the start or SIGHUP that finds it gone, or, with a placement in
flight, halted (the walker sends it no stage or launch any more: the placement fails at its next step) and
removed at the first tick after that.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from ..errors import ConfigError, SchedulerError
from ..topology import Topology
from .bodies import clip
from .config import TOO_LONG, SchedulerConfig, ShardSpec, long_text
from .decide import Decider
from .placement import Result
from .states import NotFound
from .triggers import Trigger
from .view import ShardView, request_for

__all__ = ["on_this_host", "register", "remove", "remove_unlisted", "unlisted"]

log = logging.getLogger("sits_observe.scheduler")


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


def register(decider: Decider, spec: ShardSpec, origin: str) -> dict[str, Any]:
    """Place ``spec`` (or adopt its ``placement``), then store it; refused -> unchanged.  Only the API's
    registrations are held to ``max_shards``: the config's are counted at load, the simulator's are few."""
    now, planner, views, seen = decider.seen.now, decider.planner, decider.views(), decider.seen
    if spec.id in views:
        raise SchedulerError(f"shard {spec.id}: already registered; re-shard it instead")
    if origin == "api":
        _check_room(spec, views, decider.cfg)
        if (name := long_text(spec)) is not None:  # the config's are refused at load
            raise ConfigError(f"shard {spec.id}: {name}: {TOO_LONG}, got {clip(getattr(spec, name))}")
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
    decider.store.add_shard(spec, now, origin)
    d = decider.assign(spec, t, res)
    return decider.views()[spec.id].to_dict() | {k: d[k] for k in ("outcome", "failure")} | {"decision_id": d["id"]}


def _in_flight(view: ShardView) -> str:
    """What of ``view``'s placements is on its way, for a refusal."""
    what = "a re-shard" if view.serving is not None else "its first placement"
    steps = ", ".join(f"placement {p.id} {p.state.value}" + (f" waiting for step {p.step}" if p.step else "")
                      for p in view.live if p is not view.serving)
    return f"{what} is in flight ({steps})"


def _forget(decider: Decider, view: ShardView, by: str) -> dict[str, Any]:
    """Remove ``view``'s shard (a ``shard.remove`` decision, ``by`` saying who); returns it as it was, with the
    decision's id."""
    t = Trigger("unregister", "none", True, decider.seen.now,
                by + (f"; GPUs {list(view.gpus)} freed" if view.gpus else ""))
    d = decider.decision(t, "shard.remove", "remove", t.reason, view.spec.id, None, view.gpus)
    decider.store.remove_shard(view.spec.id, view.live, decider.tracer.span(d))
    return view.to_dict() | {"decision_id": decider.record(d)["id"]}


def remove(decider: Decider, shard_id: str, simulated: Collection[str]) -> dict[str, Any]:
    """``DELETE``: stop tracking ``shard_id``; returns it as it was, with the decision's id."""
    if any(s.id == shard_id for s in decider.cfg.shards):
        raise SchedulerError(f"shard {shard_id}: cannot remove a shard of the config (scheduler.shards): the next "
                             "SIGHUP or start would register it again; remove it from the config and reload (SIGHUP): "
                             "that removes it")
    if shard_id in simulated:
        raise SchedulerError(f"shard {shard_id}: cannot remove a shard the simulator runs: the next start would "
                             "register it again")
    view = decider.views().get(shard_id)
    if view is None:
        raise NotFound(f"shard {shard_id}: not registered")
    if view.migrating:
        raise SchedulerError(f"shard {shard_id}: cannot remove while {_in_flight(view)}; try again when it has "
                             "finished, or failed (its orchestrator's failed ack, or scheduler.step_timeout)")
    return _forget(decider, view, "removed by api")


def unlisted(decider: Decider, simulated: Collection[str]) -> set[str] | None:
    """The shards the config declared that it no longer lists, nor the simulator runs; those it lists are claimed as
    the config's first (also one the API registered).  None of them from a config without ``scheduler.shards`` at
    all (a start without ``--config``, a file that lost the section: every config shard and its history went with
    it); None itself (not looked for) when the database refused."""
    listed = {s.id for s in decider.cfg.shards}
    try:
        declared = decider.store.claim("config", listed)
    except SchedulerError as exc:  # disk full: the rest of the config applies; the next SIGHUP or start looks again
        log.error("scheduler: shards no longer in the config not looked for (at the next SIGHUP or start): %s", exc)
        return None
    gone = declared - listed - set(simulated)
    if gone and "shards" not in decider.cfg.model_fields_set:
        log.warning("scheduler: this config gives no scheduler.shards; the %d shard(s) an earlier one declared are "
                    "kept (%s): write `shards: []` to remove them", len(gone), ", ".join(sorted(gone)[:5]))
        return set()
    return gone


def remove_unlisted(decider: Decider, ids: set[str], announce: bool) -> set[str]:
    """Remove the shards of ``ids`` (:func:`unlisted`) as ``DELETE`` does; returns those kept for now, to be removed
    at a later tick: one with a placement in flight (said in the log when ``announce``), and one whose removal the
    database refused (logged)."""
    views, kept = decider.views(), set[str]()
    for shard_id in sorted(ids & views.keys()):  # one gone meanwhile (DELETE) is done with
        view = views[shard_id]
        if view.migrating:
            kept.add(shard_id)
            if announce:
                log.warning("scheduler: shard %s is no longer in the config (scheduler.shards); %s: no stage or "
                            "launch is sent for it any more (a drain still is), and it is removed once the step on "
                            "its way has ended", shard_id, _in_flight(view))
            continue
        try:
            _forget(decider, view, "removed from the config (scheduler.shards)")
        except SchedulerError as exc:  # disk full: the next tick tries again
            kept.add(shard_id)
            log.error("scheduler: shard %s, no longer in the config, not removed (retried at the next tick): %s",
                      shard_id, exc)
    return kept
