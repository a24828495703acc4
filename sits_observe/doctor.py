"""`sits-observe doctor`: what the eBPF and GPU parts need, with a mark and a fix for each.

Exit 0 when eBPF can run, 1 otherwise.  Checks only read the system; they change nothing.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CollectorError

__all__ = ["register", "Check", "run_checks"]

CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN = 39, 38, 21


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed_for_ebpf: bool = True


def _caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _privileges() -> Check:
    caps = _caps()
    has = lambda bit: bool(caps >> bit & 1)  # noqa: E731
    ok = os.geteuid() == 0 or (has(CAP_BPF) and has(CAP_PERFMON)) or has(CAP_SYS_ADMIN)
    detail = "root" if os.geteuid() == 0 else f"CAP_BPF={has(CAP_BPF)} CAP_PERFMON={has(CAP_PERFMON)}"
    return Check("privileges", ok, detail, "run as root or grant CAP_BPF,CAP_PERFMON (see docs/sits-observe.service)")


def _kernel() -> Check:
    rel = platform.release()
    m = re.match(r"(\d+)\.(\d+)", rel)
    ok = bool(m) and (int(m.group(1)), int(m.group(2))) >= (5, 8)
    return Check("kernel", ok, rel, "kernel 5.8 or newer is needed (CAP_BPF, BPF_MAP_TYPE_PERCPU_HASH batch ops)")


def _btf() -> Check:
    ok = Path("/sys/kernel/btf/vmlinux").exists()
    return Check("btf", ok, "/sys/kernel/btf/vmlinux" if ok else "missing",
                 "use a kernel built with CONFIG_DEBUG_INFO_BTF=y", needed_for_ebpf=False)


def _tracefs() -> Check:
    for path in ("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"):
        try:
            if Path(path).is_dir():
                return Check("tracefs", True, path)
        except PermissionError:  # mode 0700 for a user: doctor stopped with an error instead of saying so
            return Check("tracefs", False, f"{path}: not readable by this user",
                         "run as root, or with CAP_DAC_READ_SEARCH (the shipped unit grants it)")
    return Check("tracefs", False, "not mounted", "mount -t tracefs tracefs /sys/kernel/tracing")


def _headers() -> Check:
    rel = platform.release()
    build = Path(f"/lib/modules/{rel}/build")
    if not (build / "include").exists():
        return Check("kernel headers", False, f"{build} missing",
                     "install your kernel's headers (Debian: linux-headers-$(uname -r)); `make demo` links "
                     "linux-headers-amd64 on VMs without packaged headers")
    target = build.resolve().name
    match = rel in target
    detail = f"{build} -> {target}" + ("" if match else f" (older than the running kernel {rel}: tracepoint args only)")
    return Check("kernel headers", True, detail)


def _bcc() -> Check:
    try:
        import bcc  # noqa: F401
    except Exception as exc:  # ImportError or a broken libbcc
        return Check("bcc", False, f"not importable: {exc}",
                     "apt-get install python3-bpfcc and expose it to the venv (`make` does)")
    return Check("bcc", True, "importable")


def _probe_sources() -> Check:
    """The probes' C: in the checkout's bpf/, or sits_observe/bpf in an installed wheel (a copy without it loads
    no probe, which only the daemon's log said, one probe at a time)."""
    from .probes.specs import BPF_DIR, SPECS, source_files

    fix = "reinstall sits-observe (its wheel carries the C as sits_observe/bpf) or restore bpf/ in the checkout"
    programs = [BPF_DIR / name for name in sorted({spec.path.name for spec in SPECS.values()})]
    missing = [p for p in programs if not p.is_file()]
    try:
        for program in (p for p in programs if p.is_file()):
            list(source_files(program, missing))  # the local files it includes, theirs too: those not there
    except OSError as exc:
        return Check("probe C", False, f"{BPF_DIR}: {exc.strerror or exc}", fix)
    if missing:
        return Check("probe C", False, f"{BPF_DIR}: missing {', '.join(p.name for p in missing)}", fix)
    return Check("probe C", True, str(BPF_DIR))


def _nvml() -> Check:
    try:
        from .collectors.nvml import nvml_status
        from .collectors.nvml_driver import started
    except ImportError:
        return Check("nvml", False, "collector not installed", "", needed_for_ebpf=False)
    try:
        ok, detail = started("nvml", nvml_status)  # a driver hung by a GPU off the bus must not hang doctor
    except CollectorError as exc:
        ok, detail = False, str(exc)
    return Check("nvml", ok, detail, "install the NVIDIA driver (libnvidia-ml.so.1)", needed_for_ebpf=False)


def _library(name: str, soname: str) -> Callable[[], Check]:
    def check() -> Check:
        path = ctypes.util.find_library(name)
        return Check(soname, bool(path), path or "not found",
                     f"install {soname} or set its path in the probes config", needed_for_ebpf=False)

    return check


CHECKS: tuple[Callable[[], Check], ...] = (
    _privileges, _kernel, _btf, _tracefs, _headers, _bcc, _probe_sources, _nvml,
    _library("cuda", "libcuda.so.1"), _library("nccl", "libnccl.so.2"),
)


def run_checks() -> list[Check]:
    return [c() for c in CHECKS]


def _doctor(args: argparse.Namespace) -> int:
    checks = run_checks()
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.needed_for_ebpf else "--  ")
        line = f"[{mark}] {c.name:15} {c.detail}"
        if not c.ok and c.fix:
            line += f"\n        fix: {c.fix}"
        print(line)
    ebpf = all(c.ok for c in checks if c.needed_for_ebpf)
    print(f"eBPF probes: {'can run' if ebpf else 'cannot run (see FAIL lines)'}")
    return 0 if ebpf else 1


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check what the eBPF and GPU parts need")
    p.set_defaults(func=_doctor)
