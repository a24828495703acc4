"""Build a :class:`~sits_observe.daemon.Daemon` from a Config: which sources, consumers and actuators.

Each subsystem is imported only when the config enables it.  A part that cannot start (no NVML, no
privileges, no model) says why once and the daemon runs on without it.  The subsystems meet here and
nowhere else: the SLO engine tells the classifier when a tier burns, the classifier annotates firing
alerts and hands verdicts to the scheduler, and the scheduler links its decision spans to the alerts.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .clock import SIM_CLOCK_FILE, SimClock, WallClock
from .config import Config
from .daemon import Daemon
from .errors import ConfigError, SitsError

__all__ = ["build_daemon", "lock_state_dir", "scheduler_off", "LOCK_FILE"]

log = logging.getLogger("sits_observe.wiring")
LOCK_FILE = ".lock"  # in state_dir: the daemon using it holds an exclusive flock on it, its pid written in it


def _state_dir(config: Config) -> Path:
    path = Path(config.state_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"state_dir: cannot create {path}: {exc.strerror}; set state_dir or SITS_STATE_DIR "
                          "to a writable directory") from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"state_dir: {path} is not writable; set state_dir or SITS_STATE_DIR")
    return path


def lock_state_dir(config: Config) -> int:
    """Create state_dir and take the exclusive lock on its :data:`LOCK_FILE`; returns the descriptor, to be closed
    once the daemon has closed.  Two daemons on one state_dir would both write slo.db, deliver the same outbox (each
    page twice) and act on the same placements, so a second one is refused (ConfigError, exit 2).  The lock is the
    kernel's, not the file: a daemon killed leaves the file, and the lock goes with the process."""
    path = _state_dir(config) / LOCK_FILE
    try:  # os.open's descriptors are close-on-exec: a program the daemon starts does not keep the lock
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"state_dir: cannot open {path}: {exc.strerror}; set state_dir or SITS_STATE_DIR "
                          "to a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:  # the holder's pid only names it in the message
            holder = ""
        finally:
            os.close(fd)
        pid = f" (pid {holder})" if holder.isdigit() else ""  # written just after it took the lock: may be empty
        raise ConfigError(f"state_dir {path.parent} is in use by another sits-observe daemon{pid}; stop it, or give "
                          "this one another state_dir (state_dir or SITS_STATE_DIR)") from None
    except OSError as exc:  # a file system without locks (some NFS mounts): nothing to refuse a second daemon with
        log.warning("state_dir: cannot lock %s (%s): a second daemon started on this state_dir would not be refused",
                    path, exc.strerror)
        return fd
    with contextlib.suppress(OSError):  # the pid only names the holder in a second daemon's message
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def scheduler_off(config: Config, topology: object) -> str:
    """Why a daemon runs no scheduler (``topology``: the one it knows, or None)."""
    if not config.scheduler.enabled:
        return "scheduler.enabled is false in this daemon's config"
    if topology is None:
        return (f"no GPU topology is known (gpu.backend {config.gpu.backend}: only nvml, with the driver answering, "
                "and sim give one); set scheduler.enabled: false where no scheduler is wanted")
    return "it is running"


def build_daemon(config: Config) -> Daemon:
    """Sources, consumers and subsystems as the config says (the simulator when gpu.backend is sim)."""
    state = _state_dir(config)
    if config.gpu.backend == "sim":
        clock: WallClock | SimClock = SimClock(config.tick_interval, config.sim.speed, start=time.time(),
                                               keep=state / SIM_CLOCK_FILE)
    else:
        clock = WallClock(config.tick_interval)
    daemon = Daemon(config=config, clock=clock)
    try:
        _add_sources(daemon)
        _add_consumers(daemon)
    except BaseException:  # a part that cannot start after others did: close those (probes, state databases)
        daemon.close()
        raise
    return daemon


def _add_sources(daemon: Daemon) -> None:
    cfg = daemon.config
    if cfg.gpu.backend == "sim":
        from .sim.host import SimulatedHost

        daemon.sim = SimulatedHost(cfg.sim, daemon.layout)
        daemon.topology = daemon.sim.topology
        daemon.sources.append(daemon.sim)
    if cfg.workloads and cfg.probes.enabled:
        from .probes.source import ProbeSource

        daemon.sources.append(ProbeSource(cfg, daemon.layout))
    from .collectors.sources import build_sources
    from .probes.workloads import WorkloadTracker

    resolve = WorkloadTracker(cfg.workloads).workload_of if cfg.workloads else None
    for src in build_sources(cfg, daemon.layout, resolve_workload=resolve):
        daemon.sources.append(src)
        if src.name == "nvml" and daemon.topology is None:
            daemon.topology = _nvml_topology(src)


def _nvml_topology(src: Any) -> Any:
    from .collectors.nvml_driver import started
    from .topology import Topology

    try:
        return started("nvml topology", lambda: Topology.from_nvml(src.nvml))
    except SitsError as exc:
        log.warning("GPU topology unavailable: %s", exc)
        return None


def _add_consumers(daemon: Daemon) -> None:
    cfg = daemon.config
    from .slo.evaluate import SloEngine

    daemon.slo = SloEngine.from_config(cfg)
    if daemon.slo is not None:
        daemon.consumers.append(daemon.slo)
    if cfg.scheduler.enabled and daemon.topology is None:
        log.warning("scheduler: off: %s", scheduler_off(cfg, None))
    if daemon.topology is not None and cfg.scheduler.enabled:
        from .scheduler.engine import Scheduler

        daemon.scheduler = Scheduler(cfg.scheduler, cfg.otlp, daemon.topology, cfg.state_dir, sim=daemon.sim,
                                     annotate=lambda notes: _annotate_firing(daemon, notes),
                                     alerts=lambda: _firing_names(daemon), clock=daemon.clock.now)
        daemon.consumers.append(daemon.scheduler)
    if cfg.rca.enabled:
        from .rca.engine import RcaEngine

        daemon.rca = RcaEngine(cfg.rca, cfg.state_dir,
                               firing=lambda: _firing_names(daemon),
                               annotate=daemon.slo.annotate if daemon.slo else None,
                               on_verdict=daemon.scheduler.on_verdict if daemon.scheduler else None,
                               tick_seconds=cfg.tick_interval)
        # before the scheduler: it sees this tick's verdicts this tick
        daemon.consumers.insert(len(daemon.consumers) - (daemon.scheduler is not None), daemon.rca)


def _firing_names(daemon: Daemon) -> list[str]:
    slo = daemon.slo
    if slo is None:
        return []
    return [spec.name for spec, tier in zip(slo.specs, slo.firing) if tier is not None]


def _annotate_firing(daemon: Daemon, notes: Mapping[str, Any]) -> None:
    """Add the classifier's or scheduler's words to every firing SLO alert."""
    for name in _firing_names(daemon):
        daemon.slo.annotate(name, dict(notes))
