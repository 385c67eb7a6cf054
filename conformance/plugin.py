"""The conformance suite's pytest plugin: its command-line options, and its hooks when a run collects
the suite.

Installed (``pip install ppo-ref``), the suite is the package ``ppo_ref_conformance`` and this module
is registered through the ``pytest11`` entry point ``ppo_ref_conformance``, so that

    python -m pytest --pyargs ppo_ref_conformance --impl=my_module:make_adapter

runs the whole suite. In a checkout the directory ``conformance/`` is the same package under the
name ``conformance`` (``pytest conformance/ --impl=NAME``); its ``conftest.py`` registers this module
only when the entry point has not (ppo-ref not installed).

Every pytest run in an environment with ppo-ref installed loads this module, so it stays light: it
adds the options below and nothing else. Only when the run's arguments select the suite (a path in
this directory or one that contains it, or ``--pyargs`` naming the package) does
:func:`pytest_configure` import and register :mod:`.hooks`: the adapter, the header, the skips of
what the adapter does not provide, the ``ctx`` fixture and the report. ``pytest tests/`` loads no
adapter and prints no conformance header.

Options:

- ``--impl=NAME``: the implementation under test, resolved by ``ppo_ref.adapters.get_adapter``
  (``mine``, a built-in third-party name, an entry point of group ``ppo_ref.adapters``, or an
  importable ``module:attribute``). Default: the environment variable ``PPO_REF_IMPL``, else ``mine``.
- ``--conformance-examples=N``: Hypothesis examples per property (environment variable
  ``PPO_REF_CONFORMANCE_EXAMPLES``; default a third of the profile's ``max_examples``).
- ``--conformance-output=compact``: instead of pytest's tracebacks, one block per failing clause
  (the case or property, its input, expected against got, one reproduction), related failing
  clauses (same op) grouped under the first (env ``PPO_REF_CONFORMANCE_OUTPUT``; default ``full``).
- ``--conformance-shrink``: let Hypothesis shrink failing examples (off by default: much slower).
- ``--conformance-inference=on|off``: re-run a failing value test under the declarable conventions
  the adapter does not declare, so a legitimate convention gets the verdict ``matches undeclared
  convention`` and the declaration to paste instead of a FAIL (env ``PPO_REF_CONFORMANCE_INFERENCE``;
  default ``on``; :mod:`.inference`).
- ``--conformance-report=PATH``: write ``PATH.json`` and ``PATH.md`` (a trailing ``.json`` or
  ``.md`` on PATH is dropped first, so PATH is a stem).
- Hypothesis profiles come from ``strategies.register_profiles``: ``default`` (derandomized, no
  example database) or ``thorough``, chosen with Hypothesis' own ``--hypothesis-profile=NAME`` or
  the environment variable ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

__all__ = ["ENTRY_POINT", "HOOKS_PLUGIN", "SUITE_DIR", "import_hooks", "suite_selected"]

ENTRY_POINT = "ppo_ref_conformance"
"""The name of the ``pytest11`` entry point (``pyproject.toml``), and of this plugin in pytest."""

HOOKS_PLUGIN = "ppo-ref-conformance-hooks"
"""The name :mod:`.hooks` is registered under once a run selects the suite."""

SUITE_DIR = Path(__file__).resolve().parent
"""The suite's directory: ``conformance/`` in a checkout, ``site-packages/ppo_ref_conformance``
installed."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ppo-ref conformance")
    group.addoption(
        "--impl",
        default=os.environ.get("PPO_REF_IMPL", "mine"),
        help="implementation under test: mine (default; env PPO_REF_IMPL), trl, verl, openrlhf, torchrl, "
        "sb3, skyrl, an entry point of group ppo_ref.adapters, or module:attribute",
    )
    group.addoption(
        "--conformance-examples",
        type=int,
        default=int(os.environ["PPO_REF_CONFORMANCE_EXAMPLES"])
        if "PPO_REF_CONFORMANCE_EXAMPLES" in os.environ
        else None,
        metavar="N",
        help="Hypothesis examples per property (env PPO_REF_CONFORMANCE_EXAMPLES; default: a third of the "
        "profile's max_examples, i.e. 20 under 'default' and 333 under 'thorough')",
    )
    group.addoption(
        "--conformance-output",
        choices=("full", "compact"),
        default=os.environ.get("PPO_REF_CONFORMANCE_OUTPUT", "full"),
        help="compact: instead of pytest's tracebacks, one block per failing clause (input, expected "
        "vs got, one reproduction; related clauses grouped); full (default): pytest's own output "
        "(env PPO_REF_CONFORMANCE_OUTPUT)",
    )
    group.addoption(
        "--conformance-shrink",
        action="store_true",
        default=os.environ.get("PPO_REF_CONFORMANCE_SHRINK", "") not in ("", "0"),
        help="let Hypothesis shrink a failing example (smaller inputs, much slower failures; off by "
        "default; env PPO_REF_CONFORMANCE_SHRINK=1)",
    )
    group.addoption(
        "--conformance-inference",
        choices=("on", "off"),
        default=os.environ.get("PPO_REF_CONFORMANCE_INFERENCE", "on"),
        help="on (default): a failing value test is re-run under the declarable conventions the adapter "
        "does not declare; one that explains the clause gives 'matches undeclared convention' and the "
        "declaration to paste instead of a FAIL (env PPO_REF_CONFORMANCE_INFERENCE)",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="PATH",
        help="write the clause-by-clause report to PATH.json and PATH.md (PATH is a stem)",
    )


def _argument_path(argument: str, pyargs: bool, invocation_dir: Path) -> Path | None:
    """The file or directory a collection argument names (``path::test`` or, with ``--pyargs``, a
    module name, as pytest resolves them); None when it names neither."""
    target = argument.split("::", 1)[0]
    if pyargs and target and os.sep not in target and not target.endswith(".py"):
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            if spec.submodule_search_locations:
                return Path(next(iter(spec.submodule_search_locations))).resolve()
            if spec.origin:
                return Path(spec.origin).resolve()
    path = (invocation_dir / target).resolve()
    return path if path.exists() else None


def suite_selected(args: list[str], pyargs: bool, invocation_dir: Path) -> bool:
    """Whether pytest's collection arguments ``args`` collect the suite: one of them names
    :data:`SUITE_DIR`, a file in it, or a directory that contains it (not through a
    ``site-packages``: pytest does not collect installed packages it walks past)."""
    for argument in args:
        path = _argument_path(argument, pyargs, invocation_dir)
        if path is None:
            continue
        if path == SUITE_DIR or SUITE_DIR in path.parents:
            return True
        if path in SUITE_DIR.parents and "site-packages" not in SUITE_DIR.relative_to(path).parts:
            return True
    return False


def adapter_dir_on_path(impl: str, invocation_dir: Path) -> bool:
    """Put ``invocation_dir`` first on ``sys.path`` when ``impl`` is ``module:attribute`` whose
    top-level module is a file or package there and is not importable otherwise; return whether it
    did. ``python -m pytest`` puts the current directory on ``sys.path``, the plain ``pytest``
    script does not, so without this ``pytest --pyargs ppo_ref_conformance --impl=my_adapter:make``
    run next to ``my_adapter.py`` would fail with "no module 'my_adapter'"."""
    if not isinstance(impl, str) or not isinstance(invocation_dir, Path):
        raise ValueError(
            f"impl, invocation_dir: expected a string and a Path, got {impl!r}, {invocation_dir!r}"
        )
    module, separator, _ = impl.partition(":")
    top = module.split(".")[0]
    if not separator or not top.isidentifier():
        return False
    try:
        if importlib.util.find_spec(top) is not None:
            return False
    except (ImportError, ValueError):
        return False
    if not ((invocation_dir / f"{top}.py").is_file() or (invocation_dir / top / "__init__.py").is_file()):
        return False
    sys.path.insert(0, str(invocation_dir))
    importlib.invalidate_caches()
    return True


def import_hooks() -> ModuleType:
    """:mod:`.hooks`, imported under the name pytest gives the suite's test files.

    pytest imports a test file of a package by the package directory's own name, with the
    directory's parent first on ``sys.path``: ``conformance.test_gae`` in a checkout (even when an
    editable install also maps the directory to ``ppo_ref_conformance``), and
    ``ppo_ref_conformance.test_gae`` installed. The hooks and the tests must share one copy of the
    suite's modules (the tests read the example count and the context the hooks set), so the hooks
    are imported the same way.
    """
    root = str(SUITE_DIR.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"{SUITE_DIR.name}.hooks")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' plugin loads --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.has_plugin(HOOKS_PLUGIN):
        return
    if not suite_selected(list(config.args), bool(config.option.pyargs), config.invocation_params.dir):
        return
    adapter_dir_on_path(config.getoption("--impl"), config.invocation_params.dir)
    # Registered during pytest_configure, the hooks' own pytest_configure runs at once.
    config.pluginmanager.register(import_hooks(), HOOKS_PLUGIN)
