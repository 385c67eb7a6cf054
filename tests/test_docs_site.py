"""The manual builds as a site with ``mkdocs build --strict`` (issue 29): a dead link or ``#anchor``,
or a page of docs/ left out of the navigation, fails. The build runs in-process in ``./dev test``
(under a second); the README's command runs as typed in a subprocess (marked multiprocess)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mkdocs.commands.build import build
from mkdocs.config import load_config

from tests.docs_text import DOCS, ROOT, commands, section
from tools.mkdocs_hooks import outside_links_as_text

CONFIG = ROOT / "mkdocs.yml"


def test_every_page_of_docs_is_in_the_navigation_once() -> None:
    nav = re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)\s*$", CONFIG.read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(nav) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")), nav
    assert len(nav) == len(set(nav))


def test_the_site_builds_strict(tmp_path: Path) -> None:
    config = load_config(config_file=str(CONFIG), strict=True, site_dir=str(tmp_path / "site"))
    build(config)  # raises mkdocs.exceptions.Abort on any warning
    assert (tmp_path / "site" / "step-tier" / "index.html").is_file()
    page = (tmp_path / "site" / "step-tier" / "index.html").read_text(encoding="utf-8")
    assert "examples/my_trainer.py" in page and 'href="../examples' not in page


def test_links_outside_docs_become_text_only_when_the_file_exists(tmp_path: Path) -> None:
    text = "[a](../examples/my_trainer.py) [b](../README.md#installing) [c](../no/such.py) [d](trainer.md)"
    assert outside_links_as_text(text, DOCS) == "a b [c](../no/such.py) [d](trainer.md)"
    with pytest.raises(ValueError, match=r"^page_dir: "):
        outside_links_as_text(text, tmp_path / "missing")


@pytest.mark.multiprocess
def test_the_readmes_docs_command_as_typed(tmp_path: Path) -> None:
    (line,) = [c for c in commands(section("Documentation"), ("bash",)) if "mkdocs" in c]
    words = shlex.split(line)
    assert words[0] == ".venv/bin/mkdocs" and words[1:3] == ["build", "--strict"]
    mkdocs = Path(sys.executable).with_name("mkdocs")  # .venv/bin/mkdocs in a checkout set up by ./dev
    site = tmp_path / "site"
    args = [str(mkdocs), *words[1:]]
    args[args.index("-d") + 1] = str(site)  # the README's site/, written outside the checkout here
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "index.html").is_file()
