"""Resolve an adapter name: a built-in, an entry point, or an importable ``module:attribute``.

Lookup order for ``get_adapter(name)``:

1. a built-in name (:data:`BUILTIN_ADAPTERS`): ``mine`` (the reference functions) and the
   third-party adapters ``trl``, ``verl``, ``openrlhf``, ``torchrl``, ``sb3``, ``skyrl``, ``rlinf``,
   ``swift``, whose modules are imported only when asked for (their libraries are optional);
2. an entry point named ``name`` in the group ``ppo_ref.adapters``, declared by an installed
   package: ``[project.entry-points."ppo_ref.adapters"] mylib = "mylib.ppo_adapter:make_adapter"``;
3. ``name`` itself as ``module:attribute`` (``module.sub:attr.inner`` works too).

The target is an adapter object or a zero-argument factory returning one (a class counts as a
factory). The result must satisfy :class:`ppo_ref.adapters.Adapter`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import MappingProxyType

from ppo_ref.adapters.base import Adapter

__all__ = [
    "BUILTIN_ADAPTERS",
    "ENTRY_POINT_GROUP",
    "AdapterLoadError",
    "UnknownAdapterError",
    "available_adapters",
    "get_adapter",
]

ENTRY_POINT_GROUP = "ppo_ref.adapters"

BUILTIN_ADAPTERS: MappingProxyType[str, str] = MappingProxyType(
    {
        "mine": "ppo_ref.adapters.reference:make_adapter",
        **{
            name: f"ppo_ref.adapters.thirdparty.{name}:make_adapter"
            for name in ("trl", "verl", "openrlhf", "torchrl", "sb3", "skyrl", "rlinf", "swift")
        },
        "trl116": "ppo_ref.adapters.thirdparty.trl_family:make_adapter",
    }
)
"""Built-in adapter names and the ``module:factory`` each resolves to (imported lazily)."""


class UnknownAdapterError(ValueError):
    """The name is neither built in, nor an entry point, nor an importable ``module:attribute``."""


class AdapterLoadError(ValueError):
    """The name was found but its adapter could not be produced (import failed, bad object, ...)."""


def _entry_point_names() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_adapters() -> list[str]:
    """Built-in names followed by the installed entry-point names, sorted within each group."""
    builtin = list(BUILTIN_ADAPTERS)
    return builtin + sorted(set(_entry_point_names()) - set(builtin))


def _listing() -> str:
    return (
        f"available adapters: {', '.join(available_adapters())}; "
        "or give an importable 'module:attribute' (an adapter object or a zero-argument factory)"
    )


def _import_target(target: str, name: str) -> object:
    module_name, _, attribute_path = target.partition(":")
    if not module_name or not attribute_path:
        raise UnknownAdapterError(f"unknown adapter {name!r}; {_listing()}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            if name in BUILTIN_ADAPTERS:
                raise AdapterLoadError(
                    f"adapter {name!r} is reserved ({target}) but its module {module_name!r} is not "
                    f"available in this installation ({error}); {_listing()}"
                ) from error
            raise UnknownAdapterError(
                f"unknown adapter {name!r}: no module {module_name!r}; {_listing()}"
            ) from error
        raise AdapterLoadError(
            f"adapter {name!r}: importing {module_name!r} failed because a module it needs is missing: "
            f"{error}. Is the implementation under test installed in this environment?"
        ) from error
    except ImportError as error:
        raise AdapterLoadError(f"adapter {name!r}: importing {module_name!r} failed: {error}") from error
    obj: object = module
    for part in attribute_path.split("."):
        if not hasattr(obj, part):
            raise UnknownAdapterError(
                f"unknown adapter {name!r}: module {module_name!r} has no attribute {attribute_path!r}; "
                f"{_listing()}"
            )
        obj = getattr(obj, part)
    return obj


def _instantiate(obj: object, name: str) -> Adapter:
    if isinstance(obj, Adapter) and not isinstance(obj, type):
        return obj
    if not callable(obj):
        raise AdapterLoadError(
            f"adapter {name!r}: {obj!r} is neither an adapter (missing attributes of "
            "ppo_ref.adapters.Adapter) nor a zero-argument factory"
        )
    try:
        made = obj()
    except Exception as error:
        raise AdapterLoadError(f"adapter {name!r}: calling the factory {obj!r} failed: {error!r}") from error
    if not isinstance(made, Adapter):
        missing = [a for a in ("name", "version", "provenance", "ops", "conventions") if not hasattr(made, a)]
        raise AdapterLoadError(
            f"adapter {name!r}: the factory {obj!r} returned {made!r}, which lacks the adapter "
            f"attributes {missing}"
        )
    return made


def get_adapter(name: str) -> Adapter:
    """Resolve ``name`` to an adapter object (see the module docstring for the lookup order).

    Raises :class:`UnknownAdapterError` (a ``ValueError``) listing the available adapters when
    nothing matches, and :class:`AdapterLoadError` when the name matches but loading fails.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownAdapterError(f"adapter name: expected a non-empty str, got {name!r}; {_listing()}")
    name = name.strip()
    if name in BUILTIN_ADAPTERS:
        return _instantiate(_import_target(BUILTIN_ADAPTERS[name], name), name)
    entry_points = _entry_point_names()
    if name in entry_points:
        try:
            target = entry_points[name].load()
        except Exception as error:
            raise AdapterLoadError(
                f"adapter {name!r}: loading entry point {entry_points[name].value!r} of group "
                f"{ENTRY_POINT_GROUP!r} failed: {error!r}"
            ) from error
        return _instantiate(target, name)
    if ":" in name:
        return _instantiate(_import_target(name, name), name)
    raise UnknownAdapterError(f"unknown adapter {name!r}; {_listing()}")
