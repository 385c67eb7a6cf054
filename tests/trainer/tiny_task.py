"""A tiny task for the trainer tests: a 12-token character tokenizer, random tiny GPT-2 models.

Nothing is downloaded and nothing depends on the built-in tasks. The policy's config keeps GPT-2's
default dropout (0.1), so every test also exercises the trainer's dropout switch-off.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, PreTrainedTokenizerFast

from ppo_ref.trainer import TrainerConfig, TrainingSetup

LETTERS = "abcdefgh "


def tiny_tokenizer(pad_equals_eos: bool = False) -> PreTrainedTokenizerFast:
    """Character tokenizer: <pad>=0, <eos>=1, <unk>=2, then one token per character of LETTERS."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({ch: 3 + i for i, ch in enumerate(LETTERS)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<eos>" if pad_equals_eos else "<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def tiny_gpt2_config(tokenizer: PreTrainedTokenizerFast, **extra: Any) -> GPT2Config:
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def tiny_policy(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> GPT2LMHeadModel:
    """A random tiny GPT-2 (dropout left at GPT-2's default 0.1)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(tiny_gpt2_config(tokenizer))


def tiny_reward_model(tokenizer: PreTrainedTokenizerFast, seed: int = 1) -> GPT2ForSequenceClassification:
    """A random one-label GPT-2 classifier whose head is far from zero (scores vary by input)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2ForSequenceClassification(tiny_gpt2_config(tokenizer, num_labels=1))
        torch.nn.init.normal_(model.score.weight, std=1.0)
    return model


def count_a(prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """Rule reward: the share of 'a' characters in the response (0 for an empty response)."""
    return [response.count("a") / max(len(response), 1) for response in responses]


PROMPTS = ["abc", "hgf", "d", "ee e", "bach", "cafe", "g", "ab ab", "fed", "hh", "a", "bb"]


def write_tiny_inputs(directory: Path) -> dict[str, str]:
    """What the command line takes instead of a task: the tiny policy with its tokenizer saved in
    ``directory/policy`` and the PROMPTS in ``directory/prompts.jsonl`` (keys ``policy``, ``prompts``)."""
    tokenizer = tiny_tokenizer()
    policy = directory / "policy"
    tiny_policy(tokenizer).save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    prompts = directory / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"policy": str(policy), "prompts": str(prompts)}


def tiny_cli_argv(tmp_path: Path, *flags: str) -> list[str]:
    """argv of a tiny ``train`` run from the command line: the :func:`write_tiny_inputs` in
    ``tmp_path``, the reward ``tiny_task:count_a``, 2 iterations of 8 rollouts of 5 new tokens in 2
    minibatches, 4 eval samples, no progress bar, TensorBoard or plots; then ``flags``."""
    inputs = write_tiny_inputs(tmp_path)
    argv = ["train", "--policy", inputs["policy"], "--prompts", inputs["prompts"]]
    argv += ["--reward", "tiny_task:count_a", "--iterations", "2", "--rollout-batch-size", "8"]
    argv += ["--max-new-tokens", "5", "--num-minibatches", "2", "--eval-samples", "4"]
    return [*argv, "--no-progress-bar", "--no-tensorboard", "--no-plots", *flags]


def config_choices(name: str) -> set[object]:
    """The values TrainerConfig's field ``name`` may take: the members of its ``Literal`` (None
    aside where the field is optional)."""
    annotation = typing.get_type_hints(TrainerConfig)[name]
    members = typing.get_args(annotation)
    literal = next((m for m in members if typing.get_origin(m) is typing.Literal), annotation)
    return set(typing.get_args(literal))


def tiny_setup(pad_equals_eos: bool = False, reward_model: bool = False, seed: int = 0) -> TrainingSetup:
    tokenizer = tiny_tokenizer(pad_equals_eos)
    return TrainingSetup(
        tokenizer=tokenizer,
        policy=tiny_policy(tokenizer, seed),
        train_prompts=PROMPTS[:10],
        eval_prompts=PROMPTS[10:],
        reward_function=None if reward_model else count_a,
        reward_model=tiny_reward_model(tokenizer) if reward_model else None,
        well_formed=lambda prompt, response: " " not in response,
        name="tiny",
    )


def tiny_config(out: Path, **overrides: Any) -> TrainerConfig:
    values: dict[str, Any] = {
        "out": str(out),
        "iterations": 2,
        "rollout_batch_size": 8,
        "max_new_tokens": 6,
        "ppo_epochs": 2,
        "num_minibatches": 2,
        "eval_samples": 8,
        "audit_samples": 2,
        "tensorboard": False,
        "progress_bar": False,
        "plots": False,
    }
    values.update(overrides)
    return TrainerConfig(**values)
