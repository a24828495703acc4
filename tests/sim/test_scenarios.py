"""Scenario files: the built-ins, validation errors, random schedules."""

from __future__ import annotations

import os

import pytest

from sits_observe.config import SimConfig
from sits_observe.errors import ConfigError
from sits_observe.sim.faults import BUILTIN, CAUSES, LOAD_SURGE, Scenario
from sits_observe.sim.host import SimulatedHost


def test_builtins_load_and_mixed_has_every_class_once_spaced():
    for name in BUILTIN:
        assert Scenario.load(name).name == name
    mixed = Scenario.load("mixed").faults
    assert sorted(f.kind for f in mixed) == sorted(CAUSES)
    assert mixed[0].onset == 600
    assert all(b.onset - a.end >= 300 for a, b in zip(mixed, mixed[1:]))
    assert Scenario.load("quiet").faults == []
    stress = Scenario.load("stress").faults
    assert {f.kind for f in stress} == set(CAUSES) | {LOAD_SURGE}
    assert any(b.onset < a.end for a, b in zip(stress, stress[1:]))  # overlapping


def test_unknown_scenario_names_the_choices():
    with pytest.raises(ConfigError, match=r"sim.scenario: unknown scenario 'chaos'; choose one of quiet, mixed, "
                                          r"stress"):
        Scenario.load("chaos")


def test_unreadable_scenario_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"cannot read scenario file {missing}: .*quiet, mixed, stress"):
        Scenario.load(str(missing))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # read, it would never answer: check-config hung, and a SIGHUP would stall the tick loop
    with pytest.raises(ConfigError, match=rf"sim.scenario: scenario file {fifo} is not a regular file"):
        Scenario.load(str(fifo))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("faults: [{kind: gpu_compute_saturation, onset: 10, duration: 5, severity: 2, target: {gpus: [0]}}]",
         "faults[0].severity: Input should be less than or equal to 1, got 2"),
        ("faults: [{kind: meteor, onset: 10, duration: 5, severity: 0.5}]", "faults[0].kind: Input should be"),
        ("faults: [{kind: scheduler_stall, onset: 10, duration: 5, severity: 0.5, target: {gpus: [0]}}]",
         "faults[0]: target of scheduler_stall must give exactly one of shard; got gpus"),
        ("faults: [{kind: network_ingress, onset: 1, duration: 5, severity: 0.5, target: {numa: 0}}]",
         "target of network_ingress must give nothing (the whole host) or one of workload; got numa"),
        ("faults: [{kind: load_surge, onset: 1, duration: 5, severity: 0.5, when: now}]",
         "faults[0].when: unknown field"),
        # each of these became GPU 1, or a fault that never ends
        ("faults: [{kind: gpu_compute_saturation, onset: 1, duration: 5, severity: 0.5, target: {gpus: [true]}}]",
         "faults[0].target.gpus[0]: Input should be a valid integer, got True"),
        ("faults: [{kind: gpu_compute_saturation, onset: 1, duration: 5, severity: 0.5, target: {gpus: ['1']}}]",
         "faults[0].target.gpus[0]: Input should be a valid integer, got '1'"),
        ("faults: [{kind: gpu_compute_saturation, onset: 1, duration: 5, severity: 0.5, target: {gpus: [1.0]}}]",
         "faults[0].target.gpus[0]: Input should be a valid integer, got 1.0"),
        ("faults: [{kind: cpu_contention, onset: 1, duration: 5, severity: 0.5, target: {numa: true}}]",
         "faults[0].target.numa: Input should be a valid integer, got True"),
        ("faults: [{kind: load_surge, onset: 1, duration: .inf, severity: 0.5}]",
         "faults[0].duration: Input should be a finite number, got inf"),
        ("faults: [{kind: load_surge, onset: .inf, duration: 5, severity: 0.5}]",
         "faults[0].onset: Input should be a finite number, got inf"),
        ("faults: [oops", "not valid YAML at line 1"),
        ("- 1\n- 2\n", "a scenario is a mapping with 'faults', got list"),
    ],
)
def test_bad_scenario_files_name_file_field_and_value(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        Scenario.load(str(path))
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_targets_the_host_does_not_have_are_refused(tmp_path, layout):
    path = tmp_path / "s.yaml"
    path.write_text("faults:\n"
                    "  - {kind: gpu_memory_pressure, onset: 1, duration: 5, severity: 0.5, target: {shard: chat-9}}\n"
                    "  - {kind: thermal_throttling, onset: 1, duration: 5, severity: 0.5, target: {gpus: [3, 8]}}\n"
                    "  - {kind: cpu_contention, onset: 1, duration: 5, severity: 0.5, target: {numa: 2}}\n")
    with pytest.raises(ConfigError) as err:
        SimulatedHost(SimConfig(scenario=str(path)), layout)
    lines = str(err.value).splitlines()
    assert lines == [
        f"{path}: faults[0].target.shard: unknown shard 'chat-9'; choose one of chat-0, chat-1, chat-2",
        f"{path}: faults[1].target.gpus: must be distinct GPU indices 0-7, got [3, 8]",
        f"{path}: faults[2].target.numa: this host has NUMA nodes 0-1, got 2",
    ]


def test_random_scenarios_are_deterministic_and_cover_the_classes():
    a = Scenario.random(7, 24, "nvswitch-8", severity_range=(0.4, 0.9))
    assert a == Scenario.random(7, 24, "nvswitch-8", severity_range=(0.4, 0.9))
    assert a != Scenario.random(8, 24, "nvswitch-8", severity_range=(0.4, 0.9))
    kinds = {f.kind for f in a.faults}
    assert set(CAUSES) <= kinds and LOAD_SURGE in kinds
    assert all(0.4 <= f.severity <= 0.9 for f in a.faults)
    assert all(b.onset >= a_.end + 300 for a_, b in zip(a.faults, a.faults[1:]))
    assert a.faults[-1].end <= 24 * 3600
    assert {f.target.shard for f in a.faults if f.target.shard} == {"chat-0", "chat-1", "chat-2"}
    with pytest.raises(ConfigError, match="severity_range"):
        Scenario.random(1, 1, "pcie-8", severity_range=(0.9, 0.1))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topology": "dgx-9"}, "sim.topology: unknown topology 'dgx-9'; choose one of nvswitch-8, pcie-8$"),
        ({"topology": "fabric-2x8"}, "sim.topology: the simulator models one host and fabric-2x8 spans several"),
        ({"scenario": "chaos"}, "sim.scenario: unknown scenario 'chaos'"),
        ({"trace_path": "/nonexistent/trace.csv"}, "sim.trace_path: cannot read trace file /nonexistent/trace.csv"),
    ],
)
def test_bad_sim_config_is_a_config_error(layout, fields, message):
    with pytest.raises(ConfigError, match=message):
        SimulatedHost(SimConfig(**fields), layout)


def test_a_fault_between_two_ticks_is_said_not_dropped_silently(layout, caplog):
    """A fault that began and ended between two tick starts was never in force, and vanished without a word."""
    import logging

    from sits_observe.frame import Frame
    from sits_observe.sim.faults import FaultSpec, FaultTarget

    sc = Scenario(faults=[FaultSpec(kind="scheduler_stall", onset=601, duration=3, severity=1.0,
                                    target=FaultTarget(shard="chat-0"))])
    sim = SimulatedHost(SimConfig(scenario="quiet"), layout, scenario=sc)
    with caplog.at_level(logging.WARNING, logger="sits_observe.sim"):
        for i in range(130):  # ticks of 5 s: 600 then 605
            sim.collect(Frame(1_700_000_000.0 + (i + 1) * 5.0, 5.0))
    assert sim.fault_log() == []
    assert [r.getMessage() for r in caplog.records] == [
        "sim: fault scheduler_stall at 601s for 3s fell between two ticks and had no effect; give it a duration of "
        "a tick_interval or more"]
