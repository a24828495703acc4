"""Where the files shipped beside the code live: the probes' C (``bpf/``) and the classifier (``models/``).

In the repository they sit at its root, beside ``sits_observe/``; a wheel carries them inside the package
(``sits_observe/bpf``, ``sits_observe/models``: ``[tool.setuptools.package-dir]`` in pyproject.toml), so that an
installed copy finds them without the checkout.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["shipped"]

PACKAGE = Path(__file__).resolve().parent


def shipped(name: str) -> Path:
    """The directory ``name`` (``bpf`` or ``models``): the installed package's copy, else the checkout's."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name
