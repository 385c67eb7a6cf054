"""The trainer-step tier run against TRL's own trainers, each in its environment (spec STEP-1..5).

``pytest conformance/test_step_tier.py`` in ``.envs/trl116`` (TRL 1.16 ``GRPOTrainer``, every
loss_type) and ``.envs/trl`` (TRL 1.12 ``PPOTrainer``), through the step-only adapter
``ppo_ref.adapters.thirdparty.trl_step:make_adapter``. The failing tests are exactly those the
findings of ``docs/findings-family.md`` explain (trl116-step-position-ids, trl116-cispo-epsilon;
trl-ppo-micro-batch-mean, trl-ppo-score-slot-width): a fix upstream, or a regression of the runner,
shows up here. Skipped where the environment is missing (``python tools/thirdparty_envs.py NAME``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ADAPTER = "ppo_ref.adapters.thirdparty.trl_step:make_adapter"
EXPECTED_FAILURES = {
    "trl116": {"test_step1_ratio_is_one_before_any_update", "test_step3_extra_prompt_padding"},
    "trl": {
        "test_step2_micro_batches_give_the_whole_batch_gradient[2]",
        "test_step2_micro_batches_give_the_whole_batch_gradient[4]",
        "test_step3_extra_completion_padding",
        "test_step3_extra_prompt_padding",
    },
}

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.thirdparty]


@pytest.mark.parametrize("env", sorted(EXPECTED_FAILURES))
def test_step_tier_verdicts_of_trl(env: str) -> None:
    python = REPO / ".envs" / env / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no .envs/{env} (build it with python tools/thirdparty_envs.py {env})")
    command = [str(python), "-m", "pytest", "conformance/test_step_tier.py", f"--impl={ADAPTER}"]
    command += ["-q", "-p", "no:cacheprovider", "-rfE", "--tb=no"]
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment, timeout=900)
    failed = set(re.findall(r"^FAILED conformance/test_step_tier.py::(\S+)", done.stdout, re.MULTILINE))
    passed = re.search(r"(\d+) passed", done.stdout)
    assert failed == EXPECTED_FAILURES[env], done.stdout[-3000:]
    assert passed is not None and int(passed.group(1)) == 8 - len(failed), done.stdout[-3000:]
