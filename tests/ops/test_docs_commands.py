"""README.md and docs/*.md are the operator's contract: these tests keep them and the code in agreement, both ways.
What the code has (a command's flag, a config field, an exported metric family, an API route) must be documented,
and what the docs name must exist. The docs are read as text, so "documented" means named in the right place:

- Flags (the real parser, :func:`sits_observe.cli.build_parser`, and each benchmark's own): ``--flag`` of command P
  is documented when it is in a usage of P (``sits-observe P ... --flag`` in an inline code span or a code block
  line with its indented continuation lines; ``rca train ...``, ``bench loop ...`` without the prefix too), or in
  the prose or code of a section (the text between two headings) that names P, or in the row of a table headed
  ``bench`` whose first cell is P's benchmark. Table rows count only for themselves: README's command table names
  every command, and one command's row documents no other's flags. A usage's flags must be its command's (and a
  value shown as ``[--flag VALUE]`` its default, ``[--flag A|B]`` values it takes); a ``--flag`` written anywhere
  else (other programs' command lines left out) must be some command's; the bounds in performance.md's table are
  the parser's.
"""

from __future__ import annotations

import argparse
import importlib
import re
from functools import cache

import pytest
from docs_text import FLAG, SPAN, sections, spans

from sits_observe.cli import BENCHES, build_parser


@cache
def commands() -> dict[tuple[str, ...], dict[str, argparse.Action]]:
    """Each command path (``()`` is ``sits-observe`` itself) -> its option strings -> action, benchmarks included."""
    out: dict[tuple[str, ...], dict[str, argparse.Action]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        out[path] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))
            out[path].update((o, action) for o in action.option_strings)

    walk(build_parser(), ())
    for name, (module, func) in BENCHES.items():  # as cli._bench builds them
        mod = importlib.import_module(module)
        parser = argparse.ArgumentParser(prog=f"sits-observe bench {name}")
        parser.add_argument("--json", action="store_true")
        (getattr(mod, "add_arguments_" + func.removeprefix("run_"), None) or mod.add_arguments)(parser)
        walk(parser, ("bench", name))
    return out


def _children(path: tuple[str, ...]) -> set[str]:
    return {p[len(path)] for p in commands() if len(p) == len(path) + 1 and p[:len(path)] == path}


# how a command line may start the program: `$ `, `sudo [-u USER] `, `VAR=value `, a path, `python -m sits_observe`
LAUNCH = re.compile(r"(?:\$\s+)?(?:sudo\s+(?:-u\s+\S+\s+)?)?(?:env\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                    r"(?:\S*/)?(?:sits-observe|python3?\s+-m\s+sits_observe)(?=\s|$)")


def usage(text: str) -> tuple[list[tuple[str, ...]], str] | None:
    """The command paths a usage names (``rca dataset|train`` names two) and the rest of it, or None."""
    launch = LAUNCH.match(text)
    words = text[launch.end():].split() if launch else text.split()
    if not launch and (len(words) < 2 or words[0] not in {p[0] for p in commands() if len(p) == 2}):
        return None
    paths: list[tuple[str, ...]] = [()]
    while words:
        alts = words[0].split("|")
        if not all(set(alts) <= _children(p) for p in paths):
            break
        paths, words = [(*p, a) for p in paths for a in alts], words[1:]
    whole = launch is not None or all(len(p) == 2 for p in paths)  # `slo --slos N` is no usage
    return (paths, " ".join(words)) if whole else None


def _names(path: tuple[str, ...], text: str) -> bool:
    """Whether ``text`` names the command (``sits-observe run``; ``rca train``, ``rca dataset|train`` too)."""
    if not path:
        return "sits-observe" in text
    if len(path) == 1:
        return re.search(rf"sits-observe\s+{re.escape(path[0])}(?![\w-])", text) is not None
    alts = r"(?:[\w-]+\|)*" + re.escape(path[1]) + r"(?![\w-])"
    return re.search(rf"(?<![\w-]){re.escape(path[0])}\s+{alts}", text.replace("\\|", "|")) is not None


def _has_flag(options: list[str], text: str) -> bool:
    return bool(set(options) & set(FLAG.findall(text)))


def test_every_command_is_documented() -> None:
    named = {p for _, text in spans() if (u := usage(text)) for p in u[0]}
    leaves = [p for p in sorted(commands()) if p and not _children(p)]
    missing = [" ".join(("sits-observe", *p)) for p in leaves if p not in named]
    assert not missing, "commands no usage in README.md or docs/*.md names:\n" + "\n".join(missing)


def test_every_flag_is_documented_near_its_command() -> None:
    texts = [s.text() for s in sections()] + [" ".join(r.cells) for s in sections() for r in s.rows]
    bench_rows = {("bench", r.cells[0].strip("`")): " ".join(r.cells[1:])
                  for s in sections() for r in s.rows if r.header[0] == "bench"}
    usages = [u for _, text in spans() if (u := usage(text))]
    missing = []
    for path, actions in sorted(commands().items()):
        for action in {id(a): a for a in actions.values()}.values():
            opts = [o for o in action.option_strings if o not in ("-h", "--help")]
            if not opts or any(path in paths and _has_flag(opts, rest) for paths, rest in usages):
                continue
            near = [t for t in texts if _names(path, t)] + [bench_rows.get(path, "")]
            if not any(_has_flag(opts, t) for t in near):
                missing.append(" ".join(("sits-observe", *path, "/".join(opts))))
    assert not missing, "flags not documented beside their command in README.md or docs/*.md:\n" + "\n".join(missing)


def test_every_usage_in_the_docs_names_real_flags_and_their_defaults() -> None:
    wrong = []
    for where, text in spans():
        if (u := usage(text)) is None:
            continue
        paths, rest = u
        if rest and _children(paths[0]) and not re.match(r"[-\[.]", rest):
            wrong.append(f"{where}: `{text}`: {' '.join(('sits-observe', *paths[0]))} has no command {rest.split()[0]}")
        for path in paths:
            actions, cmd = commands()[path], " ".join(("sits-observe", *path))
            wrong += [f"{where}: `{text}`: {cmd} has no {f}" for f in FLAG.findall(rest) if f not in actions]
            for flag, value in re.findall(r"\[(--[\w-]+) ([^\]\s]+)\]", rest):
                if flag in actions and (why := _shown_value(actions[flag], value)):
                    wrong.append(f"{where}: `{text}`: {cmd} {flag} {value}: {why}")
    assert not wrong, "usages in the docs that the parser does not have:\n" + "\n".join(wrong)


def _shown_value(action: argparse.Action, value: str) -> str | None:
    """Why ``[--flag value]`` misstates the flag (a metavar such as ``FILE`` or ``N`` shows nothing)."""
    if value.isupper():
        return None
    alts = value.split("|")
    convert = action.type if callable(action.type) else str
    for alt in alts:
        try:
            got = convert(alt)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            return f"not a value it takes ({exc})"
        if action.choices is not None and got not in action.choices:
            return f"not one of {sorted(action.choices)}"
        if len(alts) == 1 and action.default is not None and got != action.default:
            return f"shown as the default, but the default is {action.default!r}"
    return None


def test_every_flag_the_docs_write_is_a_flag_of_some_command() -> None:
    """Outside usages (checked above) and other programs' command lines (pip, make, python): in prose and table
    cells, and in a code span that is a flag (`--page LONG,SHORT`)."""
    known = {o for actions in commands().values() for o in actions}
    texts = [(w, t) for s in sections() for w, t in s.prose] + [(r.where, c) for s in sections() for r in s.rows
                                                                  for c in r.cells]
    wrong = [f"{where}: {flag}" for where, text in texts for flag in FLAG.findall(SPAN.sub(" ", text))
             if flag.startswith("--") and flag not in known]
    wrong += [f"{where}: `{text}`" for where, text in spans() if text.startswith("--")
              and not set(FLAG.findall(text)) <= known]
    assert not wrong, "flags in the docs that no sits-observe command has:\n" + "\n".join(dict.fromkeys(wrong))


def test_bench_bounds_table_states_the_parsers_bounds() -> None:
    wrong, rows = [], [r for s in sections() for r in s.rows if r.header[:2] == ["bench", "bounds"]]
    assert rows, "docs/performance.md: no `| bench | bounds |` table"
    for row in rows:
        path = ("bench", row.cells[0].strip("`"))
        for flag, bound in re.findall(r"`(--[\w-]+)` ([0-9][0-9.e+]*)", row.cells[1]):
            action = commands()[path].get(flag)
            if action is None or not callable(action.type):
                wrong.append(f"{row.where}: sits-observe bench {path[1]} has no bounded {flag}")
                continue
            past = str(int(bound) + 1) if bound.isdigit() else repr(float(bound) * 1.001)
            for value, ok in ((bound, True), (past, False)):
                try:
                    action.type(value)
                    took = True
                except argparse.ArgumentTypeError:
                    took = False
                if took != ok:
                    wrong.append(f"{row.where}: bench {path[1]} {flag} {value} is {'refused' if ok else 'taken'}")
    assert not wrong, "bounds in the docs that the parser does not apply:\n" + "\n".join(wrong)


@pytest.mark.parametrize("text", ["sits-observe bench soak --hours 6", "$ sits-observe bench soak --hours 6",
                                  "sudo -u sits SITS_LOG_LEVEL=debug /usr/bin/sits-observe bench soak --hours 6",
                                  "python -m sits_observe bench soak --hours 6", "bench soak --hours 6"])
def test_a_usage_is_read_however_the_program_is_started(text: str) -> None:
    assert usage(text) == ([("bench", "soak")], "--hours 6")  # so a wrong flag there is caught, not skipped


def test_text_that_starts_no_program_is_no_usage() -> None:
    assert usage("path: /opt/sits-observe/dashboards") is None and usage("sits-observe.yaml here") is None
