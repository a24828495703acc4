"""NVML source: per-GPU gauges, NVLink per-link state and counters, XID events, per-process memory and SM use.

Reads through pynvml (nvidia-ml-py), passed in as ``nvml`` so tests hand in a fake.  NVML is polled every
``sample_interval`` seconds (default 5: sub-second NVML polling is known to slow inference); the ticks in
between reuse the last sample.  A field the GPU model does not support is NaN for that GPU and is not
asked again; a lost GPU (``NVML_ERROR_GPU_IS_LOST``) is marked unhealthy and reported in ``frame.errors``
while the other GPUs go on; no driver means the source cannot start (one-line :class:`CollectorError`).
A sample runs in a thread of its own (:class:`~.background.Background`): NVML calls take no timeout, and one
that hangs (a GPU off the bus, a wedged driver) holds that thread, not the tick, which waits ``timeout`` at
most; then the GPUs read as missing (the hung call's GPU unhealthy) until it returns (:meth:`_hung`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CollectorError
from ..frame import GPU_FIELD_INDEX, Frame, GpuFrame, Sample
from .background import Background
from .gpu_processes import OTHER_WORKLOAD, Attribution, attribute, process_samples
from .gpu_samples import detail, gpu_sample
from .nvml_driver import SCALARS, clock_event_reasons, is_unsupported, load_nvml, nvml_status
from .nvml_gpus import NvmlGpu, open_gpu
from .nvml_links import link_bytes
from .nvml_xid import XidEvents
from .replicas import ReplicaBoard

__all__ = ["NvmlSource", "nvml_status", "OTHER_WORKLOAD"]  # nvml_status: `doctor` calls it from here

log = logging.getLogger(__name__)

_F = GPU_FIELD_INDEX

SKIP_RECHECK_S = 300.0  # a field a GPU does not support is asked again after this long


class _Lost(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST or NVML_ERROR_RESET_REQUIRED: no call on it will work."""


@dataclass
class _Snapshot:
    at: float
    gpu: GpuFrame
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pids: dict[int, list[int]] = field(default_factory=dict)  # GPU -> its compute processes
    work: set[int] = field(default_factory=set)  # GPUs whose replica had work at the sample


class NvmlSource:
    """A Source (``name = "nvml"``) filling ``frame.gpu`` and per-link / per-process samples."""

    name = "nvml"

    def __init__(self, nvml: Any = None, *, sample_interval: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 resolve_workload: Callable[[int], str | None] | None = None, timeout: float = 2.0,
                 wall_clock: Callable[[], float] = time.time, replicas: ReplicaBoard | None = None) -> None:
        self.nvml = load_nvml(nvml)
        self.replicas = replicas  # servers' backlogs, joined to GPUs through their processes
        self.sample_interval = sample_interval
        self.timeout = timeout  # the longest a tick waits for a sample
        self._sampler: Background[_Snapshot] = Background("nvml sample")
        self._started = ""  # wall time (UTC) the sample out started
        self._late = False  # that sample is out past the timeout: ticks no longer wait for it
        # GPU, what the sample out reads and since when (monotonic): named, and that GPU unhealthy, if it hangs
        self._calling: tuple[int | None, str, float] = (None, "", 0.0)  # "": between calls
        self._t0 = 0.0  # clock() at the sample's start: NVLink counters are timed from it, as read
        self._stop: threading.Event | None = None  # the daemon's, from prefetch(): a stop ends the wait for a sample
        self.clock = clock
        self.wall_clock = wall_clock  # NVML stamps per-process samples with the wall clock
        self.resolve_workload = resolve_workload or (lambda pid: None)
        self._attributes = resolve_workload is not None  # workloads configured: serving / foreign fields
        self._attribution = Attribution()
        self._skip: dict[tuple[int, str], float] = {}  # (gpu, group) the GPU does not support: until when
        self._noted: set[tuple[int, str, int]] = set()  # (gpu, group, code) already logged
        self._lost: set[int] = set()
        self._snap: _Snapshot | None = None
        nv = self.nvml
        self._scalars = [(g, _F[f], getattr(nv, fn), tuple(getattr(nv, a) for a in args), s)
                         for g, f, fn, args, s in SCALARS]
        self._enabled, self._success = nv.NVML_FEATURE_ENABLED, nv.NVML_SUCCESS
        try:
            self.gpus = [open_gpu(nv, i) for i in range(nv.nvmlDeviceGetCount())]
            self.xid = XidEvents(nv, [g.handle for g in self.gpus])
        except nv.NVMLError as exc:
            nv.nvmlShutdown()
            raise CollectorError(f"nvml: cannot list GPUs: {exc}; check `nvidia-smi`") from exc

    # ---- Source --------------------------------------------------------------------------------

    def prefetch(self, stop: threading.Event | None = None) -> None:
        """Start the sample when one is due, so that it runs beside the tick's page fetches; a wait for it ends
        once ``stop`` is set."""
        self._stop = stop
        now = self.clock()
        if not self._sampler.busy and (self._snap is None or now - self._snap.at >= self.sample_interval):
            self._late, self._started = False, time.strftime("%H:%M:%S UTC", time.gmtime(self.wall_clock()))
            self._sampler.start(self.sample, now)

    def collect(self, frame: Frame) -> None:
        replicas, sampler = self.replicas, self._sampler
        self.prefetch(self._stop)  # started already when the tick prefetched (then this starts nothing)
        if sampler.busy:
            if not sampler.wait(0.0 if self._late else self.timeout, self._stop):  # known hung: no wait
                self._hung(frame)
            self._snap = sampler.take()  # the sample's own exception, if it raised, fails this tick
            if replicas:  # which replicas had work when the utilization was sampled
                self._snap.work = {i for i, pids in self._snap.pids.items() if replicas.has_work(pids)}
        snap = self._snap
        frame.gpu = GpuFrame(snap.gpu.info, snap.gpu.values.copy(), snap.gpu.healthy.copy())
        if replicas:  # the utilization is the last sample's: only where the replica had work then and now
            for i in snap.work:
                if replicas.has_work(snap.pids[i]):
                    frame.gpu.values[i, _F["backlog_utilization_ratio"]] = frame.gpu.values[i, _F["utilization_ratio"]]
        frame.samples.extend(snap.samples)
        if snap.errors:
            frame.errors[self.name] = "; ".join(snap.errors)

    def _hung(self, frame: Frame) -> None:
        """The sample out is past the timeout: every GPU reads as missing but for its XID count; the GPU of a call
        out for half the timeout or more is unhealthy.  A sample merely slow (every call quick) blames no GPU."""
        self._late = True
        gpu, what, since = self._calling
        frame.gpu = GpuFrame.empty([g.info for g in self.gpus])
        if self._snap is not None:
            frame.gpu.healthy[:] = self._snap.gpu.healthy
        for i, g in enumerate(self.gpus):  # the XID that explains a hang is kept
            self.xid.fields(i, g.info, frame.gpu.values[i], frame.samples)
        what = what if gpu is None else f"GPU {gpu}, {what}"
        if not what or time.monotonic() - since < self.timeout / 2:
            raise CollectorError(f"nvml: the sample started at {self._started} has not ended within "
                                 f"gpu.nvml_timeout ({self.timeout:g} s), no call hung so far (now: "
                                 f"{what or 'between NVML calls'}); GPU readings are missing until it ends")
        if gpu is not None:
            frame.gpu.healthy[gpu] = False
        raise CollectorError(f"nvml: a call ({what}) has not returned since {self._started}; GPU readings "
                             "are missing until it does (a GPU off the bus or a hung driver: check `nvidia-smi` and "
                             "the kernel log for Xid errors)")

    def close(self) -> None:
        if self._sampler.busy and not self._sampler.wait(self.timeout):  # NVML shut down under a call: undefined
            log.warning("nvml: left without nvmlShutdown: a sample is still out (now: %s)",
                        self._calling[1] or "between NVML calls")
            return
        nv = self.nvml
        try:
            self.xid.close()
        finally:
            nv.nvmlShutdown()

    # ---- one sample ----------------------------------------------------------------------------

    def sample(self, now: float) -> _Snapshot:
        """Read every GPU once (what :meth:`prefetch` starts in its thread every ``sample_interval``)."""
        snap = _Snapshot(now, GpuFrame.empty([g.info for g in self.gpus]))
        self._attribution.start()
        self._calling, self._t0 = (None, "XID events", time.monotonic()), self.clock()
        self.xid.drain(snap.errors)
        self._calling = (None, "", time.monotonic())
        for i, g in enumerate(self.gpus):
            samples: list[Sample] = []
            try:
                self._read(i, g, snap.gpu.values[i], samples, snap)
            except _Lost as lost:
                snap.gpu.values[i] = np.nan
                snap.gpu.healthy[i] = False
                self.xid.fields(i, g.info, snap.gpu.values[i], snap.samples)  # an XID 79: why it fell off the bus
                snap.errors.append(f"GPU {i} ({g.info.uuid}, {g.info.pci_bus_id}) is lost (NVML: "
                                   f"{lost.args[0] if lost.args else 'GPU is lost'}); drain and reset it"
                                   if g.handle is not None else f"GPU {i} could not be opened at start; unhealthy until a "
                                   "restart")
                if i not in self._lost:
                    log.warning("nvml: %s", snap.errors[-1])
                self._lost.add(i)
                continue
            if i in self._lost:
                log.info("nvml: GPU %d answers again", i)
                self._lost.discard(i)
            snap.samples += samples
        if self._attributes and not self._attribution.usable():
            snap.gpu.values[:, [_F["serving_utilization_ratio"], _F["foreign_utilization_ratio"]]] = np.nan
        return snap

    def _get(self, i: int, group: str, snap: _Snapshot, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; None when unsupported (remembered) or failed (reported); _Lost when the GPU is lost."""
        if snap.at < self._skip.get((i, group), -np.inf):
            return None
        nv = self.nvml
        self._calling = (i, group, time.monotonic())
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _Lost("GPU is lost") from exc
            if exc.value == getattr(nv, "NVML_ERROR_RESET_REQUIRED", None):
                raise _Lost("GPU needs a reset") from exc
            if is_unsupported(nv, exc):  # asked again later: MIG turned off, a driver updated, a reset
                self._skip[(i, group)] = snap.at + SKIP_RECHECK_S
                log.debug("nvml: GPU %d does not support %s (%s); omitted", i, group, exc)
                return None
            snap.errors.append(f"GPU {i}: {group}: {exc}")
            if (i, group, exc.value) not in self._noted:
                self._noted.add((i, group, exc.value))
                log.warning("nvml: GPU %d: reading %s failed: %s", i, group, exc)
            return None
        finally:  # what runs after the call (reading /proc for its processes) is no call of this GPU's
            self._calling = (None, "", time.monotonic())

    def _read(self, i: int, g: NvmlGpu, row: np.ndarray, samples: list[Sample], snap: _Snapshot) -> None:
        nv, h = self.nvml, g.handle
        if h is None:
            raise _Lost
        util = self._get(i, "utilization", snap, nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            row[_F["utilization_ratio"]] = util.gpu / 100.0
            row[_F["memory_utilization_ratio"]] = util.memory / 100.0
        mem = self._get(i, "memory", snap, nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            row[_F["memory_used_bytes"]] = mem.used
            row[_F["memory_total_bytes"]] = mem.total
        for group, col, fn, args, scale in self._scalars:
            value = self._get(i, group, snap, fn, h, *args)
            if value is not None:
                row[col] = value * scale
        reasons = self._get(i, "clock_event_reasons", snap, clock_event_reasons, nv, h)
        if reasons is not None:
            row[_F["throttle_reasons"]] = reasons
        sbe = self._get(i, "retired_pages", snap, nv.nvmlDeviceGetRetiredPages, h,
                        nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = self._get(i, "retired_pages", snap, nv.nvmlDeviceGetRetiredPages, h,
                        nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        if sbe is not None and dbe is not None:
            row[_F["retired_pages"]] = len(sbe) + len(dbe)
        rows = self._get(i, "remapped_rows", snap, nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            samples.append(gpu_sample("sits_gpu_remapped_rows", g.info, rows[0], kind="correctable"))
            samples.append(gpu_sample("sits_gpu_remapped_rows", g.info, rows[1], kind="uncorrectable"))
        self.xid.fields(i, g.info, row, samples)
        self._read_nvlink(i, g, row, samples, snap)
        self._read_processes(i, g, row, samples, snap)

    def _read_nvlink(self, i: int, g: NvmlGpu, row: np.ndarray, samples: list[Sample], snap: _Snapshot) -> None:
        if not g.links:
            return
        nv = self.nvml
        for link, labels in zip(g.links, g.link_labels):
            state = self._get(i, "nvlink_state", snap, nv.nvmlDeviceGetNvLinkState, g.handle, link)
            if state is not None:
                samples.append(detail("sits_gpu_nvlink_link_up", labels, state == self._enabled))
        values = self._get(i, "nvlink_counters", snap, nv.nvmlDeviceGetFieldValues, g.handle, g.field_ids)
        read = link_bytes(values or (), self._success, g.link_labels, samples)
        totals, rates = g.nvlink.update(snap.at + self.clock() - self._t0, read)  # as read: a late sample reads late
        row[[_F["nvlink_rx_bytes_total"], _F["nvlink_tx_bytes_total"]]] = totals
        row[[_F["nvlink_rx_bytes_per_second"], _F["nvlink_tx_bytes_per_second"]]] = rates

    def _read_processes(self, i: int, g: NvmlGpu, row: np.ndarray, samples: list[Sample], snap: _Snapshot) -> None:
        procs = self._get(i, "processes", snap, self.nvml.nvmlDeviceGetComputeRunningProcesses, g.handle)
        if procs is None:
            return
        snap.pids[i] = [int(p.pid) for p in procs]
        util = float(row[_F["utilization_ratio"]])
        # both fields or neither (the classifier was trained that way), and serving needs the utilization:
        # without it the per-process samples are not asked for
        per_process = (self._get(i, "process_utilization", snap, process_samples, self.nvml, g.handle,
                                 self.wall_clock(), self.sample_interval)
                       if self._attributes and not np.isnan(util) else None)
        users = attribute(procs, per_process, self.resolve_workload, util)
        for workload, nbytes in sorted(users.memory.items()):
            samples.append(gpu_sample("sits_gpu_process_memory_used_bytes", g.info, nbytes, workload=workload))
        self._attribution.add(bool(len(procs)), users.serving)
        if users.foreign_util is not None:
            row[_F["foreign_utilization_ratio"]] = users.foreign_util
            if users.serving:
                row[_F["serving_utilization_ratio"]] = util
