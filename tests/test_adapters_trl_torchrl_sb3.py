"""The TRL, TorchRL and Stable-Baselines3 adapters, checked in the main environment, where none of
those libraries is installed: they import lazily, fail clearly, and their source pins are well formed."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from ppo_ref.adapters import AdapterLoadError, get_adapter
from ppo_ref.adapters.thirdparty import _inline
from tests.thirdparty_env import assert_names_the_env_commands, import_without_library

LIBRARY_MODULES = {
    "trl": ("trl", "trl.experimental.ppo.ppo_trainer"),
    "torchrl": ("torchrl", "torchrl.objectives.value.functional"),
    "sb3": ("stable_baselines3", "stable_baselines3.common.buffers"),
}


# --- lazy imports and the error when a library is missing -----------------------------------------


@pytest.mark.parametrize("name", sorted(LIBRARY_MODULES))
def test_adapter_modules_import_without_their_library(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = import_without_library(monkeypatch, name, LIBRARY_MODULES[name])
    assert callable(module.make_adapter)


@pytest.mark.parametrize("name", sorted(LIBRARY_MODULES))
def test_missing_library_is_a_clear_error_naming_the_env_command(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in LIBRARY_MODULES[name]:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(AdapterLoadError) as raised:
        get_adapter(name)
    assert_names_the_env_commands(name, str(raised.value))


# --- the pins of the library source the adapters run ------------------------------------------------


@pytest.mark.parametrize("name", ["trl", "sb3"])
def test_adapter_pins_are_well_formed(name: str) -> None:
    blocks = importlib.import_module(f"ppo_ref.adapters.thirdparty.{name}").BLOCKS
    assert blocks
    for block in blocks.values():
        assert re.fullmatch(f"[0-9a-f]{{{_inline.DIGEST_LENGTH}}}", block.digest), block.digest
        assert block.first == block.first.strip() and block.last == block.last.strip()
