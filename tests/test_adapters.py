"""ppo_ref.adapters: name resolution, the Adapter protocol, the reference adapter, and the declared
conventions with their reference variants."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType, SimpleNamespace

import pytest
import torch

import ppo_ref
from conformance.variant import ReferenceVariant
from ppo_ref.adapters import (
    BUILTIN_ADAPTERS,
    CONVENTIONS,
    ENTRY_POINT_GROUP,
    OP_NAMES,
    Adapter,
    AdapterLoadError,
    ConventionError,
    ConventionSet,
    ReferenceAdapter,
    UnknownAdapterError,
    available_adapters,
    contract_problems,
    convention_problems,
    get_adapter,
    parse_conventions,
)
from tests import example_adapter


def test_mine_is_the_reference_adapter() -> None:
    adapter = get_adapter("mine")
    assert isinstance(adapter, ReferenceAdapter)
    assert isinstance(adapter, Adapter)
    assert adapter.ops == frozenset(OP_NAMES)
    # input conventions only, the widest (junk in masked-out slots, every edge input): issue 20
    assert dict(adapter.conventions) == {"masked_fill": "any", "edge_inputs": "all"}
    assert not parse_conventions(adapter.conventions).clauses()  # no expected value changes
    assert adapter.version == ppo_ref.__version__
    assert contract_problems(adapter) == []
    assert adapter.gae is ppo_ref.gae or adapter.gae == ppo_ref.gae


def test_module_attribute_resolves_an_object_and_a_factory() -> None:
    obj = get_adapter("tests.example_adapter:ADAPTER")
    assert obj is example_adapter.ADAPTER
    made = get_adapter("tests.example_adapter:make_adapter")
    assert made is not example_adapter.ADAPTER
    assert made.name == "example"
    assert dict(made.conventions) == {"clipfrac": "ratio-outside"}


def test_a_class_is_used_as_a_factory() -> None:
    adapter = get_adapter("ppo_ref.adapters.reference:ReferenceAdapter")
    assert isinstance(adapter, ReferenceAdapter) and not isinstance(adapter, type)


class _EntryPoint:
    def __init__(self, name: str, target: object) -> None:
        self.name, self.value, self._target = name, f"somepkg.adapter:{name}", target

    def load(self) -> object:
        return self._target


def test_entry_point_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def fake_entry_points(group: str) -> list[_EntryPoint]:
        seen.append(group)
        return [_EntryPoint("fromplugin", example_adapter.make_adapter)]

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    adapter = get_adapter("fromplugin")
    assert adapter.name == "example"
    assert ENTRY_POINT_GROUP in seen
    assert "fromplugin" in available_adapters()


def test_broken_entry_point_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(_EntryPoint):
        def load(self) -> object:
            raise ImportError("No module named 'somepkg'")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Broken("broken", None)])
    with pytest.raises(AdapterLoadError, match="entry point"):
        get_adapter("broken")


@pytest.mark.parametrize(
    "name", ["no-such-adapter", "no_such_module_xyz:make", "tests.example_adapter:nothing"]
)
def test_unknown_names_list_the_available_adapters(name: str) -> None:
    with pytest.raises(UnknownAdapterError) as info:
        get_adapter(name)
    assert isinstance(info.value, ValueError)
    for builtin in BUILTIN_ADAPTERS:
        assert builtin in str(info.value)
    assert "module:attribute" in str(info.value)


def test_reserved_third_party_names_load_lazily_with_a_clear_error() -> None:
    assert {"trl", "verl", "openrlhf", "torchrl", "sb3", "skyrl"} <= set(BUILTIN_ADAPTERS)
    for name in ("trl", "verl", "openrlhf", "torchrl", "sb3", "skyrl"):
        assert BUILTIN_ADAPTERS[name] == f"ppo_ref.adapters.thirdparty.{name}:make_adapter"
        try:
            adapter = get_adapter(name)
        except (AdapterLoadError, UnknownAdapterError) as error:  # module or library not installed
            assert name in str(error)
        else:
            assert isinstance(adapter, Adapter)


def test_a_factory_returning_junk_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    module = SimpleNamespace(bad=lambda: 42, raising=lambda: 1 / 0)
    monkeypatch.setitem(sys.modules, "fake_adapter_module", module)
    with pytest.raises(AdapterLoadError, match="lacks the adapter attributes"):
        get_adapter("fake_adapter_module:bad")
    with pytest.raises(AdapterLoadError, match="ZeroDivisionError"):
        get_adapter("fake_adapter_module:raising")


def test_protocol_accepts_a_duck_typed_object() -> None:
    duck = SimpleNamespace(
        name="duck",
        version="1",
        provenance="inline",
        ops=frozenset({"masked_mean"}),
        conventions=MappingProxyType({}),
        masked_mean=ppo_ref.masked_mean,
    )
    assert isinstance(duck, Adapter)
    assert contract_problems(duck) == []
    assert not isinstance(SimpleNamespace(name="x", version="1"), Adapter)


def test_contract_problems_are_specific() -> None:
    bad = SimpleNamespace(
        name="", version="1", provenance="p", ops=frozenset({"gae", "nope"}), conventions={}
    )
    problems = contract_problems(bad)
    assert any("name" in p for p in problems)
    assert any("'nope'" in p for p in problems)
    assert any("no callable attribute 'gae'" in p for p in problems)


def test_unknown_convention_keys_and_values_are_reported() -> None:
    problems = convention_problems(
        {"clipfrac_definition": "ratio-outside", "dual_clip": 0.5, "approx_kl": "k9"}
    )
    assert len(problems) == 3
    assert "unknown key 'clipfrac_definition'" in problems[0]
    assert "dual_clip" in problems[1] and "> 1" in problems[1]
    assert "approx_kl" in problems[2]
    with pytest.raises(ConventionError):
        parse_conventions({"whiten_variance": "sometimes"})
    assert convention_problems({key: c.reference for key, c in CONVENTIONS.items()}) == []


def test_every_convention_key_has_one_reference_value() -> None:
    """ConventionSet has a field per key of CONVENTIONS, whose default is that key's reference value."""
    defaults = ConventionSet()
    assert [f.name for f in fields(ConventionSet)] == list(CONVENTIONS)
    for key, convention in CONVENTIONS.items():
        assert getattr(defaults, key) is convention.reference, key
    assert defaults.deviations() == {}


def test_declared_conventions_map_to_clauses() -> None:
    conventions = parse_conventions(
        {"clipfrac": "ratio-outside", "kl_clamp": {"k3": 10}, "kl_estimators": ["k1", "k3"]}
    )
    clauses = conventions.clauses()
    assert clauses["PG-3"] == ["clipfrac='ratio-outside'"]
    assert "KL-3" in clauses and "KL-2" in clauses and "KL-1" not in clauses
    assert parse_conventions({}).deviations() == {}
    assert parse_conventions({"clipfrac": "flat-branch"}).deviations() == {}


def _variant(conventions: Mapping[str, object]) -> ReferenceVariant:
    return ReferenceVariant(parse_conventions(conventions))


def test_variants_reproduce_the_spec_alternatives() -> None:
    """The numbers of SPEC.md for the declared alternatives (PG-1 dual clip, PG-3/4, VF-1, KL-3)."""
    logp = torch.tensor([[1.4, 1.6, 0.6, 0.6, 1.4, 4.0]], dtype=torch.float64).log()
    adv = torch.tensor([[2.0, 2.0, 2.0, -2.0, -2.0, -2.0]], dtype=torch.float64)
    mask, old = torch.ones(1, 6), torch.zeros(1, 6, dtype=torch.float64)
    plain = _variant({}).policy_loss(logp, old, adv, mask, 0.2, loss_agg="seq-mean-token-sum")
    assert float(plain.loss) == pytest.approx(6.4)
    dual = _variant({"dual_clip": 3.0}).policy_loss(logp, old, adv, mask, 0.2, loss_agg="seq-mean-token-sum")
    assert float(dual.loss) == pytest.approx(6.4 - 8.0 + 6.0)  # the last token: max(-8, 3 * -2) = -6
    outside = _variant({"clipfrac": "ratio-outside"}).policy_loss(logp, old, adv, mask, 0.2)
    assert float(plain.clipfrac) == pytest.approx(0.5) and float(outside.clipfrac) == pytest.approx(1.0)
    k1 = _variant({"approx_kl": "k1"}).policy_loss(logp, old, adv, mask, 0.2)
    assert float(k1.approx_kl) == pytest.approx(float(-logp.mean()))
    v, old_v, ret = torch.tensor([[1.0]]), torch.tensor([[5.0]]), torch.tensor([[10.0]])
    assert float(_variant({}).value_loss(v, old_v, ret, torch.ones(1, 1), 0.2)) == pytest.approx(40.5)
    sb3 = _variant({"value_loss_scale": 1.0, "value_clip_form": "clipped-only"})
    assert float(sb3.value_loss(v, old_v, ret, torch.ones(1, 1), 0.2)) == pytest.approx(27.04)
    assert float(sb3.value_loss(v, old_v, ret, torch.ones(1, 1), None)) == pytest.approx(81.0)


def test_variant_score_placement_and_whitening() -> None:
    scores, zeros, mask = (
        torch.tensor([1.0, 2.0]),
        torch.zeros(2, 4),
        torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]),
    )
    after = _variant({"score_placement": "after-last-action-token"}).token_rewards(
        scores, zeros, zeros, mask, 0.0
    )
    assert after.tolist() == [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]]
    x, m = torch.tensor([1.0, 2.0, 3.0, 9.0]), torch.tensor([1, 1, 1, 0])
    biased = _variant({"whiten_variance": "biased"}).masked_whiten(x, m)
    assert biased.tolist() == pytest.approx([-(1.5**0.5), 0.0, 1.5**0.5, 0.0], abs=1e-6)
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.7]])
    advantages, returns = _variant({"gae_whitening": "unbiased"}).gae(
        rewards, values, torch.ones(1, 3), 1.0, 0.5
    )
    assert returns[0].tolist() == pytest.approx([0.625, 0.85, 1.0])
    assert float(advantages.mean()) == pytest.approx(0.0, abs=1e-6)


def test_variant_gradients_stay_finite_with_junk_in_masked_slots() -> None:
    logp = torch.tensor([[-1.0, float("nan")]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.2, float("inf")]], dtype=torch.float64)
    adv, mask = torch.tensor([[-1.0, float("nan")]], dtype=torch.float64), torch.tensor([[1, 0]])
    variant = _variant({"dual_clip": 3.0, "log_ratio_clamp": 5.0, "approx_kl": "k2"})
    (grad,) = torch.autograd.grad(variant.policy_loss(logp, old, adv, mask, 0.2).loss, logp)
    assert bool(torch.isfinite(grad).all()) and float(grad[0, 1]) == 0.0
