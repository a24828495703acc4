"""LibraryAttacher without a kernel: when a library file counts as done, and how a failed one is retried."""

from __future__ import annotations

from typing import Any

import pytest

from sits_observe.errors import ProbeError
from sits_observe.probes import uprobes
from sits_observe.probes.uprobes import LibraryAttacher

INODE = (2049, 123456)
LIB = "/usr/lib/libcuda.so.1"

_num_open_probes = 0  # FakeBpf counts its open probes here, as bcc 0.26 does in its module's global


class FakeBpf:
    """Records attached (path, address, function) and keeps ``uprobe_fds`` as bcc does (event name -> fd), and
    its count of open probes; ``refuse`` makes attach_uprobe raise as bcc does, ``stuck`` detach_uprobe_event."""

    def __init__(self) -> None:
        self.attached: list[tuple[bytes, int, bytes]] = []
        self.uprobe_fds: dict[bytes, int] = {}
        self.refuse = False
        self.stuck = False
        self._fd = 100

    def _add(self, kind: bytes, name: bytes, addr: int) -> None:
        global _num_open_probes
        self._fd += 1
        self.uprobe_fds[b"%s_%s_0x%x" % (kind, name, addr)] = self._fd
        _num_open_probes += 1

    def _del_uprobe_fd(self, ev_name: bytes) -> None:
        global _num_open_probes
        del self.uprobe_fds[ev_name]
        _num_open_probes -= 1

    def attach_uprobe(self, name: bytes, addr: int, fn_name: bytes) -> None:
        if self.refuse:
            raise Exception("Failed to attach BPF program enter_sync to uprobe")  # noqa: TRY002 (bcc's own)
        self.attached.append((name, addr, fn_name))
        self._add(b"p", name, addr)

    def attach_uretprobe(self, name: bytes, addr: int, fn_name: bytes) -> None:
        self._add(b"r", name, addr)

    def detach_uretprobe(self, name: bytes, addr: int) -> None:
        self._del_uprobe_fd(b"r_%s_0x%x" % (name, addr))

    def detach_uprobe_event(self, ev_name: bytes) -> None:
        if self.stuck:
            raise Exception("Failed to detach BPF from uprobe")  # noqa: TRY002 (bcc's own)
        self._del_uprobe_fd(ev_name)


class Symbols:
    """find_symbols' stand-in: answers ``answers`` in turn (a dict, or a ProbeError to raise); counts calls."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, path: str, symbols: set[str]) -> dict[str, int]:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, ProbeError):
            raise answer
        return answer


def _offer(attacher: LibraryAttacher, pid: int) -> str | None:
    return attacher.attach(INODE, f"/proc/{pid}/root{LIB}", LIB)


def test_a_file_read_through_a_process_that_exited_is_tried_again_through_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    symbols = Symbols(ProbeError("cannot read its symbols: [Errno 2] No such file or directory"),
                      {"cuStreamSynchronize": 0x1000})
    monkeypatch.setattr(uprobes, "find_symbols", symbols)
    bpf = FakeBpf()
    attacher = LibraryAttacher(bpf, {"sync": ("cuStreamSynchronize",)})
    assert "cannot read its symbols" in (_offer(attacher, 4242) or "")  # the short-lived worker, gone
    assert _offer(attacher, 4300) is None  # the server, the same file: attached at the next scan
    assert bpf.attached == [(f"/proc/4300/root{LIB}".encode(), 0x1000, b"enter_sync")]
    assert attacher.probes == 1 and attacher.files == {INODE: LIB} and attacher.failed == {}
    assert _offer(attacher, 4300) is None and symbols.calls == 2  # done: not read again


def test_a_file_where_every_attach_failed_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uprobes, "find_symbols", Symbols({"cuStreamSynchronize": 0x1000}))
    bpf = FakeBpf()
    bpf.refuse = True  # the process exited between reading the symbols and attaching
    attacher = LibraryAttacher(bpf, {"sync": ("cuStreamSynchronize",)})
    assert "attach failed" in (_offer(attacher, 4242) or "") and attacher.probes == 0
    bpf.refuse = False
    assert _offer(attacher, 4300) is None and attacher.probes == 1 and attacher.files == {INODE: LIB}


def test_a_file_without_the_symbols_is_read_again_less_and_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    symbols = Symbols({})
    monkeypatch.setattr(uprobes, "find_symbols", symbols)
    attacher = LibraryAttacher(FakeBpf(), {"sync": ("cuStreamSynchronize",)})
    read_at = []
    for scan in range(40):
        before = symbols.calls
        problem = _offer(attacher, 4300)
        if symbols.calls > before:
            read_at.append(scan)
            assert problem == f"{LIB}: symbols not in the library (skipped): cuStreamSynchronize"
        else:
            assert problem is None
    assert read_at == [0, 1, 3, 7, 15, 31]  # skipping 0, 1, 3, 7, 15 offers in between
    assert attacher.files == {} and attacher.missing == {LIB: ["cuStreamSynchronize"]}


def test_a_file_no_process_maps_is_detached_and_a_failed_one_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uprobes, "find_symbols", Symbols({"cuStreamSynchronize": 0x1000}, {}))
    bpf = FakeBpf()
    attacher = LibraryAttacher(bpf, {"sync": ("cuStreamSynchronize",)})
    other = (2049, 777)
    assert _offer(attacher, 4300) is None and attacher.probes == 1
    assert attacher.attach(other, "/proc/4400/root/opt/libcuda.so.1", "/opt/libcuda.so.1")  # no symbols: failed
    mapped = {INODE: (f"/proc/4300/root{LIB}", LIB), other: ("/proc/4400/root/opt/libcuda.so.1", "/opt/libcuda.so.1")}
    assert attacher.release(mapped) == [] and len(bpf.uprobe_fds) == 2  # both still mapped: nothing changes
    assert attacher.release({}, held={INODE}) == [] and attacher.probes == 1  # deleted, still mapped: kept
    # held by its maps line, whose device may not be stat's (btrfs, an overlay before 6.8): the inode holds it
    assert attacher.release({}, held={(INODE[0] + 1, INODE[1])}) == [] and attacher.probes == 1
    assert attacher.failed == {} and attacher.missing == {LIB: []}  # the failed file, unmapped, is forgotten
    assert attacher.release({}) == [(LIB, None)]
    assert attacher.probes == 0 and attacher.files == {} and bpf.uprobe_fds == {} and attacher.missing == {}
    assert attacher.detached == 1
    monkeypatch.setattr(uprobes, "find_symbols", Symbols({"cuStreamSynchronize": 0x1000}))
    assert _offer(attacher, 4500) is None and attacher.probes == 1  # mapped again: attached afresh


def test_a_probe_that_failed_to_detach_is_counted_out_of_bccs_open_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """bcc closed its fd but kept it counted: dropped from uprobe_fds, it must leave bcc's count too, or each such
    probe brings "Number of open probes would exceed global quota" closer."""
    monkeypatch.setattr(uprobes, "find_symbols", Symbols({"cuStreamSynchronize": 0x1000}))
    bpf = FakeBpf()
    attacher = LibraryAttacher(bpf, {"sync": ("cuStreamSynchronize",)})
    before = _num_open_probes
    assert _offer(attacher, 4300) is None and _num_open_probes == before + 2  # an uprobe and a uretprobe
    bpf.stuck = True
    [(shown, problem)] = attacher.release({})
    assert shown == LIB and "Failed to detach BPF from uprobe" in (problem or "")
    assert bpf.uprobe_fds == {} and _num_open_probes == before


def test_a_failure_is_said_with_the_path_shown_not_the_one_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """bcc names the file it opened, /proc/PID/root/...: a new text for every process that exited before its
    library was read, so each was logged and remembered anew (the once-per-text set grew for days)."""
    def unreadable(path: str, symbols: set[str]) -> dict[str, int]:
        raise ProbeError(f"cannot read its symbols: Error -1 enumerating symbols in {path.encode()!r}")

    monkeypatch.setattr(uprobes, "find_symbols", unreadable)
    attacher = LibraryAttacher(FakeBpf(), {"sync": ("cuStreamSynchronize",)})
    said = {_offer(attacher, pid) for pid in (4242, 4243)}
    assert said == {f"{LIB}: cannot read its symbols: Error -1 enumerating symbols in {LIB.encode()!r}"}
