"""Config: defaults, every error with its path, environment precedence, secrets never echoed."""

import os
import subprocess

import pytest

from sits_observe.config import DEFAULT_LISTEN, load, parse
from sits_observe.errors import ConfigError


def test_empty_file_is_all_defaults(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("")
    cfg = load(f, env={})
    assert cfg.listen == DEFAULT_LISTEN and cfg.gpu.backend == "sim" and cfg.store.history == 3600


def test_every_error_is_listed_with_its_path(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("listen: nope\nstore:\n  history: 5\n  bogus: 1\nsim:\n  speed: -3\n")
    with pytest.raises(ConfigError) as err:
        load(f, env={})
    lines = str(err.value).splitlines()
    assert f"{f}: listen: must be host:port, e.g. 127.0.0.1:9477, got 'nope'" in lines
    assert any(line.startswith(f"{f}: store.history:") and "got 5" in line for line in lines)
    assert any("store.bogus: unknown field" in line for line in lines)
    assert any(line.startswith(f"{f}: sim.speed:") and "got -3" in line for line in lines)
    assert len(lines) == 4


def test_environment_overrides_file_and_token_is_secret(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("listen: 127.0.0.1:1000\nstate_dir: /a\n")
    env = {"SITS_LISTEN": "127.0.0.1:2000", "SITS_STATE_DIR": "/b", "SITS_LOG_LEVEL": "DEBUG",
           "SITS_API_TOKEN": "s3cret-value"}
    cfg = load(f, env=env)
    assert (cfg.listen, cfg.state_dir, cfg.log_level) == ("127.0.0.1:2000", "/b", "debug")
    assert cfg.api_token.get_secret_value() == "s3cret-value"
    assert "s3cret-value" not in repr(cfg)


def test_sits_config_names_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("tick_interval: 2\n")
    assert load(None, env={"SITS_CONFIG": str(f)}).tick_interval == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: [1,\n", "not valid YAML at line"),
        ("slos:\n\t- name: x\n", "found character '\\t' that cannot start any token; indent with spaces, not tabs"),
        ("- 1\n- 2\n", "top level must be a mapping"),
        ("workloads:\n  - {name: a, comm: x}\n  - {name: a, comm: y}\n",
         "workloads[1].name: duplicate workload name (also [0])"),
        # one that can match no process was skipped without a word
        ("workloads:\n  - name: a\n", "workloads[0]: give at least one of comm, exe, cgroup or pids"),
        ("workloads:\n  - {name: a, exe: python3}\n", "workloads[0]: exe: 'python3' is not an absolute path"),
        ("workloads:\n  - {name: a, pids: [-5]}\n", "workloads[0]: pids: [-5] holds a pid below 1"),
        ("store:\n  buckets: [0.001, 0.00101]\n", "c.yaml: store.buckets[1]: snaps to"),
    ],
)
def test_structural_errors(tmp_path, text, needle):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=None) as err:
        load(f, env={})
    assert needle in str(err.value)


def test_missing_file_is_one_line():
    with pytest.raises(ConfigError, match="cannot read config file"):
        load("/nonexistent/sits.yaml", env={})


def test_parse_rejects_bad_token_without_echo():
    with pytest.raises(ConfigError) as err:
        parse({"api_token": ["x"]}, env={})
    assert "got" not in str(err.value)


def test_a_receiver_list_given_as_a_url_is_refused_without_echoing_it():
    """A Slack webhook's URL is its secret; written where the list of receivers belongs, it was echoed."""
    url = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"
    with pytest.raises(ConfigError) as err:
        parse({"alerting": {"receivers": url}}, env={})
    assert "alerting.receivers: Input should be a valid list" in str(err.value) and "SECRET" not in str(err.value)


def test_a_url_given_where_a_list_belongs_is_echoed_without_its_credentials():
    """`servers: "http://user:pw@host/metrics?token=..."` (one URL for the list) was echoed whole."""
    with pytest.raises(ConfigError) as err:
        parse({"servers": "http://user:s3cret@host:8000/metrics?token=abc"}, env={})
    assert "servers: Input should be a valid list" in str(err.value)
    assert "s3cret" not in str(err.value) and "abc" not in str(err.value)


@pytest.mark.parametrize("data", [{"servers": "http://[bad"}, {"alerting": {"receivers": "http://[x"}},
                                  {"servers": [{"kind": "vllm", "url": "http://h:1/m", "workload": "w",
                                                "timeout": "http://[x"}]}])
def test_a_value_shaped_like_a_broken_url_is_a_config_error_not_a_traceback(data):
    with pytest.raises(ConfigError) as err:
        parse(data, env={})
    assert "[" not in str(err.value).partition(": ")[2].partition(": ")[2]  # the value is not echoed


def test_a_command_given_as_one_string_is_refused_without_echoing_its_arguments():
    """Its arguments may hold credentials (messages name argv[0] only); as one string they were echoed whole."""
    with pytest.raises(ConfigError) as err:
        parse({"scheduler": {"actuator": "command",
                             "command": {"argv": "/usr/local/bin/move-shard --token SECRETTOKEN"}}}, env={})
    assert "scheduler.command.argv: Input should be a valid list (write it as a list: [program, argument, ...])" \
        in str(err.value) and "SECRETTOKEN" not in str(err.value)


def test_a_token_no_bearer_header_can_carry_is_refused():
    """api_token "pässwörd" was accepted and could never authenticate: every POST got a 401."""
    with pytest.raises(ConfigError,
                       match="api_token: Value error, must be printable ASCII|api_token: must be printable"):
        parse({"api_token": "pässwörd"}, env={})
    assert parse({"api_token": "s3cr3t-T0ken_!~"}, env={}).api_token is not None


def test_an_empty_config_path_is_refused_not_taken_for_the_defaults():
    """`run --config "$CFG"` with CFG unset started with every default (and check-config "" said ok)."""
    from sits_observe.config import load

    with pytest.raises(ConfigError, match="config file path is empty"):
        load("", env={})


def test_a_home_state_dir_and_an_upper_case_log_level_are_taken_as_meant(monkeypatch):
    """`state_dir: ~/x` made a directory named "~" in the working one; `log_level: INFO` was refused in the file
    although SITS_LOG_LEVEL=INFO was taken."""
    monkeypatch.setenv("HOME", "/home/ops")
    cfg = parse({"state_dir": "~/sits", "log_level": "INFO"}, env={})
    assert (cfg.state_dir, cfg.log_level) == ("/home/ops/sits", "info")


def test_a_home_of_an_unknown_user_is_a_config_error_not_a_traceback():
    with pytest.raises(ConfigError, match="state_dir: .*cannot tell which home directory ~ means here"):
        parse({"state_dir": "~nosuchuser_review/state"}, env={})


def test_no_command_argument_is_echoed_whatever_its_type():
    with pytest.raises(ConfigError) as err:
        parse({"scheduler": {"actuator": "command", "command": {"argv": ["/bin/true", "--pin", 987654321]}}}, env={})
    assert "scheduler.command.argv[2]: Input should be a valid string" in str(err.value)
    assert "987654321" not in str(err.value)


def test_a_state_dir_that_cannot_be_made_is_refused_by_the_check(tmp_path):
    """check-config said ok to a state_dir under a file, which `run` then refused at start."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"state_dir: '.*/afile/state' cannot be created: '.*/afile' is a file; "
                                          "name a directory"):
        parse({"state_dir": str(tmp_path / "afile" / "state")}, env={})
    assert parse({"state_dir": str(tmp_path / "afile" / "state")}, env={}, this_host=False)  # rules made elsewhere
    assert parse({"state_dir": str(tmp_path / "new" / "state")}, env={}).state_dir == str(tmp_path / "new" / "state")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only tmpfs (root)")
def test_a_state_dir_on_a_read_only_mount_is_refused_by_the_check(tmp_path):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(tmp_path)], check=True)
    try:
        for state in (tmp_path, tmp_path / "sits"):
            with pytest.raises(ConfigError, match=f"state_dir: '{state}' is on a read-only file system"):
                parse({"state_dir": str(state)}, env={})
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)


@pytest.mark.parametrize(("text", "needle"), [
    # the ticks' times could not tell 1e-300 s from 0: every tick failed, with no data, at full CPU
    ("tick_interval: 1.0e-300\n", "tick_interval: Input should be greater than or equal to 0.001, got 1e-300"),
    # one sample, then shown as current for ever
    ("gpu: {sample_interval: .inf}\n", "gpu.sample_interval: Input should be less than or equal to 60, got inf"),
])
def test_intervals_the_daemon_cannot_run_on_are_refused(tmp_path, text, needle):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(f, env={})
    assert str(err.value) == f"{f}: {needle}"


def test_a_simulated_fabric_of_many_hosts_is_refused_by_its_name():
    """fabric-99999x8 was refused only after its 800 000 GPUs' link matrices were built: 11 GB and minutes for a
    typo in `check-config`, `demo --topology` or `rca dataset --topology`; `slo rules` (another host) let it pass."""
    for this_host in (False, True):  # (the old code built the matrices at True: run False first)
        with pytest.raises(ConfigError, match="sim.topology: the simulator models one host and fabric-99999x8 spans "
                                              "several; choose one of nvswitch-8, pcie-8"):
            parse({"sim": {"topology": "fabric-99999x8"}}, env={}, this_host=this_host)
    assert parse({"sim": {"topology": "fabric-1x8"}}, env={}).sim.topology == "fabric-1x8"  # one host, as before
