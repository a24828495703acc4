"""Config load refuses what the daemon would refuse later, each as one line naming the file (or the
environment variable), the field and the value (found by a review of the command line)."""

import sys

import pytest

from sits_observe.config import load
from sits_observe.errors import ConfigError


def _lines(tmp_path, text, env=None):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(f, env=env or {})
    return f, str(err.value).splitlines()


def _one(tmp_path, text, start, *needles, env=None):
    f, lines = _lines(tmp_path, text, env)
    assert len(lines) == 1, lines
    assert lines[0].startswith(start.format(f=f)), lines
    for needle in needles:
        assert needle in lines[0], lines


def test_an_invalid_comm_regex_is_refused_at_load(tmp_path):
    _one(tmp_path, 'workloads: [{name: a, comm: "("}]\n', "{f}: workloads[0].comm: not a valid regular expression",
         "got '('")


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("slos:\n  - {name: a, objective: 0.99, latency: {stage: e2e, threshold: 2.5}}\nalerting:\n"
         "  receivers: []\nslos:\n  - {name: b, objective: 0.999, latency: {stage: queue, threshold: 1.0}}\n",
         5, "slos"),
        ("gpu:\n  backend: sim\ngpu:\n  backend: nvml\n", 3, "gpu"),
        ("gpu: {backend: sim, backend: nvml}\n", 1, "backend"),
        ("slos:\n  - name: a\n    objective: 0.99\n    latency: {stage: e2e, threshold: 2.5}\n"
         "    latency: {stage: queue, threshold: 1.0}\n", 5, "latency"),
    ],
)
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, text, line, key):
    _one(tmp_path, text, "{f}: not valid YAML at line " + str(line), f"key {key!r} given twice (first at line")


def test_yaml_merge_keys_may_still_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("servers:\n  - &s {kind: vllm, url: 'http://127.0.0.1:8000/metrics', workload: a}\n"
                 "  - {<<: *s, workload: b}\n")
    assert [s.workload for s in load(f, env={}).servers] == ["a", "b"]


def test_yaml_nested_too_deep_is_one_line(tmp_path):
    _one(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n", "{f}: not valid YAML at line 1",
         "nested more than 64 levels deep")


@pytest.mark.parametrize(
    ("var", "value", "start"),
    [
        ("SITS_LOG_LEVEL", "verbose", "SITS_LOG_LEVEL: log_level: Input should be"),
        ("SITS_API_TOKEN", " ", "SITS_API_TOKEN: api_token: must not be empty"),
        ("SITS_API_TOKEN", "s3cret\n", "SITS_API_TOKEN: api_token: must not begin or end with whitespace"),
        ("SITS_LISTEN", "foo", "SITS_LISTEN: listen: must be host:port"),
    ],
)
def test_a_bad_environment_variable_is_named_not_the_file(tmp_path, var, value, start):
    f, lines = _lines(tmp_path, "tick_interval: 2\n", env={var: value})
    assert len(lines) == 1 and lines[0].startswith(start) and str(f) not in lines[0], lines


def test_a_negative_sim_seed_is_refused(tmp_path):
    _one(tmp_path, "sim: {seed: -1}\n", "{f}: sim.seed:", "got -1")


@pytest.mark.parametrize(
    ("sim", "needle"),
    [
        ("topology: foo", "sim.topology: unknown topology 'foo'"),
        ("topology: fabric-2x8", "sim.topology: the simulator models one host"),
        ("scenario: nope", "sim.scenario: unknown scenario 'nope'"),
        ("scenario: {tmp}/missing.yaml", "sim.scenario: cannot read scenario file"),
        ("scenario: {tmp}/", "sim.scenario: scenario file"),  # a directory: "... is not a regular file"
        ("trace_path: {tmp}/missing.csv", "sim.trace_path: cannot read trace file"),
        ("trace_path: {tmp}", "sim.trace_path: trace file"),
    ],
)
def test_simulator_inputs_are_checked_at_load(tmp_path, sim, needle):
    _one(tmp_path, "sim: {" + sim.format(tmp=tmp_path) + "}\n", "{f}: " + needle)


def test_a_scenario_file_error_names_the_scenario_file(tmp_path):
    scen = tmp_path / "s.yaml"
    scen.write_text("faults:\n  - {kind: cpu_contention, onset: 10, duration: 60, severity: 0.5,"
                    " target: {gpus: [99]}}\n")
    _one(tmp_path, f"sim: {{scenario: {scen}}}\n", f"{scen}: faults[0].target.gpus:")


def test_the_sim_section_is_not_checked_when_the_simulator_is_off(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpu: {backend: none}\nsim: {topology: foo}\n")
    assert load(f, env={}).sim.topology == "foo"


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("scheduler: {webhook: {url: not a url}}", "{f}: scheduler.webhook.url: must be an http:// or https:// URL"),
        ("scheduler: {webhook: {url: 'ftp://h/x'}}", "{f}: scheduler.webhook.url: must be an http:// or https:// URL"),
        ("scheduler: {webhook: {url: 'http://u:pw@h:99999/x'}}", "{f}: scheduler.webhook.url: has a port"),
        ("otlp: {endpoint: nope}", "{f}: otlp.endpoint: must be an http:// or https:// URL"),
        ("otlp: {endpoint: 'http://u:pw@h:99999'}", "{f}: otlp.endpoint: has a port"),
    ],
)
def test_endpoint_urls_are_checked_and_never_echo_a_password(tmp_path, text, start):
    f, lines = _lines(tmp_path, text + "\n")
    assert len(lines) == 1 and lines[0].startswith(start.format(f=f)) and "pw" not in lines[0], lines


@pytest.mark.parametrize(
    ("text", "path", "got"),
    [
        ("scheduler: {webhook: {url: 'htp://orch/SEKRIT5?x'}}", "scheduler.webhook.url", "htp://orch/<hidden>"),
        ("scheduler: {webhook: {url: 'http://orch:99999/hooks/SEKRIT5'}}", "scheduler.webhook.url",
         "http://orch:99999/<hidden>"),
        ("otlp: {endpoint: 'htp://collector:4318/SEKRIT5'}", "otlp.endpoint", "htp://collector:4318/<hidden>"),
        ("gpu: {dcgm_url: 'htp://u:SEKRIT5@dcgm:9400/metrics#SEKRIT5'}", "gpu.dcgm_url", "htp://dcgm:9400/<hidden>"),
        ("servers: [{kind: vllm, url: 'htp://vllm:8000/SEKRIT5/metrics', workload: a}]", "servers[0].url",
         "htp://vllm:8000/<hidden>"),
        ("listen: 'http://0.0.0.0:9477/SEKRIT5'", "listen", "http://0.0.0.0:9477/<hidden>"),  # a URL anywhere
        ("alerting: {receivers: [{type: slack, url: 'htp://hooks.example/services/SEKRIT5'}]}",
         "alerting.receivers[0].url", None),  # not even its host
    ],
)
def test_a_bad_url_shows_at_most_its_scheme_and_host(tmp_path, text, path, got):
    f, lines = _lines(tmp_path, text + "\n")
    assert len(lines) == 1 and lines[0].startswith(f"{f}: {path}: "), lines
    assert lines[0].endswith(f", got {got!r}") if got else ", got" not in lines[0], lines
    assert "SEKRIT5" not in lines[0], lines


def test_a_url_whose_host_cannot_be_told_apart_is_not_shown(tmp_path):
    for url in ("orch/SEKRIT5", "http://u:SEK/RIT5@orch:99999/x", "htp://orch?to=SEKRIT5@x"):
        f, lines = _lines(tmp_path, f"scheduler: {{webhook: {{url: '{url}'}}}}\n")
        assert len(lines) == 1 and "SEK" not in lines[0] and ", got" not in lines[0], lines


def test_a_command_actuator_program_must_exist_and_be_executable(tmp_path):
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    for program, why in [("/nonexistent/move-shard", "does not exist"), (str(plain), "is not executable"),
                         (str(tmp_path), "is not executable"), ("no-such-program-xyz", "not found on PATH")]:
        _one(tmp_path, f"scheduler: {{command: {{argv: ['{program}', '--dry']}}}}\n",
             "{f}: scheduler.command.argv[0]: program ", why, f"got '{program}'")
    f = tmp_path / "ok.yaml"
    f.write_text("scheduler: {actuator: command, command: {argv: ['true']}}\n")
    assert load(f, env={}).scheduler.command.argv == ["true"]
    f.write_text(f"scheduler: {{actuator: command, command: {{argv: ['{sys.executable}', '-c', 'pass']}}}}\n")
    assert load(f, env={}).scheduler.command.argv[0] == sys.executable


def test_a_listen_host_that_does_not_resolve_is_refused_at_load(tmp_path):
    _one(tmp_path, "listen: nosuchhost.invalid:19483\n", "{f}: listen: host 'nosuchhost.invalid' does not resolve",
         "got 'nosuchhost.invalid:19483'")


@pytest.mark.parametrize(
    ("text", "start", "needle"),
    [
        ("store: 5", "{f}: store: must be a mapping of settings", "got int"),
        ("probes: {runq: true}", "{f}: probes.runq: must be a mapping of settings", "got bool"),
        ("store: {buckets: [1, 0.5]}", "{f}: store.buckets: must be at least two ascending", "got [1, 0.5]"),
        ("store: {buckets: [0.001, 0.00101]}", "{f}: store.buckets[1]:", ""),
        ("alerting: {receivers: [{type: webhook, url: 'http://h/x', secret: ''}]}",
         "{f}: alerting.receivers[0].secret: must not be empty", ""),
        ("alerting: {receivers: [{type: webhook, url: 'http://h/x', secret: '  '}]}",
         "{f}: alerting.receivers[0].secret: must not be empty", ""),
        ("scheduler: {actuator: webhook, webhook: {url: 'http://h/x', secret: ''}}",
         "{f}: scheduler.webhook.secret: must not be empty", ""),
        ("scheduler: {actuator: command, command: {argv: [/nonexistent/x]}}",
         "{f}: scheduler.command.argv[0]: program does not exist", ""),
        ("alerting: {backoff: {initial: 10, max: 5}}", "{f}: alerting.backoff: initial (10 s) is above max (5 s)",
         ""),
    ],
)
def test_section_type_bucket_secret_and_backoff_messages(tmp_path, text, start, needle):
    _one(tmp_path, text + "\n", start, needle)


def test_partial_scheduler_weights_override_only_the_terms_given(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("scheduler: {strategy: pack, weights: {comm: 10}}\n")
    w = load(f, env={}).scheduler.score_weights()
    assert (w.comm, w.memory, w.load, w.balance, w.numa) == (10, 4, 0.5, 0, 1)



def test_a_control_byte_is_one_line_with_its_line_number(tmp_path):
    _one(tmp_path, "tick_interval: 2\nlog_level: info\x01\n", "{f}: not valid YAML at line 2: special characters",
         "'\\x01'")


def test_a_nul_byte_in_state_dir_is_refused_at_load(tmp_path):
    _one(tmp_path, 'state_dir: "a\\0b"\n', "{f}: state_dir: must be a directory path (not empty, no NUL byte)")


def test_a_state_dir_that_is_a_file_is_refused_saying_so_and_left_as_it_was(tmp_path):
    afile = tmp_path / "state"
    afile.write_text("kept\n")
    _one(tmp_path, f"state_dir: {afile}\n", f"{{f}}: state_dir: '{afile}' is a file, not a directory; name a directory")
    assert afile.read_text() == "kept\n"


def test_a_state_dir_that_is_a_file_here_passes_for_another_host(tmp_path):
    from sits_observe.config import parse

    afile = tmp_path / "state"
    afile.write_text("")
    assert parse({"state_dir": str(afile)}, env={}, this_host=False).state_dir == str(afile)


@pytest.mark.parametrize("path", ["/dev/zero", "fifo", "big"])
def test_a_config_path_that_is_no_small_regular_file_is_refused_at_once(tmp_path, path):
    import os

    if path == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # reading it would wait for a writer for ever
    elif path == "big":
        path = str(tmp_path / "big.yaml")
        with open(path, "w") as f:
            f.write("# padding\n" * 200_000)  # 2 MB
    with pytest.raises(ConfigError, match="not a regular file|larger than 1 MiB"):
        load(path, env={})


def test_a_store_that_could_outgrow_the_memory_cap_is_refused_at_load(tmp_path):
    _one(tmp_path, "store:\n  history: 86400\n", "{f}: store: history 86400 x max_series 1024 could need 9.6 GiB",
         "lower one of them")
    load_ok = tmp_path / "ok.yaml"
    load_ok.write_text("store:\n  history: 86400\n  max_series: 64\n")  # a day at 1 s for 64 series: 0.6 GiB
    assert load(load_ok, env={}).store.history == 86400


@pytest.mark.parametrize("sim, shard, want", [
    # it passed check-config, then `run` stopped (exit 2) with a message naming neither the file nor the field
    ("{}", "placement: [0, 99]", r"placement: GPUs \[99\] not on the simulated nvswitch-8 host \(GPUs 0-7\)"),
    # check-config said ok; `run` then stopped with exit 2 (the scheduler checks it against the topology)
    ("{topology: pcie-8}", "numa_node: 7",
     r"numa_node: no GPU of the simulated pcie-8 host is on NUMA node 7 \(its GPUs are on nodes \[0, 1\]\)"),
])
def test_a_config_shard_off_the_simulated_host_is_refused_at_load(tmp_path, sim, shard, want):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"gpu: {{backend: sim}}\nsim: {sim}\nscheduler:\n  shards:\n"
                   f"    - {{id: s1, gpus: 2, memory_per_gpu: 1000, {shard}}}\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}: scheduler.shards\[0\].{want}"):
        load(str(cfg), env={})
    cfg.write_text(cfg.read_text().replace("99", "1").replace("numa_node: 7", "numa_node: 1"))
    assert load(str(cfg), env={}).scheduler.shards[0].gpus == 2  # one it has


@pytest.mark.parametrize("field, value, hint", [
    ("memory_per_gpu", "8.0e+10", "written as a plain integer: no quotes, no fraction or exponent"),
    ("gpus", '"2"', "written as a plain integer"),
    ("comm_intensity", '"0.5"', "written as a number, without quotes"),
])
def test_a_shard_value_a_lax_section_would_convert_says_how_to_write_it(tmp_path, field, value, hint):
    """Shards became strict: a config that loaded before failed with 'Input should be a valid integer' alone."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"scheduler:\n  shards:\n    - {{id: s1, {field}: {value}}}\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}: scheduler.shards\[0\].{field}: .*, got .* \({hint}"):
        load(str(cfg), env={})


@pytest.mark.parametrize("section, item, limit, says", [
    # 16,000 SLOs passed check-config: by `bench slo` (100 KB and 0.0065 ms a tick per SLO), 1.6 GB and 100 ms
    ("slos", "{{name: s{i}, objective: 0.99, window: 28d, ratio: {{good: good_total, total: requests_total}}}}",
     1000, "SLOs, more than 1000 \\(each keeps about 100 KB"),
    # every process is matched against each group at every /proc scan; 10,000 groups were taken
    ("workloads", "{{name: w{i}, comm: w{i}}}", 256, "workloads, more than 256 \\(every process"),
])
def test_a_list_longer_than_a_daemon_handles_is_refused_at_load(tmp_path, section, item, limit, says):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{section}:\n" + "".join(f"  - {item.format(i=i)}\n" for i in range(limit + 1)))
    with pytest.raises(ConfigError, match=rf"^{cfg}: {section}: {limit + 1} {says}"):
        load(str(cfg), env={})
    cfg.write_text(f"{section}:\n" + "".join(f"  - {item.format(i=i)}\n" for i in range(limit)))
    assert len(getattr(load(str(cfg), env={}), section)) == limit
