"""The ``rca`` commands' argument types and output-path check: each refuses a bad value while the command line
is parsed or before any long work starts (a usage error, exit 2)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..errors import ConfigError
from ..topology import one_host
from .config import MAX_WIDTH, SHIPPED_MODEL

__all__ = ["MAX_HOURS", "MIN_HOURS", "hidden_pair", "name_list", "severity_range", "rate_list", "host_topology",
           "check_out"]

MAX_HOURS = 168.0  # rca dataset --hours, per entity: memory grows with hours (~1 GB at 168 h; entities are
# written one at a time), run time with hours x entities
MIN_HOURS = 0.001  # 3.6 ticks of 1 s: under 2 no window, and no step, could be made


def hidden_pair(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two integers like 64,32, got {text!r}") from None
    if not (1 <= a <= MAX_WIDTH and 1 <= b <= MAX_WIDTH):  # what a model file may hold: larger failed to load
        raise argparse.ArgumentTypeError(f"must be two sizes of 1 to {MAX_WIDTH}, got {text!r}")
    return a, b


def name_list(text: str) -> tuple[str, ...]:
    """``a,b,c`` -> ("a", "b", "c"); "" -> ()."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def severity_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH like 0.5,1.0, got {text!r}") from None
    if not 0 < lo <= hi <= 1:  # a fault's severity is a share of its full strength
        raise argparse.ArgumentTypeError(f"need 0 < LOW <= HIGH <= 1, got {text!r}")
    return lo, hi


def rate_list(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected multipliers like 0.6,1.0,1.4, got {text!r}") from None
    if not all(0 < r <= 100 for r in out):
        raise argparse.ArgumentTypeError(f"multipliers must be in (0, 100], got {text!r}")
    return out


def host_topology(text: str) -> str:
    try:
        return one_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_out(path: Path, *, directory: bool, force: bool, dataset: Path | None = None) -> None:
    """Refuse an output path that cannot be written before any long work starts: a directory where a file
    is wanted or the reverse, a parent that is a file, a directory we may not write in; what is stored there
    already unless ``force`` (a model daemons load, a dataset: both were replaced without a word); a model file
    inside ``dataset`` (its own metrics.csv was replaced by the model it was training)."""
    if dataset is not None and path.resolve().is_relative_to(dataset.resolve()):
        raise ConfigError(f"--out: {path} is inside the dataset {dataset}; write the model elsewhere")
    stored = any((path / n).exists() for n in ("metrics.csv", "labels.csv")) if directory else path.is_file()
    if stored and not force:
        what = "a file" if not directory else "a dataset"
        raise ConfigError(f"--out: {path} holds {what} already; give another path, or --force to replace it")
    if path.is_dir() and not directory:
        raise ConfigError(f"--out: {path} is a directory; give a file path such as {path / SHIPPED_MODEL.name}")
    if path.exists() and not path.is_dir() and directory:
        raise ConfigError(f"--out: {path} is a file; give a directory (it is created if missing)")
    if path.exists() and not path.is_dir() and not path.is_file():  # the model was renamed over it: /dev/null too
        raise ConfigError(f"--out: {path} is not a regular file (a device, FIFO or socket); give a file path such "
                          f"as {SHIPPED_MODEL.name}")
    parent = path if path.is_dir() else path.parent
    while not parent.exists():  # missing directories are created: the first existing one must take them
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"--out: {parent} is not a directory; choose an --out path inside a directory")
    try:  # a file made there, not os.access: root may write anywhere by its answer, /proc included
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ConfigError(f"--out: cannot write in {parent} ({exc.strerror}); choose another --out path") from None
