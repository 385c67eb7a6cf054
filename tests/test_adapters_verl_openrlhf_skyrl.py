"""The verl, OpenRLHF and skyrl adapters without their libraries (ppo-ref's own environment).

The adapters themselves run against the libraries in ``.envs/NAME`` (``docs/thirdparty-envs.md``);
here: they import lazily, fail clearly when the library is missing, declare valid conventions with
a source for each, and OpenRLHF's import stubs answer only for their allow-listed names.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ppo_ref.adapters import OP_NAMES, AdapterLoadError, convention_problems, get_adapter
from ppo_ref.adapters.thirdparty import _openrlhf_stubs as stubs
from tests.thirdparty_env import assert_names_the_env_commands

ADAPTERS = {
    "verl": ("verl", "ppo_ref.adapters.thirdparty.verl"),
    "openrlhf": ("openrlhf", "ppo_ref.adapters.thirdparty.openrlhf"),
    "skyrl": ("skyrl", "ppo_ref.adapters.thirdparty.skyrl"),
}
"""Adapter name -> (the library's top-level import name, the adapter module)."""


def _loaded(package: str) -> list[str]:
    return [name for name in sys.modules if name == package or name.startswith(package + ".")]


@pytest.fixture
def library_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every adapted library unimportable, whether or not it is installed here."""
    for package, _module in ADAPTERS.values():
        for name in _loaded(package):
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, package, None)  # import -> ModuleNotFoundError


@pytest.fixture
def clean_stubs() -> Iterator[None]:
    """No stub finder and no stub module before and after the test."""
    stubs.uninstall()
    yield
    stubs.uninstall()


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_module_imports_without_its_library(name: str) -> None:
    package, module_name = ADAPTERS[name]
    module = importlib.import_module(module_name)
    assert callable(module.make_adapter)
    if importlib.util.find_spec(package) is None:
        assert _loaded(package) == [], f"importing {module_name} imported {package}"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
@pytest.mark.usefixtures("library_missing", "clean_stubs")
def test_missing_library_names_the_environment_commands(name: str) -> None:
    with pytest.raises(AdapterLoadError) as raised:
        get_adapter(name)
    assert_names_the_env_commands(name, str(raised.value))


@pytest.mark.usefixtures("library_missing", "clean_stubs")
def test_skyrl_normalize_adapter_fails_the_same_way() -> None:
    with pytest.raises(AdapterLoadError, match=r"python tools/thirdparty_envs\.py skyrl"):
        get_adapter("ppo_ref.adapters.thirdparty.skyrl:make_normalize_adapter")


@pytest.mark.usefixtures("library_missing", "clean_stubs")
def test_openrlhf_without_the_library_installs_no_stub() -> None:
    with pytest.raises(AdapterLoadError):
        get_adapter("openrlhf")
    assert stubs.installed() is None
    assert [n for n in stubs.STUBBED_NAMES if n in sys.modules] == []


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_declared_conventions_are_valid_and_each_has_a_source(name: str) -> None:
    module = importlib.import_module(ADAPTERS[name][1])
    assert convention_problems(module.CONVENTIONS) == []
    assert set(module.CONVENTION_SOURCES) == set(module.CONVENTIONS)
    assert all(".py" in source for source in module.CONVENTION_SOURCES.values())
    assert set(module.NOT_PROVIDED) <= set(OP_NAMES)
    assert all(reason for reason in module.NOT_PROVIDED.values())


def test_skyrl_normalize_adapter_conventions_are_valid() -> None:
    from ppo_ref.adapters.thirdparty.skyrl import SkyRLNormalizeAdapter

    assert convention_problems(SkyRLNormalizeAdapter.conventions) == []
    assert set(SkyRLNormalizeAdapter.convention_sources) == set(SkyRLNormalizeAdapter.conventions)


# --- OpenRLHF's import stubs ---


def _require_absent(*names: str) -> None:
    for name in names:
        if importlib.util.find_spec(name) is not None:
            pytest.skip(f"{name} is really installed here; the stub would not be used")


@pytest.mark.usefixtures("clean_stubs")
def test_stubs_provide_only_the_listed_attributes_and_they_raise() -> None:
    _require_absent("flash_attn", "vllm")
    stubs.install()
    pad_input = importlib.import_module("flash_attn.bert_padding").pad_input
    with pytest.raises(stubs.StubCalledError, match=r"flash_attn\.bert_padding\.pad_input"):
        pad_input()
    for name, attributes in stubs.STUBBED_NAMES.items():
        module = importlib.import_module(name)
        public = {
            a for a, v in vars(module).items() if not a.startswith("__") and not isinstance(v, ModuleType)
        }
        assert public == set(attributes), name
    vllm = importlib.import_module("vllm")
    with pytest.raises(stubs.StubCalledError):
        vllm.LLM(model="x")
    assert not hasattr(vllm, "AsyncEngineArgs")  # so `from vllm import AsyncEngineArgs` raises ImportError


@pytest.mark.usefixtures("clean_stubs")
def test_stubs_look_uninstalled_to_version_checks() -> None:
    _require_absent("flash_attn")
    stubs.install()
    flash_attn = importlib.import_module("flash_attn")
    assert not hasattr(flash_attn, "__version__")
    assert getattr(flash_attn, "__file__", None) is None


@pytest.mark.usefixtures("clean_stubs")
@pytest.mark.parametrize(
    "name", ["flash_attn.ops", "flash_attn.ops.triton.cross_entropy", "vllm.distributed", "flash_attn_2"]
)
def test_names_outside_the_allow_list_still_fail_to_import(name: str) -> None:
    _require_absent("flash_attn", "vllm", "flash_attn_2")
    stubs.install()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(name)


@pytest.mark.usefixtures("clean_stubs")
def test_install_appends_one_finder_at_the_end_and_uninstall_removes_it() -> None:
    first = stubs.install()
    assert stubs.install() is first
    assert sys.meta_path[-1] is first
    assert sum(isinstance(f, stubs.StubFinder) for f in sys.meta_path) == 1
    stubs.uninstall()
    assert stubs.installed() is None


@pytest.mark.usefixtures("clean_stubs")
def test_a_real_installation_wins_over_the_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_absent("flash_attn")
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text("REAL = True\n__version__ = '9.9'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    stubs.install()
    try:
        module: ModuleType = importlib.import_module("flash_attn")
        assert getattr(module, "REAL", False) is True
    finally:
        sys.modules.pop("flash_attn", None)
