"""Faults and bad input: bad scores, degenerate responses, long prompts, bad files, SIGINT."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from reliability_support import cli_args, one_thread, out_dir, start_cli, wait_for, write_local_inputs
from tiny_task import count_a, tiny_config, tiny_setup

from ppo_ref import cli
from ppo_ref.trainer import BadScoreError, PPOTrainer, TrainingSetup, load_checkpoint

__all__ = ["one_thread", "out_dir"]


def _scores_with(bad: object, row: int = 3) -> object:
    """A reward function that returns ``bad`` for the sample in ``row`` of each batch."""

    def reward(prompts: Sequence[str], responses: Sequence[str]) -> list[object]:
        scores: list[object] = list(count_a(prompts, responses))
        scores[row] = bad
        return scores

    return reward


def _setup_with(reward: object) -> TrainingSetup:
    return replace(tiny_setup(), reward_function=reward)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [(math.nan, "is nan"), (math.inf, "is inf"), (None, "is None"), ("0.5", "is '0.5'")],
)
def test_a_bad_score_stops_the_run_naming_the_sample(out_dir: Path, bad: object, reason: str) -> None:
    trainer = PPOTrainer(tiny_config(out_dir), _setup_with(_scores_with(bad)))
    with pytest.raises(BadScoreError, match="on_bad_score") as error:
        trainer.collect_rollout(0)
    message = str(error.value)
    assert "sample 3 (prompt '" in message and reason in message and "expected a finite number" in message


def test_the_error_names_the_prompt_of_the_bad_sample(out_dir: Path) -> None:
    seen: list[str] = []

    def reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        seen.extend(prompts)
        return [math.nan if i == 5 else 0.0 for i in range(len(prompts))]

    with pytest.raises(BadScoreError) as error:
        PPOTrainer(tiny_config(out_dir), _setup_with(reward)).collect_rollout(0)
    assert f"sample 5 (prompt {seen[5]!r}, response " in str(error.value)


def test_a_reward_function_that_raises_is_traced_to_its_sample(out_dir: Path) -> None:
    calls: list[int] = []

    def reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        calls.append(len(prompts))
        if any(r.startswith("a") for r in responses):
            raise ZeroDivisionError("the verifier divided by zero")
        return count_a(prompts, responses)

    trainer = PPOTrainer(tiny_config(out_dir, rollout_batch_size=16), _setup_with(reward))
    with pytest.raises(
        BadScoreError, match=r"raised ZeroDivisionError\('the verifier divided by zero'\)"
    ) as error:
        trainer.collect_rollout(0)
    assert calls[0] == 16 and calls[1:] == [1] * 16  # the batch, then each sample alone
    assert "sample " in str(error.value) and "(prompt '" in str(error.value)
    # With skip, exactly the samples it raises on are dropped, and the iteration trains.
    skipping = PPOTrainer(
        tiny_config(out_dir, rollout_batch_size=16, on_bad_score="skip"), _setup_with(reward)
    )
    rollout = skipping.collect_rollout(0)
    starts_with_a = torch.tensor([r.startswith("a") for r in rollout.responses])
    assert starts_with_a.any() and torch.equal(~rollout.valid.cpu(), starts_with_a)


def test_wrong_length_is_an_error_even_with_skip(out_dir: Path) -> None:
    def reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        return count_a(prompts, responses)[:-1]

    for mode in ("error", "skip"):
        trainer = PPOTrainer(tiny_config(out_dir, on_bad_score=mode), _setup_with(reward))
        with pytest.raises(BadScoreError, match="returned 7 scores for 8 responses"):
            trainer.collect_rollout(0)


def test_skipped_samples_train_nothing_and_are_counted(out_dir: Path) -> None:
    config = tiny_config(out_dir, on_bad_score="skip", iterations=2, audit_samples=8)
    trainer = PPOTrainer(config, _setup_with(_scores_with(math.nan, row=3)))
    rollout = trainer.collect_rollout(0)
    assert rollout.valid.tolist() == [i != 3 for i in range(8)]
    assert not rollout.mask[3].any() and rollout.sequences.response_mask[3].any()
    assert float(rollout.rewards[3].abs().sum()) == 0.0 and float(rollout.advantages[3].abs().sum()) == 0.0
    assert torch.isfinite(rollout.advantages).all() and torch.isfinite(rollout.scored.scores).all()
    summary = PPOTrainer(config, _setup_with(_scores_with(math.nan, row=3))).train()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_samples"] for r in records] == [1, 1] and summary["skipped_samples"] == 2
    assert all(math.isfinite(r[k]) for r in records for k in ("policy_loss", "value_loss", "score_mean"))
    audit = [json.loads(line) for line in (out_dir / "rollouts.jsonl").read_text().splitlines()]
    assert [a["skipped"] for a in audit[:8]] == [i == 3 for i in range(8)] and audit[3]["score"] is None


def test_a_batch_with_every_score_bad_is_an_error_even_with_skip(out_dir: Path) -> None:
    def reward(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        return [math.nan] * len(prompts)

    trainer = PPOTrainer(tiny_config(out_dir, on_bad_score="skip"), _setup_with(reward))
    with pytest.raises(ValueError, match="8 of 8 samples skipped for bad scores"):
        trainer.collect_rollout(0)


def test_a_reward_model_returning_nan_is_caught(out_dir: Path) -> None:
    setup = tiny_setup(reward_model=True)
    assert setup.reward_model is not None
    with torch.no_grad():
        setup.reward_model.score.weight.fill_(math.nan)
    with pytest.raises(BadScoreError, match=r"sample 0 \(prompt '.*\) is nan"):
        PPOTrainer(tiny_config(out_dir), setup).collect_rollout(0)


def _bias_towards_eos(setup: TrainingSetup, bias: float) -> TrainingSetup:
    """Give the policy an output bias of ``bias`` on EOS (+: every response ends at once; -: never)."""
    policy = setup.policy
    head = torch.nn.Linear(policy.config.n_embd, policy.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(policy.lm_head.weight)
        head.bias.zero_()
        head.bias[setup.tokenizer.eos_token_id] = bias
    policy.lm_head = head
    policy.config.tie_word_embeddings = False
    return setup


def _parameters(trainer: PPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.actor_critic.policy_parameters()]


def test_empty_responses_train_without_nan(out_dir: Path) -> None:
    seen: list[str] = []

    def by_prompt(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        seen.extend(responses)
        return [len(p) / 5 for p in prompts]

    setup = _bias_towards_eos(_setup_with(by_prompt), 30.0)
    trainer = PPOTrainer(tiny_config(out_dir, iterations=2), setup)
    before = _parameters(trainer)
    summary = trainer.train()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert set(seen) == {""}  # every response is the EOS alone: empty text
    for record in records:
        assert record["response_length"] == 1.0 and record["eos_rate"] == 1.0
        for key in ("policy_loss", "value_loss", "approx_kl", "entropy", "advantage_std", "kl_ref"):
            assert math.isfinite(record[key]), key
        assert record["nonfinite_steps"] == 0 and record["optimizer_steps"] == 4
    after = _parameters(trainer)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert summary["nonfinite_steps"] == 0


@pytest.mark.parametrize("truncation", ["terminal", "bootstrap"])
def test_a_batch_where_every_response_hits_max_length(out_dir: Path, truncation: str) -> None:
    setup = _bias_towards_eos(tiny_setup(), -30.0)
    config = tiny_config(out_dir, iterations=2, truncation=truncation, missing_eos="penalty")
    trainer = PPOTrainer(config, setup)
    rollout = trainer.collect_rollout(0)
    assert not rollout.ended.any() and bool(rollout.mask.all())
    assert rollout.mask.shape[1] == config.max_new_tokens
    assert torch.allclose(rollout.scored.adjustment, torch.full((8,), -config.missing_eos_penalty))
    before = _parameters(trainer)
    trainer.train()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        assert record["eos_rate"] == 0.0 and record["response_length"] == config.max_new_tokens
        assert all(math.isfinite(record[k]) for k in ("policy_loss", "value_loss", "explained_variance"))
    after = _parameters(trainer)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_prompt_longer_than_the_context_fails_before_any_work(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_prompt = "ab" * 31  # 62 tokens + 6 new tokens > the tiny model's 64 positions
    setup = replace(tiny_setup(), train_prompts=["abc", long_prompt])
    monkeypatch.setattr(PPOTrainer, "_build_models", lambda self: pytest.fail("models were built"))
    with pytest.raises(
        ValueError, match=r"train_prompts: prompt 1 \('abab.*\.\.\.'\) has 62 tokens"
    ) as error:
        PPOTrainer(tiny_config(out_dir), setup)
    assert "exceeds the model's context of 64 positions" in str(error.value)
    assert not out_dir.exists()


@pytest.fixture(scope="module")
def local_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_local_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "p.jsonl: no prompts"),
        (b'{"prompt": "ab"}\n{"prompt": "ba"}\n{"prompt": "ab"\n', "p.jsonl:3: not valid JSON"),
        (b'{"prompt": "ab"}\n{"text": "ba"}\n', 'p.jsonl:2: expected an object with a non-empty "prompt"'),
        (b'{"prompt": "ab"}\n{"prompt": "b\xff"}\n', "p.jsonl:2: not UTF-8 text"),
        (b'{"prompt": "ab"}\n["ab"]\n', 'p.jsonl:2: expected an object with a non-empty "prompt"'),
        ((b'{"prompt": "' + b"ab" * 40 + b'"}\n') * 4, "has 80 tokens; with max_new_tokens=5 it exceeds"),
    ],
)
def test_bad_prompt_files_fail_with_file_and_line(
    tmp_path: Path,
    local_inputs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    message: str,
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    out = tmp_path / "out"
    assert cli.main(cli_args({**local_inputs, "prompts": prompts}, out, 1)) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not out.exists()


def test_a_prompts_path_that_is_a_directory_fails_clearly(
    tmp_path: Path, local_inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(cli_args({**local_inputs, "prompts": tmp_path}, tmp_path / "out", 1)) == 2
    assert f"{tmp_path}: cannot read the prompts file" in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_stops_cleanly_with_a_final_checkpoint(tmp_path: Path, local_inputs: dict[str, Path]) -> None:
    out, log = tmp_path / "run", tmp_path / "log.txt"
    process = start_cli(cli_args(local_inputs, out, 1000), log)
    metrics = out / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, process, log, timeout=120)
    process.send_signal(signal.SIGINT)
    status = process.wait(timeout=120)
    output = log.read_text()
    assert status == 130, output
    assert "SIGINT received; stopping after this iteration" in output and "--resume" in output
    done = len(metrics.read_text().splitlines())
    assert 1 <= done < 1000
    checkpoint = load_checkpoint(out)
    assert checkpoint.path.name == f"iter-{done:06d}" and checkpoint.iteration == done
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and summary["iterations_done"] == done
    assert summary["eval_score_final"] is None and summary["last_checkpoint"] == str(checkpoint.path)
    assert len(checkpoint.metrics_records()) == done
