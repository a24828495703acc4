"""Query parameters of the UI pages (``/load?field=power_watts&range=15m``), checked before any work.

A bad parameter is answered 400 with the parameter, the value and what is allowed; the checks are pure
and cheap, so a flood of bad requests costs no more than parsing them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import parse_qs

from werkzeug.exceptions import BadRequest

__all__ = ["parse_query", "parse_range", "parse_gpu", "parse_choice", "fmt_range", "fmt_gpus"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
MAX_QUERY = 512  # characters; page URLs are short, anything longer is not ours


def parse_query(search: str | None, allowed: Iterable[str], page: str) -> dict[str, str]:
    """``?a=1&b=2`` -> ``{"a": "1", "b": "2"}``; unknown, repeated or oversized parameters -> 400."""
    raw = (search or "").lstrip("?")
    if len(raw) > MAX_QUERY:
        raise BadRequest(f"{page}: query string is {len(raw)} characters; at most {MAX_QUERY} are accepted")
    try:
        parsed = parse_qs(raw, keep_blank_values=True, strict_parsing=bool(raw), max_num_fields=16)
    except ValueError:
        raise BadRequest(f"{page}: malformed query string {raw[:80]!r}; use name=value pairs joined by &") from None
    allowed = tuple(allowed)
    out: dict[str, str] = {}
    for name, values in parsed.items():
        if name not in allowed:
            hint = f"allowed: {', '.join(allowed)}" if allowed else "this page takes no parameters"
            raise BadRequest(f"{page}: unknown parameter {name!r}; {hint}")
        if len(values) > 1:
            raise BadRequest(f"{page}: parameter {name!r} given {len(values)} times; give it once")
        out[name] = values[0]
    return out


def parse_range(raw: str | None, default: float, limit: float) -> float:
    """A time range such as ``900``, ``90s``, ``15m`` or ``1h`` in seconds, at most ``limit``."""
    if raw is None:
        return min(default, limit)
    m = _RANGE.match(raw)
    if not m:
        raise BadRequest(f"range: expected a duration such as 90s, 15m or 1h, got {raw[:40]!r}")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]  # too many digits: inf, more than is kept
    if seconds <= 0:
        raise BadRequest(f"range: must be more than 0 seconds, got {raw[:40]!r}")
    if seconds > limit:
        raise BadRequest(f"range: this daemon keeps {fmt_range(limit)} of history "
                         f"(store.history x tick_interval), got {raw[:40]!r}; ask for at most {fmt_range(limit)}")
    return seconds


def parse_gpu(raw: str | None, gpus: Sequence[int]) -> int | None:
    """A GPU index present on this host (``gpus``: the indices the host reports, not their count)."""
    if raw is None:
        return None
    known = fmt_gpus(gpus)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise BadRequest(f"gpu: expected a GPU index ({known}), got {raw[:40]!r}")
    gpu = int(raw)
    if gpu not in gpus:
        raise BadRequest(f"gpu: no GPU {gpu} on this host; GPUs are {known}")
    return gpu


def fmt_gpus(gpus: Sequence[int]) -> str:
    """``[0..7]`` -> ``0-7``, ``[0, 1, 3]`` -> ``0, 1, 3``."""
    ordered = sorted(gpus)
    if not ordered:
        return "none: no GPU is known"
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def parse_choice(name: str, raw: str | None, choices: Mapping[str, object] | Iterable[str], default: str) -> str:
    """One of ``choices`` (or ``default`` when absent)."""
    if raw is None:
        return default
    options = list(choices)
    if not isinstance(raw, str):
        raise BadRequest(f"{name}: expected a string, got {type(raw).__name__}; choose one of {', '.join(options)}")
    if raw not in options:
        raise BadRequest(f"{name}: unknown value {raw[:40]!r}; choose one of {', '.join(options)}")
    return raw


def fmt_range(seconds: float) -> str:
    """``3600`` -> ``1h``, ``5400`` -> ``90m``, ``45`` -> ``45s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
