"""Allow-listed import stubs for OpenRLHF's GPU-only top-level imports (``flash_attn``, ``vllm``).

OpenRLHF 0.11.2 imports ``flash_attn`` and ``vllm`` at module level on the way to the functions
the adapter calls (``openrlhf/models/__init__.py`` -> ``models/actor.py`` ->
``models/ring_attn_utils.py:3-4``; ``trainer/ppo_utils/experience_maker.py`` ->
``trainer/ray/vllm_engine.py:7-12``). Neither installs without CUDA. :func:`install` appends a
finder to the END of ``sys.meta_path`` that answers only for the exact module names in
:data:`STUBBED_NAMES`, so:

- a real installation, found by the normal finders first, always wins;
- any other name (``flash_attn.ops.triton.cross_entropy``, ``vllm.distributed``, ...) still raises
  ``ModuleNotFoundError``, so OpenRLHF's own ``try: ... except ImportError`` fallbacks (e.g. in
  ``openrlhf.models.utils.log_probs_from_logits``) keep taking the pure-torch path;
- a stub module has only the attributes listed for it; each is a stand-in that raises
  :class:`StubCalledError` when called or instantiated, so a stub can never compute anything;
- a stub has no ``__version__`` and no ``__file__``: transformers' availability check
  (``transformers/utils/import_utils.py`` ``_is_package_available``) then reports flash-attn as
  not installed.

Only the OpenRLHF adapter's ``make_adapter`` installs it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import MappingProxyType, ModuleType
from typing import NoReturn

__all__ = ["STUBBED_NAMES", "StubCalledError", "StubFinder", "install", "installed", "uninstall"]

STUBBED_NAMES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        "flash_attn": (),
        "flash_attn.bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
        "flash_attn.utils": (),
        "flash_attn.utils.distributed": ("all_gather",),
        "vllm": ("SamplingParams", "LLM"),
        "vllm.inputs": ("TokensPrompt",),
        "vllm.utils": ("random_uuid",),
    }
)
"""Module name -> the attributes its stub provides (docs/thirdparty-envs.md, "OpenRLHF without
import stubs", lists where each is imported)."""


class StubCalledError(RuntimeError):
    """A stand-in from an import stub was called: the GPU-only library is not really installed."""


class _StandIn:
    """Stands in for one imported name; calling it (or instantiating it) raises."""

    def __init__(self, qualified_name: str) -> None:
        self._qualified_name = qualified_name

    def __repr__(self) -> str:
        return f"<ppo-ref import stub for {self._qualified_name}>"

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise StubCalledError(
            f"{self._qualified_name} is an import stub installed by ppo-ref's OpenRLHF adapter "
            "(ppo_ref.adapters.thirdparty._openrlhf_stubs); the real package is not installed"
        )


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module creation; exec_module fills it

    def exec_module(self, module: ModuleType) -> None:
        for attribute in STUBBED_NAMES[module.__name__]:
            setattr(module, attribute, _StandIn(f"{module.__name__}.{attribute}"))


class StubFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`STUBBED_NAMES`, and nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in STUBBED_NAMES:
            return None
        # A package (empty search path) so that its listed submodules can be imported; origin None
        # leaves __file__ unset.
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)

    def __repr__(self) -> str:
        return "StubFinder(ppo-ref OpenRLHF import stubs)"


def installed() -> StubFinder | None:
    """The installed finder, if any."""
    return next((f for f in sys.meta_path if isinstance(f, StubFinder)), None)


def install() -> StubFinder:
    """Append the finder to the end of ``sys.meta_path`` (once; later calls return the same one)."""
    finder = installed()
    if finder is None:
        finder = StubFinder()
        sys.meta_path.append(finder)
    return finder


def uninstall() -> None:
    """Remove the finder and forget every stub module already imported (for tests)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, StubFinder)]
    for name in STUBBED_NAMES:
        module = sys.modules.get(name)
        if module is not None and isinstance(module.__spec__, importlib.machinery.ModuleSpec):
            if isinstance(module.__spec__.loader, _StubLoader):
                del sys.modules[name]
