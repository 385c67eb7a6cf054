"""What ``ppo-ref train`` needs beyond the base install: the packages of ppo-ref's extra ``trainer``.

The base install (``pip install ppo-ref`` or ``"ppo-ref[conformance]"``) is the reference math and
the conformance suite; the trainer's stack (transformers, accelerate, matplotlib, safetensors) comes
with ``pip install "ppo-ref[trainer]"``. The list is read from the installed distribution's metadata
(``pyproject.toml`` is its one source), so that the command can say what is missing before any work.
"""

from __future__ import annotations

import re
from importlib import metadata

__all__ = ["EXTRA", "missing_requirements", "missing_trainer_message"]

EXTRA = "trainer"
"""The name of the extra that installs the trainer's dependencies."""

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing_requirements(distribution: str = "ppo-ref", extra: str = EXTRA) -> list[str]:
    """The distribution names that ``distribution``'s ``extra`` requires and that are not installed,
    in the order the metadata lists them; ``[]`` when ``distribution`` itself is not installed (a
    source tree on ``sys.path``: nothing to read the extra from). Only requirements whose marker is
    the extra alone count (``; extra == "trainer"``, as ppo-ref's are); versions are not compared.

    Example: with the suite-only install, ``missing_requirements()`` is
    ``['transformers', 'accelerate', 'matplotlib', 'safetensors']``.
    """
    if not isinstance(distribution, str) or not distribution:
        raise ValueError(f"distribution: expected a distribution name, got {distribution!r}")
    if not isinstance(extra, str) or not extra:
        raise ValueError(f"extra: expected the name of an extra, got {extra!r}")
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""\s*extra\s*==\s*["']{re.escape(extra)}["']\s*""")
    own = re.sub(r"[-_.]+", "-", distribution).lower()
    missing = []
    for requirement in requires:
        requirement_part, _, condition = requirement.partition(";")
        found = _NAME.match(requirement_part)
        if found is None or not marker.fullmatch(condition):  # other markers are not evaluated
            continue
        name = found.group(1)
        if re.sub(r"[-_.]+", "-", name).lower() == own:  # ppo-ref[trainer] inside another extra
            continue
        if not _installed(name):
            missing.append(name)
    return missing


def missing_trainer_message(missing: list[str]) -> str:
    """The error ``ppo-ref train`` prints when the packages ``missing`` are not installed."""
    if not isinstance(missing, list) or not missing or not all(isinstance(m, str) for m in missing):
        raise ValueError(f"missing: expected a non-empty list of package names, got {missing!r}")
    return (
        f"the trainer needs {', '.join(missing)}, not installed here: this is ppo-ref without its extra "
        f"'{EXTRA}' (the reference math and the conformance suite only). Install it with "
        f'pip install "ppo-ref[{EXTRA}]" (install a pinned torch first, e.g. pip install torch==2.13.0: '
        "an unpinned one can pull a multi-GB CUDA build)"
    )
