"""What ``bench soak`` reads of the daemon it runs (its ``/proc``, the files and tables of its ``state_dir``, its
log) and what it concludes from the samples (:func:`growth`): see :mod:`.soak`."""

from __future__ import annotations

import os
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from .collectors.replicas import listening_ports, namespace_listeners

__all__ = ["CORE", "listens", "proc_status", "state_files", "growths", "growth", "families_changed", "log_counts",
           "last_line"]

CORE = ("rss_mib", "threads", "fds", "series", "state_bytes")  # the quantities every sample has


def proc_status(pid: int) -> dict[str, Any]:
    """The child's memory, threads, open files and CPU seconds, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    if "VmRSS" not in status:  # a zombie: it exited and is not reaped yet
        raise ProcessLookupError(f"/proc/{pid}: the process has exited")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            "rss_peak_mib": round(int(status["VmHWM"].split()[0]) / 1024, 1),
            "threads": int(status["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "cpu_s": round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)}  # utime + stime


def listens(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a socket listening on ``port`` in its network namespace (False once it has exited)."""
    try:
        return port in listening_ports(pid, namespace_listeners(pid, {port}))
    except OSError:
        return False


def state_files(state: Path) -> dict[str, Any]:
    """Bytes of each file under ``state_dir`` and rows of each table of each SQLite database there.  A file the
    daemon removes or renames meanwhile (``sim-clock.<unique>.tmp``, a ``-journal``) is left out; only SQLite files are
    opened (read-only)."""
    files: dict[str, int] = {}
    databases: list[str] = []
    for p in sorted(state.iterdir()):
        try:
            if p.is_file():
                files[p.name] = p.stat().st_size
                with p.open("rb") as f:
                    if f.read(16) == b"SQLite format 3\x00":
                        databases.append(p.name)
        except FileNotFoundError:
            continue
    rows: dict[str, int | None] = {}
    for name in databases:
        try:
            db = sqlite3.connect(f"file:{state / name}?mode=ro", uri=True, timeout=5.0)
            try:
                tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                                   "AND name NOT LIKE 'sqlite_%'")]
                for table in tables:
                    rows[f"{name}/{table}"] = db.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error:  # busy past the timeout: not counted this time, the file size still is
            rows[name] = None
    return {"state_bytes": sum(files.values()), "files": files, "rows": rows}

def _after(samples: list[dict[str, Any]], warmup_h: float) -> list[dict[str, Any]]:
    return [s for s in samples if s["sim_hours"] >= warmup_h]

def growths(samples: list[dict[str, Any]], warmup_h: float, tolerance: float) -> dict[str, dict[str, Any]]:
    """:func:`growth` of every core quantity, file and table row count measured after warm-up."""
    after = [s for s in samples if s["sim_hours"] >= warmup_h]
    if len(after) < 4:
        return {}
    series: dict[str, list[tuple[float, float]]] = {}
    for s in after:
        values = {**{k: s[k] for k in CORE}, **{f"files/{k}": v for k, v in s["files"].items()},
                  **{f"rows/{k}": v for k, v in s["rows"].items()}}
        for k, v in values.items():
            if v is not None:
                series.setdefault(k, []).append((s["sim_hours"], float(v)))
    return {k: growth(points, tolerance) for k, points in series.items() if len(points) >= 4}

def growth(points: list[tuple[float, float]], tolerance: float) -> dict[str, Any]:
    """The last quarter of ``points`` (simulated hour, value) against the first: medians, their difference,
    whether the last quarter's median is more than ``tolerance`` (a fraction of the first's, at least 1 unit) above
    the first's, and the least-squares slope per hour over all of them and over the last quarter alone (near 0:
    what grew has stopped, e.g. a table that reached its cap)."""
    q = max(1, len(points) // 4)
    base = statistics.median(v for _, v in points[:q])
    last = statistics.median(v for _, v in points[-q:])
    return {"baseline": base, "last": last, "change": round(last - base, 3),
            "slope_per_hour": _slope(points), "last_quarter_slope_per_hour": _slope(points[-q:]),
            "grows": last - base > max(tolerance * abs(base), 1.0)}

def _slope(points: list[tuple[float, float]]) -> float:
    hours, values = np.array([h for h, _ in points]), np.array([v for _, v in points])
    return round(float(np.polyfit(hours, values, 1)[0]), 3) if np.ptp(hours) > 0 else 0.0

def families_changed(families: dict[str, dict[str, int]]) -> dict[str, list[int]]:
    """Families whose series count differs between the first sample after warm-up and the last: [first, last]."""
    first, last = families.get("first", {}), families.get("last", {})
    return {k: [first.get(k, 0), last.get(k, 0)] for k in sorted({*first, *last}) if first.get(k) != last.get(k)}

def log_counts(path: Path) -> dict[str, int]:
    counts = {"log_warnings": 0, "log_errors": 0}
    with path.open("rb") as log:
        for line in log:
            counts["log_warnings"] += b" WARNING " in line
            counts["log_errors"] += b" ERROR " in line
    return counts

def last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no output)"
