"""trl-logprobs-half-precision (non-default: a bfloat16 policy): TRL 1.12's ``selective_log_softmax``
computes bf16/fp16 log-probs in half precision, and ``PPOTrainer.train`` trains on them.

Interpreter: .envs/trl/bin/python (any env with ``pip install trl==1.12.0``; TRL removed PPO in 1.13).
Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-logprobs-half-precision.py``.

Drives ``trl.experimental.ppo.PPOTrainer.train()`` itself, one iteration, real sampling, on tiny
random GPT-2 policy, reference, value and reward models built from a config and a 16-token word-level
tokenizer built in-process (no hub, no network; writes only in a tempfile directory). For logits of
a dtype other than float32/float64, ``trl.trainer.utils.selective_log_softmax`` runs
``F.log_softmax`` in that dtype and returns it (``trainer/utils.py:507-520``); ``train()`` uses it for
the old, reference and new log-probs (``ppo_trainer.py:703``, ``:714``, ``:823``). Expected: the float32
log-softmax of the very logits ``train()`` used (read at each micro-batch by a wrapper around
``accelerator.backward``), ``log_softmax(logits.float())[response token]``; printed: the largest and
mean |new_logprobs - expected| over the action tokens, and the largest resulting error of the ratio.

Triggering setting (exit 1 when the error exceeds 1e-3): the policy loaded in bfloat16 (what
``--dtype bfloat16`` does in TRL's ``ppo.py``/``ppo_tldr.py``, whose ``ModelConfig.dtype`` defaults
to float32). Also run: TRL's defaults (float32 weights; ``PPOConfig.bf16`` left at its default True,
which ``PPOTrainer`` does not pass to the ``Accelerator`` it builds itself, so no autocast: float32 logits).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

VOCAB = 16  # model vocabulary; the tokenizer's [PAD] is id 16, outside it (TRL masks pad ids to 0 before
EOS = 1  # every forward, as in TRL's ppo_tldr.py where [PAD] is added to the tokenizer)
PROMPT, RESPONSE, PER_DEVICE = 4, 12, 8
TOLERANCE = 1e-3


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)} | {"[PAD]": VOCAB}
    vocab["<eos>"] = EOS
    del vocab[f"t{EOS}"]
    raw = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", eos_token="<eos>")


def models_(seed: int) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    sizes = {"n_positions": 32, "n_embd": 16, "n_layer": 1, "n_head": 2}
    config = GPT2Config(vocab_size=VOCAB, num_labels=1, bos_token_id=EOS, eos_token_id=EOS, **sizes)
    built: dict[str, Any] = {}
    for name, cls, offset in (("policy", GPT2LMHeadModel, 0), ("ref", GPT2LMHeadModel, 0)):
        torch.manual_seed(seed + offset)
        built[name] = cls(config)
    for name, offset in (("value", 1), ("reward", 2)):
        torch.manual_seed(seed + offset)
        built[name] = GPT2ForSequenceClassification(config)
    return built


def run(dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """One train() iteration; the dtypes and the log-prob error against float32 math."""
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    m = models_(seed)
    m["policy"], m["ref"] = m["policy"].to(dtype), m["ref"].to(dtype)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, VOCAB, (2 * PER_DEVICE, PROMPT), generator=g).tolist()
    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(
            output_dir=out, per_device_train_batch_size=PER_DEVICE, total_episodes=PER_DEVICE,
            response_length=RESPONSE, num_sample_generations=0, report_to="none", save_strategy="no",
            use_cpu=True, seed=seed,
        )  # fmt: skip
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer(),
            model=m["policy"],
            ref_model=m["ref"],
            reward_model=m["reward"],
            value_model=m["value"],
            train_dataset=Dataset.from_dict({"input_ids": prompts}),
        )
        seen: list[dict[str, Any]] = []
        backward = trainer.accelerator.backward

        def spy(loss: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
            logits, responses = f["logits"].detach(), f["mb_responses"]
            action = ~f["padding_mask"][f["micro_batch_inds"]]
            got = f["new_logprobs"].detach()
            exact = torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
            err = (got.float() - exact)[action].abs()
            seen.append(
                {
                    "logits": logits.dtype,
                    "logprobs": got.dtype,
                    "max": float(err.max()),
                    "mean": float(err.mean()),
                }
            )
            return backward(loss, **kwargs)

        trainer.accelerator.backward = spy
        np.random.seed(seed)  # train()'s mini-batch shuffle (np.random.permutation) is not seeded by TRL
        trainer.train()
        precision = str(trainer.accelerator.mixed_precision)
    worst = max(s["max"] for s in seen)
    return {
        "bf16": config.bf16, "mixed_precision": precision, "logits": seen[0]["logits"],
        "logprobs": seen[0]["logprobs"], "max": worst, "mean": sum(s["mean"] for s in seen) / len(seen),
        "ratio": float(torch.expm1(torch.tensor(worst))),
    }  # fmt: skip


def main() -> int:
    torch.set_num_threads(1)
    wrong = False
    for label, dtype in (
        ("trigger: bfloat16 policy", torch.bfloat16),
        ("defaults: float32 policy", torch.float32),
    ):
        r = run(dtype)
        print(
            f"{label} (PPOConfig.bf16={r['bf16']}, accelerator mixed_precision={r['mixed_precision']}): "
            f"logits {r['logits']}, new_logprobs {r['logprobs']}; |new_logprobs - float32 log-softmax| on "
            "action tokens "
            f"expected 0 (float32 rounding, < {TOLERANCE:g}), got max {r['max']:.4g}, mean {r['mean']:.4g}; "
            f"ratio error up to {r['ratio']:.3%}"
        )
        wrong |= dtype != torch.float32 and r["max"] > TOLERANCE
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
