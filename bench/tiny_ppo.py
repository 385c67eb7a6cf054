"""The trainer benchmark's fixed settings, models, tokenizer and prompts (issue 6).

Imported by both sides of the comparison: ppo-ref's trainer (``bench/trainer_worker.py``, main
``.venv``) and TRL 1.12's ``PPOTrainer`` (``bench/trl_iteration.py``, ``.envs/trl``). Both build
exactly the same four randomly initialised GPT-2 models from the same seeds, the same tokenizer
and the same 640 prompts, so the two trainers differ only in their own code.

Settings (those of issue 6's "TRL 1.12 PPOTrainer against a lean PPO loop" comparison, all
written here): four separate ``GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64,
vocab_size=64)`` models (policy, frozen reference, value, reward), dropout 0, float32; PAD and EOS
outside the model vocabulary, so every response is exactly 32 tokens; 640 fixed random 8-token
prompts; batch 64; 32 new tokens at temperature 1; 4 epochs x 4 minibatches of 16; no gradient
accumulation, no gradient clipping; AdamW lr 3e-4, weight decay 0, fused; KL coefficient 0.05
(k1, fixed), clip 0.2, value clip 0.2, value-loss weight 0.1, gamma 1, lambda 0.95; 2 threads.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import torch
from torch import Tensor

from bench.worker import claim_stdout_for_protocol, protocol_stream  # the workers' protocol, once

VOCAB = 64
PAD_ID = VOCAB  # outside the model vocabulary: never sampled
EOS_ID = VOCAB + 1  # outside the model vocabulary: no response ever ends early
PROMPTS = 640
PROMPT_TOKENS = 8
RESPONSE_TOKENS = 32
BATCH = 64
EPOCHS = 4
MINIBATCHES = 4
LEARNING_RATE = 3e-4
KL_COEF = 0.05
CLIP = 0.2
VALUE_CLIP = 0.2
VF_COEF = 0.1
GAMMA = 1.0
LAM = 0.95
THREADS = int(os.environ.get("PPO_REF_BENCH_THREADS", "2"))
"""Torch threads of every benchmark process (the settings say 2; ``PPO_REF_BENCH_THREADS`` overrides)."""
SEED = 0

__all__ = [
    "BATCH",
    "EOS_ID",
    "PAD_ID",
    "RESPONSE_TOKENS",
    "build_models",
    "build_tokenizer",
    "claim_stdout_for_protocol",
    "gpt2_config",
    "peak_rss_bytes",
    "prompt_ids",
    "prompt_texts",
    "protocol_stream",
]


def gpt2_config(**extra: Any) -> Any:
    """The tiny GPT-2 shape, dropout 0 (the step kit's :func:`~ppo_ref.adapters.step_kit.tiny_config`,
    width 64; GPT-2's default BOS/EOS 50256 lie outside this vocabulary: none)."""
    from ppo_ref.adapters.step_kit import tiny_config

    return tiny_config("gpt2", VOCAB, n_embd=64, pad_id=None, eos_id=None, bos_id=None, **extra)


def build_models(seed: int = SEED) -> dict[str, Any]:
    """``policy`` and ``reference`` (GPT2LMHeadModel), ``value`` and ``reward``
    (GPT2ForSequenceClassification, one label), each randomly initialised from its own seed."""
    from ppo_ref.adapters.step_kit import tiny_model

    models: dict[str, Any] = {}
    for offset, (name, head) in enumerate(
        [("policy", "lm"), ("reference", "lm"), ("value", "score"), ("reward", "score")]
    ):
        config = gpt2_config(num_labels=1) if head == "score" else gpt2_config()
        models[name] = tiny_model(config, seed + offset, head=head).eval()
    # The reference starts as the policy's copy (ppo-ref's default; TRL gets it as a separate object).
    models["reference"].load_state_dict(models["policy"].state_dict())
    return models


def build_tokenizer() -> Any:
    """A word-level tokenizer over ``t0`` .. ``t63`` plus ``[PAD]`` (64) and ``[EOS]`` (65)."""
    from ppo_ref.adapters.step_kit import word_tokenizer

    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab["[PAD]"] = PAD_ID
    vocab["[EOS]"] = EOS_ID
    return word_tokenizer(vocab, pad="[PAD]", eos="[EOS]", bos=None, unk="[PAD]", padding_side="left")


def prompt_ids(seed: int = SEED) -> Tensor:
    """(640, 8) int64 random prompt tokens in [0, 64)."""
    generator = torch.Generator().manual_seed(seed + 100)
    return torch.randint(0, VOCAB, (PROMPTS, PROMPT_TOKENS), generator=generator)


def prompt_texts(seed: int = SEED) -> list[str]:
    """The prompts as texts ``"t5 t17 ..."`` (the tokenizer maps them back to :func:`prompt_ids`)."""
    return [" ".join(f"t{i}" for i in row) for row in prompt_ids(seed).tolist()]


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
