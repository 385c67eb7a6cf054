"""The conformance suite's hooks, registered by :mod:`.plugin` when a pytest run selects the suite
(the options are :mod:`.plugin`'s).

At configure time the adapter named by ``--impl`` is loaded (a bad name is a usage error, exit
status 4), its declared conventions read, and the session's :class:`~.support.Context` and the report
recorder (:class:`~.report.ConformanceRecorder`) set up; the header names the adapter.

Markers: ``clause(*ids)`` ties a test to spec clauses (the report's rows), ``ops(*names)`` names the
adapter ops it calls (skipped as "not provided" when the adapter does not list one), and
``needs(*capabilities)`` names declared capabilities (``kl_estimator:k2``, ``loss_agg:token-mean``,
``value_clip:clipped``, ``gae_bootstrap``, ``policy_option:counts``, ``group_method:rloo``,
``group_std_scope:batch``, ``kl_loss_estimator:k3+``, ``correction_level:sequence``,
``correction_mode:mask``, ``mask_holes:gae``, ``whiten_mode:keep-mean``) that the adapter's
conventions may exclude.

Input conventions (issues 11 and 20): every test runs inside :func:`.strategies.declared_inputs`
with the adapter's declared ``masked_fill`` and the edge inputs it declares (``edge_inputs``; never
holes when all of the test's ops are in its ``prefix_masks``), and an edge clause's test also with
the edge input it is about (:func:`.support.drawn_inputs`); so the value clauses see what the
library's own pipeline feeds it, the edge clauses the edge inputs, and only the robustness clauses
(``ROB-*``, whose strategies pass ``junk=True``) write NaN and inf whatever is declared.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping

import pytest

from ppo_ref.adapters import (
    AdapterLoadError,
    ConventionSet,
    UnknownAdapterError,
    contract_problems,
    convention_problems,
    get_adapter,
    parse_conventions,
)
from ppo_ref.adapters.conventions import CONVENTIONS, describe
from ppo_ref.aggregation import COUNT_AGGREGATIONS

from .cases import Case
from .inference import Inference
from .report import ConformanceRecorder
from .strategies import declared_inputs, register_profiles
from .support import (
    Context,
    begin_test,
    compared_adapter,
    configure_examples,
    configure_precision,
    drawn_inputs,
    edge_clause,
)
from .variant import ReferenceVariant

# Registered at import, before Hypothesis' plugin reads --hypothesis-profile in pytest_configure.
register_profiles()

CONTEXT_KEY = pytest.StashKey[Context]()


OPTION_KEYWORDS: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "clip_eps_high": (("policy_loss", ("clip_eps_high",)),),
    "dual_clip": (("policy_loss", ("dual_clip",)),),
    "counts": (
        ("policy_loss", ("norm_constant", "token_count", "row_count")),
        ("value_loss", ("loss_agg", "norm_constant", "token_count", "row_count")),
        ("aggregate_loss", ("norm_constant", "token_count", "row_count")),
    ),
}
"""policy_loss_options value -> (op, keywords it must accept) for each op that uses it. An adapter
whose ``aggregate_loss`` takes no count keywords (a library reducing one batch at a time, e.g.
ms-swift's ``_sdar_agg_loss``) gets the counts tests as "not provided", not a ``TypeError`` FAIL."""


def _accepts(function: object, keywords: tuple[str, ...]) -> bool:
    """Whether ``function`` takes every keyword (True when its signature cannot be read)."""
    try:
        parameters = inspect.signature(function).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return all(k in parameters for k in keywords)


def _inferred_capabilities(adapter: object, declared: Mapping[str, object]) -> dict[str, object]:
    """For an adapter that does not declare ``policy_loss_options`` (one written before CLIP-1..3
    and AGG-1..3, or by a newcomer): the options whose keywords its policy_loss / value_loss /
    aggregate_loss signatures accept, and
    without ``counts`` no ``seq-mean-token-sum-norm`` (it needs ``norm_constant``) unless
    ``loss_aggregations`` is declared. So an older adapter keeps its verdicts and the new rows read
    "not provided" instead of failing on a keyword it was never given."""
    if "policy_loss_options" in declared:
        return {}
    declared_ops: object = getattr(adapter, "ops", frozenset())
    ops: frozenset[object] = (
        frozenset(declared_ops) if isinstance(declared_ops, (set, frozenset)) else frozenset()
    )
    options = [
        option
        for option, uses in OPTION_KEYWORDS.items()
        if all(op not in ops or _accepts(getattr(adapter, op, None), keywords) for op, keywords in uses)
    ]
    if len(options) == len(OPTION_KEYWORDS):
        return {}
    inferred: dict[str, object] = {"policy_loss_options": options}
    if "counts" not in options and "loss_aggregations" not in declared:
        inferred["loss_aggregations"] = list(COUNT_AGGREGATIONS)
    return inferred


def _declared_conventions(adapter: object) -> ConventionSet:
    """The valid part of the adapter's conventions (invalid keys fail the contract test instead),
    with the capabilities of an older adapter inferred where it declares none (see above)."""
    declared = getattr(adapter, "conventions", None)
    if not isinstance(declared, Mapping):
        return ConventionSet()
    valid = {k: v for k, v in declared.items() if not convention_problems({k: v})}
    return parse_conventions({**_inferred_capabilities(adapter, declared), **valid})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "clause(*ids): the spec clauses (e.g. GAE-2) a test exercises")
    config.addinivalue_line("markers", "ops(*names): the adapter ops a conformance test calls")
    # the trainer-step tier (test_step_tier.py) is marked slow, also where the suite runs outside a checkout
    config.addinivalue_line("markers", "slow: end-to-end training steps (seconds each)")
    config.addinivalue_line(
        "markers",
        "needs(*capabilities): declared capabilities a conformance test needs (kl_estimator:k2, ...)",
    )
    configure_examples(config.getoption("--conformance-examples"), config.getoption("--conformance-shrink"))
    compact = config.getoption("--conformance-output") == "compact"
    if compact and config.option.tbstyle == "auto":  # the compact blocks replace the tracebacks
        config.option.tbstyle = "no"
        chars = config.option.reportchars.replace("A", "sxXpP").replace("a", "sxX")
        # the skipped tests are summarised by the compact output too: one line per reason
        config.option.reportchars = chars.replace("f", "").replace("E", "").replace("s", "")
    impl = config.getoption("--impl")
    try:
        adapter = get_adapter(impl)
    except (UnknownAdapterError, AdapterLoadError) as error:
        raise pytest.UsageError(f"--impl={impl}: {error}") from error
    conventions = _declared_conventions(adapter)
    configure_precision(conventions.float32_ops)
    # compute_dtype and off_mask_outputs change how results are compared (support.ComparedAdapter)
    context = Context(
        compared_adapter(adapter, conventions), impl, conventions, ReferenceVariant(conventions)
    )
    config.stash[CONTEXT_KEY] = context
    recorder = ConformanceRecorder(
        context, config.getoption("--conformance-report"), config.invocation_params.args, compact=compact
    )
    if config.getoption("--conformance-inference") == "on":  # issue 20: conventions inferred
        recorder.inference = Inference(adapter, context, lambda: recorder.items)
    config.pluginmanager.register(recorder, "ppo-ref-conformance-recorder")


def pytest_report_header(config: pytest.Config) -> list[str]:
    context = config.stash.get(CONTEXT_KEY, None)
    if context is None:
        return []
    adapter = context.adapter
    deviations = context.conventions.deviations()
    written = getattr(adapter, "conventions", None)
    inferred = _inferred_capabilities(adapter, written) if isinstance(written, Mapping) else {}
    declared = (
        ", ".join(
            f"{k}={describe(v)}" + (" (inferred from the op signatures)" if k in inferred else "")
            for k, v in deviations.items()
        )
        or "none (reference conventions)"
    )
    problems = contract_problems(adapter) + convention_problems(getattr(adapter, "conventions", None))
    lines = [
        f"ppo-ref conformance: --impl={context.impl} -> {getattr(adapter, 'name', '?')} "
        f"{getattr(adapter, 'version', '?')}",
        f"  provenance: {getattr(adapter, 'provenance', '?')}",
        f"  ops: {', '.join(sorted(getattr(adapter, 'ops', ()) or ())) or 'none'}",
        f"  declared conventions: {declared}",
    ]
    if problems:
        lines.append(f"  ADAPTER CONTRACT PROBLEMS: {'; '.join(problems)}")
    return lines


def _missing_capability(context: Context, capability: str) -> str | None:
    """Why the adapter's declared conventions exclude ``capability`` (None if they do not)."""
    c = context.conventions
    kind, _, value = capability.partition(":")
    checks = {
        "kl_estimator": ("reward_kl_estimators", c.reward_kl_estimators, value not in c.reward_kl_estimators),
        "loss_agg": ("loss_aggregations", c.loss_aggregations, value not in c.loss_aggregations),
        "value_clip": ("value_clip_modes", c.value_clip_modes, value not in c.value_clip_modes),
        "gae_bootstrap": ("gae_bootstrap", c.gae_bootstrap, c.gae_bootstrap == "none"),
        "statistic": (value, getattr(c, value, None), getattr(c, value, "") is None),
        "policy_option": ("policy_loss_options", c.policy_loss_options, value not in c.policy_loss_options),
        "group_method": ("group_methods", c.group_methods, value not in c.group_methods),
        "group_std_scope": ("group_std_scopes", c.group_std_scopes, value not in c.group_std_scopes),
        "kl_loss_estimator": ("kl_loss_estimators", c.kl_loss_estimators, value not in c.kl_loss_estimators),
        "correction_level": ("correction_levels", c.correction_levels, value not in c.correction_levels),
        "correction_mode": ("correction_modes", c.correction_modes, value not in c.correction_modes),
        "whiten_mode": ("whiten_modes", c.whiten_modes, value not in c.whiten_modes),
        "mask_holes": ("prefix_masks", c.prefix_masks, value in c.prefix_masks),
    }
    if kind not in checks:
        raise ValueError(f"needs marker: unknown capability {capability!r}")
    key, declared, missing = checks[kind]
    if not missing:
        return None
    return f"not provided: the adapter declares {key}={describe(declared)} ({CONVENTIONS[key].allowed})"


@pytest.hookimpl(tryfirst=True)  # before the recorder reads the clause markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    context = config.stash.get(CONTEXT_KEY, None)
    if context is None:
        return
    provided: object = getattr(context.adapter, "ops", frozenset())
    for item in items:
        case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
        if getattr(item, "originalname", None) == "test_hand_case" and isinstance(case, Case):
            edge = edge_clause(case, context.conventions.edge_inputs)
            if edge is not None:  # a value case on an undeclared edge input: its edge clause's
                item.own_markers[:] = [m for m in item.own_markers if m.name != "clause"]
                item.add_marker(pytest.mark.clause(edge))
        reasons = [
            f"not provided: op {op!r} is not in the adapter's ops"
            for marker in item.iter_markers("ops")
            for op in marker.args
            if op not in (provided if isinstance(provided, (set, frozenset)) else ())
        ]
        reasons += [
            reason
            for marker in item.iter_markers("needs")
            for capability in marker.args
            if (reason := _missing_capability(context, capability)) is not None
        ]
        if reasons:
            item.add_marker(pytest.mark.skip(reason="; ".join(dict.fromkeys(reasons))))


def item_ops(item: pytest.Item) -> list[str]:
    """The adapter ops a test's ``ops`` markers name."""
    return [op for marker in item.iter_markers("ops") for op in marker.args]


def item_clauses(item: pytest.Item) -> list[str]:
    """The spec clauses a test's ``clause`` markers name."""
    return [clause for marker in item.iter_markers("clause") for clause in marker.args]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run the test with the adapter's declared input conventions (see the module docstring)."""
    context = item.config.stash.get(CONTEXT_KEY, None)
    if context is None:
        yield
        return
    with declared_inputs(**drawn_inputs(context.conventions, item_ops(item), item_clauses(item))):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test starts with no op called (the float32 tolerance is per test: support.tolerance)."""
    begin_test()


@pytest.fixture(scope="session")
def ctx(pytestconfig: pytest.Config) -> Context:
    """The session's adapter, its declared conventions and the matching variant of the reference."""
    return pytestconfig.stash[CONTEXT_KEY]
