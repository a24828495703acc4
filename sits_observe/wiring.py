"""Build a :class:`~sits_observe.daemon.Daemon` from a Config: which sources, consumers and actuators.

Each subsystem is imported only when the config enables it, so a host without torch-heavy parts
configured does not pay for them, and a part that cannot start (no NVML, no privileges, no model)
says why once and the daemon runs on without it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .config import Config
from .daemon import Daemon, SimClock, WallClock
from .errors import ConfigError, SitsError

__all__ = ["build_daemon"]

log = logging.getLogger("sits_observe.wiring")


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


def build_daemon(config: Config) -> Daemon:
    """Sources, consumers and subsystems as the config says (the simulator when gpu.backend is sim)."""
    _state_dir(config)
    if config.gpu.backend == "sim":
        clock: WallClock | SimClock = SimClock(config.tick_interval, config.sim.speed, start=time.time())
    else:
        clock = WallClock(config.tick_interval)
    daemon = Daemon(config=config, clock=clock)
    _add_gpu_source(daemon)
    _add_probes(daemon)
    return daemon


def _add_gpu_source(daemon: Daemon) -> None:
    cfg = daemon.config
    if cfg.gpu.backend == "sim":
        from .sim.host import SimulatedHost

        daemon.sim = SimulatedHost(cfg.sim, daemon.layout)
        daemon.topology = daemon.sim.topology
        daemon.sources.append(daemon.sim)


def _add_probes(daemon: Daemon) -> None:
    probes_cfg = getattr(daemon.config, "probes", None)
    if probes_cfg is None or not probes_cfg.enabled or not daemon.config.workloads:
        return
    try:
        from .probes.source import ProbeSource

        daemon.sources.append(ProbeSource(daemon.config, daemon.layout))
    except SitsError as exc:
        log.warning("eBPF probes are off: %s", exc)
