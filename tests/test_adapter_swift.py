"""The ms-swift adapter (issue 28): it imports lazily and fails clearly without ms-swift (main
environment), and in ``.envs/swift`` its ops give ms-swift's numbers with the declared conventions
visible in them."""

from __future__ import annotations

import pytest

from tests.thirdparty_env import assert_loads_lazily, run_json_in_env

MODULES = ("swift", "swift.rl_core", "swift.rl_core.advantage", "swift.rlhf_trainers.grpo_trainer")


def test_the_adapter_imports_without_swift_and_names_the_env_command(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_loads_lazily(monkeypatch, "swift", "SwiftAdapter", MODULES)


NUMBERS = """
import json, torch
from ppo_ref.adapters import get_adapter
a = get_adapter("swift")
two = a.group_advantages(torch.tensor([0.0, 0.02], dtype=torch.float64), torch.tensor([1, 1]), eps=0.01)
mixed = a.group_advantages(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]))
rloo = a.group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([7, 7, 7, 7]), "rloo")
logits = torch.randn(1, 2, 50, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
ent = a.entropy(logits)
agg = a.aggregate_loss(torch.tensor([[1.0, 2.0], [5.0, 5.0]]), torch.tensor([[1, 1], [0, 0]]),
                       "seq-mean-token-sum")
print(json.dumps({"two": two.tolist(), "two_dtype": str(two.dtype), "mixed": mixed.tolist(),
                  "rloo": rloo.tolist(), "ent_dtype": str(ent.dtype), "agg": float(agg),
                  "version": a.version}))
"""


@pytest.mark.thirdparty
def test_swift_numbers_show_its_declared_conventions() -> None:
    # skips where .envs/swift is missing; fails under PPO_REF_REQUIRE_ENVS=1
    got = run_json_in_env("swift", NUMBERS)
    assert got["version"] == "4.6.0"
    # a fixed 1e-4 whatever eps is asked for (group_std_eps), in float32 (compute_dtype)
    std = 0.02 / 2**0.5
    assert got["two"] == pytest.approx([-0.01 / (std + 1e-4), 0.01 / (std + 1e-4)], rel=1e-5)
    assert got["two_dtype"] == "torch.float32"
    # unequal groups (the request-aware path): a group of one gets 0 (group_singleton: zero)
    assert got["mixed"] == pytest.approx([-1 / (2**0.5 + 1e-4), 1 / (2**0.5 + 1e-4), 0.0], rel=1e-5)
    # RLOO without a std (ms-swift's default scale_rewards for rloo is 'none')
    assert got["rloo"] == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3], rel=1e-6)
    # the entropy comes back in the logits' dtype (TRL's entropy_from_logits, what grpo_trainer binds)
    assert got["ent_dtype"] == "torch.bfloat16"
    # seq-mean-token-sum averages over every row, the empty one included
    assert got["agg"] == pytest.approx(1.5)
