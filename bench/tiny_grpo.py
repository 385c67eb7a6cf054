"""The critic-free (GRPO) benchmark's fixed settings, model, tokenizer, prompts and reward (issue 12).

Imported by the three processes of the comparison: ppo-ref's trainer (``bench/grpo_side.py
--serve trainer``, main ``.venv``), the bare model work (``bench/grpo_side.py --serve bare``) and
TRL 1.16's ``GRPOTrainer`` (``bench/trl_grpo_iteration.py``, ``.envs/trl116``). All build the same
randomly initialised GPT-2 from the same seed, the same tokenizer, the same 8 prompts and the same
rule reward, so the trainers differ only in their own code.

Settings (issue 12, part 4): ``GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64,
vocab_size=64)``, dropout 0, float32; ``[PAD]`` = 0 and ``[EOS]`` = 1 inside the vocabulary, so a
response ends at its first sampled EOS (up to 32 new tokens); 8 fixed random 8-token prompts
(no padding), 8 responses each (64 per iteration, group size 8); temperature 1, no top-k/top-p;
group-normalised advantages (GRPO); one epoch, one optimizer step per iteration over one
micro-batch of 64; clip 0.2; token-mean loss over the whole batch (TRL's ``dapo``); fused AdamW
lr 1e-4, weight decay 0, no gradient clipping; KL to the frozen initial policy as a loss term
(k3) with coefficient ``beta`` (0 and 0.04); the reward is the fraction of response tokens equal
to ``t5``; 2 torch threads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

VOCAB = 64
PAD_ID = 0
EOS_ID = 1
TARGET_WORD = "t5"
PROMPTS = 8
PROMPT_TOKENS = 8
GROUP = 8
BATCH = PROMPTS * GROUP
RESPONSE_TOKENS = 32
MICRO_BATCH = BATCH
"""Rows per forward/backward (TRL's ``per_device_train_batch_size``); one micro-batch per step."""
LEARNING_RATE = 1e-4
CLIP = 0.2
BETAS = (0.0, 0.04)
"""The two KL coefficients compared: 0 (no reference model at all in TRL) and TRL's former default."""
THREADS = int(os.environ.get("PPO_REF_BENCH_THREADS", "2"))
SEED = 0

__all__ = [
    "BATCH",
    "BETAS",
    "EOS_ID",
    "GROUP",
    "PAD_ID",
    "RESPONSE_TOKENS",
    "build_policy",
    "build_tokenizer",
    "gpt2_config",
    "prompt_ids",
    "prompt_texts",
    "target_fraction",
]


def gpt2_config() -> Any:
    """The tiny GPT-2 shape, dropout 0, with PAD and EOS inside its vocabulary (the step kit's
    :func:`~ppo_ref.adapters.step_kit.tiny_config`, width 64)."""
    from ppo_ref.adapters.step_kit import tiny_config

    return tiny_config("gpt2", VOCAB, n_embd=64, pad_id=PAD_ID, eos_id=EOS_ID, bos_id=EOS_ID)


def build_policy(seed: int = SEED) -> Any:
    """The policy (GPT2LMHeadModel), randomly initialised from ``seed``, float32, eval mode."""
    from ppo_ref.adapters.step_kit import tiny_model

    return tiny_model(gpt2_config(), seed).eval()


def build_tokenizer() -> Any:
    """A word-level tokenizer: ``[PAD]`` = 0, ``[EOS]`` = 1 and ``t2`` .. ``t63``; no BOS is added."""
    from ppo_ref.adapters.step_kit import word_tokenizer

    vocab = {"[PAD]": PAD_ID, "[EOS]": EOS_ID, **{f"t{i}": i for i in range(2, VOCAB)}}
    return word_tokenizer(vocab, pad="[PAD]", eos="[EOS]", bos=None, unk="[PAD]", padding_side="left")


def prompt_ids(seed: int = SEED) -> Tensor:
    """(8, 8) int64 random prompt tokens in [2, 64) (never PAD or EOS)."""
    generator = torch.Generator().manual_seed(seed + 100)
    return torch.randint(2, VOCAB, (PROMPTS, PROMPT_TOKENS), generator=generator)


def prompt_texts(seed: int = SEED) -> list[str]:
    """The prompts as texts ``"t5 t17 ..."`` (the tokenizer maps them back to :func:`prompt_ids`)."""
    return [" ".join(f"t{i}" for i in row) for row in prompt_ids(seed).tolist()]


def target_fraction(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float]:
    """The reward: the fraction of a response's words equal to ``t5`` (0 for an empty response).

    Callable as ppo-ref's ``reward_function(prompts, responses)`` and as a TRL reward function
    ``(prompts, completions, **kwargs)``. Example: ``target_fraction(["t2"], ["t5 t9"]) == [0.5]``.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"completions: expected {len(prompts)} (one per prompt), got {len(completions)}")
    scores = []
    for text in completions:
        words = [w for w in str(text).split() if w not in ("[PAD]", "[EOS]")]
        scores.append(sum(w == TARGET_WORD for w in words) / len(words) if words else 0.0)
    return scores
