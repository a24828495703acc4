"""The command line as a user meets it: one-line errors with exit 2, clean SIGTERM, SIGHUP reload."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


CLI = [sys.executable, "-m", "sits_observe"]


def _run(args, **kw):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, **kw)


def _one_line_error(res, *needles):
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("sits-observe: error:")]
    assert errors, res.stderr
    for needle in needles:
        assert any(needle in line for line in errors), res.stderr


def test_check_config_lists_errors_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: 1.2.3.4\nsim:\n  speed: 0\n")
    res = _run(["check-config", str(bad)])
    _one_line_error(res, f"{bad}: listen: must be host:port", f"{bad}: sim.speed:")
    good = tmp_path / "good.yaml"
    good.write_text("")
    assert _run(["check-config", str(good)]).returncode == 0


def test_check_config_refuses_a_classifier_the_daemon_could_not_load(tmp_path):
    """`run` would start without root-cause classification (one warning line); check-config says so and exits 2."""
    cfg = tmp_path / "c.yaml"
    missing = tmp_path / "no-such-model.pt"
    cfg.write_text(f"rca:\n  model: {missing}\n")
    _one_line_error(_run(["check-config", str(cfg)]), f"{cfg}: rca.model: {missing}: no such model file",
                    "the daemon would run without root-cause classification (or set rca.enabled: false)")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((Path(__file__).parents[2] / "models" / "rca-lstm.pt").read_bytes()[:5000])
    cfg.write_text(f"rca:\n  model: {truncated}\n")
    _one_line_error(_run(["check-config", str(cfg)]), f"{cfg}: rca.model: {truncated}: not a readable model file")
    cfg.write_text("tick_interval: 2\n")  # the shipped model, trained on 1 s ticks
    _one_line_error(_run(["check-config", str(cfg)]), f"{cfg}: rca.model: ", "trained on ticks of 1 s",
                    "set tick_interval: 1")
    cfg.write_text("store:\n  history: 60\n")  # the shipped model's window is 64 ticks
    _one_line_error(_run(["check-config", str(cfg)]), f"{cfg}: rca.model: store.history is 60 ticks, shorter than "
                    "the model's window of 64 ticks")
    cfg.write_text(f"rca:\n  enabled: false\n  model: {missing}\n")
    assert _run(["check-config", str(cfg)]).returncode == 0


def test_check_config_names_a_bad_floor_of_the_classifier(tmp_path):
    """rca.min_confidence: one floor or floors per cause; every mistake is one line naming the field, exit 2 (a
    cause the model never names would silently do nothing)."""
    cfg = tmp_path / "c.yaml"
    for value, needle in (("1.5", "a floor is a confidence from 0 to 1, got 1.5"),
                          ("high", "give one floor (0.91) or causes and their floors"),
                          ("{network_ingress: 0.9}", "need a `default` floor"),
                          ("{default: 0.6, healthy: 0.5}", "rca.healthy_min_confidence"),
                          ("{default: 0.6, network_ingress: 2}", "network_ingress: 2"),
                          ("{default: 0.6, network_ingress: high}", "network_ingress: 'high'"),
                          ("{default: 0.6, thermal_throtling: 0.8}", "floors for thermal_throtling, which the model "
                                                                     "never names")):
        cfg.write_text(f"rca:\n  min_confidence: {value}\n")
        _one_line_error(_run(["check-config", str(cfg)]), f"{cfg}: rca.min_confidence: ", needle)
    cfg.write_text("rca:\n  min_confidence: {default: 0.7, thermal_throttling: 0.8}\n")
    assert _run(["check-config", str(cfg)]).returncode == 0


def test_example_config_is_valid():
    res = _run(["check-config", str(Path(__file__).parents[2] / "docs" / "example-config.yaml")])
    assert res.returncode == 0, res.stderr


def test_bad_config_file_for_run_exits_2(tmp_path):
    _one_line_error(_run(["run", "--config", str(tmp_path / "missing.yaml")]), "cannot read config file")


def test_unknown_scenario_and_unreadable_trace_exit_2(tmp_path, free_port):
    _one_line_error(_run(["demo", "--scenario", "nope", "--duration", "1", "--listen", f"127.0.0.1:{free_port()}"]),
                    "nope")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"sim:\n  trace_path: {tmp_path / 'no-such-trace.csv'}\n")
    _one_line_error(_run(["demo", "--config", str(cfg), "--duration", "1", "--listen", f"127.0.0.1:{free_port()}"]),
                    "no-such-trace.csv")


def test_port_in_use_exits_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = _run(["demo", "--duration", "1", "--listen", f"127.0.0.1:{port}"],
                   env={**os.environ, "SITS_STATE_DIR": str(tmp_path)})
    _one_line_error(res, f"listen: 127.0.0.1:{port} is in use")


def test_sigterm_exits_cleanly_and_sighup_keeps_old_config_on_error(tmp_path, free_port, wait_ready):
    port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{port}\nstate_dir: {tmp_path / 'state'}\ngpu:\n  backend: none\n")
    proc = subprocess.Popen(CLI + ["run", "--config", str(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(port, proc)
        good = cfg.read_bytes()
        for bad in (b"listen: [not, valid\n", good + b"# caf\xe9\n"):  # bad YAML; not UTF-8 (Latin-1)
            cfg.write_bytes(bad)
            proc.send_signal(signal.SIGHUP)
            time.sleep(1.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                assert b"sits_build_info" in r.read()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert rc == 0, err
    assert err.count("new config rejected, keeping the old one") == 2 and "Traceback" not in err
    assert "not UTF-8 text (byte" in err and "save the file as UTF-8" in err


def test_a_daemon_started_with_its_signals_blocked_still_drains_on_sigterm(tmp_path, free_port, wait_ready):
    """A parent that blocked SIGTERM around its fork (exec keeps the mask) left the daemon deaf to it: no drain, the
    service manager's SIGKILL after its timeout."""
    port = free_port()
    blocked = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP}); "
               "os.execv(sys.executable, [sys.executable, '-m', 'sits_observe', *sys.argv[1:]])")
    proc = subprocess.Popen([sys.executable, "-c", blocked, "demo", "--scenario", "quiet", "--listen",
                             f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SITS_STATE_DIR": str(tmp_path)})
    try:
        wait_ready(port, proc)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 0, err
    assert "draining and exiting" in err


def test_bench_prints_one_json_object():
    res = _run(["bench", "pipeline", "--json", "--gpus", "8", "--ticks", "5", "--scrapes", "2",
                "--events-per-second", "1000"])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["bench"] == "pipeline" and out["results"][0]["gpus"] == 8


def test_a_sighup_that_changes_servers_workloads_or_probes_says_they_need_a_restart(tmp_path, caplog):
    from sits_observe.config import parse
    from sits_observe.daemon import Daemon
    from sits_observe.clock import SimClock

    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}}, env={})
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 100.0, start=1000.0))
    new = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"},
                 "servers": [{"kind": "vllm", "url": "http://127.0.0.1:8000/metrics", "workload": "chat"}],
                 "workloads": [{"name": "chat", "comm": "python3"}]}, env={})
    with caplog.at_level(logging.WARNING, logger="sits_observe"):
        daemon.request_reload(lambda: new)
        daemon.run(duration=0.05)  # applied between ticks, not inside the signal handler
    assert "SIGHUP: servers, workloads changed; these take effect after a restart" in caplog.text
    # the running settings stay what the daemon uses until the restart; the rest is the new file's
    assert daemon.config.servers == [] and daemon.config.workloads == [] and daemon.config.state_dir == cfg.state_dir
    daemon.close()


def test_a_sighup_rejecting_several_mistakes_logs_one_record_on_one_line(tmp_path, caplog):
    from sits_observe.config import load, parse
    from sits_observe.daemon import Daemon
    from sits_observe.clock import SimClock

    cfg = parse({"state_dir": str(tmp_path), "gpu": {"backend": "none"}}, env={})
    daemon = Daemon(config=cfg, clock=SimClock(1.0, 100.0, start=1000.0))
    bad = tmp_path / "c.yaml"
    bad.write_text("gpu:\n  backend: none\nlistne: 1\nslo_typo: {}\n")  # two unknown fields
    with caplog.at_level(logging.ERROR, logger="sits_observe"):
        daemon.request_reload(lambda: load(bad, env={}))
        daemon.run(duration=0.05)
    rejected = [r.getMessage() for r in caplog.records if "new config rejected" in r.getMessage()]
    assert len(rejected) == 1 and "\n" not in rejected[0]
    assert "listne: unknown field" in rejected[0] and "slo_typo: unknown field" in rejected[0]
    assert daemon.config is cfg or daemon.config == cfg
    daemon.close()


def test_a_demo_reload_merges_demo_defaults_file_and_command_line_again(tmp_path):
    import argparse

    from sits_observe.runtime import _demo_config

    f = tmp_path / "c.yaml"
    f.write_text("log_level: debug\n")
    args = argparse.Namespace(config=str(f), scenario="quiet", speed=None, seed=None, topology=None, listen=None,
                              state_dir=None)
    first = _demo_config(args)
    f.write_text("log_level: warning\n")
    again = _demo_config(argparse.Namespace(**{**vars(args), "state_dir": str(first.state_dir)}))
    # not the bare file: the demo's SLOs, simulator and scenario stay, in the same state directory
    assert again.slos == first.slos and first.slos and again.sim.scenario == "quiet"
    assert again.gpu.backend == "sim" and again.state_dir == first.state_dir and again.log_level == "warning"


def test_the_demo_command_line_wins_over_the_environment(tmp_path, monkeypatch):
    """docs: command line > environment > file; SITS_LISTEN won over demo --listen."""
    import argparse

    from sits_observe.runtime import _demo_config

    monkeypatch.setenv("SITS_LISTEN", "127.0.0.1:57262")
    args = argparse.Namespace(config=None, scenario="quiet", speed=None, seed=None, topology=None,
                              listen="127.0.0.1:57263", state_dir=str(tmp_path))
    assert _demo_config(args).listen == "127.0.0.1:57263"
    monkeypatch.setenv("SITS_LISTEN", "nosuchhost.invalid:1")  # not even read when the command line gives one
    assert _demo_config(args).listen == "127.0.0.1:57263"
    monkeypatch.setenv("SITS_LISTEN", "127.0.0.1:57262")
    assert _demo_config(argparse.Namespace(**{**vars(args), "listen": None})).listen == "127.0.0.1:57262"


def test_an_empty_config_path_is_refused_by_demo_and_slo_rules_too(tmp_path):
    _one_line_error(_run(["demo", "--config", "", "--duration", "1"]), "config file path is empty")
    _one_line_error(_run(["slo", "rules", "--config", ""]), "config file path is empty")


def test_an_empty_listen_or_output_is_refused_not_taken_for_the_default(tmp_path):
    """`demo --listen ""` served on the default port and `slo rules -o ""` printed the rules to stdout, leaving
    the file as it was, both with exit 0 (an unset variable in `--listen "$ADDR"`, `-o "$RULES"`)."""
    res = _run(["demo", "--listen", "", "--duration", "1"])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "sits-observe demo: error: argument --listen: empty; give host:port" in res.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slos: [{name: s, objective: 0.99, latency: {stage: e2e, threshold: 0.25}}]\n")
    res = _run(["slo", "rules", "--config", str(cfg), "-o", ""])
    _one_line_error(res, "-o: empty; give the rules file to write, or leave -o out for stdout")
    assert res.stdout == ""


def test_check_config_applies_the_environment_as_run_does(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tick_interval: 1\n")
    _one_line_error(_run(["check-config", str(cfg)], env={**os.environ, "SITS_LISTEN": "foo"}),
                    "SITS_LISTEN: listen: must be host:port")
    res = _run(["check-config", str(cfg)], env={**os.environ, "SITS_LOG_LEVEL": "debug"})
    assert res.returncode == 0 and "with SITS_LOG_LEVEL from the environment" in res.stdout, res.stderr


def test_a_listen_host_that_does_not_resolve_exits_2_before_starting(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"listen: nosuchhost.invalid:19483\nstate_dir: {tmp_path / 'state'}\n")
    _one_line_error(_run(["run", "--config", str(cfg), "--duration", "1"]),
                    f"{cfg}: listen: host 'nosuchhost.invalid' does not resolve")
    assert not (tmp_path / "state").exists()  # refused at load: nothing was started


def test_a_bind_that_cannot_resolve_is_one_config_error():
    import pytest
    from flask import Flask

    from sits_observe.errors import ConfigError
    from sits_observe.export.http import Server

    with pytest.raises(ConfigError, match=r"listen: nosuchhost.invalid:19483 cannot be bound"):
        Server(Flask(__name__), "nosuchhost.invalid", 19483)


def test_an_ipv6_listen_address_is_shown_in_brackets(tmp_path, free_port):
    port = free_port()
    res = _run(["demo", "--duration", "1", "--scenario", "quiet", "--listen", f"::1:{port}"],
               env={**os.environ, "SITS_STATE_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert f"serving http://[::1]:{port}/metrics" in res.stderr


def test_a_listen_host_of_several_addresses_serves_on_each(monkeypatch, free_port):
    """localhost is 127.0.0.1 and ::1 on a stock Debian: waitress then gives a server of one socket per address,
    which has no effective_port, and the daemon's start ended in an AttributeError traceback (exit 1)."""
    import socket
    import urllib.request

    from flask import Flask

    from sits_observe.export.http import Server

    real = socket.getaddrinfo
    port = free_port()

    def two(host, *args, **kwargs):
        if host == "twice.test":
            return [entry for a in ("127.0.0.1", "127.0.0.2") for entry in real(a, *args, **kwargs)]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", two)
    app = Flask(__name__)
    app.add_url_rule("/", "root", lambda: "up")
    server = Server(app, "twice.test", port)
    server.start()
    try:
        assert server.port == port
        for address in ("127.0.0.1", "127.0.0.2"):
            with urllib.request.urlopen(f"http://{address}:{port}/", timeout=5) as resp:
                assert resp.read() == b"up"
    finally:
        server.close()
    assert not server._thread.is_alive()



def test_doctor_says_tracefs_is_not_readable_instead_of_stopping(monkeypatch):
    """tracefs is mode 0700: for a user Path.is_dir() raises PermissionError (Python 3.11), and doctor stopped
    with an error (exit 2) instead of its report (exit 1), for the very user it is meant to help. (As a user:
    `setpriv --reuid=65534 sits-observe doctor`; the CI's clone may not be readable by one, so it is faked.)"""
    import pathlib

    from sits_observe import doctor

    class NoEntry(pathlib.PosixPath):
        def is_dir(self):
            raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(doctor, "Path", NoEntry)
    check = doctor._tracefs()
    assert (check.ok, check.detail) == (False, "/sys/kernel/tracing/events: not readable by this user")
    assert "CAP_DAC_READ_SEARCH" in check.fix


def test_bench_ui_out_that_is_a_file_is_refused_before_the_work(tmp_path):
    """It failed with 'File exists', exit 1, after filling the history and starting the browser."""
    afile = tmp_path / "shots"
    afile.write_text("kept")
    _one_line_error(_run(["bench", "ui", "--history", "60", "--out", str(afile)]),
                    f"bench ui: --out: {afile} is a file; give a directory for the screenshots")
    assert afile.read_text() == "kept"


def test_bench_ui_out_below_a_file_is_refused_before_the_work(tmp_path):
    afile = tmp_path / "shots"
    afile.write_text("kept")
    _one_line_error(_run(["bench", "ui", "--history", "60", "--out", str(afile / "sub")]),
                    f"bench ui: --out: {afile} is a file; give a directory for the screenshots")


def test_an_output_error_without_a_file_name_is_one_plain_line(tmp_path):
    """stdout on a full disk printed "sits-observe: error: : No space left on device"."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slos: [{name: s, objective: 0.99, latency: {stage: e2e, threshold: 0.25}}]\n")
    with open("/dev/full", "w") as full:
        res = subprocess.run(CLI + ["slo", "rules", "--config", str(cfg)], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    assert res.returncode == 1 and res.stderr == "sits-observe: error: No space left on device\n"
