"""The ``probes:`` config section: which eBPF probes load, the libraries and symbols the uprobes time; and a
``workloads:`` entry (:class:`WorkloadConfig`), the process group whose name the probes' series carry."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ..section import Section

__all__ = [
    "CUDA_STAGES",
    "NCCL_STAGES",
    "ProbeToggle",
    "BlockIoProbe",
    "SyscallsProbe",
    "StageSymbols",
    "UprobeProbe",
    "CudaProbe",
    "NcclProbe",
    "ProbesConfig",
    "WorkloadConfig",
    "MAX_WORKLOADS",
]

# stage -> (timed by default, symbols). Driver API names as exported by libcuda.so.1: cuda.h maps the
# plain names to the _v2 forms and, with per-thread default streams, to the _ptds/_ptsz forms.
CUDA_STAGES: dict[str, tuple[bool, tuple[str, ...]]] = {
    # 10k+ calls/s in real servers and ~5 us per uprobe hit on VMs: opt-in.
    "launch": (False, ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")),
    "h2d": (True, ("cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds",
                   "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz")),
    "d2h": (True, ("cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds",
                   "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz")),
    "sync": (True, ("cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuCtxSynchronize", "cuEventSynchronize")),
    "alloc": (True, ("cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocPitch", "cuMemAllocPitch_v2", "cuMemAllocManaged",
                     "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz")),
}
NCCL_STAGES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "collective": (True, ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast")),
}


# Every /proc entry is matched against each group at every scan: 10,000 groups took 0.26 s a scan of 70
# processes here (a GPU host runs hundreds to thousands), 256 about 7 ms.
MAX_WORKLOADS = 256


class ProbeToggle(Section):
    enabled: bool = True


class BlockIoProbe(ProbeToggle):
    unattributed: str | None = Field(
        "host", description="workload label for IO issued by no configured workload; null: do not time it")


class SyscallsProbe(ProbeToggle):
    attach: Literal["tracepoint", "raw_tracepoint"] = Field(
        "tracepoint", description="syscalls:* tracepoints (only the timed syscalls run a program), or the raw "
        "raw_syscalls ones (cheaper per timed call, but every syscall on the host runs two programs)")


class StageSymbols(Section):
    """Override of one stage; unset fields keep the stage's defaults."""

    enabled: bool | None = None
    symbols: list[str] | None = Field(None, min_length=1)


class UprobeProbe(ProbeToggle):
    """Uprobe/uretprobe pairs on a shared library's symbols, one stage per symbol list."""

    STAGES: ClassVar[dict[str, tuple[bool, tuple[str, ...]]]] = {}
    library: str
    stages: dict[str, StageSymbols] = Field(default_factory=dict)

    @field_validator("library")
    @classmethod
    def _library(cls, v: str) -> str:
        if not v or (not v.startswith("/") and "/" in v):
            raise ValueError("must be a file name (libcuda.so.1) or an absolute path")
        return v

    @field_validator("stages")
    @classmethod
    def _known_stages(cls, v: dict[str, StageSymbols]) -> dict[str, StageSymbols]:
        unknown = sorted(set(v) - set(cls.STAGES))
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r}; stages here are {', '.join(cls.STAGES)}")
        return v

    def timed(self) -> dict[str, tuple[str, ...]]:
        """Enabled stages and their symbols, defaults filled in."""
        out = {}
        for stage, (on, symbols) in self.STAGES.items():
            o = self.stages.get(stage, StageSymbols())
            if (on if o.enabled is None else o.enabled):
                out[stage] = tuple(o.symbols) if o.symbols else symbols
        return out


class CudaProbe(UprobeProbe):
    STAGES: ClassVar[dict[str, tuple[bool, tuple[str, ...]]]] = CUDA_STAGES
    library: str = "libcuda.so.1"


class NcclProbe(UprobeProbe):
    STAGES: ClassVar[dict[str, tuple[bool, tuple[str, ...]]]] = NCCL_STAGES
    library: str = "libnccl.so.2"


class ProbesConfig(Section):
    enabled: bool = Field(True, description="off by itself (said once) when not root or bcc is missing")
    scan_interval: float = Field(2.0, gt=0, le=3600, description="seconds between /proc scans for workloads")
    bpf_stats: bool = Field(False, description="turn on kernel BPF run-time stats while the daemon runs")
    max_processes: int = Field(4096, ge=16, le=1 << 20, description="tracked processes (tgid map size)")
    max_threads: int = Field(65536, ge=64, le=1 << 22, description="threads/requests in flight per probe")
    blocks_per_series: int = Field(
        8, ge=1, le=38, description="histogram map slots per (stage, workload): one per power of two of latency "
        "seen, 8 hold a 256x range at full resolution; events that find the map full are dropped and counted")
    runq: ProbeToggle = Field(default_factory=ProbeToggle)
    syscalls: SyscallsProbe = Field(default_factory=SyscallsProbe)
    block_io: BlockIoProbe = Field(default_factory=BlockIoProbe)
    cuda: CudaProbe = Field(default_factory=CudaProbe)
    nccl: NcclProbe = Field(default_factory=NcclProbe)


class WorkloadConfig(Section):
    """A process group; the label `workload` is its name, never a raw pid."""

    name: str = Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_.-]{0,62}$")
    comm: str | None = Field(None, description="regex on /proc/PID/comm")
    exe: str | None = Field(None, description="executable path")
    cgroup: str | None = Field(None, description="cgroup v2 path prefix")
    pids: list[int] = Field(default_factory=list, description="explicit pids (tests)")

    @model_validator(mode="after")
    def _matches_something(self) -> WorkloadConfig:
        """A group that can match no process was skipped without a word (and its stages never came)."""
        if not (self.comm or self.exe or self.cgroup or self.pids):
            raise ValueError("give at least one of comm, exe, cgroup or pids: without one it matches no process")
        if self.exe is not None and not self.exe.startswith("/"):
            raise ValueError(f"exe: {self.exe!r} is not an absolute path; it is compared with /proc/PID/exe, which "
                             "always is one (give /usr/bin/python3, or match the name with comm)")
        if self.cgroup is not None and not self.cgroup.startswith("/"):
            raise ValueError(f"cgroup: {self.cgroup!r} is not a cgroup v2 path; give one from /proc/PID/cgroup, "
                             "e.g. /system.slice/vllm.service")
        if any(p <= 0 for p in self.pids):
            raise ValueError(f"pids: {self.pids} holds a pid below 1; pids are positive")
        return self

    @field_validator("comm")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc}); escape special characters such as "
                                 "( [ * with a backslash") from None
        return v
