"""eBPF stage probes: in-kernel per-stage latency histograms for the configured workloads.

The C programs live in ``bpf/``; this package probes features, compiles them with bcc, keeps the
tgid -> workload map current, attaches uprobes to the libraries workloads map, and drains the kernel maps
into Frames. Names are imported lazily: ``sits_observe.config`` imports ``probes.config`` while it loads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProbesConfig", "ProbeSource"]


def __getattr__(name: str) -> Any:
    if name == "ProbeSource":
        from .source import ProbeSource

        return ProbeSource
    if name == "ProbesConfig":
        from .config import ProbesConfig

        return ProbesConfig
    raise AttributeError(name)
