"""The documentation's text, for the tests that run or check what it shows (issue 29).

The README is a front page; the manual is the pages of ``docs/`` (the MkDocs site, ``mkdocs.yml``).
A test that reads a section asks for it by its title, wherever it lives now: :func:`section` finds
the one heading of that title across ``README.md`` and ``docs/*.md``. :func:`commands` and
:func:`bash_commands` give the command lines of fenced blocks as a user copies them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")
_FENCE = re.compile(r"^\s*```")


def pages() -> list[Path]:
    """``README.md`` and every Markdown page of ``docs/``, in a fixed order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def read(page: Path | str) -> str:
    """The text of ``page``: a path, or a name relative to the repository root (``docs/trainer.md``)."""
    path = page if isinstance(page, Path) else ROOT / page
    if not path.is_file():
        raise ValueError(f"page: {path} is not a file")
    return path.read_text(encoding="utf-8")


def all_text() -> str:
    """Every page's text, one after the other (README first)."""
    return "\n".join(read(page) for page in pages())


def headings(text: str) -> list[tuple[int, int, str]]:
    """``(line index, level, title)`` of every Markdown heading of ``text`` outside fenced blocks."""
    found: list[tuple[int, int, str]] = []
    fenced = False
    for index, line in enumerate(text.splitlines()):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            found.append((index, len(match.group(1)), match.group(2)))
    return found


def find_section(title: str) -> tuple[Path, str]:
    """The page holding the heading ``title`` (exactly one across the pages) and the section's text,
    from below the heading to the next heading of its level or above (subsections included)."""
    if not title:
        raise ValueError("title: expected a heading's title")
    hits: list[tuple[Path, str]] = []
    for page in pages():
        text = read(page)
        lines = text.splitlines()
        marks = headings(text)
        for position, (index, level, name) in enumerate(marks):
            if name != title:
                continue
            end = next((i for i, lv, _ in marks[position + 1 :] if lv <= level), len(lines))
            hits.append((page, "\n".join(lines[index + 1 : end]) + "\n"))
    if len(hits) != 1:
        where = [str(page.relative_to(ROOT)) for page, _ in hits]
        raise AssertionError(f"heading {title!r}: expected in exactly one page, found in {where}")
    return hits[0]


def section(title: str, *, subsections: bool = True) -> str:
    """The text of the section titled ``title`` (see :func:`find_section`); without
    ``subsections``, only the text before its first subheading."""
    _, text = find_section(title)
    if subsections:
        return text
    marks = headings(text)
    return text if not marks else "\n".join(text.splitlines()[: marks[0][0]]) + "\n"


def python_block_after(marker: str) -> str:
    """The first fenced ``python`` block after the one line (of all the pages) containing ``marker``."""
    found = [read(page) for page in pages() if marker in read(page)]
    if len(found) != 1:
        raise AssertionError(f"{marker!r}: expected in exactly one page, found in {len(found)}")
    text = found[0]
    match = re.search(r"```python\n(.*?)```", text[text.index(marker) :], flags=re.DOTALL)
    assert match is not None, f"no python block after {marker!r}"
    return match.group(1)


def fenced_blocks(text: str, languages: tuple[str, ...] = ("bash",)) -> list[str]:
    """The bodies of the fenced blocks of ``text`` whose info string is one of ``languages``."""
    names = "|".join(re.escape(name) for name in languages)
    return re.findall(rf"^```(?:{names})\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def commands(text: str, languages: tuple[str, ...] = ("bash", "yaml")) -> list[str]:
    """The command lines of the fenced blocks in ``text``: continuation lines joined, ``#``
    comments dropped, YAML ``- run: |`` bodies included."""
    lines: list[str] = []
    for block in fenced_blocks(text, languages):
        pending = ""
        for raw in block.splitlines():
            line = raw.strip()
            if pending:
                line = pending + " " + line
                pending = ""
            if line.endswith("\\"):
                pending = line[:-1].strip()
                continue
            code = line.split(" #", 1)[0].strip()
            if code and not code.startswith("#"):
                lines.append(code)
    return lines


def bash_commands() -> list[tuple[str, str]]:
    """``(page, command)`` for every command line of every page's fenced ``bash`` blocks."""
    return [
        (str(page.relative_to(ROOT)), line) for page in pages() for line in commands(read(page), ("bash",))
    ]
