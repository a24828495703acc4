"""Request arrivals replayed from the Azure LLM inference trace (2023), looped and time-scaled.

Each row of the trace is one request: its timestamp, prompt tokens (``ContextTokens``) and output
tokens (``GeneratedTokens``).  The simulator walks a *trace clock* that runs ``rate`` times faster than
simulated time, so a rate of 2 replays the trace's arrivals twice as densely; at the end it loops.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..yamlfile import read_text

__all__ = ["TRACES", "Trace"]

MAX_TRACE_BYTES = 256 << 20  # the packaged traces are under 1 MiB; Azure's largest published ones about 100 MiB
TRACES = {
    "conv": "data/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "code": "data/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
}
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_YEARS = (1970, 2200)  # nanoseconds since the epoch as int64 reach 2262
_STAMP = re.compile(r"(19[7-9]\d|2[01]\d\d|2200)-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d{1,9})?)?")
MAX_TOKENS = 10_000_000  # a prompt or an output of more tokens than any model's context


@dataclass(frozen=True)
class Trace:
    """Arrival offsets (s from the first request), prompt and output tokens, and the loop period."""

    name: str
    offsets: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    period: float

    @classmethod
    def load(cls, name: str, path: str | None = None) -> Trace:
        """The packaged trace ``name`` (conv|code), or the CSV at ``path`` in the same format."""
        if path is None:
            if name not in TRACES:
                raise ConfigError(f"sim.trace: unknown trace {name!r}; choose one of {', '.join(TRACES)}")
            text = resources.files("sits_observe.sim").joinpath(TRACES[name]).read_text()
            return cls._parse(name, text, f"packaged trace {name}")
        text = read_text(path, MAX_TRACE_BYTES, "sim.trace_path", "trace file",
                         f"give an Azure LLM trace CSV or unset it to use the packaged {', '.join(TRACES)} traces")
        return cls._parse(Path(path).name, text, f"sim.trace_path: {path}")

    @classmethod
    def _parse(cls, name: str, text: str, where: str) -> Trace:
        rows = csv.reader(text.splitlines())
        header = next(rows, [])
        if tuple(h.strip() for h in header[:3]) != COLUMNS:
            raise ConfigError(f"{where}: header must start with {','.join(COLUMNS)}, got {','.join(header)!r}")
        stamps, prompt, output = [], [], []
        for line, row in enumerate(rows, start=2):
            try:
                if not _STAMP.match(row[0].strip()):  # numpy read "1700000000" as a year, then overflowed
                    raise ValueError("not a date and time")
                stamps.append(np.datetime64(row[0].strip().replace(" ", "T"), "ns"))
                prompt.append(int(row[1]))
                output.append(int(row[2]))
            except (ValueError, IndexError):
                raise ConfigError(f"{where}: line {line}: expected timestamp,int,int (a timestamp as "
                                  f"2023-11-16 18:15:46.68, years {_YEARS[0]}-{_YEARS[1]}), got "
                                  f"{','.join(row)[:120]!r}") from None
            for field, tokens in (("ContextTokens", prompt[-1]), ("GeneratedTokens", output[-1])):
                if not 0 <= tokens <= MAX_TOKENS:  # 0 is taken as 1; below, or past int64, makes no request
                    raise ConfigError(f"{where}: line {line}: {field} must be 0 to {MAX_TOKENS:,} tokens, got {tokens}")
        if len(stamps) < 2:
            raise ConfigError(f"{where}: needs at least two requests, got {len(stamps)}")
        ts = (np.array(stamps) - stamps[0]).astype(np.int64) / 1e9
        order = np.argsort(ts, kind="stable")
        ts = ts[order] - ts[order][0]  # from the earliest request, whichever row it is on
        if ts[-1] < 1.0:  # replayed in a loop of its own length: a shorter one would loop without end in a tick
            raise ConfigError(f"{where}: its requests span {ts[-1]:g} s; a trace must span at least 1 s")
        gap = float(ts[-1] / (len(ts) - 1))
        return cls(name, ts, np.maximum(np.array(prompt)[order], 1), np.maximum(np.array(output)[order], 1),
                   float(ts[-1]) + gap)

    def window(self, tau0: float, tau1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Requests with trace time in ``[tau0, tau1)``: (trace times, prompt tokens, output tokens)."""
        taus, idx = [], []
        k = int(tau0 // self.period)
        while k * self.period < tau1:
            base = k * self.period
            lo = int(np.searchsorted(self.offsets, tau0 - base, side="left"))
            hi = int(np.searchsorted(self.offsets, tau1 - base, side="left"))
            if hi > lo:
                taus.append(self.offsets[lo:hi] + base)
                idx.append(np.arange(lo, hi))
            k += 1
        if not taus:
            empty = np.zeros(0)
            return empty, empty.astype(np.int64), empty.astype(np.int64)
        sel = np.concatenate(idx)
        return np.concatenate(taus), self.prompt[sel], self.output[sel]
