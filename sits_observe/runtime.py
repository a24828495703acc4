"""`run`, `demo` and `check-config`: start the daemon, serve HTTP, handle SIGTERM/SIGHUP."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .argtypes import NON_NEGATIVE_INT, POSITIVE_FLOAT, float_in
from .config import ENV_OVERRIDES, Config, load, parse
from .errors import ConfigError, ModelError
from .interrupts import sighup_held
from .scheduler.config import otlp_endpoint

if TYPE_CHECKING:
    from .daemon import Daemon

__all__ = ["register", "serve"]

log = logging.getLogger("sits_observe")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the daemon")
    p.add_argument("--config", help="YAML config file (default $SITS_CONFIG, else all defaults)")
    p.add_argument("--duration", type=POSITIVE_FLOAT, help="stop after this many wall seconds")
    p.set_defaults(func=_run)

    d = sub.add_parser("demo", help="run the daemon on the simulated GPU host")
    d.add_argument("--config", help="YAML config to start from (gpu.backend is forced to sim)")
    d.add_argument("--scenario", help="fault scenario: quiet, mixed, stress or a YAML file (default mixed)")
    d.add_argument("--speed", type=float_in(0.0, 10000.0, low_open=True),  # sim.speed's bounds, named as the flag
                   help="simulated seconds per wall second, up to 10000 (default 20)")
    d.add_argument("--duration", type=POSITIVE_FLOAT, help="stop after this many wall seconds")
    d.add_argument("--seed", type=NON_NEGATIVE_INT, help="random seed (default 1)")
    d.add_argument("--topology", help="nvswitch-8 or pcie-8")
    d.add_argument("--listen", type=_host_port, help="host:port (default 127.0.0.1:9477)")
    d.set_defaults(func=_demo)

    c = sub.add_parser("check-config", help="validate a config file; exit 2 listing every error")
    c.add_argument("file")
    c.set_defaults(func=_check)


def _host_port(text: str) -> str:
    """--listen: "" (an unset variable in `--listen "$ADDR"`) took the default port without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give host:port, e.g. 127.0.0.1:9477, or leave --listen out")
    return text


def _check(args: argparse.Namespace) -> int:
    cfg = load(args.file)  # with the environment overrides `run` applies
    if cfg.scheduler.enabled and cfg.gpu.backend in ("sim", "nvml"):  # a daemon with a scheduler (a topology)
        otlp_endpoint(cfg.otlp, os.environ)  # the environment's endpoint, which its start would refuse
    if cfg.rca.enabled and (why := _model_unusable(cfg, args.file)) is not None:
        # `run` starts without root-cause classification then (one warning line); here it is an error
        raise ConfigError(f"{args.file}: rca.model: {why}; as it is, the daemon would run without root-cause "
                          "classification (or set rca.enabled: false)")
    env = [var for var in ENV_OVERRIDES if os.environ.get(var)]
    print(f"{args.file}: ok ({len(cfg.workloads)} workloads, gpu.backend={cfg.gpu.backend}"
          f"{', with ' + ', '.join(env) + ' from the environment' if env else ''})")
    return 0


def _model_unusable(cfg: Config, file: str) -> str | None:
    """Why the daemon could not load the classifier ``cfg`` names (the checks its start makes), else None;
    ConfigError for floors naming causes the model does not have (the daemon warns and ignores them)."""
    from .rca.checks import other_step, short_history
    from .rca.floors import Floors
    from .rca.model import RcaModel

    path = cfg.rca.model_path()
    try:
        model = RcaModel.load(path)
    except ModelError as exc:
        return str(exc)
    if extra := Floors.of(cfg.rca.min_confidence).unknown_causes(model.classes):
        raise ConfigError(f"{file}: rca.min_confidence: floors for {', '.join(extra)}, which the model never names "
                          f"(its classes: {', '.join(model.classes)}); fix the names or remove them")
    return other_step(model, path, cfg.tick_interval) or short_history(model, cfg.store.history)


def _setup_logging(cfg: Config) -> None:
    logging.getLogger().setLevel(cfg.log_level.upper())


def _run(args: argparse.Namespace) -> int:
    cfg = load(args.config)
    path = args.config or os.environ.get("SITS_CONFIG")
    return serve(cfg, duration=args.duration, reload=(lambda: load(path)) if path else None)


DEMO_DEFAULTS = Path(__file__).with_name("demo.yaml")


def _demo(args: argparse.Namespace) -> int:
    cfg = _demo_config(args)
    if os.geteuid() != 0:
        log.info("not root: eBPF probes are off in this demo (the simulated host provides every stage)")
    # SIGHUP: the same merge again (demo defaults, the file, the command line), in the same state_dir
    again = argparse.Namespace(**{**vars(args), "state_dir": str(cfg.state_dir)})
    return serve(cfg, duration=args.duration, reload=(lambda: _demo_config(again)) if args.config is not None else None,
                 demo=True)


def _demo_config(args: argparse.Namespace) -> Config:
    """demo.yaml, then the user's file, then the command line; the simulator as GPU backend."""
    given = {"SITS_LISTEN": args.listen, "SITS_STATE_DIR": getattr(args, "state_dir", None)}
    env = {k: v for k, v in os.environ.items() if not given.get(k)}  # the command line wins over the environment
    base = load(args.config, env) if args.config is not None else parse({}, env=env)  # "" is refused by load
    made: str | None = None  # the temporary state_dir made here
    data = {**yaml.safe_load(DEMO_DEFAULTS.read_text()), **base.model_dump(mode="python", exclude_unset=True)}
    data["gpu"] = {**data.get("gpu", {}), "backend": "sim"}
    sim = data.setdefault("sim", {})
    for key in ("scenario", "speed", "seed", "topology"):
        value = getattr(args, key)
        if value is not None:
            sim[key] = value
    if args.listen:
        data["listen"] = args.listen
    if getattr(args, "state_dir", None):
        data["state_dir"] = args.state_dir
    elif "state_dir" not in data and not env.get("SITS_STATE_DIR"):
        data["state_dir"] = tempfile.mkdtemp(prefix="sits-observe-demo-")
        made = data["state_dir"]
    if base.api_token is not None:
        data["api_token"] = base.api_token.get_secret_value()
    try:
        return parse(data, args.config or "<demo>", env)
    except ConfigError:
        if made is not None:  # a demo that cannot start leaves no empty state directory behind
            with contextlib.suppress(OSError):
                os.rmdir(made)
        raise


class _Later:
    """The WSGI application the server serves before the daemon exists: 503, ``starting``, until ``app`` is set (a
    probe or scrape during a start of tens of seconds, bcc compiling, got no answer at all until then)."""

    app: Callable[..., Any] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if self.app is not None:
            return self.app(environ, start_response)
        body = (b'{"ready": false}' if environ.get("PATH_INFO") == "/readyz" else b'{"status": "starting"}') + b"\n"
        start_response("503 Service Unavailable", [("Content-Type", "application/json"),
                                                   ("Content-Length", str(len(body))), ("Retry-After", "5")])
        return [body]


def serve(cfg: Config, *, duration: float | None = None, reload: Callable[[], Config] | None = None,
          demo: bool = False) -> int:
    """Build the daemon, serve HTTP, tick until SIGTERM/SIGINT or ``duration``; SIGHUP reloads the config
    with ``reload`` (nothing to reload without one).  Signals that come while the daemon starts are acted on
    once it runs.  Returns 0 after a clean drain, 1 when a part did not close (it raised, or hung past
    :data:`~sits_observe.closing.CLOSE_TIMEOUT`) or the HTTP server's thread died (the daemon stops then, so that
    systemd restarts it); a second SIGTERM/SIGINT exits at once with 128 + its number."""
    from .export.http import Server, create_app
    from .wiring import build_daemon, lock_state_dir

    _setup_logging(cfg)
    stop, hup = threading.Event(), threading.Event()
    built: list[Daemon] = []

    def on_term(signum: int, _frame: Any) -> None:
        if stop.is_set():
            log.error("signal %d again: exiting now, without waiting for the drain", signum)
            os._exit(128 + signum)
        log.info("signal %d: draining and exiting", signum)
        stop.set()

    def on_hup(_signum: int, _frame: Any) -> None:
        if reload is None:
            log.warning("SIGHUP: started without a config file, nothing to reload")
        elif built:
            built[0].request_reload(reload)
        else:
            hup.set()

    previous = {sig: signal.signal(sig, handler)
                for sig, handler in ((signal.SIGTERM, on_term), (signal.SIGINT, on_term), (signal.SIGHUP, on_hup))}
    # blocked by whoever started it (a parent that blocked them around its fork, and exec keeps a mask), they would
    # be held back for good: no drain on SIGTERM, no reload on SIGHUP
    masked = signal.pthread_sigmask(signal.SIG_UNBLOCK, previous)
    if sighup_held():  # came while the command loaded its config (cli.main held it)
        hup.set()
    lock: int | None = None  # state_dir's, held until the daemon has closed
    try:
        # the port, then state_dir's lock: a second copy started by mistake (on either) is refused before it touches
        # the state (the scheduler re-sends the steps in flight when it starts)
        app = _Later()
        host, port = cfg.listen_addr
        server = Server(app, host, port)
        try:
            lock = lock_state_dir(cfg)
            server.start()  # 503 "starting" meanwhile: bcc and the classifier can take tens of seconds
            daemon = build_daemon(cfg)
        except BaseException:
            server.close()
            raise
        daemon.stop_event = stop
        built.append(daemon)
        if hup.is_set() and reload is not None:
            daemon.request_reload(reload)
        try:
            app.app = create_app(daemon)
            daemon.watch("HTTP server", server.dead)
            base = f"http://{f'[{host}]' if ':' in host else host}:{server.port}"  # an IPv6 address in brackets
            print(f"sits-observe {'demo' if demo else 'daemon'} serving {base}/metrics  API {base}/api/v1/status  "
                  f"UI {base}/", file=sys.stderr, flush=True)
            if demo:
                print(f"  simulated host: topology {cfg.sim.topology}, scenario {cfg.sim.scenario}, "
                      f"speed {cfg.sim.speed:g}x, state in {cfg.state_dir}", file=sys.stderr, flush=True)
            daemon.run(duration=duration)
        finally:  # the HTTP server beside the parts, not before them: in all within the unit's TimeoutStopSec
            http = threading.Thread(target=_close_quietly, args=(server,), name="http-close", daemon=True)
            http.start()
            closed = daemon.close()
            http.join(1.0)
        return 0 if closed and daemon.died is None else 1
    finally:
        if lock is not None:
            os.close(lock)
        for sig, handler in previous.items():  # None: one not set from Python, which cannot be put back
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, masked)


def _close_quietly(server: Any) -> None:
    try:
        server.close()
    except Exception as exc:  # noqa: BLE001 - a stop goes on; the parts are closing beside it
        logging.getLogger("sits_observe.http").error("HTTP server did not close cleanly: %s: %s",
                                                     type(exc).__name__, exc)
