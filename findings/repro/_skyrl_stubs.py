"""Stand-ins for the imports .envs/skyrl does not install (skyrl-train's distributed, inference and
gym modules import them at top level; the functions the reproductions drive use none of them).

``install()`` appends a finder at the END of ``sys.meta_path``: an installed module always wins, and
a missing one under ROOTS becomes an empty module whose attributes are dummy classes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

ROOTS = (
    "tqdm",
    "transformers",
    "peft",
    "vllm",
    "sglang",
    "flash_attn",
    "deepspeed",
    "fsspec",
    "s3fs",
    "gcsfs",
    "datasets",
    "accelerate",
    "tensorboard",
    "wandb",
    "aiohttp",
    "fastapi",
    "uvicorn",
    "httpx",
    "openai",
    "jinja2",
    "safetensors",
    "hydra",
    "pydantic",
    "skyrl_gym",
)


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = lambda attr: type(attr, (), {})  # type: ignore[method-assign]
        return module

    def exec_module(self, module: Any) -> None:
        return None


def install() -> None:
    if not any(isinstance(f, _Stub) for f in sys.meta_path):
        sys.meta_path.append(_Stub())
