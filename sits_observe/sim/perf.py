"""Service times and power from the Splitwise measured performance table (``data/splitwise_perf_model``).

The table (Patel et al., ISCA 2024) holds, per model, hardware and tensor-parallel degree, the measured
prompt (prefill) time over prompt sizes 128-8192 at batch 1 and over batch sizes 1-64 at prompt 512,
the per-token decode time over the same batch sizes, and (A100 rows only) power as a fraction of TDP.
:class:`PerfModel` interpolates it; see docs/simulator.md for the cleaning rules.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ..errors import ConfigError

__all__ = ["ModelSpec", "MODELS", "PerfModel", "hardware_for"]

PERF_TABLE = "data/splitwise_perf_model/perf_model.csv"
MAX_BATCH = 256  # vLLM's default max_num_seqs


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture facts the simulator needs (fp16 weights and KV cache)."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int

    @property
    def weight_bytes(self) -> float:
        return self.params * 2

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer, fp16, all tensor-parallel ranks together."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2


# Llama 2 70B: 80 layers, hidden 8192, grouped-query attention with 8 KV heads of 128 (Touvron et al. 2023).
MODELS = {"llama2-70b": ModelSpec("llama2-70b", 69e9, 80, 8192, 8, 128)}


def hardware_for(gpu_model: str) -> str:
    """Splitwise hardware row for a GPU model name (the PCIe H100 is a power-capped H100)."""
    return "h100-80gb-pcap" if "PCIe" in gpu_model else "h100-80gb"


@functools.cache
def _table() -> list[dict[str, str]]:
    text = resources.files("sits_observe.sim").joinpath(PERF_TABLE).read_text()
    return list(csv.DictReader(text.splitlines()))


def _mean_by(rows: list[dict[str, str]], key: str, value: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``value`` per distinct ``key`` (the table repeats each point five times)."""
    acc: dict[float, list[float]] = {}
    for r in rows:
        acc.setdefault(float(r[key]), []).append(float(r[value]))
    xs = np.array(sorted(acc))
    return xs, np.array([float(np.mean(acc[x])) for x in xs])


def _monotone(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop points that fall more than 10 % below an earlier one (failed or truncated runs)."""
    keep = ys >= 0.9 * np.maximum.accumulate(ys)
    return xs[keep], ys[keep]


class PerfModel:
    """Prefill, decode and power curves of one (model, hardware, tensor_parallel) from the table."""

    def __init__(self, model: str, hardware: str, tp: int) -> None:
        if model not in MODELS:
            raise ConfigError(f"sim: model {model!r} is not simulated; choose one of {', '.join(MODELS)}")
        self.spec = MODELS[model]
        self.tp = tp
        rows = _table()
        mine = [r for r in rows if r["model"] == model and r["hardware"] == hardware
                and int(r["tensor_parallel"]) == tp and int(r["token_size"]) == 128]
        if not mine:
            raise ConfigError(f"{PERF_TABLE}: no rows for model {model}, hardware {hardware}, tensor_parallel {tp}")
        by_prompt = [r for r in mine if r["batch_size"] == "1"]
        by_batch = [r for r in mine if r["prompt_size"] == "512"]
        px, pt = _monotone(*_mean_by(by_prompt, "prompt_size", "prompt_time"))
        bx, bt = _monotone(*_mean_by(by_batch, "batch_size", "prompt_time"))
        dx, dt = _monotone(*_mean_by(by_batch, "batch_size", "token_time"))
        self._logp, self._logpt = np.log(px), np.log(pt / 1e3)
        self._p_slope = (pt[-1] - pt[-2]) / (px[-1] - px[-2]) / 1e3  # s per token beyond the table
        # batch correction: measured batch prefill over the batch-1 curve at the same total tokens
        ratio = np.array([b / 1e3 / self._prefill1(512 * x) for x, b in zip(bx, bt)])
        self._logb, self._ratio = np.log(bx), ratio
        # decode time per iteration for every batch size 0..MAX_BATCH (linear beyond the table)
        sizes = np.arange(MAX_BATCH + 1, dtype=np.float64)
        dec = np.interp(sizes, dx, dt / 1e3)
        slope = (dt[-1] - dt[-2]) / (dx[-1] - dx[-2]) / 1e3
        dec = np.where(sizes > dx[-1], dt[-1] / 1e3 + slope * (sizes - dx[-1]), dec)
        dec[0] = 0.0
        self.decode_table: list[float] = dec.tolist()
        self._power = self._power_curve(rows, model, tp)

    def _prefill1(self, tokens: float) -> float:
        if tokens >= math.exp(self._logp[-1]):
            return float(math.exp(self._logpt[-1]) + self._p_slope * (tokens - math.exp(self._logp[-1])))
        return math.exp(float(np.interp(math.log(max(tokens, 1.0)), self._logp, self._logpt)))

    def prefill_s(self, requests: int, tokens: float) -> float:
        """Seconds for one prefill iteration of ``requests`` prompts totalling ``tokens``."""
        r = float(np.interp(math.log(max(requests, 1)), self._logb, self._ratio))
        return self._prefill1(tokens) * r

    def decode_s(self, batch: int) -> float:
        """Seconds for one decode iteration (one token for each of ``batch`` requests)."""
        return self.decode_table[min(batch, MAX_BATCH)]

    @staticmethod
    def _power_curve(rows: list[dict[str, str]], model: str, tp: int) -> tuple[np.ndarray, np.ndarray, float]:
        # H100 rows carry no power readings; the A100 rows give the fraction of TDP drawn while busy.
        a100 = [r for r in rows if r["model"] == model and r["hardware"] == "a100-80gb"
                and int(r["tensor_parallel"]) == tp and float(r["average_power"]) >= 0.3]
        xs, avg = _mean_by(a100, "batch_size", "average_power")
        _, peak = _mean_by(a100, "batch_size", "peak_power")
        return xs, np.minimum(avg, 1.0), float(min(np.max(peak), 1.0))

    def power_fraction(self, batch: float) -> float:
        """Fraction of TDP drawn while decoding at ``batch`` (held flat beyond the measured batches)."""
        xs, avg, _ = self._power
        return float(np.interp(batch, xs, avg))

    @property
    def prefill_power_fraction(self) -> float:
        """Fraction of TDP drawn during prefill (the measured peak)."""
        return self._power[2]
