"""eBPF stage probes: in-kernel per-stage latency histograms for the configured workloads.

The C programs live in ``bpf/``; this package probes features, compiles them with bcc, keeps the
tgid -> workload map current, attaches uprobes to the libraries workloads map, and drains the kernel maps
into Frames. ``ProbeSource`` is imported lazily: the config section must not pull in the runtime.
"""

from __future__ import annotations

from typing import Any

from .config import ProbesConfig

__all__ = ["ProbesConfig", "ProbeSource"]


def __getattr__(name: str) -> Any:
    if name == "ProbeSource":
        from .source import ProbeSource

        return ProbeSource
    raise AttributeError(name)
