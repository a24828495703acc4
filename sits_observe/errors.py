"""One error hierarchy for the whole daemon.

Every error a user can cause (bad config, bad input, a port in use) is a :class:`ConfigError` and makes
the CLI exit with code 2 and one line naming the file, field and value.  Errors from third-party
libraries (bcc, pynvml, torch, sqlite) are translated at the boundary with ``raise X(...) from exc``.
"""

from __future__ import annotations

__all__ = [
    "SitsError",
    "ConfigError",
    "BucketEdgeError",
    "ProbeError",
    "CollectorError",
    "StillDown",
    "StoreError",
    "StateFileError",
    "DamagedStateError",
    "SloError",
    "AlertingError",
    "ModelError",
    "SchedulerError",
    "SimError",
    "ListenError",
]


class SitsError(Exception):
    """Base class of every error raised by sits-observe."""

    exit_code = 1


class ConfigError(SitsError):
    """A usage or configuration mistake: the message says what, where, and how to fix it."""

    exit_code = 2


class BucketEdgeError(ConfigError):
    """A histogram bucket edge that cannot be used; ``index``, ``reason`` and ``edge`` let a config check place it."""

    def __init__(self, field: str, index: int, reason: str, edge: float) -> None:
        super().__init__(f"{field}[{index}]: {reason}, got {edge}")
        self.index = index
        self.reason = reason
        self.edge = edge


class ProbeError(SitsError):
    """An eBPF probe could not be compiled, loaded, attached or drained."""


class CollectorError(SitsError):
    """A GPU or inference-server source failed to produce its part of a Frame."""


class StillDown(CollectorError):
    """A source that failed is not asked again yet (back-off, between samples): still down, not a new error."""


class ListenError(SitsError):
    """The HTTP port cannot be bound for a reason that may pass (the DNS resolver not answering yet at boot):
    exit code 1, so that systemd starts the daemon again."""


class StoreError(SitsError):
    """The series store refused data (cardinality cap, unknown series)."""


class StateFileError(SitsError):
    """A state database under ``state_dir`` this version cannot use (written by a newer version, or
    damaged): every start would fail the same way until it is moved aside or restored, so the CLI exits
    with code 2 (no restart loop)."""

    exit_code = 2


class DamagedStateError(StateFileError):
    """A state database that is not a database or whose pages are damaged."""


class SloError(SitsError):
    """An SLO could not be evaluated."""


class AlertingError(SitsError):
    """An alert could not be queued or delivered."""


class ModelError(SitsError):
    """The root-cause model file is missing, corrupt or does not match the data."""


class SchedulerError(SitsError):
    """A placement transition was refused or a plan could not be applied."""


class SimError(SitsError):
    """The simulated host was given something it cannot simulate."""
