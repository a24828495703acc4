"""README.md and docs/*.md read as text for tests/ops/test_docs_*.py: sections (the text between two headings)
with their paragraphs, code lines and blocks, and table rows."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = ["ROOT", "DOCS", "FLAG", "SPAN", "Row", "Section", "sections", "spans"]

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")
SPAN = re.compile(r"`([^`]+)`")


@dataclass
class Row:
    where: str
    header: list[str]
    cells: list[str]
    intro: str  # the section's heading, after the paragraph just before the table when that ends with ':'


@dataclass
class Section:
    where: str
    prose: list[tuple[str, str]] = field(default_factory=list)  # (where, text) of each paragraph
    code: list[tuple[str, str, str]] = field(default_factory=list)  # (where, language, a line with its continuation)
    blocks: list[tuple[str, str, str]] = field(default_factory=list)  # (where, language, text) of each code block
    rows: list[Row] = field(default_factory=list)

    def text(self) -> str:
        """Its paragraphs and code, not its table rows."""
        return " ".join([line for _, line in self.prose] + [line for _, _, line in self.code])


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _sections(path: Path) -> Iterator[Section]:
    name = path.relative_to(ROOT).as_posix()
    sec, heading = Section(f"{name}:1"), ""
    fence: str | None = None  # the language of the code block we are in
    header: list[str] | None = None  # of the table we are in
    last: list[str] = []  # the last paragraph's lines, kept over blank lines up to a table
    gap = True  # a blank line (or a block) since the last paragraph line
    for no, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{name}:{no}"
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            if fence is not None:
                sec.blocks.append((where, fence, ""))
            last, gap = [], True
        elif fence is not None:
            sec.blocks[-1] = (*sec.blocks[-1][:2], sec.blocks[-1][2] + line + "\n")
            text = re.sub(r"\s+#.*", "", line).strip()  # less a shell or YAML comment
            if line[:1].isspace() and sec.code and sec.code[-1][1] == fence and not fence:
                sec.code[-1] = (sec.code[-1][0], fence, f"{sec.code[-1][2]} {text}")
            elif text:
                sec.code.append((where, fence, text))
        elif line.startswith("#"):
            yield sec
            sec, heading, header, last, gap = Section(where), line, None, [], True
        elif line.startswith("|"):
            cells = _cells(line)
            if header is None:
                header = cells
                intro = " ".join([*last, heading] if last and last[-1].rstrip(" `").endswith(":") else [heading])
            elif not set("".join(cells)) <= set("-: "):
                sec.rows.append(Row(where, header, cells, intro))
            last, gap = [], True
        elif not line.strip():
            header, gap = None, True
        else:
            header = None
            if gap:
                sec.prose.append((where, line.strip()))
                last = [line]
            else:
                sec.prose[-1] = (sec.prose[-1][0], f"{sec.prose[-1][1]} {line.strip()}")
                last.append(line)
            gap = False
    yield sec


@cache
def sections() -> list[Section]:
    return [s for path in DOCS for s in _sections(path)]


def spans() -> Iterator[tuple[str, str]]:
    """Every inline code span (prose and table cells) and every code block command, with where it is."""
    for sec in sections():
        yield from ((where, s) for where, text in sec.prose for s in SPAN.findall(text))
        yield from ((row.where, s) for row in sec.rows for cell in row.cells for s in SPAN.findall(cell))
        yield from ((where, text) for where, _, text in sec.code)
