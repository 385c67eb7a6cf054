"""The configuration and the ``ppo-ref`` command line: every field has a flag, bad values fail early."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from tiny_task import tiny_policy, tiny_reward_model, tiny_tokenizer

from ppo_ref import cli
from ppo_ref.trainer import TrainerConfig
from ppo_ref.trainer.config import config_from_toml, field_docs
from ppo_ref.trainer.metrics import PLOTS, REQUIRED_METRICS, STAGE_SECONDS
from ppo_ref.trainer.setup import load_prompts


def _parse(argv: list[str]) -> TrainerConfig:
    return cli.resolve_config(cli.build_parser().parse_args(["train", *argv]))[0]


def test_every_field_has_a_docstring_and_a_valid_default() -> None:
    docs = field_docs()
    assert {f.name for f in fields(TrainerConfig)} == set(docs)
    assert all(len(doc) > 10 for doc in docs.values())
    TrainerConfig()  # the defaults validate


def test_the_task_field_names_every_built_in_task() -> None:
    from ppo_ref.trainer.setup import available_tasks

    names = available_tasks()
    assert names and all(name in field_docs()["task"] for name in names)


def test_help_lists_every_field_with_default_and_meaning(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for f in fields(TrainerConfig):
        assert "--" + f.name.replace("_", "-") in text
        assert " ".join(field_docs()[f.name].split()) in text
        assert f"(default: {f.default!r})" in text
    for flag in (
        "--config",
        "--task",
        "--iterations",
        "--seed",
        "--out",
        "--policy",
        "--reward",
        "--prompts",
    ):
        assert flag in text


def test_flags_override_toml_which_overrides_defaults(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('iterations = 7\nkl_coef = 0.2\ntruncation = "bootstrap"\nvalue_clip_eps = 1\n')
    config = _parse(["--config", str(toml), "--iterations", "9", "--no-tensorboard", "--top-p", "0.9"])
    assert config.iterations == 9 and config.kl_coef == 0.2 and config.truncation == "bootstrap"
    assert config.value_clip_eps == 1.0 and isinstance(config.value_clip_eps, float)
    assert config.tensorboard is False and config.top_p == 0.9
    assert _parse(["--value-clip-eps", "none", "--micro-batch-size", "4"]).value_clip_eps is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("iteratoins = 3\n", "unknown config field 'iteratoins' (did you mean 'iterations'?)"),
        ('iterations = "ten"\n', "config field 'iterations': expected an integer, got 'ten'"),
        ("tensorboard = 1\n", "config field 'tensorboard': expected true or false"),
        ('kl_estimator = "k4"\n', "config field 'kl_estimator': expected one of 'k1', 'k2', 'k3'"),
        ("clip_eps = -0.1\n", "config field 'clip_eps': expected a number > 0"),
        ("[trainer]\nseed = 1\n", "unknown config field 'trainer'"),
    ],
)
def test_bad_toml_fails_clearly_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None, content: str, message: str
) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(content)
    assert cli.main(["train", "--config", str(toml), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iterations", "0"], "config field 'iterations': expected an int >= 1"),
        (
            ["--num-minibatches", "3"],
            "config field 'num_minibatches': expected a divisor of rollout_batch_size=64",
        ),
        (["--gamma", "1.5"], "config field 'gamma': expected a number in [0, 1]"),
        (["--top-p", "0"], "config field 'top_p': expected a number in (0, 1]"),
        (["--policy", "/does/not/exist"], "config field 'policy': /does/not/exist does not exist"),
        (["--task", "nope"], "config field 'task': unknown task 'nope'; expected one of"),
    ],
)
def test_bad_values_on_the_command_line_fail_clearly(
    capsys: pytest.CaptureFixture[str], no_work: None, argv: list[str], message: str
) -> None:
    assert cli.main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iteratoins", "3"], "unrecognized arguments: --iteratoins"),
        (["--iterations", "ten"], "expected an integer for iterations, got 'ten'"),
        (["--clip-eps", "nan"], "expected a finite number for clip_eps, got 'nan'"),
        (["--critic", "shared"], "expected one of policy, reward, value-head for critic, got 'shared'"),
        (["--iter", "3"], "unrecognized arguments: --iter"),  # no silent abbreviations
    ],
)
def test_unknown_flags_and_wrong_types_fail_clearly(
    capsys: pytest.CaptureFixture[str], no_work: None, argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_config_from_toml_reads_a_valid_file(tmp_path: Path) -> None:
    toml = tmp_path / "ok.toml"
    toml.write_text('task = "reverse"\nseed = 3\n')
    assert config_from_toml(toml) == {"task": "reverse", "seed": 3}
    (tmp_path / "broken.toml").write_text("seed = = 3\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        config_from_toml(tmp_path / "broken.toml")


def test_prompt_files_are_checked_line_by_line(tmp_path: Path) -> None:
    good = tmp_path / "prompts.jsonl"
    good.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(20)))
    train, held_out = load_prompts(good, seed=0)
    assert len(held_out) == 2 and len(train) == 18 and not set(train) & set(held_out)
    assert load_prompts(good, seed=0) == (train, held_out)
    split = tmp_path / "split.jsonl"
    split.write_text('{"prompt": "a", "split": "train"}\n{"prompt": "b", "split": "eval"}\n')
    assert load_prompts(split, seed=0) == (["a"], ["b"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected an object"):
        load_prompts(bad, seed=0)
    bad.write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_prompts(bad, seed=0)
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(bad, seed=0)


def test_train_local_checkpoints_on_a_prompts_file_and_write_every_output(tmp_path: Path) -> None:
    tokenizer = tiny_tokenizer()
    policy_dir, reward_dir = tmp_path / "policy", tmp_path / "reward"
    tiny_policy(tokenizer).save_pretrained(policy_dir)
    tokenizer.save_pretrained(policy_dir)
    tiny_reward_model(tokenizer).save_pretrained(reward_dir)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ["abc", "bad", "cafe", "h", "gg", "e"])
    )
    out = tmp_path / "out"
    argv = ["train", "--policy", str(policy_dir), "--reward", str(reward_dir), "--prompts", str(prompts)]
    argv += ["--out", str(out), "--iterations", "2", "--rollout-batch-size", "8", "--max-new-tokens", "5"]
    argv += ["--num-minibatches", "2", "--ppo-epochs", "1", "--eval-samples", "6", "--audit-samples", "3"]
    argv += ["--critic", "reward", "--no-progress-bar", "--reference", str(policy_dir)]
    assert cli.main(argv) == 0

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        missing = set(REQUIRED_METRICS) | set(STAGE_SECONDS)
        assert missing <= set(record), missing - set(record)
        assert record["tokens_per_second"] > 0 and record["seconds_iteration"] > 0
    audit = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(audit) == 6 and {a["iteration"] for a in audit} == {0, 1}
    for item in audit:
        n = len(item["response_ids"])
        assert item["stop_reason"] in ("eos", "length")
        assert len(item["action_mask"]) == n == len(item["old_logprobs"]) == len(item["ref_logprobs"])
        kept = [v for v, m in zip(item["old_logprobs"], item["action_mask"], strict=True) if m]
        assert kept and all(v is not None and v <= 0 for v in kept)
        assert set(item["score_components"]) == {"raw", "missing_eos_adjustment"}
        assert item["score"] == pytest.approx(
            item["score_components"]["raw"] + item["score_components"]["missing_eos_adjustment"]
        )
        assert isinstance(item["prompt"], str) and isinstance(item["response"], str) and "values" in item
    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval_score_initial", "eval_score_final", "kl_ref_final", "wall_seconds"):
        assert isinstance(summary[key], float)
    assert "well_formed_rate_final" in summary and summary["well_formed_rate_final"] is None  # no format
    assert summary["eval_samples"] == 6
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((out / "tensorboard").iterdir())
