"""Fixtures for the eBPF probe tests. Loading a BPF program costs about half a second, so each test
module shares one ProbeSource (module-scoped fixtures in the modules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe_helpers import STUB_C, build_stub


@pytest.fixture(scope="session")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """libcuda.so.1, libnccl.so.2 and libselftest.so built from stub_libs.c with gcc."""
    out = tmp_path_factory.mktemp("stubs")
    return {name: build_stub(STUB_C, out / name, define)
            for name, define in (("libcuda.so.1", "STUB_CUDA"), ("libnccl.so.2", "STUB_NCCL"),
                                 ("libselftest.so", "STUB_SELFTEST"))}
