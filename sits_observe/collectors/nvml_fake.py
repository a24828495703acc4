"""A stand-in for pynvml: exactly the calls sits_observe.collectors makes, driven by a Topology.

The tests' GPU host (CI has no GPU) and ``bench collectors``'s (which times our code on top of it, the driver's
cost left out); the daemon never imports it, only ``pynvml`` (tests/collectors checks).

Constants and ``NVMLError`` come from the real pynvml, so the collector's error handling runs unchanged; a
pynvml function this fake does not define raises AttributeError (tests/collectors checks the two lists
match).  Values are scripted per GPU in :class:`FakeGpu`; errors are injected per GPU and call name
(``gpu.fail["nvmlDeviceGetPowerUsage"] = NVML_ERROR_NOT_SUPPORTED``), a GPU is lost with ``gpu.lost``, the
library is missing with ``FakeNvml(topology, init_error=NVML_ERROR_LIBRARY_NOT_FOUND)``.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

from sits_observe.topology import LinkKind, Topology

__all__ = ["FakeNvml", "FakeGpu", "FakeLink", "FAKE_CALLS"]

_ANCESTOR = {LinkKind.PCIE_SWITCH: _real.NVML_TOPOLOGY_SINGLE, LinkKind.PCIE_HOST_BRIDGE: _real.NVML_TOPOLOGY_NODE,
             LinkKind.NUMA_INTERCONNECT: _real.NVML_TOPOLOGY_SYSTEM}


def _err(code: int) -> _real.NVMLError:
    return _real.NVMLError(code)


@dataclass
class FakeLink:
    remote_bus: str
    remote_type: int
    up: bool = True
    rx_kib: int = 0  # cumulative data counters, KiB
    tx_kib: int = 0
    counter_error: int | None = None  # NVML code the link's counter fields answer instead


@dataclass
class FakeGpu:
    index: int
    uuid: str
    name: str
    bus_id: str
    numa_node: int
    cpus: tuple[int, ...]
    mem_total: int
    mem_used: int = 20 * 1024**3
    util_gpu: int = 73  # percent
    util_mem: int = 41
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    power_mw: int = 512_345
    temp_c: int = 61
    clock_reasons: int = 0x4 | 0x20  # sw power cap + sw thermal slowdown
    pcie_rx_kb: int = 2_000
    pcie_tx_kb: int = 3_000
    ecc_corrected: int = 5
    ecc_uncorrected: int = 1
    retired_sbe: list[int] = field(default_factory=lambda: [0x1000, 0x2000])
    retired_dbe: list[int] = field(default_factory=lambda: [0x3000])
    remapped_rows: tuple[int, int, int, int] = (2, 1, 0, 0)  # correctable, uncorrectable, pending, failure
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes or None)
    # per-process SM samples NVML holds: (pid, timestamp in microseconds, SM utilization percent)
    process_util: list[tuple[int, int, int]] = field(default_factory=list)
    util_periods: int = 0  # > 0: every call answers that many fresh periods of samples for every process
    links: list[FakeLink] = field(default_factory=list)
    pcie_gen: int = 5
    pcie_width: int = 16
    lost: bool = False
    fail: dict[str, int] = field(default_factory=dict)  # call name -> NVML error code
    fail_once: dict[str, int] = field(default_factory=dict)  # the same, for the next call only


class FakeNvml:
    """A pynvml module look-alike for one host built from ``topology``."""

    def __init__(self, topology: Topology, *, init_error: int | None = None,
                 nvlink_version: int = _real.NVML_NVLINK_VERSION_4_0, switches: int = 4,
                 driver: str = "550.90.07") -> None:
        self.topology = topology
        self.init_error = init_error
        self.nvlink_version = nvlink_version
        self.driver = driver
        self.initialised = 0
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, tuple[Any, ...]]] | None = None  # set to [] to record every call
        self.events: deque[tuple[int, int]] = deque()  # (gpu index, xid) waiting in the event set
        self.gpus = [FakeGpu(g.index, g.uuid, g.model, g.pci_bus_id, g.numa_node, g.cpu_affinity,
                             g.memory_total_bytes) for g in topology.gpus]
        switch_bus = [f"00000000:{0xC0 + k:02X}:00.0" for k in range(switches)]
        for a, fg in enumerate(self.gpus):
            for b in range(topology.n):
                if topology.kinds[a][b] == LinkKind.NVLINK:
                    fg.links += [FakeLink(self.gpus[b].bus_id, _real.NVML_NVLINK_DEVICE_TYPE_GPU)
                                 for _ in range(int(topology.nvlinks[a, b]))]
            to_switch = max((int(topology.nvlinks[a, b]) for b in range(topology.n)
                             if topology.kinds[a][b] == LinkKind.NVSWITCH), default=0)
            fg.links += [FakeLink(switch_bus[k % switches], _real.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                         for k in range(to_switch)]

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "nvmlEventType")) or name == "NVMLError":
            value = getattr(_real, name)
            setattr(self, name, value)  # looked up once, like a module attribute afterwards
            return value
        raise AttributeError(f"FakeNvml does not implement {name}")

    # ---- plumbing ------------------------------------------------------------------------------

    def _enter(self, name: str, handle: Any = None, *args: Any) -> FakeGpu | None:
        self.calls[name] += 1
        if self.log is not None:
            self.log.append((name, (handle, *args) if handle is not None else args))
        if not self.initialised:
            raise _err(_real.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        g = self.gpus[handle.index]
        if g.lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        if name in g.fail:
            raise _err(g.fail[name])
        if name in g.fail_once:
            raise _err(g.fail_once.pop(name))
        return g

    def _link(self, g: FakeGpu, link: int) -> FakeLink:
        if not g.links:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(g.links):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return g.links[link]

    def push_xid(self, gpu: int, xid: int) -> None:
        self.events.append((gpu, xid))

    # ---- library -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise _err(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex", None, index)
        if self.gpus[index].lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetIndex", h).index

    # ---- identity and placement ----------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._enter("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._enter("nvmlDeviceGetName", h).name

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=self._enter("nvmlDeviceGetPciInfo", h).bus_id)

    def nvmlDeviceGetNumaNodeId(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetNumaNodeId", h).numa_node

    def nvmlDeviceGetCpuAffinity(self, h: Any, words: int) -> list[int]:
        g = self._enter("nvmlDeviceGetCpuAffinity", h, words)
        mask = [0] * words
        for c in g.cpus:
            if c < 64 * words:
                mask[c // 64] |= 1 << (c % 64)
        return mask

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: Any, h2: Any) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", h1, h2)
        a, b = h1.index, h2.index
        kind = self.topology.kinds[a][b]
        if kind in _ANCESTOR:
            return _ANCESTOR[kind]
        if kind == LinkKind.NVLINK:  # bridged pairs sit on one board switch
            return _real.NVML_TOPOLOGY_SINGLE
        same = self.gpus[a].numa_node == self.gpus[b].numa_node
        return _real.NVML_TOPOLOGY_NODE if same else _real.NVML_TOPOLOGY_SYSTEM

    # ---- NVLink --------------------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        up = self._link(self._enter("nvmlDeviceGetNvLinkState", h, link), link).up
        return _real.NVML_FEATURE_ENABLED if up else _real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Any, link: int) -> Any:
        return SimpleNamespace(busId=self._link(self._enter("nvmlDeviceGetNvLinkRemotePciInfo", h, link), link).remote_bus)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Any, link: int) -> int:
        return self._link(self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", h, link), link).remote_type

    def nvmlDeviceGetNvLinkVersion(self, h: Any, link: int) -> int:
        self._link(self._enter("nvmlDeviceGetNvLinkVersion", h, link), link)
        return self.nvlink_version

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[tuple[int, int]]) -> list[Any]:
        g = self._enter("nvmlDeviceGetFieldValues", h, ids)
        out = []
        for fid, link in ids:
            ret, value = _real.NVML_SUCCESS, 0
            if not 0 <= link < len(g.links):
                ret = _real.NVML_ERROR_INVALID_ARGUMENT
            elif g.links[link].counter_error is not None:
                ret = g.links[link].counter_error
            elif fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                value = g.links[link].rx_kib
            elif fid == _real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                value = g.links[link].tx_kib
            else:
                ret = _real.NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=fid, scopeId=link, nvmlReturn=ret, value=SimpleNamespace(ullVal=value)))
        return out

    # ---- gauges and counters -------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        g = self._enter("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        g = self._enter("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=g.mem_total, used=g.mem_used, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        g = self._enter("nvmlDeviceGetClockInfo", h, clock)
        return {_real.NVML_CLOCK_SM: g.sm_clock_mhz, _real.NVML_CLOCK_MEM: g.mem_clock_mhz}[clock]

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        assert sensor == _real.NVML_TEMPERATURE_GPU
        return self._enter("nvmlDeviceGetTemperature", h, sensor).temp_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", h).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h).clock_reasons

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        g = self._enter("nvmlDeviceGetPcieThroughput", h, counter)
        return g.pcie_rx_kb if counter == _real.NVML_PCIE_UTIL_RX_BYTES else g.pcie_tx_kb

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        g = self._enter("nvmlDeviceGetTotalEccErrors", h, error_type, counter_type)
        assert counter_type == _real.NVML_VOLATILE_ECC
        return g.ecc_corrected if error_type == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        g = self._enter("nvmlDeviceGetRetiredPages", h, cause)
        single = _real.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(g.retired_sbe if cause == single else g.retired_dbe)

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return self._enter("nvmlDeviceGetRemappedRows", h).remapped_rows

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        g = self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    def nvmlDeviceGetProcessUtilization(self, h: Any, since_us: int) -> list[Any]:
        g = self._enter("nvmlDeviceGetProcessUtilization", h, since_us)
        script = g.process_util + [(pid, since_us + k + 1, 50) for k in range(g.util_periods) for pid, _ in g.processes]
        out = [SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
               for pid, ts, sm in script if ts > since_us]
        if not out:
            raise _err(_real.NVML_ERROR_NOT_FOUND)  # what the driver answers when no sample is newer
        return out

    # ---- XID events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return SimpleNamespace(registered=set())

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents", h, types, event_set)
        event_set.registered.add(h.index)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2", None, event_set, timeout_ms)
        while self.events:
            gpu, xid = self.events.popleft()
            if gpu in event_set.registered:
                return SimpleNamespace(device=SimpleNamespace(index=gpu), eventType=_real.nvmlEventTypeXidCriticalError,
                                       eventData=xid)
        raise _err(_real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree", None, event_set)


FAKE_CALLS = frozenset(n for n in vars(FakeNvml) if n.startswith("nvml"))
