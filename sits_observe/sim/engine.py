"""Continuous batching on one shard (vLLM-style), advanced event by event within a tick.

Requests sent to the shard cross the network first (*inbound*, ordered by when they reach the server);
only those that have reached it wait in its queue, count towards its queue limit and show as waiting.
The engine runs iterations back to back: a *prefill* iteration admits waiting requests (FIFO, while the
KV cache has room for their prompts) and produces their first token; otherwise a *decode* iteration
adds one token to every running request.  Between events (an arrival, a request finishing, the tick's
end, a scheduler freeze) the batch is constant, so a run of ``k`` decode iterations is advanced in one
step.  When the KV cache cannot grow by one token per running request, the newest request is preempted
and later recomputed (prefill of its prompt plus what it had generated).  Queueing, batching and tails
come out of this; nothing is drawn at random here.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .perf import MAX_BATCH, PerfModel

__all__ = ["Conditions", "TickStats", "ShardEngine"]

ARRIVAL, REM, CTX, FIRST, SEQ = range(5)  # columns of the running matrix
KV_WATERMARK = 0.99  # admit only while the prompt fits under this share of the cache
MAX_PREFILL_TOKENS = 16384  # tokens per prefill iteration (vLLM max_num_batched_tokens)


@dataclass(slots=True)
class Conditions:
    """What the shard's GPUs, links and CPUs allow during one tick (built from faults and topology)."""

    kv_capacity: float
    prefill_mult: float = 1.0
    decode_mult: float = 1.0
    extra_fixed: float = 0.0  # seconds added to each iteration (collective and copy waits)
    extra_per_token: float = 0.0  # seconds added per token in the iteration (collective bytes)
    host_decode: float = 0.0  # host-side seconds to issue one decode iteration
    host_prefill: float = 0.0
    stall: tuple[float, float, float] | None = None  # (origin, period, frozen seconds) of scheduler freezes


@dataclass(slots=True)
class TickStats:
    """What one shard did during one tick."""

    ingress: list[float] = field(default_factory=list)  # network time of the requests that reached the server
    queue: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    finished_arrival: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    errors: int = 0
    preemptions: int = 0
    tokens: int = 0
    decode_tokens: int = 0
    prefill_iters: int = 0
    decode_iters: int = 0
    prefill_tokens: int = 0
    prefill_gpu_s: float = 0.0
    decode_gpu_s: float = 0.0
    busy_shift: float = 0.0  # GPU seconds of iterations crossing tick edges: carried in minus carried out


def _frozen_until(t: float, stall: tuple[float, float, float]) -> float:
    origin, period, frozen = stall
    phase = (t - origin) % period
    return t + (frozen - phase) if phase < frozen else t


def _next_freeze(t: float, stall: tuple[float, float, float]) -> float:
    origin, period, _ = stall
    return t + period - (t - origin) % period


class ShardEngine:
    """Inbound requests, waiting queue, running batch and KV cache of one shard; ``step`` advances to a time."""

    def __init__(self, perf: PerfModel, start: float, *, timeout: float = 60.0, max_waiting: int = 2048) -> None:
        self.perf = perf
        self.t = start
        self.timeout = timeout
        self.max_waiting = max_waiting
        # entries: [reached the server at, client arrival, context tokens, tokens left, first-token time];
        # inbound ones also carry their network time
        self.inbound: list[list[float]] = []  # a heap: still crossing the network
        self.waiting: deque[list[float]] = deque()  # at the server, not yet admitted
        self.running = np.zeros((0, 5))
        self.kv_used = 0.0
        self.kv_capacity = 0.0
        self._seq = 0
        self._carry = 0.0  # GPU seconds of the last iteration that fall after the last step's end
        self._gpu_share = 0.0  # GPU share of the last iteration's duration

    @property
    def outstanding(self) -> int:
        """Requests sent to this shard and not finished: what a load balancer counts."""
        return len(self.inbound) + len(self.waiting) + len(self.running)

    @property
    def backlog(self) -> int:
        """Requests at the server, waiting or running: what the server's own metrics count."""
        return len(self.waiting) + len(self.running)

    def enqueue(self, arrival: np.ndarray, ingress: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> None:
        """Send requests at ``arrival`` that reach the server ``ingress`` seconds later (a full queue refuses
        them then)."""
        reach = arrival + ingress
        for i in range(len(arrival)):
            heapq.heappush(self.inbound, [float(reach[i]), float(arrival[i]), float(prompt[i]), float(output[i]),
                                          math.nan, float(ingress[i])])

    def _receive(self, t: float, s: TickStats) -> None:
        """Move the requests that have reached the server by ``t`` into its queue (their network time is
        measured there); refuse them when it is full."""
        while self.inbound and self.inbound[0][0] <= t:
            *entry, network = heapq.heappop(self.inbound)
            s.ingress.append(network)
            if len(self.waiting) >= self.max_waiting:
                s.errors += 1
            else:
                self.waiting.append(entry)

    def step(self, t_end: float, c: Conditions) -> TickStats:
        """Run iterations until ``t_end`` (the last one may end a little after it)."""
        s = TickStats()
        t = self.t
        self.kv_capacity = c.kv_capacity
        while t < t_end:
            if c.stall is not None and (resume := _frozen_until(t, c.stall)) > t:
                t = min(resume, t_end)
                continue
            self._receive(t, s)
            self._expire(t, s)
            n, tokens = self._admit(t, c.kv_capacity, s)
            if n:
                t = self._prefill(t, n, tokens, c, s)
                continue
            b = len(self.running)
            if b == 0:
                if self.waiting:  # too large for the cache even alone
                    self.waiting.popleft()
                    s.errors += 1
                    continue
                t = min(self.inbound[0][0], t_end) if self.inbound else t_end
                continue
            if c.kv_capacity - self.kv_used < b:
                self._preempt(t, c.kv_capacity, s)
                continue
            t = self._decode(t, t_end, b, c, s)
        self._receive(t_end, s)
        carry = max(t - t_end, 0.0) * self._gpu_share
        s.busy_shift = self._carry - carry
        self._carry = carry
        self.t = t
        return s

    def _expire(self, t: float, s: TickStats) -> None:
        while self.waiting and self.waiting[0][0] <= t - self.timeout:
            self.waiting.popleft()
            s.errors += 1

    def _admit(self, t: float, cap: float, s: TickStats) -> tuple[int, float]:
        if not self.waiting:
            return 0, 0.0
        rows: list[list[float]] = []
        tokens = 0.0
        room = MAX_BATCH - len(self.running)
        while self.waiting and len(rows) < room:
            enq, arrival, ctx, left, first = self.waiting[0]
            if self.kv_used + tokens + ctx > cap * KV_WATERMARK:
                break
            if rows and tokens + ctx > MAX_PREFILL_TOKENS:
                break
            self.waiting.popleft()
            s.queue.append(t - enq)
            rows.append([arrival, left, ctx, first, self._seq])
            self._seq += 1
            tokens += ctx
        if rows:
            self.running = np.vstack([self.running, np.array(rows)])
            self.kv_used += tokens
        return len(rows), tokens

    def _prefill(self, t: float, n: int, tokens: float, c: Conditions, s: TickStats) -> float:
        gpu = self.perf.prefill_s(n, tokens) * c.prefill_mult + c.extra_fixed + c.extra_per_token * tokens
        dur = max(gpu, c.host_prefill)
        self._gpu_share = gpu / dur
        t += dur
        new = self.running[-n:]
        new[:, FIRST] = np.where(np.isnan(new[:, FIRST]), t, new[:, FIRST])
        new[:, REM] -= 1
        new[:, CTX] += 1
        self.kv_used += n
        s.prefill.extend([dur] * n)
        s.prefill_iters += 1
        s.prefill_tokens += int(tokens)
        s.prefill_gpu_s += gpu
        s.tokens += n
        if new[:, REM].min() <= 0:
            self._finish(t, s)
        return t

    def _decode(self, t: float, t_end: float, b: int, c: Conditions, s: TickStats) -> float:
        gpu = self.perf.decode_table[min(b, MAX_BATCH)] * c.decode_mult + c.extra_fixed + c.extra_per_token * b
        it = max(gpu, c.host_decode)
        self._gpu_share = gpu / it
        first_done = int(self.running[:, REM].min())
        k = min(first_done, int((c.kv_capacity - self.kv_used) // b), math.ceil((t_end - t) / it))
        if self.inbound:  # stop at the next arrival so it can be admitted
            k = min(k, math.ceil((self.inbound[0][0] - t) / it))
        if c.stall is not None:
            k = min(k, math.ceil((_next_freeze(t, c.stall) - t) / it))
        k = max(k, 1)
        t += k * it
        self.running[:, REM] -= k
        self.running[:, CTX] += k
        self.kv_used += k * b
        s.decode_iters += k
        s.tokens += k * b
        s.decode_tokens += k * b
        s.decode_gpu_s += k * gpu
        if k >= first_done:
            self._finish(t, s)
        return t

    def _finish(self, t: float, s: TickStats) -> None:
        done = self.running[:, REM] <= 0
        if not done.any():
            return
        fin = self.running[done]
        s.decode.extend((t - fin[:, FIRST]).tolist())
        s.finished_arrival.extend(fin[:, ARRIVAL].tolist())
        s.finished_at.extend([t] * len(fin))
        self.kv_used -= float(fin[:, CTX].sum())
        self.running = self.running[~done]

    def _preempt(self, t: float, cap: float, s: TickStats) -> None:
        """Recompute preemption: newest first until every running request can grow by one token."""
        while len(self.running) and cap - self.kv_used < len(self.running):
            i = int(np.argmax(self.running[:, SEQ]))
            arrival, left, ctx, first, _ = self.running[i]
            self.running = np.delete(self.running, i, axis=0)
            self.kv_used -= ctx
            self.waiting.appendleft([t, arrival, ctx, left, first])
            s.preemptions += 1
