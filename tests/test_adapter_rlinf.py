"""The RLinf adapter (issue 28): it imports lazily and fails clearly without RLinf (main environment),
and in ``.envs/rlinf`` its ops give RLinf's numbers with the declared conventions visible in them."""

from __future__ import annotations

import pytest

from tests.thirdparty_env import assert_loads_lazily, run_json_in_env

MODULES = ("rlinf", "rlinf.algorithms.advantages", "rlinf.algorithms.losses", "rlinf.algorithms.utils")


def test_the_adapter_imports_without_rlinf_and_names_the_env_command(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_loads_lazily(monkeypatch, "rlinf", "RlinfAdapter", MODULES)


NUMBERS = """
import json, torch
from ppo_ref.adapters import get_adapter
a = get_adapter("rlinf")
lp = torch.tensor([[-1.0, -1.0, 0.0]], dtype=torch.float64)
old = torch.tensor([[-1.5, -0.5, 0.0]], dtype=torch.float64)
mask = torch.tensor([[1, 1, 0]])
pl = a.policy_loss(lp, old, torch.ones(1, 3, dtype=torch.float64), mask, 0.2)
adv, ret = a.gae(torch.tensor([[0.0, 1.0, 9.0]]), torch.tensor([[0.5, 0.25, 7.0]]), mask, 1.0, 1.0)
g = a.group_advantages(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]))
print(json.dumps({"approx_kl": float(pl.approx_kl), "adv": adv.tolist(), "ret": ret.tolist(),
                  "group": [None if x != x else x for x in g.tolist()], "version": a.version}))
"""


@pytest.mark.thirdparty
def test_rlinf_numbers_show_its_declared_conventions() -> None:
    # skips where .envs/rlinf is missing; fails under PPO_REF_REQUIRE_ENVS=1
    got = run_json_in_env("rlinf", NUMBERS)
    assert got["version"] == "0.3.0"
    assert got["approx_kl"] == pytest.approx(0.0, abs=1e-7)  # k1: mean(old - new) = (-0.5 + 0.5) / 2
    # the episode ends at the last action token: the padded reward 9 and value 7 never enter
    assert got["adv"][0] == pytest.approx([0.5, 0.75, 0.0])
    assert got["ret"][0] == pytest.approx([1.0, 1.0, 0.0])
    # group of two: (r - mean) / (std + 1e-6), std unbiased (sqrt 2); a group of one: NaN (unguarded)
    assert got["group"][:2] == pytest.approx([-1 / (2**0.5 + 1e-6), 1 / (2**0.5 + 1e-6)])
    assert got["group"][2] is None
