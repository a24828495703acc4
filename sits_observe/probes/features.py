"""Feature probing before anything is compiled: privileges, bcc, tracefs, kernel headers, BPF stats."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import warnings
from pathlib import Path

__all__ = ["can_load_bpf", "environment_problem", "tracepoint_exists", "raw_syscalls_supported",
           "optional_available", "bpf_stats_enabled", "enable_bpf_stats", "prog_run_stats",
           "prog_recursion_misses"]

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


def _prog_info(prog_fd: int, *names: str) -> tuple[int, ...] | None:
    """The integer fields ``names`` of one loaded program from /proc/self/fdinfo, None if one is not shown."""
    try:
        text = Path(f"/proc/self/fdinfo/{prog_fd}").read_text()
    except OSError:
        return None
    vals = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        return tuple(int(vals[n]) for n in names)
    except (KeyError, ValueError):
        return None


def prog_run_stats(prog_fd: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of one loaded program, None if not shown."""
    got = _prog_info(prog_fd, "run_time_ns", "run_cnt")
    return None if got is None else (got[0], got[1])


def prog_recursion_misses(prog_fd: int) -> int | None:
    """How often the kernel did not run one loaded program for its event (5.12+, else None): a kprobe, uprobe or
    tracepoint program is skipped when its event fires on a CPU where such a program is running already (the
    per-CPU ``bpf_prog_active`` guard), e.g. a block completion interrupt arriving during a syscall's program."""
    got = _prog_info(prog_fd, "recursion_misses")
    return None if got is None else got[0]
