"""ppo-ref's critic-free (GRPO) iteration at the settings of ``bench/tiny_grpo.py``, its bare model
work, and TRL 1.16's ``GRPOTrainer`` at the same settings (issue 12, part 4).

The side-by-side comparison (interleaved rounds, three processes) is ``tools/run_bench.py --only
grpo``; these tests time each side alone and check that each still runs. TRL's side needs
``.envs/trl116`` (``python tools/thirdparty_envs.py trl116``) and skips without it (fails under
``PPO_REF_REQUIRE_ENVS=1``, as in CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import tiny_grpo as g
from bench.grpo_side import BareGrpo, make_grpo_trainer
from bench.ppo_ref_side import TrainStepper
from tests.thirdparty_env import thirdparty_python

ROOT = Path(__file__).resolve().parent.parent


def _disabled(benchmark: Any) -> bool:
    return bool(getattr(benchmark, "disabled", False))


@pytest.fixture(scope="module", params=g.BETAS, ids=lambda beta: f"beta{beta:g}")
def grpo_stepper(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(g.THREADS)
    stepper = TrainStepper(make_grpo_trainer(str(tmp_path_factory.mktemp("grpo-bench")), request.param))
    stepper.step()  # warm-up
    yield stepper
    stepper.close()
    torch.set_num_threads(threads)


def test_grpo_iteration(benchmark: Any, grpo_stepper: TrainStepper) -> None:
    """One iteration of ``PPOTrainer.train()`` with ``advantage_estimator="grpo"``, checks and metrics on."""
    logged_before = len(grpo_stepper.metrics_records())
    rounds = 1 if _disabled(benchmark) else 8
    benchmark.group = "critic-free iteration (tiny GPT-2, 8 prompts x 8 responses, <= 32 tokens)"
    benchmark.pedantic(grpo_stepper.step, rounds=rounds, iterations=1)
    new = grpo_stepper.metrics_records()[logged_before:]
    assert len(new) == rounds, "one metrics record per iteration"
    for record in new:
        assert record["value_loss"] is None and record["grad_norm_critic"] is None  # no critic at all
        assert record["logprob_check_max_abs_diff"] <= 1e-3  # the step-0 check ran and passed
        assert 1 <= record["response_length"] <= g.RESPONSE_TOKENS
        assert record["optimizer_steps"] == 1


@pytest.mark.parametrize("beta", g.BETAS, ids=lambda beta: f"beta{beta:g}")
def test_grpo_bare_compute(benchmark: Any, beta: float) -> None:
    """The model work of the same iteration alone: generate, reference forward (beta > 0), update."""
    torch.set_num_threads(g.THREADS)
    bare = BareGrpo(beta)
    before = [p.detach().clone() for p in bare.policy.parameters()]
    benchmark.group = "bare compute of one critic-free iteration"
    parts = benchmark.pedantic(bare.measure, rounds=1 if _disabled(benchmark) else 4, iterations=1)
    assert parts["bare"] == pytest.approx(parts["generate"] + parts["reference"] + parts["update"])
    assert (parts["reference"] > 0) == (beta > 0)
    assert any(not torch.equal(a, b) for a, b in zip(before, bare.policy.parameters(), strict=True))
    sequences = bare.generate()
    assert sequences.shape[0] == g.BATCH and sequences.shape[1] <= g.PROMPT_TOKENS + g.RESPONSE_TOKENS
    own = bare.generate_own()
    assert own.response_ids.shape[0] == g.BATCH and bool(own.response_mask[:, 0].all())


def test_reward_counts_the_target_word() -> None:
    assert g.target_fraction(["p", "p", "p"], ["t5 t9", "", "t5 [PAD] t5"]) == [0.5, 0.0, 1.0]
    with pytest.raises(ValueError, match="completions"):
        g.target_fraction(["p"], [])


@pytest.mark.thirdparty
@pytest.mark.parametrize("beta", g.BETAS, ids=lambda beta: f"beta{beta:g}")
def test_trl_grpo_side_runs(beta: float) -> None:
    """TRL 1.16's GRPOTrainer at the same settings still runs, with the settings the benchmark claims."""
    python = thirdparty_python("trl116")  # skips without .envs/trl116; fails under PPO_REF_REQUIRE_ENVS=1
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1"}
    command = [str(python), "-m", "bench.trl_grpo_iteration", "--beta", str(beta)]
    done = subprocess.run(
        [*command, "--warmup", "1", "--iterations", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith('{"')][-1])
    assert result["versions"]["trl"].startswith("1.16.")
    settings = result["settings"]
    assert settings["bf16"] is False and settings["gradient_checkpointing"] is False
    assert settings["max_grad_norm"] == 0 and settings["beta"] == beta
    assert settings["num_generations"] == g.GROUP and settings["generation_batch_size"] == g.BATCH
    assert result["iterations"] == 2 and result["median_seconds_per_iteration"] > 0
