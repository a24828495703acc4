"""YAML text -> data for config and scenario files: a key given twice in one mapping is an error (PyYAML keeps the
last one silently, so a second ``slos:`` would drop the first), and so is nesting past :data:`MAX_DEPTH`.  Files a
config names (a scenario, a trace) are read with :func:`read_text`."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

__all__ = ["MAX_DEPTH", "parse_yaml", "read_text"]

MAX_DEPTH = 64  # far deeper than any config; a deeper file would exhaust the parser's recursion


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and deep nesting; ``<<`` merge keys may still be overridden."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(problem=f"nested more than {MAX_DEPTH} levels deep; flatten the file",
                                           problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    problem=f"key {key!r} given twice (first at line {first.line + 1}); keep one",
                    problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data; a syntax error, a duplicate key or too deep nesting becomes one ConfigError line with
    the position."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.reader.ReaderError as exc:  # a character YAML refuses (a control byte): it has no problem_mark
        line = text.count("\n", 0, exc.position) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        raise ConfigError(f"{source}: not valid YAML at line {line}: {exc.reason} ({char!r}); remove it") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = str(getattr(exc, "problem", exc))
        fix = "; indent with spaces, not tabs" if "'\\t'" in problem else ""  # YAML refuses tabs there
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}{fix}") from None


def read_text(path: str | Path, limit: int, field: str, what: str, fix: str) -> str:
    """The UTF-8 text of the regular file ``path`` (a ``what``, at most ``limit`` bytes) that config field ``field``
    names; one ConfigError line ending in ``fix`` otherwise: a FIFO would never answer and /dev/zero never end, at
    a start or, worse, at a SIGHUP in the tick loop."""
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            raise ConfigError(f"{field}: {what} {p} is not a regular file; {fix}")
        with p.open("rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:
            raise ConfigError(f"{field}: {what} {p} is larger than {limit >> 20} MiB; {fix}")
        return raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {what} {p}: {exc.strerror}; {fix}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{field}: {what} {p} is not UTF-8 text (byte {exc.start}); {fix}") from None
