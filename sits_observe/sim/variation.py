"""How one simulated host differs from its topology preset where real fleets differ without any fault.

Two hosts of the same SKU run at different temperatures (rack position, inlet air, fan curves), some
have a lower power limit set (``nvidia-smi -pl``), each runs its own share of other work on its
CPUs, and some route requests by session (prefix-cache affinity) rather than to the least-loaded
replica, so one replica can sit idle while the others queue.  None of this is a fault, so a root-cause
model trained on one nominal box learns to call a warm GPU "thermal" or a power-capped one "saturated";
the dataset generator (``rca dataset --vary``) draws a :class:`HostVariation` per simulated host so that
such levels are seen on healthy hosts too.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostVariation", "NOMINAL"]


@dataclass(frozen=True, slots=True)
class HostVariation:
    """Departures from the preset's GPU spec, CPU load and request routing (the defaults change nothing)."""

    inlet_offset: float = 0.0  # deg C added to the inlet air temperature
    resistance_scale: float = 1.0  # factor on the die-to-air thermal resistance
    power_limit: float = 1.0  # board power limit as a share of TDP; clocks drop to stay under it
    background_cpu: float = 0.0  # share of every NUMA node's CPUs busy with other work
    affinity: float = 0.0  # share of requests a session-affine router sends to their session's replica, busy or not


NOMINAL = HostVariation()
