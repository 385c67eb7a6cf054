"""pytest wiring of the conformance suite in a checkout: ``pytest conformance/ --impl=NAME``.

The options and hooks live in :mod:`.plugin` (and :mod:`.hooks`, which it registers when a run
selects the suite). With ppo-ref installed, editable or not, pytest registers :mod:`.plugin` itself
through the ``pytest11`` entry point ``ppo_ref_conformance``; this file registers it only when that
entry point is absent (a checkout used without installing ppo-ref), so nothing is registered twice.
"""

from __future__ import annotations

import pytest

from . import plugin


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    if not pluginmanager.has_plugin(plugin.ENTRY_POINT) and not pluginmanager.is_registered(plugin):
        pluginmanager.register(plugin, plugin.ENTRY_POINT)
