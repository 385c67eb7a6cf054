"""Every relative link and ``#anchor`` of README.md and docs/*.md resolves (issue 29), as GitHub shows
the pages: the file exists, and the anchor is a heading's slug or an ``<a id>`` of the target page.
``mkdocs build --strict`` (``tests/test_docs_site.py``, CI) checks the docs pages once more with the
site's own slugs; this test covers the README too, which the site does not hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_text import ROOT, headings, pages, read

_LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)\)")
_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code spans, where a ``[..](..)`` is no link."""
    kept: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(kept)


def github_slug(title: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation other than ``-``
    and ``_`` removed, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page: its headings' slugs (a repeated one numbered ``-1``, ``-2``, as GitHub
    does) and its explicit ``<a id=...>`` / ``<a name=...>``."""
    found: set[str] = set(_ID.findall(text))
    seen: dict[str, int] = {}
    for _, _, title in headings(text):
        slug = github_slug(title)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return _LINK.findall(prose(read(page)))


def test_the_slugs_are_githubs() -> None:
    assert github_slug("Outputs (in `--out`)") == "outputs-in---out"
    assert github_slug("Judging your trainer's step") == "judging-your-trainers-step"
    assert (
        github_slug("From Python: `PPOTrainer` and `TrainingSetup`")
        == "from-python-ppotrainer-and-trainingsetup"
    )
    assert anchors("# A\n\n## A\n\n```\n# not a heading\n```\n") == {"a", "a-1"}
    assert links(ROOT / "README.md"), "no link found in README.md"


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    dead: list[str] = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            dead.append(f"{target}: no file {destination}")
            continue
        if anchor and destination.suffix == ".md" and anchor not in anchors(read(destination)):
            dead.append(f"{target}: no anchor #{anchor} in {destination.relative_to(ROOT)}")
        elif anchor and destination.suffix != ".md":
            dead.append(f"{target}: an anchor into a file that is not a Markdown page")
    assert dead == [], "\n".join(dead)
