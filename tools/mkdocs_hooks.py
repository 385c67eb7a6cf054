"""MkDocs hook (``mkdocs.yml``, ``hooks:``): links from a page of ``docs/`` to a repository file
outside it (``../examples/my_trainer.py``, ``../README.md#installing``) resolve on GitHub but not on
the site, which holds ``docs/`` only. On the site each such link becomes its text, once the file it
names is found to exist; a link to a file that does not exist is left as it is, so that MkDocs
reports it and ``mkdocs build --strict`` fails.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
_LINK = re.compile(r"\[([^\]]*)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def outside_links_as_text(markdown: str, page_dir: Path) -> str:
    """``markdown`` with every link to an existing file outside ``docs/`` replaced by its text."""
    if not isinstance(markdown, str):
        raise ValueError(f"markdown: expected a str, got {type(markdown).__name__}")
    if not page_dir.is_dir():
        raise ValueError(f"page_dir: {page_dir} is not a directory")

    def replace(match: re.Match[str]) -> str:
        target = (page_dir / match.group(2)).resolve()
        inside = target == DOCS or DOCS in target.parents
        return match.group(0) if inside or not target.exists() else match.group(1)

    return _LINK.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs' event: the page's Markdown before it is rendered."""
    return outside_links_as_text(markdown, (DOCS / page.file.src_uri).parent)
