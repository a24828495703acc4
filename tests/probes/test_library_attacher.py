"""LibraryAttacher without a kernel: when a library file counts as done, and how a failed one is retried."""

from __future__ import annotations

from typing import Any

import pytest

from sits_observe.errors import ProbeError
from sits_observe.probes import program
from sits_observe.probes.program import LibraryAttacher

INODE = (2049, 123456)
LIB = "/usr/lib/libcuda.so.1"


class FakeBpf:
    """Records attached (path, address, function); ``refuse`` makes attach_uprobe raise as bcc does."""

    def __init__(self) -> None:
        self.attached: list[tuple[bytes, int, bytes]] = []
        self.refuse = False

    def attach_uprobe(self, name: bytes, addr: int, fn_name: bytes) -> None:
        if self.refuse:
            raise Exception("Failed to attach BPF program enter_sync to uprobe")  # noqa: TRY002 (bcc's own)
        self.attached.append((name, addr, fn_name))

    def attach_uretprobe(self, name: bytes, addr: int, fn_name: bytes) -> None:
        pass


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
    monkeypatch.setattr(program, "find_symbols", symbols)
    bpf = FakeBpf()
    attacher = LibraryAttacher(bpf, {"sync": ("cuStreamSynchronize",)})
    assert "cannot read its symbols" in (_offer(attacher, 4242) or "")  # the short-lived worker, gone
    assert _offer(attacher, 4300) is None  # the server, the same file: attached at the next scan
    assert bpf.attached == [(f"/proc/4300/root{LIB}".encode(), 0x1000, b"enter_sync")]
    assert attacher.probes == 1 and attacher.files == {INODE: LIB} and attacher.failed == {}
    assert _offer(attacher, 4300) is None and symbols.calls == 2  # done: not read again


def test_a_file_where_every_attach_failed_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program, "find_symbols", Symbols({"cuStreamSynchronize": 0x1000}))
    bpf = FakeBpf()
    bpf.refuse = True  # the process exited between reading the symbols and attaching
    attacher = LibraryAttacher(bpf, {"sync": ("cuStreamSynchronize",)})
    assert "attach failed" in (_offer(attacher, 4242) or "") and attacher.probes == 0
    bpf.refuse = False
    assert _offer(attacher, 4300) is None and attacher.probes == 1 and attacher.files == {INODE: LIB}


def test_a_file_without_the_symbols_is_read_again_less_and_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    symbols = Symbols({})
    monkeypatch.setattr(program, "find_symbols", symbols)
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
