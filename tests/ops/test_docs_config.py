"""README.md and docs/*.md are the operator's contract: these tests keep them and the code in agreement, both ways.
What the code has (a command's flag, a config field, an exported metric family, an API route) must be documented,
and what the docs name must exist. The docs are read as text, so "documented" means named in the right place:

- Config fields (``Config.model_fields``, walked into each section's model; a list or mapping of models is one
  level): a field is documented by a row of a ``| field | ...`` table (the section is the one the heading, or the
  ``X:`` line just before the table, names), by a backticked name in the row of its parent, or as a key of a YAML
  config example (a ``yaml`` code block whose top-level keys are config sections). Every row and every key of such
  an example must be a field; a table's ``default`` must be the model's wherever it is a value (a backticked
  literal, a number, ``unset`` or ``required``; prose such as "the type" is not compared).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, get_args, get_origin

import yaml
from docs_text import SPAN, Row, sections
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from sits_observe.config import Config


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model a field holds (in a list, a mapping or an Optional too), and whether by mapping key."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    for arg in get_args(annotation):
        model, keyed = _model_in(arg)
        if model is not None:
            return model, keyed or get_origin(annotation) is dict
    return None, False


@cache
def config_fields() -> dict[tuple[str, ...], FieldInfo]:
    """Every field of the config by path: ``scheduler.shards[].gpus`` is ``("scheduler", "shards", "gpus")``."""
    out: dict[tuple[str, ...], FieldInfo] = {}

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            out[(*path, name)] = info
            if (sub := _model_in(info.annotation)[0]) is not None:
                walk(sub, (*path, name))

    walk(Config, ())
    return out


def resolve(prefix: tuple[str, ...], name: str) -> tuple[str, ...] | None:
    """The config path a doc's name stands for under ``prefix`` (``receivers[].url``, ``cuda.stages.<stage>``,
    ``nccl.stages.collective``: a mapping's key is no field), or None when the config has no such field."""
    path = list(prefix)
    model = Config if not prefix else _model_in(config_fields()[prefix].annotation)[0]
    keyed = bool(prefix) and _model_in(config_fields()[prefix].annotation)[1]
    for part in re.sub(r"\[\]", "", name.rstrip(":")).split("."):
        if keyed and (part.startswith("<") or model is not None and part not in model.model_fields):
            keyed = False  # a key of the mapping
            continue
        if model is None or part not in model.model_fields:
            return None
        path.append(part)
        model, keyed = _model_in(model.model_fields[part].annotation)
    return tuple(path)


def _section_of(text: str) -> tuple[str, ...]:
    """The section a table's heading or intro names (``## Configuration (`probes:`)``, `` `scheduler.shards[]` ``)."""
    for name in SPAN.findall(text):
        if (path := resolve((), name.strip())) is not None and _model_in(config_fields()[path].annotation)[0]:
            return path
    return ()


@dataclass
class FieldRow:
    row: Row
    paths: list[tuple[str, ...] | None]
    names: list[str]


def field_rows() -> Iterator[FieldRow]:
    """Rows of the ``| field | ...`` tables; `a.b` / `c` and `a.b`, `.c` name a.b and a.c."""
    for sec in sections():
        for row in sec.rows:
            if row.header[0] != "field" or not (names := SPAN.findall(row.cells[0])):
                continue
            prefix, first = _section_of(row.intro), names[0]
            parent = first.rsplit(".", 1)[0] + "." if "." in first else ""
            full = [first] + [parent + n.lstrip(".") if n.startswith(".") or ("." not in n and parent) else n
                              for n in names[1:]]
            yield FieldRow(row, [resolve(prefix, n) for n in full], full)


def yaml_examples() -> Iterator[tuple[str, dict[str, Any]]]:
    """The YAML code blocks whose top-level keys are config fields."""
    for sec in sections():
        for where, lang, text in sec.blocks:
            data = yaml.safe_load(text) if lang == "yaml" else None
            if isinstance(data, dict) and set(data) & set(Config.model_fields):
                yield where, data


def _yaml_keys(data: dict[str, Any], path: tuple[str, ...], where: str) -> Iterator[tuple[str, ...] | str]:
    """Each key's config path, or a message for a key the config does not have."""
    for key, value in data.items():
        if (sub := resolve(path, str(key))) is None:
            yield f"{where}: {'.'.join((*path, str(key)))}"
            continue
        yield sub
        model, keyed = _model_in(config_fields()[sub].annotation)
        items = (value if isinstance(value, list) else list(value.values()) if keyed and isinstance(value, dict)
                 else [value]) if model is not None else []
        for item in items:
            if isinstance(item, dict):
                yield from _yaml_keys(item, sub, where)


def test_every_config_field_is_documented() -> None:
    documented: set[tuple[str, ...]] = set()
    for fr in field_rows():
        named = [p for p in fr.paths if p is not None]
        documented.update(named)
        words = set(re.findall(r"\w+", " ".join(SPAN.findall(" ".join(fr.row.cells[1:])))))
        documented.update((*p, w) for p in named for w in words if (*p, w) in config_fields())
        documented.add(_section_of(fr.row.intro))
    for where, data in yaml_examples():
        documented.update(k for k in _yaml_keys(data, (), where) if isinstance(k, tuple))
    documented |= {p[:i] for p in documented for i in range(len(p))}  # a field named with its section names both
    missing = [".".join(p) for p in config_fields() if p not in documented]
    assert not missing, ("config fields in no `| field |` table row (or its parent's row, or a YAML config example) "
                         "of docs/*.md:\n" + "\n".join(missing))


def test_every_config_field_the_docs_name_exists() -> None:
    wrong = [f"{fr.row.where}: {name}" for fr in field_rows() for name, p in zip(fr.names, fr.paths) if p is None]
    for where, data in yaml_examples():
        wrong += [k for k in _yaml_keys(data, (), where) if isinstance(k, str)]
    assert not wrong, "config fields in docs/*.md that the config model does not have:\n" + "\n".join(wrong)


REQUIRED, UNSET = object(), object()


def _literal(text: str) -> Any:
    """The value a default cell states, or None when it is prose ("the type", "see below")."""
    text = text.strip()
    if re.fullmatch(r"`[^`]*`", text):
        return yaml.safe_load(text[1:-1]) if text[1:-1] else ""
    if re.fullmatch(r"-?[0-9][0-9.e+-]*", text):
        return yaml.safe_load(text)
    return {"unset": UNSET, "required": REQUIRED}.get(text)


def test_documented_config_defaults_are_the_models() -> None:
    wrong = []
    for fr in field_rows():
        if len(fr.row.header) < 2 or fr.row.header[1] != "default":
            continue
        cell = fr.row.cells[1]
        parts = re.split(r"\s*[,/]\s*", cell) if len(fr.paths) > 1 and re.search(r"[,/]", cell) else [cell]
        for path, part in zip(fr.paths, parts if len(parts) == len(fr.paths) else parts * len(fr.paths)):
            if path is None or (doc := _literal(part)) is None:
                continue
            info = config_fields()[path]
            if doc is REQUIRED or info.is_required():
                ok = doc is REQUIRED and info.is_required()
            elif doc is UNSET:
                ok = info.get_default(call_default_factory=True) is None
            else:
                kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
                adapter = TypeAdapter(kind)  # its validators too: `28d` is 2419200 s
                ok = adapter.validate_python(doc) == info.get_default(call_default_factory=True)
            if not ok:
                shown = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
                wrong.append(f"{fr.row.where}: {'.'.join(path)}: documented {part.strip()}, the model's {shown}")
    assert not wrong, "documented config defaults that are not the model's:\n" + "\n".join(wrong)
