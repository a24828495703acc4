"""The wheel a user builds carries everything the code reads, and an installed copy works without the checkout.

A file the code finds beside the package in the checkout (the probes' C in bpf/, the shipped classifier in
models/) is missing only from an installed copy, never from the source tree: this builds the real wheel from
the files git sees, installs it into a fresh venv and runs the commands from a directory outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked() -> list[str]:
    """The files of the working tree that git sees (tracked, or new and not ignored), as a user's clone has them."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for f in _tracked():  # a copy: building in place would leave build/ and egg-info in the checkout
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "-w", str(out), "--no-deps",
                        "--no-build-isolation", "--no-index", "-v"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    (out / "build.log").write_text(r.stdout + r.stderr)
    (whl,) = out.glob("sits_observe-*.whl")
    return whl


def test_wheel_builds_without_setuptools_warnings(wheel: Path) -> None:
    # they announce a build that stops working (a deprecated field: `project.license` as a table fails from
    # 2027-02-18) or a data folder that setuptools will leave out
    log = (wheel.parent / "build.log").read_text()
    warnings = sorted({line.split("BuildBackendWarning: ")[-1] for line in log.splitlines()
                       if "BuildBackendWarning" in line})
    assert not warnings, warnings


def test_wheel_carries_every_package_file_the_c_and_the_model(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    files = _tracked()
    want = {f for f in files if f.startswith("sits_observe/") and "__pycache__" not in f}
    want |= {f"sits_observe/{f}" for f in files if f.startswith("bpf/") and f.endswith((".c", ".h"))}
    want |= {"sits_observe/models/rca-lstm.pt", "sits_observe/models/README.md"}
    assert any(f.startswith("bpf/") for f in files) and "sits_observe/demo.yaml" in want
    assert not want - names, f"missing from the wheel: {sorted(want - names)}"
    # the licences travel with any copy: the code's (Apache-2.0, as the metadata says), and the data's, in the
    # package beside the data and where licence tools look
    licences = {n.split("/licenses/", 1)[1] for n in names if ".dist-info/licenses/" in n}
    assert licences == {"LICENSE", "sits_observe/sim/data/azure_llm_2023/LICENSE.txt",
                        "sits_observe/sim/data/splitwise_perf_model/LICENSE.txt"}, sorted(names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(meta).decode()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # the dependencies (torch, dash, ...) from this interpreter's site-packages, added after the venv's own: a
    # .pth there runs no .pth of theirs, so the checkout's editable install stays out of the fresh venv
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    deps.append(sysconfig.get_paths()["purelib"])
    (Path(purelib) / "deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    return venv


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SITS_", "PYTHON"))}
    return subprocess.run([str(venv / "bin" / "sits-observe"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_installed_copy_finds_its_files_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    code = ("import sits_observe, sits_observe.probes.specs as s, sits_observe.rca.config as c; "
            "print(sits_observe.__file__); print(s.BPF_DIR); print(c.SHIPPED_MODEL)")
    r = subprocess.run([str(installed / "bin" / "python"), "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pkg, bpf, model = (Path(line) for line in r.stdout.split())
    assert pkg.is_relative_to(installed), pkg  # the installed copy, not the checkout
    assert bpf == pkg.parent / "bpf" and (bpf / "runq.bpf.c").is_file() and model.is_file(), r.stdout


def test_installed_copy_checks_the_example_config_and_prints_the_probes(installed: Path, tmp_path: Path) -> None:
    # what an operator installs beside the code comes with it, under the prefix's share/ (they were only in the
    # checkout); the example config leaves rca.model unset: the shipped classifier, which check-config loads
    share = installed / "share" / "sits-observe"
    for name in ("example-config.yaml", "sits-observe.service"):
        assert (share / name).read_bytes() == (ROOT / "docs" / name).read_bytes(), name
    dashboards = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    assert dashboards and sorted(p.name for p in (share / "dashboards").iterdir()) == dashboards
    r = _run(installed, tmp_path, "check-config", str(share / "example-config.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run(installed, tmp_path, "probes", "--print-bpf", "runq")
    assert r.returncode == 0, r.stderr
    assert "// bcc src_file: " in r.stdout and "hist.h" in r.stdout


def test_installed_copy_runs_the_collectors_bench(installed: Path, tmp_path: Path) -> None:
    """Its NVML stand-in lived with the tests: an installed copy refused the bench (it needed the checkout)."""
    r = _run(installed, tmp_path, "bench", "collectors", "--samples", "2", "--processes", "1", "--pages", "1",
             "--dcgm-gpus", "8", "--host-cpus", "8", "--host-ticks", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["nvml"]["gpus"] == 8 and out["nvml"]["ours_ms_per_gpu_sample"] > 0, out
