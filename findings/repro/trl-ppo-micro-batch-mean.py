"""trl-ppo-micro-batch-mean (non-default): TRL 1.12's PPO loss is a mean of micro-batch means.

Interpreter: .envs/trl/bin/python (any env with ``pip install trl==1.12.0``; TRL removed PPO in 1.13).
Run from the repository root: ``.envs/trl/bin/python findings/repro/trl-ppo-micro-batch-mean.py``.

Drives ``trl.experimental.ppo.PPOTrainer.train()`` itself, one iteration, real sampling (HF
``generate``), on tiny random GPT-2 policy, reference, value and reward models built from a config
and a 16-token word-level tokenizer built in-process (no hub, no network; writes only in a tempfile
directory). ``train()`` takes ``pg_loss = masked_mean(pg_loss_max, ~padding_mask[micro_batch_inds])``
per micro-batch (``ppo_trainer.py:846``, the value loss likewise at ``:837``) and accelerate divides
each micro-batch's loss by ``gradient_accumulation_steps = k``: a response token of micro-batch m
weighs ``1 / (k * n_m)`` instead of ``1 / N`` (n_m: its micro-batch's action tokens, N: the
mini-batch's). Expected (the token mean over the mini-batch, which TRL's k = 1 run computes):

    grad_expected = sum_m d/dtheta [ sum_{tokens of m} pg_loss_max / N_pg
                                     + vf_coef * 0.5 * sum_{tokens of m} vf_loss_max / N_vf ]

computed inline with ``torch.autograd.grad`` on ``train()``'s own per-token losses at each
micro-batch (a wrapper around ``accelerator.backward`` reads its frame), against the gradient
``train()`` accumulated before its ``optimizer.step()``. Printed: max |got - expected| / max |expected|.

Triggering setting (exit 1 when wrong): ``stop_token="eos"`` (responses end at EOS, so micro-batches
hold unequal token counts) with ``gradient_accumulation_steps`` 2 and 4, as TRL's own
``examples/scripts/ppo/ppo_tldr.py`` recipe runs (``--stop_token eos --gradient_accumulation_steps
64`` or ``4``). Also run: TRL's defaults (``stop_token=None``: every response has the full
``response_length``, so every micro-batch has the same count and the mean of means is exact) with
k = 2, and k = 1. The dataset holds two loader batches so the iteration is not the loader's last
(see trl-ppo-accumulation-end-of-dataloader, a separate defect that would add optimizer steps).
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
PROMPT, RESPONSE, PER_DEVICE = 4, 8, 4
TOLERANCE = 1e-4


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


def run(k: int, stop_token: str | None, seed: int = 0) -> tuple[float, float, int]:
    """One train() iteration; returns (relative gradient error, largest expected entry, short rows)."""
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    m = models_(seed)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, VOCAB, (2 * PER_DEVICE * k, PROMPT), generator=g).tolist()
    with tempfile.TemporaryDirectory() as out:
        config = PPOConfig(
            output_dir=out, per_device_train_batch_size=PER_DEVICE, gradient_accumulation_steps=k,
            total_episodes=PER_DEVICE * k, response_length=RESPONSE, stop_token=stop_token,
            num_sample_generations=0, report_to="none", save_strategy="no", use_cpu=True, seed=seed,
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
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        expected = [torch.zeros_like(p) for p in params]
        record: dict[str, Any] = {}
        backward = trainer.accelerator.backward

        def spy(loss: Any, **kwargs: Any) -> Any:
            f = sys._getframe(1).f_locals  # PPOTrainer.train's frame
            if f["ppo_epoch_idx"] or f["minibatch_idx"] or "got" in record:
                return backward(loss, **kwargs)
            mini, micro = f["mini_batch_inds"], f["micro_batch_inds"]
            n_pg = (~f["padding_mask"][mini]).sum()
            n_vf = (~f["padding_mask_p1"][mini]).sum()
            target = (f["pg_loss_max"] * ~f["padding_mask"][micro]).sum() / n_pg + config.vf_coef * 0.5 * (
                f["vf_loss_max"] * ~f["padding_mask_p1"][micro]
            ).sum() / n_vf
            grads = torch.autograd.grad(target, params, retain_graph=True, allow_unused=True)
            for e, d in zip(expected, grads, strict=True):
                if d is not None:
                    e += d
            result = backward(loss, **kwargs)
            if f["gradient_accumulation_idx"] == k - 1:  # before train()'s optimizer.step()
                record["got"] = [p.grad.detach().clone() for p in params]
                record["short"] = int((f["sequence_lengths"] < f["responses"].shape[1] - 1).sum())
            return result

        trainer.accelerator.backward = spy
        np.random.seed(seed)  # train()'s mini-batch shuffle (np.random.permutation) is not seeded by TRL
        trainer.train()
    scale = max(float(e.abs().max()) for e in expected)
    err = max(float((g_ - e).abs().max()) for g_, e in zip(record["got"], expected, strict=True))
    return err / scale, scale, record["short"]


def main() -> int:
    torch.set_num_threads(1)
    wrong = False
    for label, k, stop in (
        ("trigger: stop_token='eos', gradient_accumulation_steps=2", 2, "eos"),
        ("trigger: stop_token='eos', gradient_accumulation_steps=4", 4, "eos"),
        ("defaults: stop_token=None, gradient_accumulation_steps=2", 2, None),
        ("defaults: stop_token=None, gradient_accumulation_steps=1", 1, None),
    ):
        rel, scale, short = run(k, stop)
        print(
            f"{label}: responses ended before the width {short}/{PER_DEVICE * k}; "
            f"expected max|grad - token-mean grad| / max|grad| 0 (<{TOLERANCE:g}), got {rel:.3g} "
            f"(largest entry {scale:.4g})"
        )
        wrong |= stop == "eos" and rel > TOLERANCE
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
