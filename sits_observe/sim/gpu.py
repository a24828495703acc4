"""Per-GPU physical state: power, a first-order thermal model with a clock controller, and the gauges.

Power is idle power plus the busy share of the dynamic range, scaled by the Splitwise power fraction
of the work being done and by the square of the clock ratio.  The die temperature relaxes towards
``inlet + R * power`` with time constant ``TAU``; above ``T_SLOWDOWN`` the controller lowers the SM
clock (NVML's HW thermal slowdown), which lowers power and slows compute (:mod:`.mechanics`).  Under a
board power limit below TDP (:class:`.variation.HostVariation`) the clock also drops as far as the limit
needs (NVML's SW power cap).
A ``thermal_throttling`` fault raises the inlet temperature and the thermal resistance (failed fan,
blocked airflow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from ..frame import GPU_FIELD_INDEX, THROTTLE_REASONS, GpuFrame, GpuInfo
from ..topology import LinkKind, Topology
from .variation import NOMINAL, HostVariation

__all__ = ["GpuSpec", "spec_for", "INPUTS", "GpuInputs", "GpuModel"]

T_SLOWDOWN = 87.0  # deg C where the HW slowdown starts lowering clocks
T_SW_THERMAL = 85.0  # deg C where the driver reports SW thermal slowdown
CLOCK_GAIN = 0.06  # clock ratio lost per degree above T_SLOWDOWN
CLOCK_MIN = 0.35
CLOCK_TAU = 2.0  # s, clock controller response
TAU = 40.0  # s, die thermal time constant
COOLING_INLET = 12.0  # deg C inlet rise at thermal fault severity 1
COOLING_RESISTANCE = 2.5  # extra thermal resistance (x) at severity 1

_BITS = {name: bit for bit, name in THROTTLE_REASONS}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    tdp: float
    idle_w: float
    sm_hz: float
    idle_sm_hz: float
    mem_hz: float
    resistance: float  # K/W from die to inlet air
    inlet: float


SXM = GpuSpec(700.0, 70.0, 1980e6, 345e6, 2619e6, 0.065, 28.0)  # H100 SXM5 80GB HBM3
PCIE = GpuSpec(350.0, 45.0, 1755e6, 345e6, 1593e6, 0.15, 30.0)  # H100 PCIe 80GB HBM2e, passive cooling


def spec_for(model: str) -> GpuSpec:
    return PCIE if "PCIe" in model else SXM


INPUTS = ("busy", "activity", "mem_activity", "memory_used", "pcie_rx", "pcie_tx", "nvlink_rx", "nvlink_tx")
_ROW = {name: i for i, name in enumerate(INPUTS)}


class GpuInputs:
    """What the GPUs did during one tick: a row per quantity of ``INPUTS``, a column per GPU.

    ``busy`` is the share of the tick our kernels ran, ``activity`` the busy share weighted by the
    power fraction of the work, ``memory_used`` bytes, the link rows bytes per second; ``serving`` marks
    the GPUs a serving process uses (a shard placed there, or weights loading onto it), ``backlog`` those
    whose replica has requests waiting or running at the tick's end.
    """

    def __init__(self, n: int) -> None:
        self.m = np.zeros((len(INPUTS), n))
        self.serving = np.zeros(n, dtype=bool)
        self.backlog = np.zeros(n, dtype=bool)

    def add(self, gpus: list[int], values: np.ndarray) -> None:
        """Add ``values`` (one per ``INPUTS`` row) to each GPU of ``gpus``, which a serving process uses."""
        self.m[:, gpus] += values[:, None]
        self.serving[gpus] = True

    def row(self, name: str) -> np.ndarray:
        return self.m[_ROW[name]]


class GpuModel:
    """Temperature, clock ratio and cumulative NVLink counters of every GPU of a topology."""

    def __init__(self, topology: Topology, variation: HostVariation = NOMINAL) -> None:
        self.topology = topology
        self.specs = [spec_for(g.model) for g in topology.gpus]
        self.info = tuple(GpuInfo(g.index, g.uuid, g.model, g.pci_bus_id) for g in topology.gpus)
        self._arr = {k: np.array([getattr(s, k) for s in self.specs]) for k in (f.name for f in fields(GpuSpec))}
        self._arr["inlet"] = self._arr["inlet"] + variation.inlet_offset
        self._arr["resistance"] = self._arr["resistance"] * variation.resistance_scale
        self._limit = self._arr["tdp"] * variation.power_limit
        self.temp = self._arr["inlet"] + self._arr["resistance"] * self._arr["idle_w"]
        self._thermal_clock = np.ones(topology.n)  # where the thermal controller has brought the SM clock
        self.clock = np.ones(topology.n)  # SM clock ratio in effect: thermal state, then the power limit
        self.total = np.array([float(g.memory_total_bytes) for g in topology.gpus])
        self.nvlink_bw = np.array([
            max((topology.bandwidth[i, j] for j in range(topology.n)
                 if topology.kinds[i][j] in (LinkKind.NVLINK, LinkKind.NVSWITCH)), default=0.0)
            for i in range(topology.n)])
        self._nvl_total = np.zeros((topology.n, 2))

    def step(self, dt: float, x: GpuInputs, steal: np.ndarray, cooling: np.ndarray) -> GpuFrame:
        """Advance the thermal state by ``dt`` and return the tick's GPU gauges."""
        a = self._arr
        cotenant = (steal > 0).astype(float)
        util = np.clip(x.row("busy") + cotenant, 0.0, 1.0)
        act = np.clip(x.row("activity") + steal, 0.0, 1.0)
        thermal = np.clip(1.0 - CLOCK_GAIN * (self.temp - T_SLOWDOWN), CLOCK_MIN, 1.0)
        demand = (a["tdp"] - a["idle_w"]) * act  # dynamic power at full clock
        fits = np.divide(self._limit - a["idle_w"], demand, out=np.ones_like(demand), where=demand > 0)
        capped = np.sqrt(np.clip(fits, CLOCK_MIN**2, 1.0))  # the clock whose power fits under the limit
        self._thermal_clock += (thermal - self._thermal_clock) * (1.0 - math.exp(-dt / CLOCK_TAU))
        self.clock = np.minimum(self._thermal_clock, capped)  # the power controller acts within the tick
        power = a["idle_w"] + demand * self.clock**2
        steady = a["inlet"] + COOLING_INLET * cooling + a["resistance"] * (1 + COOLING_RESISTANCE * cooling) * power
        self.temp += (steady - self.temp) * (1.0 - math.exp(-dt / TAU))
        self._nvl_total += np.stack([x.row("nvlink_rx"), x.row("nvlink_tx")], axis=1) * dt
        idle = util < 0.01
        hot = (self._thermal_clock < 0.98) & (self._thermal_clock <= capped)  # heat, not the power limit
        reasons = (np.where(idle, _BITS["gpu_idle"], 0)
                   | np.where(self.temp > T_SW_THERMAL, _BITS["sw_thermal_slowdown"], 0)
                   | np.where(hot, _BITS["hw_thermal_slowdown"], 0)
                   | np.where(power >= 0.98 * self._limit, _BITS["sw_power_cap"], 0))
        g = GpuFrame.empty(self.info)
        cols = {
            "utilization_ratio": util,
            "serving_utilization_ratio": np.where(x.serving, util, np.nan),
            "backlog_utilization_ratio": np.where(x.backlog, util, np.nan),
            "foreign_utilization_ratio": steal,  # the co-tenant's time share, as NVML samples it per process
            "memory_utilization_ratio": np.clip(x.row("mem_activity") + 0.5 * steal, 0.0, 1.0),
            "memory_used_bytes": np.minimum(x.row("memory_used"), self.total),
            "memory_total_bytes": self.total,
            "sm_clock_hertz": np.where(idle, a["idle_sm_hz"], a["sm_hz"] * self.clock),
            "memory_clock_hertz": a["mem_hz"],
            "power_watts": power,
            "temperature_celsius": self.temp,
            "throttle_reasons": reasons.astype(float),
            "pcie_rx_bytes_per_second": x.row("pcie_rx"),
            "pcie_tx_bytes_per_second": x.row("pcie_tx"),
            "nvlink_rx_bytes_per_second": x.row("nvlink_rx"),
            "nvlink_tx_bytes_per_second": x.row("nvlink_tx"),
            "nvlink_rx_bytes_total": self._nvl_total[:, 0],
            "nvlink_tx_bytes_total": self._nvl_total[:, 1],
            "xid_errors_total": 0.0,
            "ecc_corrected_errors_total": 0.0,
            "ecc_uncorrected_errors_total": 0.0,
            "retired_pages": 0.0,
        }
        for name, col in cols.items():
            g.values[:, GPU_FIELD_INDEX[name]] = col
        return g
