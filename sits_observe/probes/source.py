"""ProbeSource: the eBPF probes as a daemon Source (``collect``) and metrics provider (``metrics``).

Each probe loads on its own: one that cannot load or attach (privileges, headers, a missing tracepoint
or library) is logged once with the reason and the rest run on. Workloads are re-scanned in /proc every
``probes.scan_interval`` seconds; uprobes attach to library files as workload processes map them, and
are detached from a file once no workload process maps it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ProbeError
from ..frame import STAGES, BucketLayout, Frame, Sample
from . import specs
from .features import bpf_stats_enabled, enable_bpf_stats, environment_problem, tracepoint_exists
from .program import Program, attach_path, compile_probe
from .uprobes import LibraryAttacher
from .workloads import Mapping, WorkloadTracker, library_matcher

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["ProbeState", "ProbeSource"]

log = logging.getLogger("sits_observe.probes")
SAID_KEPT = 256  # distinct problem texts a probe remembers as said (logged once each, counted once each)


@dataclass
class ProbeState:
    """What one probe is doing, for metrics, ``probes --list`` and tests."""

    spec: specs.ProbeSpec
    enabled: bool
    program: Program | None = None
    attacher: LibraryAttacher | None = None
    library: str | None = None
    problem: str | None = None
    attach: str | None = None
    missing_tracepoints: tuple[str, ...] = ()
    errors: int = 0
    said: set[str] = field(default_factory=set)

    @property
    def attached(self) -> bool:
        return self.program is not None and (self.attacher is None or self.attacher.probes > 0)


class ProbeSource:
    """Kernel per-stage histograms for the configured workloads (``name = "probes"``)."""

    name = "probes"

    def __init__(self, config: Config, layout: BucketLayout, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = config.probes
        self._layout = layout
        self._clock = clock
        self._tracker = WorkloadTracker(config.workloads)
        self._labels = dict(self._tracker.names)
        if self._cfg.block_io.unattributed:
            self._labels[0] = self._cfg.block_io.unattributed
        self._last_scan = float("-inf")
        self._stats_fd: int | None = None
        self.states = {name: ProbeState(spec, getattr(self._cfg, name).enabled and self._cfg.enabled)
                       for name, spec in specs.SPECS.items()}
        self.off = self._off_reason()
        if self.off:
            log.log(logging.INFO if "in config" in self.off else logging.WARNING, "probes: off: %s", self.off)
            for state in self.states.values():
                state.problem = self.off
            return
        if self._cfg.bpf_stats:
            try:
                self._stats_fd = enable_bpf_stats()
            except OSError as exc:
                log.warning("probes: cannot turn on BPF run-time stats: %s", exc.strerror)
        for state in self.states.values():
            if state.enabled:
                self._load(state, len(config.workloads))
            else:
                state.problem = "disabled in config"
        if not config.workloads:
            log.info("probes: no workloads configured; only unattributed block_io is timed")
        self.rescan()

    def _off_reason(self) -> str | None:
        if not self._cfg.enabled:
            return "disabled in config (probes.enabled: false)"
        if not any(s.enabled for s in self.states.values()):
            return "every probe is disabled in config"
        return environment_problem()

    def _report(self, state: ProbeState, message: str, *, error: bool = True) -> None:
        """Log each distinct message of a probe once; count errors for sits_probe_errors_total."""
        if error:
            state.errors += 1
        if message not in state.said:
            if len(state.said) >= SAID_KEPT:  # bounded over days of churn: an old text may be said again
                state.said.clear()
            state.said.add(message)
            log.warning("probe %s: %s", state.spec.name, message)

    def _load(self, state: ProbeState, n_workloads: int) -> None:
        spec = state.spec
        plan = specs.plan_tracepoints(spec, tracepoint_exists)
        state.missing_tracepoints = plan.missing
        if plan.problem:
            state.problem = f"not loaded: {plan.problem}"
            self._report(state, state.problem)
            return
        try:
            wanted = specs.wanted(spec, self._cfg)
            bpf, kept = compile_probe(spec, wanted,
                                      lambda opt: specs.cflags(spec, self._cfg, n_workloads, plan.macros + opt))
        except ProbeError as exc:
            state.problem = f"not loaded: {exc}"
            self._report(state, state.problem)
            return
        skipped = [*plan.missing, *(m for m in wanted if m not in kept)]
        state.program = Program(bpf, self._layout)
        state.attach = attach_path(spec, kept)
        if spec.kind == "uprobe":
            ucfg = getattr(self._cfg, spec.name)
            state.library = ucfg.library
            state.attacher = LibraryAttacher(bpf, ucfg.timed())
        log.info("probe %s: loaded (%s)%s", spec.name, state.attach,
                 f" without {', '.join(skipped)}" if skipped else "")

    def rescan(self) -> None:
        """Re-read /proc: update every program's workload map; attach uprobes to newly mapped libraries and
        detach them from libraries no workload process maps any more."""
        self._last_scan = self._clock()
        tgids = self._tracker.scan()
        maps: dict[int, list[Mapping]] = {}  # each process's mapped files, read once for every uprobe's library
        for state in self.states.values():
            if state.program is None:
                continue
            try:
                state.program.set_workloads(tgids)
            except Exception as exc:  # bcc map writes raise bare Exception
                self._report(state, f"cannot update the workload map: {exc}")
            if state.attacher is not None:
                self._attach_libraries(state, tgids, maps)

    def _attach_libraries(self, state: ProbeState, tgids: dict[int, int], maps: dict[int, list[Mapping]]) -> None:
        assert state.attacher is not None and state.library is not None
        files, held = self._tracker.libraries(tgids, library_matcher(state.library), maps)
        for shown, problem in state.attacher.release(files, held):
            log.info("probe %s: detached from %s: no workload process maps it any more", state.spec.name, shown)
            if problem:
                self._report(state, f"{shown}: detach failed: {problem}")
        for file, (path, shown) in files.items():
            problem = state.attacher.attach(file, path, shown)
            if problem:  # counted once per text: a file attached afresh at each workload restart said it again
                self._report(state, problem, error=problem not in state.said)
        if state.attacher.probes:
            state.problem = None
        else:
            failed = sorted(set(state.attacher.failed.values()))
            state.problem = (f"not attached: {'; '.join(failed)} (tried again as processes map it)" if failed
                             else f"not attached: no workload process maps {state.library} (yet)")
            self._report(state, state.problem, error=False)

    def collect(self, frame: Frame) -> None:
        """Add this tick's per-(stage, workload) histogram deltas to ``frame``."""
        if self._clock() - self._last_scan >= self._cfg.scan_interval:
            self.rescan()
        for state in self.states.values():
            if state.program is None:
                continue
            try:
                series = state.program.drain()
            except ProbeError as exc:
                self._report(state, f"drain failed: {exc}")
                frame.errors[f"probes.{state.spec.name}"] = str(exc)
                continue
            for s in series:
                label = self._labels.get(s.workload)
                if label is not None and s.stage < len(STAGES):
                    frame.add_hist(STAGES[s.stage], label, s.counts, s.sum_ns / 1e9)

    def metrics(self) -> Iterator[Sample]:
        """Self-metrics: attached, errors, dropped events, BPF run time/count where the kernel counts it."""
        stats_on = self._stats_fd is not None or bpf_stats_enabled()
        for name, state in self.states.items():
            lab = (("probe", name),)
            yield Sample("sits_probe_attached", "gauge", "1 when the probe's BPF programs are loaded and attached.",
                         lab, float(state.attached))
            yield Sample("sits_probe_errors_total", "counter",
                         "Probe load, attach, map and drain failures.", lab, float(state.errors))
            if state.attacher is not None:
                yield Sample("sits_probe_detached_files_total", "counter",
                             "Library files whose uprobes were detached because no workload process mapped them "
                             "any more.", lab, float(state.attacher.detached))
            if (program := state.program) is None:  # read once: close() may take it between two samples
                continue
            yield Sample("sits_probe_dropped_events_total", "counter",
                         "Events not counted because a kernel map was full.", lab, float(program.dropped()))
            counts = program.kernel_counts()
            if "recursion_misses" in counts:
                yield Sample("sits_probe_missed_events_total", "counter",
                             "Events the kernel did not run the probe's programs for: they fired on a CPU already "
                             "running a BPF tracing program (its recursion guard).", lab,
                             float(counts["recursion_misses"]))
            if stats_on and "run_time_ns" in counts and "run_cnt" in counts:
                yield Sample("sits_probe_run_time_seconds_total", "counter",
                             "Time spent running the probe's BPF programs (kernel.bpf_stats_enabled).",
                             lab, counts["run_time_ns"] / 1e9)
                yield Sample("sits_probe_runs_total", "counter",
                             "Runs of the probe's BPF programs (kernel.bpf_stats_enabled).", lab,
                             float(counts["run_cnt"]))

    def status(self) -> list[dict[str, Any]]:
        """One row per probe: enabled, attached, problem, what is attached where."""
        rows = []
        for name, st in self.states.items():
            row: dict[str, Any] = {"probe": name, "program": f"{st.spec.program}.bpf.c", "enabled": st.enabled,
                                   "attached": st.attached, "attach": st.attach, "problem": st.problem,
                                   "missing_tracepoints": list(st.missing_tracepoints)}
            if st.attacher is not None:
                row["library"] = st.library
                row["files"] = sorted(st.attacher.files.values())
                row["missing_symbols"] = st.attacher.missing
            rows.append(row)
        return rows

    def close(self) -> None:
        """Detach and unload every program."""
        for state in self.states.values():
            if state.program is not None:  # out of a scrape's sight before its maps close
                program, state.program = state.program, None
                program.close()
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None
