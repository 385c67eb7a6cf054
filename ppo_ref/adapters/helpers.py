"""Public helpers for writing an adapter to a third-party library (the built-in adapters use them).

Locating an installed library:

- :func:`import_library` imports a module of the adapted library and, if that fails, raises
  :class:`~ppo_ref.adapters.AdapterLoadError` saying which library is missing and how to get it
  (:func:`missing_library`);
- :func:`library_location` names a library function as ``module.qualname (path/in/site-packages.py:line)``,
  for an adapter's ``provenance``;
- :func:`float_mask` turns a bool mask into the 0/1 float mask most libraries take.

Running exact lines of a library's own source (inline extraction): some libraries keep their PPO
math inline in a long method (TRL 1.12 ``PPOTrainer.train``, stable-baselines3 ``PPO.train``)
instead of a function an adapter could call. Rather than copying those lines, an adapter describes
a block with an :class:`InlineBlock`: the function that holds it, its first and last line (stripped
of indentation) and a SHA-256 digest of the whole block. :func:`locate` reads the installed source
with :func:`inspect.getsourcelines`, finds the block, checks the digest, and compiles it under the
library file's name and line numbers, so a traceback points into the library.
:meth:`LocatedBlock.run` executes it in a namespace made of the library module's globals plus the
variables the adapter binds, and returns that namespace. When the installed source no longer holds
the pinned lines verbatim (another version, a patch, a reformatted line), :func:`locate` raises
:class:`InlineSourceError` saying what it found; nothing is ever executed from a block that does
not match its digest. To pin a new block (or re-pin after a deliberate library upgrade), print it
with its digest::

    python -m ppo_ref.adapters.helpers MODULE:QUALNAME 'FIRST LINE' 'LAST LINE'

Example, on a module of the standard library (any installed module works the same way)::

    >>> import textwrap
    >>> block = InlineBlock("textwrap", "dedent", "if margin:", "return text", "0" * 16)
    >>> try:
    ...     locate(block)
    ... except InlineSourceError as error:
    ...     print("no longer matches its pin" in str(error))
    True

:class:`LibraryPolicyLoss` is a ready result type for a ``policy_loss`` op (``None`` where the
library computes no such statistic). No library is imported by this module.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import torch
from torch import Tensor

from ppo_ref.adapters.registry import AdapterLoadError

__all__ = [
    "DIGEST_LENGTH",
    "InlineBlock",
    "InlineSourceError",
    "LibraryPolicyLoss",
    "LocatedBlock",
    "block_digest",
    "float_mask",
    "import_library",
    "library_location",
    "locate",
    "missing_library",
]


def missing_library(
    adapter: str, library: str, error: ImportError, hint: str | None = None
) -> AdapterLoadError:
    """The error for adapter ``adapter`` when ``library`` (e.g. ``"TRL 1.12.0"``) cannot be imported.

    ``hint`` says how to get the library (default: for a built-in adapter, the command that builds
    its isolated environment and the one that runs the suite there, ``docs/thirdparty-envs.md``;
    for any other adapter, to install the library where the suite runs).

    >>> error = missing_library("mine2", "lib 2.0", ImportError("no lib"), "Run `pip install lib`.")
    >>> str(error).startswith("adapter 'mine2' needs lib 2.0"), str(error).endswith("`pip install lib`.")
    (True, True)
    """
    for name, value in (("adapter", adapter), ("library", library)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: expected a non-empty str, got {value!r}")
    if not isinstance(error, ImportError):
        raise ValueError(f"error: expected an ImportError, got {type(error).__name__}")
    if hint is None:
        from ppo_ref.adapters.registry import BUILTIN_ADAPTERS

        hint = (
            f"Build its isolated environment with `python tools/thirdparty_envs.py {adapter}`, then run "
            f"`.envs/{adapter}/bin/python -m pytest conformance/ --impl={adapter}` (docs/thirdparty-envs.md)"
            if adapter in BUILTIN_ADAPTERS
            else f"Install {library} in the Python environment that runs the conformance suite"
        )
    return AdapterLoadError(
        f"adapter {adapter!r} needs {library}, which cannot be imported in this environment ({error}). {hint}"
    )


def import_library(adapter: str, library: str, module: str, hint: str | None = None) -> ModuleType:
    """Import ``module`` of the adapted library; :func:`missing_library`'s error if that fails.

    >>> import_library("mine", "the standard library", "json").__name__
    'json'
    """
    if not isinstance(module, str) or not module:
        raise ValueError(f"module: expected a non-empty module name, got {module!r}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise missing_library(adapter, library, error, hint) from error


def library_location(function: Any) -> str:
    """``module.qualname (path/in/site-packages.py:line)`` of a library function."""
    target = inspect.unwrap(function)
    name = f"{target.__module__}.{target.__qualname__}"
    try:
        source = Path(inspect.getsourcefile(target) or "")
        line = inspect.getsourcelines(target)[1]
        top = sys.modules[target.__module__.partition(".")[0]]
        root = Path(top.__file__ or "").parent.parent
        return f"{name} ({source.relative_to(root)}:{line})"
    except (TypeError, OSError, ValueError, KeyError):
        return name


def float_mask(mask: Tensor, like: Tensor) -> Tensor:
    """The mask as 0/1 values of ``like``'s floating dtype (float32 if ``like`` is not floating).

    >>> float_mask(torch.tensor([True, False]), torch.zeros(2, dtype=torch.float64))
    tensor([1., 0.], dtype=torch.float64)
    """
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask: expected a torch.Tensor, got {type(mask).__name__}")
    if not isinstance(like, Tensor):
        raise ValueError(f"like: expected a torch.Tensor, got {type(like).__name__}")
    dtype = like.dtype if like.is_floating_point() else torch.float32
    return mask.to(dtype)


DIGEST_LENGTH = 16
"""Hex characters of SHA-256 kept in a pin (64 bits: enough to notice any edit)."""


class InlineSourceError(RuntimeError):
    """The installed library's source does not hold a pinned block verbatim (or the function is gone)."""


def block_digest(text: str) -> str:
    """The pin of a block: the first :data:`DIGEST_LENGTH` hex digits of SHA-256 of its dedented text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_LENGTH]


@dataclass(frozen=True)
class InlineBlock:
    """A block of consecutive lines inside ``module:qualname``, pinned by content.

    ``first`` and ``last`` are the block's first and last lines without indentation (they may be the
    same line); ``digest`` is :func:`block_digest` of the dedented block, first line to last.
    """

    module: str
    qualname: str
    first: str
    last: str
    digest: str

    @property
    def owner(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class LocatedBlock:
    """A pinned block found in the installed source, compiled and ready to run."""

    block: InlineBlock
    file: str
    start: int
    end: int
    source: str
    code: CodeType = field(repr=False)
    module_globals: Mapping[str, Any] = field(repr=False)

    def where(self) -> str:
        """``package/path/file.py:START-END`` relative to the installation's site-packages."""
        return f"{_site_relative(self.file)}:{self.start}-{self.end}"

    def run(self, /, **bindings: Any) -> dict[str, Any]:
        """Execute the block with the library module's globals plus ``bindings``; return the namespace."""
        namespace: dict[str, Any] = dict(self.module_globals)
        namespace.update(bindings)
        exec(self.code, namespace)
        return namespace


def _site_relative(file: str) -> str:
    path = Path(file)
    for index, part in enumerate(path.parts):
        if part in ("site-packages", "dist-packages"):
            return "/".join(path.parts[index + 1 :])
    return str(path)


def _resolve(module_name: str, qualname: str) -> tuple[object, dict[str, Any]]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InlineSourceError(f"cannot import {module_name!r} to read the pinned lines: {error}") from error
    obj: object = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise InlineSourceError(f"{module_name} has no {qualname!r} (no attribute {part!r})")
        obj = getattr(obj, part)
    return inspect.unwrap(obj), vars(module)  # type: ignore[arg-type]


def _candidates(lines: list[str], first: str, last: str) -> list[tuple[int, int, str]]:
    """(start index, end index, dedented text) for every start line equal to ``first``, ending at the
    next line equal to ``last``."""
    found = []
    for start, line in enumerate(lines):
        if line.strip() != first:
            continue
        for end in range(start, len(lines)):
            if lines[end].strip() == last:
                found.append((start, end, textwrap.dedent("".join(lines[start : end + 1]))))
                break
    return found


def locate(block: InlineBlock) -> LocatedBlock:
    """Find ``block`` in the installed source and compile it; :class:`InlineSourceError` if it is not
    there verbatim (the message says what was found instead)."""
    obj, module_globals = _resolve(block.module, block.qualname)
    try:
        lines, first_line = inspect.getsourcelines(obj)  # type: ignore[arg-type]
        file = inspect.getsourcefile(obj) or "<unknown>"  # type: ignore[arg-type]
    except (OSError, TypeError) as error:
        raise InlineSourceError(f"cannot read the source of {block.owner}: {error}") from error
    candidates = _candidates(lines, block.first, block.last)
    matching = [c for c in candidates if block_digest(c[2]) == block.digest]
    where = f"{_site_relative(file)} ({block.owner})"
    if not candidates:
        raise InlineSourceError(
            f"{where}: the pinned block starting {block.first!r} and ending {block.last!r} is not in the "
            "installed source; the library changed, so the adapter cannot run these lines"
        )
    if not matching:
        seen = ", ".join(
            f"lines {first_line + s}-{first_line + e} digest {block_digest(text)}"
            for s, e, text in candidates
        )
        raise InlineSourceError(
            f"{where}: the block from {block.first!r} to {block.last!r} no longer matches its pin "
            f"(expected digest {block.digest}, found {seen}); the installed source differs from the one "
            "the adapter was written against. Print it with "
            f"`python -m ppo_ref.adapters.helpers {block.owner} FIRST LAST`"
        )
    if len(matching) > 1:
        raise InlineSourceError(f"{where}: the pinned block occurs {len(matching)} times; pin a longer block")
    start, end, text = matching[0]
    start_line, end_line = first_line + start, first_line + end
    # dont_inherit: compiled as plain library code, without this module's __future__ flags
    code = compile("\n" * (start_line - 1) + text, file, "exec", dont_inherit=True)
    return LocatedBlock(block, file, start_line, end_line, text, code, module_globals)


@dataclass(frozen=True)
class LibraryPolicyLoss:
    """What the third-party adapters' ``policy_loss`` ops return: the library's own loss and the
    statistics it computes (``None`` where the library computes no such statistic)."""

    loss: Tensor
    clipfrac: Tensor | None
    approx_kl: Tensor | None
    ratio_outside_frac: Tensor | None = None
    ratio_mean: Tensor | None = None
    ratio_max: Tensor | None = None


def _print_block(argv: list[str]) -> int:
    if len(argv) != 3 or ":" not in argv[0]:
        print(__doc__)
        print("usage: python -m ppo_ref.adapters.helpers MODULE:QUALNAME 'FIRST' 'LAST'")
        return 2
    module_name, _, qualname = argv[0].partition(":")
    obj, _ = _resolve(module_name, qualname)
    lines, first_line = inspect.getsourcelines(obj)  # type: ignore[arg-type]
    candidates = _candidates(lines, argv[1].strip(), argv[2].strip())
    if not candidates:
        print(f"no block from {argv[1]!r} to {argv[2]!r} in {argv[0]}")
        return 1
    for start, end, text in candidates:
        print(f"# lines {first_line + start}-{first_line + end}, digest {block_digest(text)}")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(_print_block(sys.argv[1:]))
