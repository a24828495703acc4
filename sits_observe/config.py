"""Typed daemon configuration: one YAML file, every field defaulted, so an empty file works.

Precedence: command-line argument > environment (``SITS_LISTEN``, ``SITS_STATE_DIR``,
``SITS_LOG_LEVEL``, ``SITS_API_TOKEN``; ``SITS_CONFIG`` names the file) > file > default.
:func:`load` raises :class:`ConfigError` listing every problem as ``FILE: path: message, got value`` (a bad
environment value names its variable instead of the file), including what the daemon would trip over at start:
an unresolvable ``listen`` host, an invalid ``comm`` regex, the simulator's topology, scenario and trace.
Each subsystem owns its section model; this module only assembles and validates them.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from .alerting.config import AlertingConfig, check_unique
from .collectors.config import ServerConfig, check_url
from .errors import ConfigError
from .probes.config import MAX_WORKLOADS, ProbesConfig, WorkloadConfig
from .rca.config import RcaConfig
from .scheduler.config import OtlpConfig, SchedulerConfig
from .section import Section
from .slo.spec import SloList
from .store.config import StoreConfig
from .topology import one_host
from .ui.config import UiConfig
from .validation import elsewhere, format_errors, validate
from .yamlfile import parse_yaml

__all__ = [
    "parse_yaml",
    "validate",
    "DEFAULT_LISTEN",
    "DEFAULT_STATE_DIR",
    "Config",
    "load",
    "parse",
    "format_errors",
]

DEFAULT_LISTEN = "127.0.0.1:9477"
DEFAULT_STATE_DIR = "/var/lib/sits-observe"
class SimConfig(Section):
    topology: str = "nvswitch-8"
    scenario: str = Field("mixed", description="quiet | mixed | stress, or the path of a scenario YAML file")
    trace: Literal["conv", "code"] = "conv"
    speed: float = Field(20.0, gt=0, le=10000)
    seed: int = Field(1, ge=0, description="random seed; same seed, same run")
    trace_path: str | None = Field(None, description="override the packaged Azure trace CSV")
    rate: float = Field(0.75, gt=0, le=100, description="request-rate multiplier: trace seconds per simulated second")


class GpuConfig(Section):
    backend: Literal["sim", "nvml", "dcgm", "none"] = "sim"
    # at most a minute: .inf took one sample and showed it as current for ever; the scheduler takes a reading to be
    # at most a minute old (scheduler.view.SHOWN_AFTER_S)
    sample_interval: float = Field(5.0, gt=0, le=60, description="seconds between NVML / DCGM samples; ticks reuse "
                                   "the last")
    dcgm_url: str | None = Field(None, description="dcgm-exporter page, e.g. http://127.0.0.1:9400/metrics")
    dcgm_timeout: float = Field(2.0, gt=0, le=30, description="seconds to wait for the dcgm-exporter page")
    nvml_timeout: float = Field(2.0, gt=0, le=5, description="seconds a tick waits for an NVML sample; a call hung "
                                "longer fails the source (GPUs missing) until it returns")

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_url(cls, v: str | None) -> str | None:
        return None if v is None else check_url(v, "http://127.0.0.1:9400/metrics")  # dcgm-exporter's port

    @model_validator(mode="after")
    def _dcgm_needs_url(self) -> GpuConfig:
        if self.backend == "dcgm" and not self.dcgm_url:
            raise ValueError("backend dcgm needs gpu.dcgm_url, e.g. http://127.0.0.1:9400/metrics")
        return self


class Config(Section):
    listen: str = DEFAULT_LISTEN
    state_dir: str = DEFAULT_STATE_DIR
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    api_token: SecretStr | None = None
    # from 1 ms: at 1e-300 the ticks' times (unix seconds) could not move on, and every tick failed without data
    tick_interval: float = Field(1.0, ge=0.001, le=60)
    store: StoreConfig = Field(default_factory=StoreConfig)
    workloads: list[WorkloadConfig] = Field(default_factory=list)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    sim: SimConfig = Field(default_factory=SimConfig)
    ui: UiConfig = Field(default_factory=UiConfig)
    servers: list[ServerConfig] = Field(default_factory=list)
    rca: RcaConfig = Field(default_factory=RcaConfig)
    slos: SloList = Field(default_factory=list)  # after `store`: latency thresholds are checked against it
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)
    probes: ProbesConfig = Field(default_factory=ProbesConfig, validate_default=True)  # checked against workloads
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    otlp: OtlpConfig = Field(default_factory=OtlpConfig)

    @field_validator("state_dir")
    @classmethod
    def _a_path(cls, v: str) -> str:
        if not v or "\0" in v:
            raise ValueError("must be a directory path (not empty, no NUL byte)")
        return v

    @field_validator("api_token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("must not be empty (a blank bearer token would let anyone in); leave it unset to "
                             "turn mutating API calls off")
        if v is not None and v.get_secret_value() != v.get_secret_value().strip():
            # the HTTP server strips a header value's ends, so such a token could never match
            raise ValueError("must not begin or end with whitespace (a YAML block scalar adds a newline); "
                             "remove it")
        if v is not None and not all(" " <= c < "\x7f" for c in v.get_secret_value()):
            # an HTTP header carries it as latin-1 bytes: any other character could never match
            raise ValueError("must be printable ASCII (an HTTP header cannot carry other characters as sent); "
                             "use letters, digits and punctuation")
        return v

    @field_validator("state_dir")
    @classmethod
    def _home(cls, v: str, info: ValidationInfo) -> str:
        """``~/...`` is the home directory (it made a directory named ``~`` in the working one); on this host,
        not a file (mkdir said only "File exists")."""
        try:
            path = Path(v).expanduser()
        except RuntimeError:  # ~nosuchuser, or ~ with no HOME and no passwd entry
            raise ValueError(f"{v!r}: cannot tell which home directory ~ means here; give an absolute path") from None
        if elsewhere(info):
            return str(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"{str(path)!r} is a file, not a directory; name a directory (it is created when missing)")
        # what the daemon's start would refuse whoever runs it (check-config passed them): a file where a directory
        # must be made, a read-only mount (another user's permissions are left to the start)
        first = next(p for p in (path, *path.parents) if p.exists())
        if not first.is_dir():
            raise ValueError(f"{str(path)!r} cannot be created: {str(first)!r} is a file; name a directory")
        try:
            read_only = bool(os.statvfs(first).f_flag & os.ST_RDONLY)
        except OSError:  # a mount this user may not look into: the daemon's start decides
            read_only = False
        if read_only:
            raise ValueError(f"{str(path)!r} is on a read-only file system ({str(first)!r}); name a writable directory")
        return str(path)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_any_case(cls, v: Any) -> Any:
        """``INFO`` as ``info`` (SITS_LOG_LEVEL took either; the file only the lower case)."""
        return v.lower() if isinstance(v, str) else v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str, info: ValidationInfo) -> str:
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be host:port, e.g. 127.0.0.1:9477")
        if elsewhere(info):
            return v
        host = host.removeprefix("[").removesuffix("]")
        try:  # what the HTTP server resolves when it binds
            socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (OSError, UnicodeError) as exc:
            if isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_AGAIN:  # no answer yet (DNS not up at
                return v  # boot): no mistake in the file; the bind decides (runtime.serve)
            raise ValueError(f"host {host!r} does not resolve ({getattr(exc, 'strerror', None) or exc}); use an "
                             "IP address of this host, e.g. 127.0.0.1 or 0.0.0.0") from None
        return v

    @field_validator("sim")
    @classmethod
    def _one_host(cls, v: SimConfig) -> SimConfig:
        """Here, not in SimConfig, whose own users (the simulator) say ConfigError; also for another host's config."""
        try:
            one_host(v.topology)
        except ValueError as exc:
            raise ValidationError.from_exception_data("sim", [InitErrorDetails(
                type=PydanticCustomError("one_host", str(exc)), loc=("topology",), input=v.topology)]) from None
        return v

    @field_validator("workloads", mode="before")
    @classmethod
    def _few_workloads(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_WORKLOADS:
            raise ValueError(f"{len(v)} workloads, more than {MAX_WORKLOADS} (every process on the host is matched "
                             "against each at every scan); group processes by comm, exe or cgroup instead")
        return v

    @field_validator("workloads")
    @classmethod
    def _unique_workloads(cls, v: list[WorkloadConfig]) -> list[WorkloadConfig]:
        check_unique([w.name for w in v], "workload")
        return v

    @field_validator("probes")
    @classmethod
    def _unattributed_is_no_workload(cls, v: ProbesConfig, info: ValidationInfo) -> ProbesConfig:
        label = v.block_io.unattributed  # a workload of that name: its IO and the host's in one series, unsaid
        timed = v.enabled and v.block_io.enabled
        if timed and label is not None and label in {w.name for w in info.data.get("workloads") or ()}:
            raise ValueError(f"block_io.unattributed: {label!r} is also a workload's name; its block IO would be "
                             "mixed with the host's: name one of them otherwise")
        return v

    @property
    def listen_addr(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


ENV_OVERRIDES = {"SITS_LISTEN": "listen", "SITS_STATE_DIR": "state_dir", "SITS_LOG_LEVEL": "log_level",
                 "SITS_API_TOKEN": "api_token"}


def parse(data: Any, source: str = "<config>", env: dict[str, str] | None = None, this_host: bool = True) -> Config:
    """Validate a mapping (YAML already parsed) with environment overrides applied; ``this_host`` False: for use
    on another machine (no check of the listen host, the actuator's program or the simulator's files)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(data).__name__}")
    env = os.environ if env is None else env
    data = dict(data)
    origins = {}
    for var, key in ENV_OVERRIDES.items():
        if env.get(var):
            data[key] = env[var].lower() if key == "log_level" else env[var]
            origins[key] = var
    cfg = validate(Config, data, source, origins=origins, this_host=this_host)
    if cfg.gpu.backend == "sim" and this_host:  # what the simulator would refuse at start, refused here, file named
        from .sim.inputs import check_inputs

        try:
            check_inputs(cfg.sim, cfg.scheduler.shards)
        except ConfigError as exc:  # a scenario file's own errors already name that file
            raise ConfigError("\n".join(f"{source}: {line}" if line.startswith(("sim.", "scheduler.")) else line
                                         for line in str(exc).splitlines())) from None
    return cfg


MAX_CONFIG_BYTES = 1 << 20  # a config file with every section filled in is a few KiB


def load(path: str | Path | None = None, env: dict[str, str] | None = None, this_host: bool = True) -> Config:
    """Load ``path`` (or ``$SITS_CONFIG``; none means all defaults) and validate it (``this_host``: :func:`parse`)."""
    env = os.environ if env is None else env
    if path is not None and not str(path).strip():  # an unset variable in a unit file's --config "$CFG"
        raise ConfigError("config file path is empty; give the path of the YAML config file (or none at all, for "
                          "the defaults)")
    path = path or env.get("SITS_CONFIG")
    if not path:
        return parse({}, "<defaults>", env, this_host)
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):  # /dev/zero would never end, a FIFO never answer
            raise ConfigError(f"{p}: not a regular file; give the path of the YAML config file")
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES >> 20} MiB; is this the config file?")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror}; check the path") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r}); "
                          "save the file as UTF-8") from None
    return parse(parse_yaml(text, str(p)), str(p), env, this_host)


RESTART_ONLY = ("listen", "state_dir", "store", "tick_interval", "gpu", "sim", "slos", "alerting", "servers",
                "workloads", "probes", "otlp")


def restart_only(old: Config, new: Config, *, rca_built: bool) -> tuple[list[str], Config]:
    """What of ``new`` (a SIGHUP's) takes effect only after a restart, and ``new`` with those kept as in
    ``old``, so nothing reads a value the daemon does not use."""
    keys = [k for k in RESTART_ONLY if getattr(new, k) != getattr(old, k)]
    update: dict[str, Any] = {k: getattr(old, k) for k in keys}
    if new.scheduler.enabled != old.scheduler.enabled:  # the scheduler is built, or not, at start-up
        keys.append("scheduler.enabled")
        update["scheduler"] = new.scheduler.model_copy(update={"enabled": old.scheduler.enabled})
    if new.ui.enabled != old.ui.enabled:  # the UI is mounted, or not, at start-up
        keys.append("ui.enabled")
        update["ui"] = new.ui.model_copy(update={"enabled": old.ui.enabled})
    if new.rca.enabled and not old.rca.enabled and not rca_built:  # never built: nothing to turn on
        keys.append("rca.enabled")
    return keys, new.model_copy(update=update) if update else new
