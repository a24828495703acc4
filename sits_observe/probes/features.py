"""Feature probing before anything is compiled: privileges, bcc, tracefs, kernel headers, BPF stats."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import warnings
from pathlib import Path

__all__ = ["can_load_bpf", "environment_problem", "tracepoint_exists", "raw_syscalls_supported",
           "optional_available", "bpf_stats_enabled", "enable_bpf_stats", "prog_info",
           "prog_run_stats"]

_TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
_NR_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0


_CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 21, 38, 39


def _effective_caps() -> int:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    return next((int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("CapEff:")), 0)


def can_load_bpf() -> bool:
    """Effective CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (what tracing programs need since 5.8)."""
    caps = _effective_caps()
    return bool(caps >> _CAP_SYS_ADMIN & 1) or bool(caps >> _CAP_BPF & 1 and caps >> _CAP_PERFMON & 1)


def environment_problem() -> str | None:
    """Why no probe can load on this machine, or None."""
    if not can_load_bpf():
        return ("no privileges to load eBPF programs (needs root, or CAP_BPF and CAP_PERFMON); "
                "run the daemon as root to get kernel histograms")
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc is not importable; install python3-bpfcc (`make venv` links it into .venv)"
    if own_pid_namespace():
        return ("the daemon runs in a PID namespace of its own (a container without hostPID): the kernel's thread "
                "ids are not the ones its /proc shows, so probes would time other processes; run it in the host's "
                "PID namespace")
    if not any(_is_dir(p / "events") for p in _TRACEFS):
        return ("tracefs is not mounted or not readable (it is root's: mode 700); mount -t tracefs tracefs "
                "/sys/kernel/tracing, and give a non-root daemon CAP_DAC_READ_SEARCH as the shipped unit does")
    build = Path("/lib/modules") / platform.release() / "build"
    if not (build / "include").is_dir():
        return f"no kernel headers at {build}; install linux-headers or run .ci/setup-system.sh"
    return None


def _is_dir(path: Path) -> bool:
    """``path.is_dir()``, False where it cannot be looked at (tracefs is root's, mode 700)."""
    try:
        return path.is_dir()
    except OSError:
        return False


_INIT_PID_NS = 0xEFFFFFFC  # the inode of the host's (initial) PID namespace, fixed by the kernel since 3.8


def own_pid_namespace(ns: str = "/proc/self/ns/pid") -> bool:
    """True when this process runs in a PID namespace other than the host's (a container without hostPID)."""
    try:
        return os.stat(ns).st_ino != _INIT_PID_NS
    except OSError:  # no /proc/self/ns (very old kernels): assume the host's
        return False


def tracepoint_exists(category: str, event: str) -> bool:
    """bcc's ``BPF.tracepoint_exists``; a tracefs look-up where bcc is missing (``probes --list``)."""
    try:
        from bcc import BPF
    except ImportError:
        return any(_is_dir(p / "events" / category / event) for p in _TRACEFS)
    return bool(BPF.tracepoint_exists(category, event))


@functools.cache
def raw_syscalls_supported() -> bool:
    """True when raw tracepoint programs can attach to ``raw_syscalls:sys_enter``/``sys_exit`` (4.17+)."""
    try:
        from bcc import BPF
    except ImportError:
        return False
    with warnings.catch_warnings():  # bcc 0.26 passes str symbol names to its own bytes-only helper
        warnings.simplefilter("ignore", DeprecationWarning)
        supported = bool(BPF.support_raw_tracepoint())
    return supported and all(
        tracepoint_exists("raw_syscalls", ev) for ev in ("sys_enter", "sys_exit"))


def optional_available(macro: str) -> bool:
    """Whether an optional feature is worth trying on this kernel (a load failure still drops it)."""
    return raw_syscalls_supported() if macro == "USE_RAW_TP" else True


def bpf_stats_enabled() -> bool:
    """True when the kernel counts BPF program run time (``kernel.bpf_stats_enabled``)."""
    try:
        return Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip() == "1"
    except OSError:
        return False


def enable_bpf_stats() -> int:
    """Turn BPF run-time stats on for as long as the returned fd stays open (BPF_ENABLE_STATS, 5.8+)."""
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(0, f"BPF_ENABLE_STATS: unknown syscall number on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint32 * 2)(_BPF_STATS_RUN_TIME, 0)
    fd = libc.syscall(nr, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_ENABLE_STATS: {os.strerror(err)}")
    return fd


def prog_info(prog_fd: int) -> dict[str, int]:
    """The integer fields of one loaded program's /proc/self/fdinfo (empty if it cannot be read): ``run_time_ns``
    and ``run_cnt`` (counted while BPF stats are on), ``recursion_misses`` (the field from 5.12; for kprobe and
    tracepoint programs counted from 6.7: how often the kernel did not run the program for its event, because a
    kprobe or tracepoint program was running on that CPU already, its per-CPU ``bpf_prog_active`` guard: e.g. a
    block completion interrupt during a syscall's program)."""
    try:
        text = Path(f"/proc/self/fdinfo/{prog_fd}").read_text()
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k: int(v) for k, v in fields if v.strip().isdigit()}


def prog_run_stats(prog_fd: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of one loaded program, None if not shown."""
    info = prog_info(prog_fd)
    return (info["run_time_ns"], info["run_cnt"]) if "run_time_ns" in info and "run_cnt" in info else None
