"""The ms-swift adapter (issue 28): it imports lazily and fails clearly without ms-swift (main
environment), and in ``.envs/swift`` its ops give ms-swift's numbers with the declared conventions
visible in them."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from ppo_ref.adapters import AdapterLoadError, get_adapter, parse_conventions
from tests.thirdparty_env import REPO, thirdparty_python

MODULES = ("swift", "swift.rl_core", "swift.rl_core.advantage", "swift.rlhf_trainers.grpo_trainer")


def test_the_adapter_imports_without_swift_and_names_the_env_command(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in MODULES:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delitem(sys.modules, "ppo_ref.adapters.thirdparty.swift", raising=False)
    module = importlib.import_module("ppo_ref.adapters.thirdparty.swift")
    parse_conventions(module.SwiftAdapter.conventions)  # every declared key and value is known
    assert set(module.SwiftAdapter.convention_sources) == set(module.SwiftAdapter.conventions)
    with pytest.raises(AdapterLoadError) as raised:
        get_adapter("swift")
    assert "python tools/thirdparty_envs.py swift" in str(raised.value)


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
    python = thirdparty_python(
        "swift"
    )  # skips where .envs/swift is missing; fails under PPO_REF_REQUIRE_ENVS=1
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(python), "-c", NUMBERS], cwd=REPO, capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
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
