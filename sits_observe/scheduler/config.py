"""Config sections ``scheduler:`` (triggers, placement strategy, actuator, shards) and ``otlp:``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from ..collectors.config import check_url
from ..errors import ConfigError
from ..section import Section, SigningKey
from ..validation import elsewhere, url_origin
from .bodies import shown

__all__ = ["MAX_ID_CHARS", "MAX_TEXT_CHARS", "TOO_LONG", "OTLP_EXAMPLE", "STRATEGIES", "ScoreWeights", "ShardSpec",
           "WebhookActuatorConfig", "CommandActuatorConfig", "SchedulerConfig", "OtlpConfig", "long_text",
           "otlp_endpoint"]

OTLP_EXAMPLE = "http://127.0.0.1:4318"  # an OTLP/HTTP collector's base URL (the port of gRPC: 4317)


class ScoreWeights(Section):
    """Weights of the placement score terms (each term is in [0, 1], higher is better)."""

    @model_validator(mode="after")
    def _not_all_zero(self) -> ScoreWeights:
        if not any(getattr(self, k) > 0 for k in type(self).model_fields):
            raise ValueError("all weights are 0: every GPU set would score the same, so no move would ever gain "
                             "and a verdict's move would land anywhere; give at least one term a weight above 0")
        return self

    comm: float = Field(ge=0, description="link bandwidth inside the set, scaled by the shard's comm intensity")
    memory: float = Field(ge=0, description="snug memory fit: little free memory stranded on the chosen GPUs")
    load: float = Field(ge=0, description="headroom: low utilization and memory use on the chosen GPUs after the move")
    balance: float = Field(ge=0, description="low spread of utilization across all GPUs after the move")
    numa: float = Field(ge=0, description="chosen GPUs on one NUMA node (the shard's own node when it has one)")


# Strategy presets: the name picks the weights; ``scheduler.weights`` overrides them.
STRATEGIES: dict[str, ScoreWeights] = {
    "topology-aware": ScoreWeights(comm=4, memory=1, load=2, balance=1, numa=2),
    "latency-aware": ScoreWeights(comm=2, memory=0.5, load=4, balance=1, numa=1),
    "pack": ScoreWeights(comm=1, memory=4, load=0.5, balance=0, numa=1),
    "spread": ScoreWeights(comm=1, memory=0, load=2, balance=4, numa=0.5),
}


MAX_ID_CHARS = 63  # a shard id's length, at most
MAX_SHARD_GPUS = 64  # a shard's GPUs, at most

MAX_TEXT_CHARS = 256  # a shard's free text (model, workload, tenant), at most
TOO_LONG = f"at most {MAX_TEXT_CHARS} characters (shorten it: it is repeated in every shard list, plan and span)"

# 1 PiB: far above any GPU, and exact as a float (the placement maths is float64; a larger int overflows it)
MAX_MEMORY_PER_GPU = 2**50


class ShardSpec(Section):
    """A unit of a model deployment placed on a set of GPUs (a replica or a tensor-parallel group).

    Strict (as the simulator's fault targets): a value of another JSON/YAML type is refused, not converted (lax,
    ``true``, ``"2"`` and ``2.0`` were all taken for a number of GPUs, ``true`` for GPU 1); an integer is taken
    where a fraction belongs."""

    model_config = ConfigDict(strict=True)
    id: str = Field(pattern=rf"^[a-zA-Z0-9_][a-zA-Z0-9_.:-]{{0,{MAX_ID_CHARS - 1}}}$")
    model: str = ""
    workload: str = "default"
    gpus: int = Field(1, ge=1, le=MAX_SHARD_GPUS, description="GPUs needed")
    memory_per_gpu: int = Field(0, ge=0, le=MAX_MEMORY_PER_GPU,
                                description="bytes of device memory needed on each GPU")
    comm_intensity: float = Field(0.0, ge=0, le=1, description="0 = independent replicas, 1 = chatty TP group")
    tenant: str = "default"
    priority: int = Field(0, ge=0, le=100)
    numa_node: int | None = Field(None, ge=0, description="NUMA node of the workload's CPUs, if pinned")
    placement: list[int] | None = Field(None, description="GPUs it already runs on (adopted as is)")

    @field_validator("placement", mode="before")
    @classmethod
    def _placement_length(cls, v: object, info: ValidationInfo) -> object:
        """A list longer than any shard is refused whole, before its items are checked: each bad item was an error
        of its own (a 1 MiB body of ``"1"`` answered a 17 MB 400, after seconds of CPU)."""
        if isinstance(v, list) and len(v) > MAX_SHARD_GPUS:
            k = info.data.get("gpus")
            raise ValueError(f"must list {k if isinstance(k, int) else f'at most {MAX_SHARD_GPUS}'} distinct GPU "
                             "indices (the shard's 'gpus')")
        return v

    @field_validator("placement")
    @classmethod
    def _placement_size(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        k = info.data.get("gpus")
        if v is not None and k is not None and (len(v) != k or len(set(v)) != k):
            raise ValueError(f"must list {k} distinct GPU indices (the shard's 'gpus')")
        return v


def long_text(spec: ShardSpec) -> str | None:
    """The first of ``spec``'s free-text fields (model, workload, tenant) past :data:`MAX_TEXT_CHARS`, None when none
    is.  Checked where a shard comes in (the API, the config), not as a field limit: shards stored in
    ``scheduler.sqlite`` before the limit still load (a 900 kB ``model`` was taken)."""
    return next((name for name in ("model", "workload", "tenant") if len(getattr(spec, name)) > MAX_TEXT_CHARS), None)


class WebhookActuatorConfig(Section):
    url: str | None = Field(None, description="orchestrator endpoint receiving the signed plan JSON")
    secret: SigningKey | None = Field(None, description="HMAC-SHA256 key for the X-Sits-Signature header")
    timeout: float = Field(5.0, gt=0, le=60)
    retries: int = Field(3, ge=0, le=10)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v, "https://orchestrator.example/reshard")


class CommandActuatorConfig(Section):
    argv: list[str] = Field(default_factory=list, description="program and arguments; plan JSON on stdin")
    timeout: float = Field(60.0, gt=0, le=3600)

    @field_validator("argv")
    @classmethod
    def _program(cls, v: list[str], info: ValidationInfo) -> list[str]:
        """The program must exist and be executable now (a missing one would fail only at the first re-shard)."""
        if not v or elsewhere(info):
            return v
        found = shutil.which(v[0]) if "/" not in v[0] else v[0]
        if found is None:
            why = "not found on PATH; give its absolute path"
        elif not os.path.exists(found):
            why = "does not exist; give the path of the program to run"
        elif os.path.isdir(found) or not os.access(found, os.X_OK):
            why = "is not executable; chmod +x it or run it through its interpreter (e.g. [python3, script.py])"
        else:
            return v
        raise ValidationError.from_exception_data("argv", [InitErrorDetails(
            type=PydanticCustomError("program", "program " + why), loc=(0,), input=v[0])])


class SchedulerConfig(Section):
    enabled: bool = True
    strategy: Literal["topology-aware", "latency-aware", "pack", "spread"] = "topology-aware"
    weights: ScoreWeights | None = Field(None, description="override the strategy's weights (terms not given keep it)")
    webhook: WebhookActuatorConfig = Field(default_factory=WebhookActuatorConfig)
    command: CommandActuatorConfig = Field(default_factory=CommandActuatorConfig)
    actuator: Literal["log", "webhook", "command", "sim"] = "log"  # after webhook/command: checked against them
    verdict_threshold: float = Field(0.7, gt=0, le=1, description="classifier confidence that counts")
    verdict_consecutive: int = Field(3, ge=1, le=100, description="verdicts in a row before acting")
    verdict_on_burn_only: bool = Field(True, description="count only verdicts made while an SLO burns")
    imbalance_stddev: float = Field(0.30, gt=0, le=1, description="stddev of GPU utilization that counts")
    imbalance_sustain: float = Field(60.0, ge=0, description="seconds the imbalance must last")
    saturation_ratio: float = Field(0.85, gt=0, le=1, description="GPU memory or host CPU fraction that counts")
    saturation_sustain: float = Field(300.0, ge=0, description="seconds the saturation must last")
    hysteresis: float = Field(0.05, ge=0, le=0.5, description="a fired trigger re-arms below level - hysteresis")
    cooldown: float = Field(300.0, ge=0, description="seconds between two re-shards of one shard")
    max_migrations: int = Field(2, ge=1, le=64, description="migrations in flight at once (one per GPU always)")
    min_gain: float = Field(0.05, ge=0, le=1, description="score gain a load-driven move must bring")
    step_timeout: float = Field(600.0, gt=0, description="seconds to wait for an actuator to ack a step")
    exact_limit: int = Field(20000, ge=1, le=1_000_000,  # each set is scored in the tick: a million take seconds
                             description="candidate sets up to which placement searches exhaustively")
    seeds: int = Field(32, ge=1, le=4096, description="seed GPUs for the greedy search on large topologies")
    decisions_kept: int = Field(256, ge=16, le=100000, description="decisions kept in memory for the API/UI")
    max_shards: int = Field(256, ge=1, le=4096,  # each decision, registration and read sees every shard
                            description="shards tracked at once; an API registration past it is refused")
    shards: list[ShardSpec] = Field(default_factory=list, description="shards registered at start-up")

    @field_validator("actuator")
    @classmethod
    def _actuator_settings(cls, v: str, info: ValidationInfo) -> str:
        if v not in info.data:  # log and sim need no section; a refused section has its own error already
            return v
        if v == "webhook" and not info.data["webhook"].url:
            raise ValueError("'webhook' needs scheduler.webhook.url (the orchestrator endpoint)")
        if v == "command" and not info.data["command"].argv:
            raise ValueError("'command' needs scheduler.command.argv (the program to run)")
        return v

    @model_validator(mode="after")
    def _outlasts_the_command(self) -> SchedulerConfig:
        if self.actuator == "command" and self.command.timeout >= self.step_timeout:
            raise ValueError(f"step_timeout ({self.step_timeout:g} s) must be above command.timeout "
                             f"({self.command.timeout:g} s): a command still running when its step times out is "
                             "not stopped, and what it does then is not undone")
        return self

    @field_validator("weights", mode="before")
    @classmethod
    def _over_preset(cls, v: object, info: ValidationInfo) -> object:
        if not isinstance(v, dict):
            return v
        preset = STRATEGIES.get(info.data.get("strategy", ""), STRATEGIES["topology-aware"])
        return {**preset.model_dump(), **v}

    @field_validator("shards")
    @classmethod
    def _unique_ids(cls, v: list[ShardSpec]) -> list[ShardSpec]:
        ids = [s.id for s in v]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate shard ids {dup}")
        return v

    @field_validator("shards")
    @classmethod
    def _within_cap(cls, v: list[ShardSpec], info: ValidationInfo) -> list[ShardSpec]:
        cap = info.data.get("max_shards")  # absent: refused itself
        if cap is not None and len(v) > cap:
            raise ValueError(f"{len(v)} shards, more than scheduler.max_shards ({cap}); raise max_shards or list "
                             "fewer shards")
        return v

    @field_validator("shards")
    @classmethod
    def _short_text(cls, v: list[ShardSpec]) -> list[ShardSpec]:
        """The API's limit on free text (:func:`long_text`), the value echoed cut short."""
        errors = [InitErrorDetails(type=PydanticCustomError("too_long", TOO_LONG), loc=(i, name),
                                   input=shown(getattr(s, name))) for i, s in enumerate(v) if (name := long_text(s))]
        if errors:
            raise ValidationError.from_exception_data("shards", errors)
        return v

    def score_weights(self) -> ScoreWeights:
        return self.weights or STRATEGIES[self.strategy]


class OtlpConfig(Section):
    """Where ShardDecisionSpans go; no endpoint here nor in OTEL_EXPORTER_OTLP_ENDPOINT means none."""

    endpoint: str | None = Field(None, description="collector base URL, e.g. http://127.0.0.1:4318")
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    timeout: float = Field(5.0, gt=0, le=60, description="seconds per export request")
    max_queue: int = Field(2048, ge=1, le=1_000_000,
                           description="spans kept in scheduler.sqlite until exported (then deleted); older ones "
                                       "beyond are dropped")
    schedule_delay: float = Field(1.0, gt=0, le=60,
                                  description="seconds from a decision to the export of the spans stored meanwhile")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v, OTLP_EXAMPLE)


def otlp_endpoint(cfg: OtlpConfig, env: Mapping[str, str]) -> str | None:
    """The OTLP collector's base URL: ``otlp.endpoint`` (checked at load), else ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (checked here: ConfigError naming the variable, as a bad one would fail every export, quietly; for grpc also
    a bare ``host:port``), else None."""
    if cfg.endpoint:
        return cfg.endpoint
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not base:
        return None
    try:
        return check_url(base, OTLP_EXAMPLE)
    except ValueError as exc:
        if cfg.protocol == "grpc" and _host_port(base):  # the OTLP spec's gRPC form without a scheme: TLS unless
            return base  # OTEL_EXPORTER_OTLP_INSECURE=true, as the gRPC exporter takes it
        shown = url_origin(base)  # as config errors show a URL: its path and query may be a credential
        raise ConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT{f': {shown[:200]!r}' if shown else ''} {exc}") from None


def _host_port(target: str) -> bool:
    """Whether ``target`` is a bare ``host:port`` (``collector:4317``): ASCII without a space or control character
    (urlsplit strips a leading one and takes others into the host) and a port in 1-65535."""
    if not (target.isascii() and target.isprintable()) or " " in target or "@" in target:
        return False
    parts = urlsplit("//" + target)
    try:
        return bool(parts.hostname) and parts.netloc == target and 1 <= (parts.port or 0) <= 65535
    except ValueError:  # a port that is not a number, or past 65535
        return False
