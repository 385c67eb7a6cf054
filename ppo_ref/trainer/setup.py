"""Resolve what a run trains: a built-in task, or local checkpoints and a prompts file.

``--policy PATH`` replaces the task's policy (and tokenizer), ``--reward PATH`` its reward, and
``--prompts FILE.jsonl`` its prompts; the task is only built when one of the three is missing.
The task's ``config_overrides`` apply to the fields the user did not set.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ppo_ref.tasks.base import Task
from ppo_ref.trainer.config import TrainerConfig, check_field_values
from ppo_ref.trainer.loop import TrainingSetup
from ppo_ref.trainer.seeding import Stream, stream_rng

__all__ = ["available_tasks", "build_setup", "check_paths", "load_prompts"]


def available_tasks() -> list[str]:
    """Names of the built-in tasks (empty if the task registry is not available)."""
    try:
        from ppo_ref.tasks import TASKS  # type: ignore[attr-defined, unused-ignore]
    except ImportError:
        return []
    return sorted(TASKS)


def _build_task(name: str, seed: int) -> Task:
    try:
        from ppo_ref.tasks import get_task  # type: ignore[attr-defined, unused-ignore]
    except ImportError as error:
        raise ValueError(
            f"config field 'task': the task registry ppo_ref.tasks is unavailable ({error})"
        ) from None
    task = get_task(name, seed)
    if not isinstance(task, Task):
        raise ValueError(f"task {name!r}: the registry returned {type(task).__name__}, expected a Task")
    return task


def check_paths(config: TrainerConfig) -> None:
    """Fail before any work if --policy, --reward or --prompts do not exist, or the task is unknown."""
    for name in ("policy", "reference", "reward", "prompts"):
        value = getattr(config, name)
        if value is not None and not Path(value).exists():
            raise ValueError(f"config field {name!r}: {value} does not exist")
    needs_task = config.policy is None or config.reward is None or config.prompts is None
    names = available_tasks()
    if needs_task and names and config.task not in names:
        raise ValueError(f"config field 'task': unknown task {config.task!r}; expected one of {names}")


def load_prompts(path: str | Path, seed: int) -> tuple[list[str], list[str]]:
    """``(train, eval)`` prompts from a JSONL file of ``{"prompt": str, "split": "train"|"eval"}``.

    Without any ``split`` field, a seeded 10% (at least one prompt) is held out for evaluation.
    Errors name the file and the line.
    """
    rows: list[tuple[str, str | None]] = []
    try:
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")
    except OSError as error:
        raise ValueError(f"{path}: cannot read the prompts file ({error.strerror})") from None
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a leading BOM is fine
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}:{number}: not UTF-8 text (byte {error.start} of the line)") from None
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"]:
            raise ValueError(f'{path}:{number}: expected an object with a non-empty "prompt" string')
        split = item.get("split")
        if split not in (None, "train", "eval"):
            raise ValueError(f'{path}:{number}: "split" must be "train" or "eval", got {split!r}')
        rows.append((item["prompt"], split))
    if not rows:
        raise ValueError(f"{path}: no prompts (the file is empty or holds only blank lines)")
    if any(split is not None for _, split in rows):
        train = [p for p, s in rows if s != "eval"]
        held_out = [p for p, s in rows if s == "eval"]
    else:
        if len(rows) < 2:
            raise ValueError(f"{path}: expected at least 2 prompts (one is held out for evaluation)")
        order = stream_rng(seed, Stream.HOLDOUT_SPLIT).permutation(len(rows)).tolist()
        cut = max(1, len(rows) // 10)
        held_out = [rows[i][0] for i in order[:cut]]
        train = [rows[i][0] for i in order[cut:]]
    if not train or not held_out:
        raise ValueError(f"{path}: expected at least one training and one evaluation prompt")
    return train, held_out


def _same_vocabulary(first: PreTrainedTokenizerBase, second: PreTrainedTokenizerBase) -> bool:
    return bool(first.get_vocab() == second.get_vocab())


def _load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_setup(config: TrainerConfig, user_fields: Collection[str]) -> tuple[TrainingSetup, TrainerConfig]:
    """Build the :class:`TrainingSetup` and the final config (task overrides below the user's values)."""
    check_paths(config)
    task = None
    if config.policy is None or config.reward is None or config.prompts is None:
        task = _build_task(config.task, config.seed)
        overrides: dict[str, Any] = {k: v for k, v in task.config_overrides.items() if k not in user_fields}
        check_field_values(overrides, f"task {config.task!r} config_overrides")
        config = replace(config, **overrides)

    policy: PreTrainedModel
    if config.policy is not None:
        tokenizer = _load_tokenizer(config.policy)
        policy = AutoModelForCausalLM.from_pretrained(config.policy, dtype=torch.float32)
    else:
        assert task is not None
        tokenizer, policy = task.tokenizer, task.policy

    if config.prompts is not None:
        train_prompts, eval_prompts = load_prompts(config.prompts, config.seed)
    else:
        assert task is not None
        train_prompts, eval_prompts = list(task.train_prompts), list(task.eval_prompts)

    reward_function = reward_model = reward_tokenizer = None
    eval_reward_function = task.eval_reward_function if task is not None and config.prompts is None else None
    if config.reward is not None:
        reward_model = AutoModelForSequenceClassification.from_pretrained(config.reward, dtype=torch.float32)
        saved = any(
            (Path(config.reward) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")
        )
        # Without a tokenizer of its own, the reward model is assumed to share the policy's.
        own_tokenizer = _load_tokenizer(config.reward) if saved else tokenizer
        reward_tokenizer = None if _same_vocabulary(own_tokenizer, tokenizer) else own_tokenizer
    else:
        assert task is not None
        reward_function, reward_model = task.reward_function, task.reward_model
        if reward_model is not None and not _same_vocabulary(task.tokenizer, tokenizer):
            reward_tokenizer = task.tokenizer
    reference = None
    if config.reference is not None:
        reference = AutoModelForCausalLM.from_pretrained(config.reference, dtype=torch.float32)
    well_formed = task.well_formed if task is not None and config.prompts is None else None
    name = config.task if task is not None and config.policy is None else str(config.policy)
    setup = TrainingSetup(
        tokenizer=tokenizer,
        policy=policy,
        train_prompts=train_prompts,
        eval_prompts=eval_prompts,
        reward_function=reward_function,
        reward_model=reward_model,
        eval_reward_function=eval_reward_function,
        reward_tokenizer=reward_tokenizer,
        well_formed=well_formed,
        reference=reference,
        name=name,
    )
    return setup, config
